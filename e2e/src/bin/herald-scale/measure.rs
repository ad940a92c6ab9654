//! What the harness reads of the processes and the API server: memory and CPU from
//! `/proc`, API requests by verb and etcd bytes from the API server's metrics, reconciles
//! from the operator's.

use super::*;

/// CPU ticks per second of /proc (USER_HZ; 100 on every Linux this runs on).
pub(crate) const TICKS: f64 = 100.0;

/// A field of `/proc/<pid>/status` in KiB (`VmRSS:`, `RssAnon:`).
pub(crate) fn proc_status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Resident memory (KiB) and CPU time (user + system) of a process.
pub(crate) fn proc_usage(pid: u32) -> (u64, Duration) {
    let rss = proc_status_kib(pid, "VmRSS:");
    let cpu = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            // Fields after the command name (which may hold spaces) start at `state`.
            let rest = s.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let user: f64 = f.get(11)?.parse().ok()?;
            let system: f64 = f.get(12)?.parse().ok()?;
            Some(Duration::from_secs_f64((user + system) / TICKS))
        })
        .unwrap_or_default();
    (rss, cpu)
}

/// A sibling binary of this one (built by `cargo build --release -p herald-e2e --bins`).
pub(crate) fn sibling(name: &str) -> PathBuf {
    std::env::current_exe()
        .expect("own path")
        .with_file_name(name)
}

pub(crate) fn spawn(name: &str, args: &[String], log: &std::path::Path) -> Child {
    let log = std::fs::File::create(log).expect("log file");
    Command::new(sibling(name))
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| {
            panic!("starting {name}: {e} (cargo build --release -p herald-e2e --bins)")
        })
}

pub(crate) fn stop_child(mut child: Child, signal: &str) {
    let _ = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status();
    let _ = child.wait();
}

/// The API server's metrics, through kubectl (one GET of `/metrics` per call).
pub(crate) fn api_metrics(env: &herald_e2e::TestEnv) -> String {
    for _ in 0..10 {
        let out = env
            .kubectl()
            .args(["get", "--raw", "/metrics"])
            .output()
            .expect("kubectl get --raw /metrics");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if text.contains("apiserver_request_total") {
            return text;
        }
        eprintln!(
            "herald-scale: scraping the API server failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        std::thread::sleep(Duration::from_secs(3));
    }
    panic!("the API server's metrics are unreachable");
}

/// `name{a="x",b="y"} 3` → ({a: x, b: y}, 3).
pub(crate) fn sample(line: &str) -> Option<(BTreeMap<&str, &str>, f64)> {
    let (head, value) = line.rsplit_once(' ')?;
    let value = value.parse().ok()?;
    let labels = head
        .split_once('{')
        .map(|(_, l)| l.trim_end_matches('}'))
        .unwrap_or("");
    let map = labels
        .split("\",")
        .filter_map(|kv| {
            let (k, v) = kv.split_once("=\"")?;
            Some((k.trim_matches(','), v.trim_end_matches('"')))
        })
        .collect();
    Some((map, value))
}

/// API requests by `VERB resource[/subresource]`.
pub(crate) fn requests(metrics: &str) -> BTreeMap<String, f64> {
    let mut by = BTreeMap::new();
    for line in metrics.lines() {
        if !line.starts_with("apiserver_request_total{") {
            continue;
        }
        let Some((labels, value)) = sample(line) else {
            continue;
        };
        let resource = labels.get("resource").copied().unwrap_or("");
        if resource.is_empty() {
            continue;
        }
        let sub = labels.get("subresource").copied().unwrap_or("");
        let verb = labels.get("verb").copied().unwrap_or("?");
        let key = if sub.is_empty() {
            format!("{verb} {resource}")
        } else {
            format!("{verb} {resource}/{sub}")
        };
        *by.entry(key).or_insert(0.0) += value;
    }
    by
}

/// etcd's database size as the API server reports it.
pub(crate) fn storage_bytes(metrics: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("apiserver_storage_size_bytes")
                || l.starts_with("apiserver_storage_db_total_size_in_bytes")
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .fold(0.0, f64::max)
}

/// The operator's reconciles by kind.
pub(crate) async fn reconciles(url: &str) -> BTreeMap<String, f64> {
    let Ok(resp) = reqwest::get(url).await else {
        return BTreeMap::new();
    };
    let text = resp.text().await.unwrap_or_default();
    let mut by = BTreeMap::new();
    for line in text.lines() {
        if !line.starts_with("herald_operator_reconciles_total{") {
            continue;
        }
        if let Some((labels, value)) = sample(line) {
            let kind = labels.get("kind").copied().unwrap_or("?").to_owned();
            *by.entry(kind).or_insert(0.0) += value;
        }
    }
    by
}

pub(crate) fn delta(
    after: &BTreeMap<String, f64>,
    before: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

/// One point of the run.
pub(crate) struct Snapshot {
    pub(crate) at: Instant,
    pub(crate) rss_kib: u64,
    /// The anonymous part of the RSS: the heap and stacks, without the binary's own
    /// pages (which grow as code runs for the first time, whatever the endpoint count).
    pub(crate) anon_kib: u64,
    pub(crate) cpu: Duration,
    pub(crate) requests: BTreeMap<String, f64>,
    pub(crate) storage: f64,
    pub(crate) reconciles: BTreeMap<String, f64>,
}

pub(crate) async fn snapshot(
    env: &herald_e2e::TestEnv,
    pid: u32,
    operator_metrics: &str,
) -> Snapshot {
    let metrics = api_metrics(env);
    let (rss_kib, cpu) = proc_usage(pid);
    Snapshot {
        at: Instant::now(),
        rss_kib,
        anon_kib: proc_status_kib(pid, "RssAnon:"),
        cpu,
        requests: requests(&metrics),
        storage: storage_bytes(&metrics),
        reconciles: reconciles(operator_metrics).await,
    }
}
