//! What a benchmark run measured: a [`Run`] per repetition, gathered into [`Results`]
//! with the machine and versions ([`Meta`]); [`Results::problems`] says what is missing.

use std::process::Command;

use serde::Serialize;

use super::calibrate;
use super::memory::MemoryRun;
use super::options::{Options, Scenario};
use super::recovery::RecoveryRun;
use super::replicas::ReplicasRun;
use super::stats::{Percentiles, Run};
use crate::TestEnv;

/// One load of the latency runs.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LoadPoint {
    pub label: String,
    /// The rate of each run, events/s.
    pub rates: Vec<f64>,
    pub runs: Vec<Run>,
}

/// One case of an isolation comparison.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Case {
    pub label: String,
    pub runs: Vec<Run>,
    /// Publish acknowledged → first arrival over the samples of every run together (the
    /// report shows it beside the median of the runs' p99s, which judges the target).
    pub pooled: Percentiles,
}

impl Case {
    pub(super) fn push(&mut self, run: Run) {
        self.runs.push(run);
        self.pooled = Percentiles::of_ms(
            self.runs
                .iter()
                .flat_map(|r| r.samples.iter().map(|&ms| f64::from(ms))),
        );
    }
}

/// The machine, the versions and the command of a benchmark run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Meta {
    pub date: String,
    pub machine: String,
    pub nats_server: String,
    pub rustc: String,
    pub commit: String,
    pub command: String,
    pub load_start: String,
    pub load_end: String,
    pub seconds: f64,
    pub smoke: bool,
}

/// Everything one benchmark run measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Results {
    pub meta: Meta,
    pub options: Option<Options>,
    /// What a JetStream publish with its ack costs on this machine.
    pub calibration: Option<calibrate::Calibration>,
    pub throughput: Vec<Run>,
    pub latency: Vec<LoadPoint>,
    pub isolation: Vec<Case>,
    pub scale: Vec<Run>,
    pub fanout: Vec<Run>,
    pub fanout_paced: Vec<Run>,
    pub isolation_scale: Vec<Case>,
    /// The steady tenant beside a steady neighbour, then beside a bursting one.
    pub burst: Vec<Case>,
    /// The bursting tenant's own runs.
    pub bursting: Vec<Run>,
    pub recovery: Vec<RecoveryRun>,
    pub ordered: Vec<Run>,
    pub keyed: Vec<Run>,
    pub memory: Vec<MemoryRun>,
    pub replicas: Vec<ReplicasRun>,
}

impl Results {
    /// What the smoke checks: every selected scenario produced numbers and delivered
    /// every event it published (to its healthy endpoints), ordered runs kept order,
    /// released state was released. Empty when all is well.
    pub fn problems(&self, options: &Options) -> Vec<String> {
        let mut out = Vec::new();
        if !self
            .calibration
            .is_some_and(|c| c.rate > 0.0 && c.total_us() > 0.0)
        {
            out.push("calibration: no numbers".to_owned());
        }
        let mut runs = |name: &str, runs: &[Run], want: usize| {
            if runs.len() < want {
                out.push(format!("{name}: {} runs of {want}", runs.len()));
            }
            for (i, run) in runs.iter().enumerate() {
                if !run.complete() {
                    out.push(format!(
                        "{name} run {}: {} of {} delivered",
                        i + 1,
                        run.delivered,
                        run.expected
                    ));
                }
                if run.rate <= 0.0 || run.latency.count == 0 {
                    out.push(format!("{name} run {}: no numbers", i + 1));
                }
                if run.inversions.is_some_and(|n| n > 0) {
                    out.push(format!(
                        "{name} run {}: {} events out of order",
                        i + 1,
                        run.inversions.unwrap_or(0)
                    ));
                }
            }
        };
        let n = options.runs;
        if options.on(Scenario::Throughput) {
            runs("throughput", &self.throughput, n);
        }
        if options.on(Scenario::Latency) {
            if self.latency.is_empty() {
                runs("latency", &[], 1);
            }
            for p in &self.latency {
                runs(&format!("latency {}", p.label), &p.runs, n);
            }
        }
        for (on, name, cases, want) in [
            (Scenario::Isolation, "isolation", &self.isolation, 3),
            (
                Scenario::IsolationScale,
                "isolation at scale",
                &self.isolation_scale,
                2,
            ),
            (Scenario::Burst, "burst", &self.burst, 2),
        ] {
            if options.on(on) {
                if cases.len() < want {
                    runs(&format!("{name}: cases"), &[], 1);
                }
                for c in cases {
                    runs(&format!("{name}, {}", c.label), &c.runs, n);
                }
            }
        }
        if options.on(Scenario::Burst) {
            runs("burst, the bursting tenant", &self.bursting, n);
        }
        if options.on(Scenario::Scale) {
            runs("scale", &self.scale, n);
        }
        if options.on(Scenario::Fanout) {
            runs("fan-out", &self.fanout, n);
            runs("fan-out paced", &self.fanout_paced, n);
        }
        if options.on(Scenario::Ordered) {
            runs("ordered", &self.ordered, n);
            runs("ordering key", &self.keyed, n);
        }
        if options.on(Scenario::Recovery) {
            if self.recovery.len() < 3 * options.recovery_runs {
                out.push(format!("recovery: {} runs", self.recovery.len()));
            }
            for run in &self.recovery {
                if !run.complete() || run.drain_seconds <= 0.0 || run.curve.is_empty() {
                    out.push(format!(
                        "recovery ({}): {} of {} delivered in {:.1} s",
                        run.receiver(),
                        run.delivered,
                        run.events,
                        run.drain_seconds
                    ));
                }
            }
        }
        if options.on(Scenario::Memory) {
            if self.memory.len() < options.memory_runs {
                out.push(format!("memory: {} runs", self.memory.len()));
            }
            for run in &self.memory {
                if !run.complete() || run.rss_idle_kib == 0 {
                    out.push(format!(
                        "memory: {} of {} delivered, {} delivery states left after release ({} before)",
                        run.delivered, run.endpoints, run.states_after, run.states_before
                    ));
                }
            }
        }
        if options.on(Scenario::Replicas) {
            if self.replicas.len() < 2 * options.replicas_runs {
                out.push(format!("replicas: {} runs", self.replicas.len()));
            }
            for run in &self.replicas {
                if !run.complete() || run.rate <= 0.0 {
                    out.push(format!(
                        "replicas {}: {} of {} delivered",
                        run.replicas, run.delivered, run.published
                    ));
                }
            }
        }
        out
    }
}

/// `/proc/loadavg`'s three averages.
pub fn load_average() -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    load.split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

impl Meta {
    pub(super) async fn at_start(env: &TestEnv) -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .unwrap_or("")
            .trim()
            .to_owned();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_gib = meminfo
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            .map_or(0.0, |kib| kib / 1_048_576.0);
        let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
        let root = crate::repo_root();
        let root = root.to_str().unwrap_or(".");
        let commit = output("git", &["-C", root, "rev-parse", "--short", "HEAD"])
            .unwrap_or_else(|| "unknown".into());
        let dirty = output(
            "git",
            &["-C", root, "status", "--porcelain", "--untracked-files=no"],
        )
        .is_some_and(|s| !s.is_empty());
        Self {
            date: jiff::Timestamp::now()
                .strftime("%Y-%m-%d %H:%M UTC")
                .to_string(),
            machine: format!("{cores} cores ({model}), {mem_gib:.0} GiB"),
            nats_server: env.nats().await.server_info().version,
            rustc: output("rustc", &["--version"]).unwrap_or_else(|| "unknown".into()),
            commit: if dirty {
                format!("{commit} with uncommitted changes")
            } else {
                commit
            },
            command: std::env::args().collect::<Vec<_>>().join(" "),
            load_start: load_average(),
            ..Self::default()
        }
    }
}
