//! Sharding across replicas: the measurement of `herald-replicas` (docs/capacity.md),
//! run as it is — a child process with a private test environment of its own, 12 shards,
//! 1 and then 3 dispatcher processes on one machine — and read back from its `--json`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ReplicasRun {
    pub replicas: usize,
    pub published: u64,
    pub delivered: u64,
    pub drained: bool,
    /// Deliveries per second, publish start → last delivery.
    pub rate: f64,
    /// CPU time per delivered event, µs.
    pub us_dispatchers: f64,
    pub us_nats: f64,
    pub us_harness: f64,
    pub us_total: f64,
    pub cores_busy: f64,
}

impl ReplicasRun {
    pub fn complete(&self) -> bool {
        self.drained && self.delivered >= self.published && self.published > 0
    }
}

#[derive(Deserialize)]
struct Summary {
    runs: Vec<ReplicasRun>,
}

/// Runs `herald-replicas` from `bin_dir` with 1 and 3 replicas, `runs` times each
/// (alternating), publishing for `seconds` (at most `events` per run); its progress
/// lines go to stdout.
pub async fn replicas(
    bin_dir: &Path,
    runs: usize,
    seconds: u64,
    events: Option<u64>,
    idle_seconds: u64,
) -> Vec<ReplicasRun> {
    let dir = std::env::temp_dir().join(format!("herald-bench-replicas-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let json = dir.join("replicas.json");
    let _ = std::fs::remove_file(&json);
    let counts = ["1", "3"].repeat(runs.max(1)).join(",");
    let exe = bin_dir.join("herald-replicas");
    let mut cmd = Command::new(&exe);
    cmd.args(["--nats-cluster", "1", "--replicas", &counts])
        .args(["--seconds", &seconds.to_string()])
        .args(["--idle-seconds", &idle_seconds.to_string()])
        .arg("--json")
        .arg(&json)
        .arg("--report")
        .arg(dir.join("replicas-report.md"))
        .stdout(Stdio::piped());
    if let Some(events) = events {
        cmd.args(["--events", &events.to_string()]);
    }
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", exe.display()));
    let stdout = child.stdout.take().expect("piped stdout");
    let status = tokio::task::spawn_blocking(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            println!("  replicas: {line}");
        }
        child.wait()
    })
    .await
    .expect("waiting for herald-replicas")
    .expect("herald-replicas ran");
    assert!(status.success(), "herald-replicas failed: {status}");
    let text = std::fs::read_to_string(&json).expect("herald-replicas wrote its JSON");
    let summary: Summary = serde_json::from_str(&text).expect("herald-replicas' JSON");
    summary.runs
}
