//! Herald's benchmark (`herald-bench`, `make bench`): the data plane on this machine —
//! NATS, the dispatcher, a receiver and a publisher together — in the scenarios of issue
//! 14, each repeated and reported as the median with its range, with plots drawn from
//! the same data. [`run`] runs the scenarios [`Options`] selects against an environment
//! and returns their [`Results`]; [`report`] and [`plots`] write them out;
//! [`Results::problems`] says what is missing (the smoke, `e2e/tests/bench.rs`, asserts
//! there is nothing).

pub mod calibrate;
pub mod harness;
pub mod memory;
pub mod plots;
pub mod receiver;
pub mod recovery;
pub mod replicas;
pub mod report;
pub mod scenarios;
pub mod stats;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::TestEnv;
use crate::dataplane::DataPlane;
use harness::{Bench, Dispatcher};
use memory::MemoryRun;
use receiver::Receiver;
use recovery::{Capacity, RecoveryRun};
use replicas::ReplicasRun;
use scenarios::{Bad, Run};
use stats::Percentiles;

/// A scenario of the benchmark.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// 10 endpoints, events published as fast as JetStream acknowledges.
    Throughput,
    /// 10 endpoints at fixed loads.
    Latency,
    /// 10 endpoints, one of them slow or timing out.
    Isolation,
    /// Many endpoints (1,000), events spread evenly.
    Scale,
    /// One event type subscribed by many endpoints (50).
    Fanout,
    /// Many endpoints, 10 % of them hanging until their timeout.
    IsolationScale,
    /// A tenant bursting beside a steady one.
    Burst,
    /// A backlog drained into a rate-limited receiver, fast and slow.
    Recovery,
    /// An ordered endpoint and an ordering-key endpoint.
    Ordered,
    /// Idle endpoints, and endpoints after traffic, in a dispatcher process of its own.
    Memory,
    /// 1 and 3 dispatcher processes (herald-replicas).
    Replicas,
}

impl Scenario {
    pub const ALL: [Scenario; 11] = [
        Scenario::Throughput,
        Scenario::Latency,
        Scenario::Isolation,
        Scenario::Scale,
        Scenario::Fanout,
        Scenario::IsolationScale,
        Scenario::Burst,
        Scenario::Recovery,
        Scenario::Ordered,
        Scenario::Memory,
        Scenario::Replicas,
    ];
}

/// Sizes and repetitions; the defaults are the sizes.
#[derive(clap::Args, Clone, Debug, Serialize)]
pub struct Options {
    /// Scenarios to run (comma-separated); all by default.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = Scenario::ALL)]
    pub scenarios: Vec<Scenario>,
    /// Repetitions of every scenario but recovery, memory and replicas; each figure is
    /// the median of them, with the range.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Events of the throughput runs (10 endpoints, and the many-endpoint run).
    #[arg(long, default_value_t = 100_000)]
    pub events: usize,
    /// Loads of the latency runs: events/s, or a fraction (≤ 1) of the run's throughput.
    #[arg(long, value_delimiter = ',', default_value = "300,0.25,0.5,0.75")]
    pub latency_loads: Vec<f64>,
    /// How long each latency and isolation run publishes, seconds.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Events/s of the isolation runs (10 endpoints, and many).
    #[arg(long, default_value_t = 1000.0)]
    pub isolation_rate: f64,
    /// Endpoints of the many-endpoint runs (scale, isolation at scale).
    #[arg(long, default_value_t = 1000)]
    pub scale_endpoints: usize,
    /// Endpoints subscribed to the one event type of the fan-out run.
    #[arg(long, default_value_t = 50)]
    pub fanout_endpoints: usize,
    /// Events of the fan-out run published at once (each delivered to every endpoint).
    #[arg(long, default_value_t = 2000)]
    pub fanout_events: usize,
    /// Events/s of the paced fan-out run (its completion latency).
    #[arg(long, default_value_t = 20.0)]
    pub fanout_rate: f64,
    /// Events/s of the steady tenant of the burst run.
    #[arg(long, default_value_t = 100.0)]
    pub burst_rate: f64,
    /// The bursting tenant publishes this many times the steady tenant's rate.
    #[arg(long, default_value_t = 10.0)]
    pub burst_factor: f64,
    /// Backlog of the recovery runs.
    #[arg(long, default_value_t = 100_000)]
    pub recovery_events: usize,
    /// Repetitions of the recovery runs (each about `recovery-events / recovery-rate`
    /// seconds, twice: fast and slow receiver).
    #[arg(long, default_value_t = 1)]
    pub recovery_runs: usize,
    /// The recovered receiver's capacity, requests/s.
    #[arg(long, default_value_t = 200.0)]
    pub recovery_rate: f64,
    /// Its token bucket's burst.
    #[arg(long, default_value_t = 20.0)]
    pub recovery_burst: f64,
    /// How long the slow receiver takes per accepted request, ms.
    #[arg(long, default_value_t = 75)]
    pub recovery_slow_ms: u64,
    /// Events of the ordered endpoint's run.
    #[arg(long, default_value_t = 5000)]
    pub ordered_events: usize,
    /// Events of the ordering-key endpoint's run.
    #[arg(long, default_value_t = 20_000)]
    pub keyed_events: usize,
    /// Distinct ordering keys of that run.
    #[arg(long, default_value_t = 64)]
    pub ordering_keys: usize,
    /// Endpoints of the memory runs.
    #[arg(long, default_value_t = 100_000)]
    pub idle_endpoints: usize,
    /// Repetitions of the memory runs.
    #[arg(long, default_value_t = 1)]
    pub memory_runs: usize,
    /// `--release-idle-after` of the memory runs' dispatcher (its default is 2m).
    #[arg(long, default_value = "5s")]
    pub release_idle_after: String,
    /// How long each replicas run publishes, seconds.
    #[arg(long, default_value_t = 20)]
    pub replicas_seconds: u64,
    /// Repetitions of the replicas runs (1 and 3 replicas each).
    #[arg(long, default_value_t = 1)]
    pub replicas_runs: usize,
    /// At most this many events per replicas run.
    #[arg(long)]
    pub replicas_events: Option<u64>,
    /// How long herald-replicas measures NATS's idle CPU, seconds.
    #[arg(long, default_value_t = 10)]
    pub replicas_idle_seconds: u64,
    /// Where `herald-test-dispatcher` and `herald-replicas` are (default: beside this
    /// executable).
    #[arg(long)]
    #[serde(skip)]
    pub bin_dir: Option<PathBuf>,
    /// Publishes of the calibration that opens the run (what a JetStream publish with
    /// its ack costs on this machine, without Herald).
    #[arg(long, default_value_t = 200_000)]
    pub calibration_publishes: usize,
    /// Set by [`Options::smoke`].
    #[arg(skip)]
    pub smoke: bool,
}

impl Options {
    /// The defaults (the sizes).
    pub fn full() -> Self {
        #[derive(clap::Parser)]
        struct Defaults {
            #[command(flatten)]
            options: Options,
        }
        <Defaults as clap::Parser>::parse_from(["herald-bench"]).options
    }

    /// Every scenario at a tiny size, once: the smoke CI runs.
    pub fn smoke(self) -> Self {
        Self {
            runs: 1,
            events: 2000,
            latency_loads: vec![300.0, 0.5],
            seconds: 1.0,
            isolation_rate: 300.0,
            scale_endpoints: 100,
            fanout_endpoints: 50,
            fanout_events: 20,
            fanout_rate: 20.0,
            burst_rate: 50.0,
            burst_factor: 10.0,
            recovery_events: 300,
            recovery_runs: 1,
            ordered_events: 100,
            keyed_events: 400,
            ordering_keys: 8,
            idle_endpoints: 1000,
            memory_runs: 1,
            release_idle_after: "2s".into(),
            replicas_seconds: 2,
            replicas_runs: 1,
            replicas_events: Some(300),
            replicas_idle_seconds: 1,
            calibration_publishes: 5_000,
            smoke: true,
            ..self
        }
    }

    fn on(&self, scenario: Scenario) -> bool {
        self.scenarios.contains(&scenario)
    }
}

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
    fn push(&mut self, run: Run) {
        self.runs.push(run);
        self.pooled = Percentiles::of_ms(
            self.runs
                .iter()
                .flat_map(|r| r.samples.iter().map(|&ms| f64::from(ms))),
        );
    }
}

/// `cases` in the order of round `n`: rotated by one each round, so no case always runs
/// first (after another scenario) or last.
fn rotated<T>(mut cases: Vec<T>, n: usize) -> Vec<T> {
    if !cases.is_empty() {
        let len = cases.len();
        cases.rotate_left(n % len);
    }
    cases
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

fn case<'a>(cases: &'a mut Vec<Case>, label: &str) -> &'a mut Case {
    if let Some(i) = cases.iter().position(|c| c.label == label) {
        return &mut cases[i];
    }
    cases.push(Case {
        label: label.to_owned(),
        ..Case::default()
    });
    cases.last_mut().expect("just pushed")
}

/// Prints a progress line with the time since `start`.
fn progress(start: Instant, line: &str) {
    println!("[{:>6.1} s] {line}", start.elapsed().as_secs_f64());
}

fn summary(run: &Run) -> String {
    format!(
        "{:.0} deliveries/s, p50 {:.2} ms, p99 {:.2} ms (from the ack: p50 {:.2} ms, p99 {:.2} ms), {} of {} delivered",
        run.rate,
        run.latency.p50,
        run.latency.p99,
        run.acked.p50,
        run.acked.p99,
        run.delivered,
        run.expected
    )
}

/// Runs the scenarios `options` selects against `env` and returns what they measured.
/// Scenarios through the dispatcher of this process run first, `runs` times in turn (so
/// the repetitions spread over the whole run's noise), then recovery; then that
/// dispatcher stops and the memory runs start one of their own; replicas last, in an
/// environment of their own.
pub async fn run(env: &'static TestEnv, options: &Options) -> Results {
    let start = Instant::now();
    let mut r = Results {
        meta: Meta::at_start(env).await,
        options: Some(options.clone()),
        ..Results::default()
    };
    // Before anything of Herald runs in the environment.
    let calibration = calibrate::run(env, options.calibration_publishes).await;
    progress(
        start,
        &format!(
            "calibration: {:.0} JetStream publishes/s, {:.1} µs of CPU each (client {:.1}, server {:.1}); {:.2}× the cost budget's reference",
            calibration.rate,
            calibration.total_us(),
            calibration.client_us,
            calibration.server_us,
            calibration.factor()
        ),
    );
    r.calibration = Some(calibration);
    let bin_dir = options.bin_dir.clone().unwrap_or_else(harness::own_bin_dir);
    let rx = Receiver::start().await;
    let dp = DataPlane::new(env.nats().await).await;
    let dispatcher = Dispatcher::start(env);
    let b = Bench {
        dp,
        index: dispatcher.index.clone(),
        rx,
    };
    let o = options;
    // Namespaces of this run alone (an environment may have served an earlier one).
    let tag = crate::unique_name("b");
    let ns = |name: String| format!("{tag}-{name}");
    for n in 0..o.runs {
        let of = format!("run {}/{}", n + 1, o.runs);
        let mut max = None;
        if o.on(Scenario::Throughput) {
            let run = scenarios::spread(&b, &ns(format!("tp-{n}")), 10, o.events, 0.0).await;
            progress(start, &format!("throughput {of}: {}", summary(&run)));
            max = Some(run.rate);
            r.throughput.push(run);
        }
        if o.on(Scenario::Latency) {
            for (k, load) in o.latency_loads.iter().enumerate() {
                let (label, rate) = if *load > 1.0 {
                    (format!("{load:.0} events/s"), *load)
                } else if let Some(max) = max {
                    (
                        format!("{:.0} % of max", load * 100.0),
                        (load * max).max(1.0),
                    )
                } else {
                    continue;
                };
                let events = (rate * o.seconds).round().max(1.0) as usize;
                let run =
                    scenarios::spread(&b, &ns(format!("lat-{n}-{k}")), 10, events, rate).await;
                progress(
                    start,
                    &format!("latency {label} ({rate:.0}/s) {of}: {}", summary(&run)),
                );
                let point = match r.latency.iter_mut().position(|p| p.label == label) {
                    Some(i) => &mut r.latency[i],
                    None => {
                        r.latency.push(LoadPoint {
                            label,
                            ..LoadPoint::default()
                        });
                        r.latency.last_mut().expect("just pushed")
                    }
                };
                point.rates.push(rate);
                point.runs.push(run);
            }
        }
        if o.on(Scenario::Isolation) {
            let cases = [
                ("all healthy (baseline)", None),
                (
                    "1 of 10 answers after 5 s",
                    Some(Bad {
                        every: 10,
                        delay: Duration::from_secs(5),
                        timeout: "10s",
                    }),
                ),
                (
                    "1 of 10 times out (1 s timeout)",
                    Some(Bad {
                        every: 10,
                        delay: Duration::from_secs(5),
                        timeout: "1s",
                    }),
                ),
            ];
            for (k, (label, bad)) in rotated(cases.into_iter().enumerate().collect(), n) {
                let ns = ns(format!("iso-{n}-{k}"));
                let run = scenarios::isolation(&b, &ns, 10, bad, o.isolation_rate, o.seconds).await;
                progress(
                    start,
                    &format!("isolation, {label} {of}: healthy {}", summary(&run)),
                );
                case(&mut r.isolation, label).push(run);
            }
        }
        if o.on(Scenario::Scale) {
            let ns = ns(format!("scale-{n}"));
            let run = scenarios::spread(&b, &ns, o.scale_endpoints, o.events, 0.0).await;
            let label = format!("{} endpoints", o.scale_endpoints);
            progress(
                start,
                &format!("throughput over {label} {of}: {}", summary(&run)),
            );
            r.scale.push(run);
        }
        if o.on(Scenario::Fanout) {
            let space = ns(format!("fan-{n}"));
            let run = scenarios::fanout(&b, &space, o.fanout_endpoints, o.fanout_events, 0.0).await;
            progress(start, &format!("fan-out {of}: {}", summary(&run)));
            r.fanout.push(run);
            let events = (o.fanout_rate * o.seconds).round().max(1.0) as usize;
            let space = ns(format!("fanp-{n}"));
            let run =
                scenarios::fanout(&b, &space, o.fanout_endpoints, events, o.fanout_rate).await;
            let done = run.completion.unwrap_or_default();
            progress(
                start,
                &format!(
                    "fan-out at {:.0} events/s {of}: {}, all {} endpoints p99 {:.2} ms",
                    o.fanout_rate,
                    summary(&run),
                    o.fanout_endpoints,
                    done.p99
                ),
            );
            r.fanout_paced.push(run);
        }
        if o.on(Scenario::IsolationScale) {
            let cases = [
                ("all healthy (baseline)", None),
                (
                    "10 % hang past their 1 s timeout",
                    Some(Bad {
                        every: 10,
                        delay: Duration::from_secs(10),
                        timeout: "1s",
                    }),
                ),
            ];
            for (k, (label, bad)) in rotated(cases.into_iter().enumerate().collect(), n) {
                let ns = ns(format!("isos-{n}-{k}"));
                let endpoints = o.scale_endpoints;
                let run =
                    scenarios::isolation(&b, &ns, endpoints, bad, o.isolation_rate, o.seconds)
                        .await;
                progress(
                    start,
                    &format!(
                        "isolation at scale, {label} {of}: healthy {}",
                        summary(&run)
                    ),
                );
                case(&mut r.isolation_scale, label).push(run);
            }
        }
        if o.on(Scenario::Burst) {
            for (k, factor) in rotated(vec![(0, 1.0), (1, o.burst_factor)], n) {
                let label = if k == 0 {
                    "neighbour steady (baseline)".to_owned()
                } else {
                    format!("neighbour bursts {factor:.0}×")
                };
                let prefix = ns(format!("burst-{n}-{k}"));
                let (steady, other) =
                    scenarios::burst(&b, &prefix, o.burst_rate, factor, o.seconds).await;
                progress(
                    start,
                    &format!("burst, {label} {of}: steady tenant {}", summary(&steady)),
                );
                case(&mut r.burst, &label).push(steady);
                if k == 1 {
                    r.bursting.push(other);
                }
            }
        }
        if o.on(Scenario::Ordered) {
            let run = scenarios::ordered(&b, &ns(format!("ord-{n}")), o.ordered_events, 0).await;
            progress(start, &format!("ordered {of}: {}", summary(&run)));
            r.ordered.push(run);
            let ns = ns(format!("key-{n}"));
            let run = scenarios::ordered(&b, &ns, o.keyed_events, o.ordering_keys).await;
            progress(start, &format!("ordering key {of}: {}", summary(&run)));
            r.keyed.push(run);
        }
    }
    if o.on(Scenario::Recovery) {
        for n in 0..o.recovery_runs {
            for delay in [0, o.recovery_slow_ms] {
                let capacity = Capacity {
                    rate: o.recovery_rate,
                    burst: o.recovery_burst,
                    delay: Duration::from_millis(delay),
                };
                progress(
                    start,
                    &format!(
                        "recovery ({delay} ms receiver) run {}/{}: {} events while down; ideal drain {:.0} s",
                        n + 1,
                        o.recovery_runs,
                        o.recovery_events,
                        (o.recovery_events as f64 - o.recovery_burst).max(0.0) / o.recovery_rate
                    ),
                );
                let ns = ns(format!("rec-{n}-{delay}"));
                let run = recovery::recovery(&b, &ns, o.recovery_events, capacity).await;
                progress(
                    start,
                    &format!(
                        "recovery ({delay} ms receiver): drained {} of {} in {:.1} s ({:.2}× the ideal), {} of {} requests refused ({:.1} %)",
                        run.delivered,
                        run.events,
                        run.drain_seconds,
                        run.ratio(),
                        run.refused,
                        run.requests,
                        run.refused_share() * 100.0
                    ),
                );
                r.recovery.push(run);
            }
        }
    }
    dispatcher.stop().await;
    if o.on(Scenario::Memory) {
        for n in 0..o.memory_runs {
            let ns = ns(format!("mem-{n}"));
            let run = memory::memory(
                &b,
                &bin_dir,
                env.nats_url(),
                &ns,
                o.idle_endpoints,
                &o.release_idle_after,
            )
            .await;
            progress(
                start,
                &format!(
                    "memory run {}/{}: {:.0} bytes per idle endpoint, {:.0} after traffic and release ({} states left, {} before)",
                    n + 1,
                    o.memory_runs,
                    run.idle_bytes(),
                    run.drained_bytes(),
                    run.states_after,
                    run.states_before
                ),
            );
            r.memory.push(run);
        }
    }
    if o.on(Scenario::Replicas) {
        progress(
            start,
            "replicas: herald-replicas, 1 and 3 dispatcher processes",
        );
        r.replicas = replicas::replicas(
            &bin_dir,
            o.replicas_runs,
            o.replicas_seconds,
            o.replicas_events,
            o.replicas_idle_seconds,
        )
        .await;
        for run in &r.replicas {
            progress(
                start,
                &format!(
                    "replicas {}: {:.0} deliveries/s, dispatchers {:.1} µs CPU per event",
                    run.replicas, run.rate, run.us_dispatchers
                ),
            );
        }
    }
    r.meta.smoke = o.smoke;
    r.meta.load_end = load_average();
    r.meta.seconds = start.elapsed().as_secs_f64();
    r
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
            if self.recovery.len() < 2 * options.recovery_runs {
                out.push(format!("recovery: {} runs", self.recovery.len()));
            }
            for run in &self.recovery {
                if !run.complete() || run.drain_seconds <= 0.0 || run.curve.is_empty() {
                    out.push(format!(
                        "recovery ({} ms): {} of {} delivered in {:.1} s",
                        run.delay_ms, run.delivered, run.events, run.drain_seconds
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
    async fn at_start(env: &TestEnv) -> Self {
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
