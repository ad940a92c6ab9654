//! What a benchmark run measures: its [`Scenario`]s and their [`Options`].

use std::path::PathBuf;

use serde::Serialize;

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

    /// Whether `scenario` is selected.
    pub fn on(&self, scenario: Scenario) -> bool {
        self.scenarios.contains(&scenario)
    }
}
