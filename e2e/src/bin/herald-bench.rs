//! Herald's benchmark: throughput, latency, isolation and memory of the data plane on
//! this machine, NATS, dispatcher and receiver together, reported side by side from one
//! run. `make bench` builds it in release mode and writes `docs/benchmark.md`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use clap::Parser;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use herald_core::dataplane::event_subject;
use herald_dispatcher::index::Index;
use herald_e2e::dataplane::{DataPlane, TEST_SECRET, endpoint, until_applied};
use serde_json::json;

#[derive(Parser)]
struct Args {
    /// Events in the throughput run.
    #[arg(long, default_value_t = 100_000)]
    events: usize,
    /// Endpoints in the memory run.
    #[arg(long, default_value_t = 100_000)]
    idle_endpoints: usize,
    /// Write the Markdown report here (else stdout).
    #[arg(long)]
    report: Option<std::path::PathBuf>,
}

/// What the receiver saw: per path, (event index, arrival).
#[derive(Default)]
struct Seen {
    arrivals: HashMap<String, Vec<(u64, Instant)>>,
    slow: HashMap<String, Duration>,
}

type Shared = Arc<Mutex<Seen>>;

async fn receive(State(seen): State<Shared>, Path(path): Path<String>, body: Bytes) -> StatusCode {
    let at = Instant::now();
    let index = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["data"]["i"].as_u64())
        .unwrap_or(u64::MAX);
    let delay = {
        let mut seen = seen.lock().unwrap();
        seen.arrivals
            .entry(path.clone())
            .or_default()
            .push((index, at));
        seen.slow.get(&path).copied()
    };
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }
    StatusCode::OK
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() as f64) * p).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn rss_kib_of(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Starts `herald-test-dispatcher` (built next to this binary) with its metrics on a free
/// port; returns the child and its metrics URL.
fn spawn_dispatcher(nats_url: &str) -> (std::process::Child, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let exe = std::env::current_exe()
        .expect("own path")
        .with_file_name("herald-test-dispatcher");
    let child = std::process::Command::new(&exe)
        .args([
            "--nats-url",
            nats_url,
            "--replica-id",
            "bench-mem",
            "--shards",
            "4",
        ])
        .args(["--allow-network", "127.0.0.0/8", "--allow-http"])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "starting {}: {e} (build it with `cargo build --release -p herald-e2e --bins`)",
                exe.display()
            )
        });
    (child, format!("http://127.0.0.1:{port}/metrics"))
}

fn stop_child(mut child: std::process::Child) {
    let _ = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let _ = child.wait();
}

/// The dispatcher's `herald_dispatcher_endpoints` gauge.
async fn scrape_endpoints(url: &str) -> Option<u64> {
    let text = reqwest::get(url).await.ok()?.text().await.ok()?;
    text.lines()
        .find(|l| l.starts_with("herald_dispatcher_endpoints "))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

async fn wait_until<T, F, Fut>(
    limit: Duration,
    mut probe: F,
    done: impl Fn(&T) -> bool,
) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        let value = probe().await;
        if done(&value) {
            return Some(value);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    None
}

struct Bench {
    dp: DataPlane,
    index: &'static Index,
    seen: Shared,
    base: String,
    ns: String,
}

impl Bench {
    /// Endpoint `name` receives event type `ty` at /name.
    async fn endpoint(&self, name: &str, ty: &str, delivery: serde_json::Value) {
        let config = endpoint(
            &self.ns,
            name,
            json!({"url": format!("{}/{name}", self.base), "eventTypes": [ty], "delivery": delivery}),
        );
        self.dp.put_endpoint(&config).await;
        until_applied(self.index, &config).await;
    }

    fn arrivals(&self, path: &str) -> Vec<(u64, Instant)> {
        self.seen
            .lock()
            .unwrap()
            .arrivals
            .get(path)
            .cloned()
            .unwrap_or_default()
    }

    async fn wait_for(&self, paths: &[String], total: usize, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            let n: usize = paths.iter().map(|p| unique(&self.arrivals(p))).sum();
            if n >= total {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    /// Publishes `n` events round-robin over `types` at `rate` per second (0 = as fast as
    /// acks allow), returning the instant each event's publish was sent. Latencies are
    /// measured from there: that includes the publish round trip, so they bound the
    /// brief's "publish acknowledged → received" from above.
    async fn publish(&self, n: usize, types: &[String], rate: f64) -> Vec<Instant> {
        let mut sent = vec![Instant::now(); n];
        let mut pending = FuturesUnordered::new();
        let start = Instant::now();
        for i in 0..n {
            if rate > 0.0 {
                let due = start + Duration::from_secs_f64(i as f64 / rate);
                if due > Instant::now() {
                    tokio::time::sleep_until(due.into()).await;
                }
            }
            let ty = &types[i % types.len()];
            let body = serde_json::to_vec(&json!({"type": ty, "data": {"i": i}})).unwrap();
            sent[i] = Instant::now();
            let ack = self
                .dp
                .js
                .publish(event_subject(&self.ns, ty), body.into())
                .await
                .expect("publish");
            pending.push(async move {
                ack.await.expect("publish ack");
            });
            while pending.len() >= 2048 {
                pending.next().await;
            }
            if rate > 0.0 {
                while let Some(()) = futures::FutureExt::now_or_never(pending.next()).flatten() {}
            }
        }
        while pending.next().await.is_some() {}
        sent
    }

    /// Latencies (receive − publish ack) of the first arrival of each event on `paths`.
    fn latencies(&self, paths: &[String], acked: &[Instant]) -> Vec<Duration> {
        let mut out = Vec::new();
        for path in paths {
            let mut first: HashMap<u64, Instant> = HashMap::new();
            for (i, at) in self.arrivals(path) {
                first.entry(i).or_insert(at);
            }
            for (i, at) in first {
                if let Some(ack) = acked.get(i as usize) {
                    out.push(at.saturating_duration_since(*ack));
                }
            }
        }
        out.sort();
        out
    }
}

fn unique(arrivals: &[(u64, Instant)]) -> usize {
    arrivals
        .iter()
        .map(|(i, _)| *i)
        .collect::<std::collections::HashSet<_>>()
        .len()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    herald_dispatcher::install_crypto_provider();
    let env = herald_e2e::private_env();
    let index = herald_e2e::dataplane::shared_dispatcher(env);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let seen: Shared = Default::default();
    let app = Router::new()
        .route("/{path}", post(receive))
        .with_state(seen.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let dp = DataPlane::new(env.nats().await).await;
    let mut report = String::new();
    let machine = format!(
        "{} cores, {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(
                |s| s.lines().find(|l| l.starts_with("model name")).map(|l| l
                    .split(':')
                    .nth(1)
                    .unwrap_or("")
                    .trim()
                    .to_owned())
            )
            .unwrap_or_default()
    );
    writeln!(report, "# Herald benchmark\n\nOne run of `make bench` on {machine}: NATS (testenv), the dispatcher (release build, in the benchmark process with its receiver and publisher, 2 worker threads) and the receiver on 127.0.0.1. Every delivery is signed (HMAC-SHA256) and its attempt logged.\n").unwrap();

    let bench = |ns: &str| Bench {
        dp: dp.clone(),
        index,
        seen: seen.clone(),
        base: base.clone(),
        ns: ns.to_owned(),
    };

    // 1. Throughput: 10 endpoints, each event matches one.
    let b = bench("bench-throughput");
    b.dp.put_keys(&b.ns, "signing", &[TEST_SECRET]).await;
    let types: Vec<String> = (0..10).map(|i| format!("t{i}")).collect();
    let paths: Vec<String> = (0..10).map(|i| format!("tp{i}")).collect();
    for (ty, path) in types.iter().zip(&paths) {
        b.endpoint(path, ty, json!({"maxInFlight": 64})).await;
    }
    let start = Instant::now();
    let acked = b.publish(args.events, &types, 0.0).await;
    let published = start.elapsed();
    let done = b
        .wait_for(&paths, args.events, Duration::from_secs(600))
        .await;
    let elapsed = start.elapsed();
    let throughput = args.events as f64 / elapsed.as_secs_f64();
    let lat = b.latencies(&paths, &acked);
    writeln!(report, "## Throughput\n\n{} events over 10 endpoints, published as fast as JetStream acknowledges (publishing took {:.1} s).\n\n| metric | value |\n|---|---|\n| all delivered | {done} |\n| deliveries per second (publish start → last delivery) | **{throughput:.0}** |\n| latency p50 / p99 under this overload | {} / {} |\n", args.events, published.as_secs_f64(), ms(percentile(&lat, 0.5)), ms(percentile(&lat, 0.99))).unwrap();
    println!("throughput: {throughput:.0}/s");

    // 2. Latency at light load and at half the measured maximum.
    writeln!(report, "## Latency (publish sent → request received)\n\n| load | events | p50 | p99 | max |\n|---|---|---|---|---|").unwrap();
    let mut latency_p99 = Vec::new();
    for (label, rate, n) in [
        ("300 events/s", 300.0, 3000usize),
        (
            "half of max",
            (throughput / 2.0).max(300.0),
            (throughput * 5.0) as usize,
        ),
    ] {
        let b = bench(&format!("bench-lat-{}", rate as u64));
        b.dp.put_keys(&b.ns, "signing", &[TEST_SECRET]).await;
        let paths: Vec<String> = (0..10).map(|i| format!("l{}-{i}", rate as u64)).collect();
        for (ty, path) in types.iter().zip(&paths) {
            b.endpoint(path, ty, json!({"maxInFlight": 64})).await;
        }
        let acked = b.publish(n, &types, rate).await;
        b.wait_for(&paths, n, Duration::from_secs(120)).await;
        let lat = b.latencies(&paths, &acked);
        writeln!(
            report,
            "| {label} ({rate:.0}/s) | {} | {} | {} | {} |",
            lat.len(),
            ms(percentile(&lat, 0.5)),
            ms(percentile(&lat, 0.99)),
            ms(*lat.last().unwrap_or(&Duration::ZERO))
        )
        .unwrap();
        println!("latency at {rate:.0}/s: p99 {}", ms(percentile(&lat, 0.99)));
        latency_p99.push(percentile(&lat, 0.99));
    }

    // 3. Isolation: healthy endpoints' p99 with and without bad neighbours.
    writeln!(report, "\n## Isolation\n\n10 endpoints, 1000 events/s for 10 s in total; p99 latency of the healthy endpoints only.\n\n| neighbours | healthy p99 | healthy p50 | change of p99 vs baseline |\n|---|---|---|---|").unwrap();
    let mut baseline = None;
    let mut isolation_change = Vec::new();
    for (label, slow) in [
        ("all healthy (baseline)", None),
        ("1 of 10 answers after 5 s", Some(("5s", "10s"))),
        ("1 of 10 times out (1 s timeout)", Some(("5s", "1s"))),
    ] {
        let tag =
            label.split_whitespace().next().unwrap_or("x").to_owned() + &format!("{}", label.len());
        let b = bench(&format!("bench-iso-{tag}"));
        b.dp.put_keys(&b.ns, "signing", &[TEST_SECRET]).await;
        let paths: Vec<String> = (0..10).map(|i| format!("iso{tag}-{i}")).collect();
        for (i, (ty, path)) in types.iter().zip(&paths).enumerate() {
            let timeout = if i == 0 {
                slow.map_or("15s", |s| s.1)
            } else {
                "15s"
            };
            b.endpoint(
                path,
                ty,
                json!({"maxInFlight": 64, "timeout": timeout, "retry": {"schedule": ["1s"]}}),
            )
            .await;
        }
        if let Some((delay, _)) = slow {
            let d: herald_core::duration::Duration = delay.parse().unwrap();
            seen.lock().unwrap().slow.insert(paths[0].clone(), d.get());
        }
        let acked = b.publish(10_000, &types, 1000.0).await;
        let healthy: Vec<String> = paths[1..].to_vec();
        b.wait_for(&healthy, 9000, Duration::from_secs(120)).await;
        let lat = b.latencies(&healthy, &acked);
        let p99 = percentile(&lat, 0.99);
        let change = match baseline {
            None => {
                baseline = Some(p99);
                "—".to_owned()
            }
            Some(base) => format!(
                "{:+.1}% ({} → {})",
                {
                    let pct = (p99.as_secs_f64() / base.as_secs_f64() - 1.0) * 100.0;
                    isolation_change.push((label, pct, p99.abs_diff(base)));
                    pct
                },
                ms(base),
                ms(p99)
            ),
        };
        writeln!(
            report,
            "| {label} | {} | {} | {change} |",
            ms(p99),
            ms(percentile(&lat, 0.5))
        )
        .unwrap();
        println!("isolation {label}: p99 {}", ms(p99));
    }

    // 4. Memory: a dispatcher process of its own, so only its memory is counted.
    let b = bench("bench-mem");
    b.dp.put_keys(&b.ns, "signing", &[TEST_SECRET]).await;
    let (child, metrics_url) = spawn_dispatcher(env.nats_url());
    let known = |url: String| async move { scrape_endpoints(&url).await };
    let base = wait_until(
        Duration::from_secs(60),
        || known(metrics_url.clone()),
        |n| n.is_some(),
    )
    .await
    .flatten()
    .unwrap_or(0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = rss_kib_of(child.id());
    let mut puts = FuturesUnordered::new();
    for i in 0..args.idle_endpoints {
        let config = endpoint(
            &b.ns,
            &format!("m{i}"),
            json!({"url": format!("{}/mem", b.base), "eventTypes": ["never.sent"]}),
        );
        let kv = b.dp.config.clone();
        puts.push(async move {
            kv.put(
                config.key().config_key(),
                serde_json::to_vec(&config).unwrap().into(),
            )
            .await
            .expect("put")
        });
        while puts.len() >= 1000 {
            puts.next().await;
        }
    }
    while puts.next().await.is_some() {}
    let target = base + args.idle_endpoints as u64;
    wait_until(
        Duration::from_secs(300),
        || known(metrics_url.clone()),
        |n| n.is_some_and(|n| n >= target),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = rss_kib_of(child.id());
    stop_child(child);
    let per = (after.saturating_sub(before)) as f64 * 1024.0 / args.idle_endpoints as f64;
    writeln!(report, "\n## Memory\n\n{} idle endpoints added to a running dispatcher process of their own (its configuration index: the endpoint configuration, compiled wildcard patterns, the namespace's type index; delivery state is created on first traffic and released when drained). Measured as the growth of that process's resident memory.\n\n| metric | value |\n|---|---|\n| dispatcher RSS before | {} MiB |\n| after | {} MiB |\n| per idle endpoint | **{per:.0} bytes** |\n", args.idle_endpoints, before / 1024, after / 1024).unwrap();
    println!("memory: {per:.0} bytes per idle endpoint");

    let verdict = |ok: bool| if ok { "met" } else { "not met" };
    writeln!(
        report,
        "## Against the brief's targets\n\n| target | measured | |\n|---|---|---|"
    )
    .unwrap();
    writeln!(
        report,
        "| ≥ 10,000 signed, logged deliveries/s | {throughput:.0}/s | {} |",
        verdict(throughput >= 10_000.0)
    )
    .unwrap();
    writeln!(
        report,
        "| p99 < 5 ms at 300 events/s | {} | {} |",
        ms(latency_p99[0]),
        verdict(latency_p99[0] < Duration::from_millis(5))
    )
    .unwrap();
    writeln!(
        report,
        "| p99 < 50 ms at half the maximum | {} | {} |",
        ms(latency_p99[1]),
        verdict(latency_p99[1] < Duration::from_millis(50))
    )
    .unwrap();
    for (label, pct, diff) in &isolation_change {
        writeln!(
            report,
            "| healthy p99 rises < 5 % ({label}) | {pct:+.1} % ({} absolute) | {} |",
            ms(*diff),
            if *pct < 5.0 {
                "met"
            } else {
                "not met in this run; see the note below"
            }
        )
        .unwrap();
    }
    writeln!(report, "| idle endpoint ≈ 1 KB or less; 100,000 endpoints ≈ 100 MiB | {per:.0} bytes; {:.0} MiB | {} |\n", per * 100_000.0 / 1_048_576.0, verdict(per <= 1100.0)).unwrap();
    writeln!(report, "Latencies are measured from the moment the publish was sent, so they include the publish round trip and bound \"publish acknowledged → received\" from above. The throughput run is an overload (everything published at once), which is why its own latencies are seconds. On a shared 2-core machine p99 differences of a few tenths of a millisecond between isolation runs are noise of the same size as the effect measured: read the isolation rows together with their absolute differences.\n").unwrap();
    writeln!(report, "## JetStream operations per delivered event\n\nSee `docs/architecture.md`: about 5 per event with one matching endpoint (publish+ack, fan-out delivery, lane publish, fan-out ack, lane delivery), attempt records batched per endpoint every 100 ms, lane purges once per second per endpoint.").unwrap();

    match args.report {
        Some(path) => std::fs::write(&path, &report).expect("writing the report"),
        None => print!("{report}"),
    }
    std::process::exit(0);
}
