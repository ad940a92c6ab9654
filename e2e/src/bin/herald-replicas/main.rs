//! Capacity of the data plane across replicas: R dispatcher processes (1, then 3) on one
//! NATS (a single server or a JetStream cluster of 3), endpoints in many namespaces so
//! every ingest partition has traffic, a loopback receiver, and events published as fast
//! as JetStream acknowledges. Measures deliveries per second overall, per replica and per
//! partition, and the CPU time per delivered event of each component (dispatchers, NATS,
//! this harness), from which `docs/capacity.md` extrapolates what 1 billion events a day
//! with 5× bursts needs. `make replicas` runs it; the Markdown is appended to `--report`.
//!
//! The machine's cores are shared by everything measured, so wall-clock throughput here
//! is the machine's limit, not Herald's: the extrapolation rests on CPU time per event.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use clap::Parser;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use herald_core::dataplane::{
    CONFIG_BUCKET, EVENTS_STREAM, HEALTH_BUCKET, event_subject, partition_of, shard_for,
};
use herald_e2e::dataplane::{DataPlane, TEST_SECRET, endpoint};
use serde_json::json;

mod cpu;
mod markdown;

use cpu::*;
use markdown::*;

/// Per-namespace delivery counts of the receiver.
type Counts = Arc<BTreeMap<String, AtomicU64>>;

/// 1 billion events a day, on average per second.
const DAILY_AVERAGE: f64 = 1e9 / 86_400.0;

#[derive(Parser)]
struct Args {
    /// Shards (= ingest partitions) every dispatcher runs with.
    #[arg(long, default_value_t = 12)]
    shards: u32,
    /// Replica counts to measure, one run each, on the same NATS.
    #[arg(long, value_delimiter = ',', default_value = "1,3")]
    replicas: Vec<usize>,
    /// nats-server nodes: 1 (embedded in the test environment) or 3 (a JetStream cluster
    /// of child processes; Herald's streams then get 3 replicas, as in production).
    #[arg(long, default_value_t = 1)]
    nats_cluster: usize,
    /// Namespaces (tenants) per ingest partition.
    #[arg(long, default_value_t = 4)]
    namespaces_per_partition: usize,
    /// Endpoints per namespace; each takes one event type, so an event has one delivery.
    #[arg(long, default_value_t = 4)]
    endpoints_per_namespace: usize,
    /// How long each run publishes.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Cores one dispatcher replica gets in the extrapolation.
    #[arg(long, default_value_t = 2.0)]
    cores_per_replica: f64,
    /// Publish at most this many events per run (the benchmark's smoke keeps runs tiny).
    #[arg(long)]
    events: Option<u64>,
    /// How long NATS's idle CPU is measured before the runs, in seconds.
    #[arg(long, default_value_t = 10)]
    idle_seconds: u64,
    /// Append the Markdown report here (else print it).
    #[arg(long)]
    report: Option<PathBuf>,
    /// Also write each run's figures here as JSON (`herald-bench` reads them).
    #[arg(long)]
    json: Option<PathBuf>,
}

async fn receive(State(counts): State<Counts>, Path(ns): Path<String>) -> StatusCode {
    if let Some(n) = counts.get(&ns) {
        n.fetch_add(1, Ordering::Relaxed);
    }
    StatusCode::OK
}

fn delivered(counts: &Counts) -> BTreeMap<String, u64> {
    counts
        .iter()
        .map(|(ns, n)| (ns.clone(), n.load(Ordering::Relaxed)))
        .collect()
}

/// One dispatcher process and what it reports.
struct Replica {
    id: String,
    child: Child,
    metrics: String,
}

impl Replica {
    fn start(id: &str, nats_url: &str, shards: u32, js_replicas: usize) -> Self {
        let port = herald_e2e::free_port();
        let exe = std::env::current_exe()
            .expect("own path")
            .with_file_name("herald-test-dispatcher");
        let child = Command::new(&exe)
            .args(["--nats-url", nats_url, "--replica-id", id])
            .args(["--shards", &shards.to_string()])
            .args(["--jetstream-replicas", &js_replicas.to_string()])
            .args(["--allow-network", "127.0.0.0/8", "--allow-http"])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", exe.display()));
        Self {
            id: id.to_owned(),
            child,
            metrics: format!("http://127.0.0.1:{port}/metrics"),
        }
    }

    /// The sum of every sample of `name` (all label sets) in its metrics, if reachable.
    async fn metric(&self, name: &str) -> Option<f64> {
        let text = reqwest::get(&self.metrics).await.ok()?.text().await.ok()?;
        Some(
            text.lines()
                .filter(|l| {
                    l.strip_prefix(name)
                        .is_some_and(|r| r.starts_with(' ') || r.starts_with('{'))
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum(),
        )
    }

    async fn sample(&self) -> Sample {
        Sample {
            cpu: cpu_of(self.child.id()),
            attempts: self
                .metric("herald_dispatcher_attempts_total")
                .await
                .unwrap_or(0.0),
            ingested: self
                .metric("herald_dispatcher_events_ingested_total")
                .await
                .unwrap_or(0.0),
            owned: self
                .metric("herald_dispatcher_owned_shards")
                .await
                .unwrap_or(0.0),
        }
    }
}

#[derive(Clone, Copy, Default)]
struct Sample {
    cpu: Duration,
    attempts: f64,
    ingested: f64,
    owned: f64,
}

/// Acknowledged fan-out messages of each partition's consumer `herald-fanout-<p>`.
async fn fanout_acked(dp: &DataPlane, shards: u32) -> Vec<u64> {
    let stream = dp
        .js
        .get_stream(EVENTS_STREAM)
        .await
        .expect("events stream");
    let mut out = Vec::new();
    for p in 0..shards {
        let info = stream.consumer_info(format!("herald-fanout-{p}")).await;
        out.push(info.map_or(0, |i| i.ack_floor.consumer_sequence));
    }
    out
}

/// The replica holding each shard's lease.
async fn owners(dp: &DataPlane, shards: u32) -> Vec<String> {
    let Ok(kv) = dp
        .js
        .get_key_value(herald_core::dataplane::SHARDS_BUCKET)
        .await
    else {
        return vec![String::new(); shards as usize];
    };
    let mut out = Vec::new();
    for p in 0..shards {
        let holder = kv
            .get(herald_core::dataplane::LeaseKey::Shard(p).to_string())
            .await
            .ok()
            .flatten();
        out.push(holder.map_or_else(String::new, |v| String::from_utf8_lossy(&v).into_owned()));
    }
    out
}

/// Polls `probe` every 250 ms until it holds or `limit` passes; whether it held.
async fn until<F, Fut>(limit: Duration, mut probe: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if probe().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    false
}

/// Publishes round-robin over `targets` (namespace, type) for `seconds` (at most `limit`
/// events), pipelined (up to 4096 unacknowledged); returns how many JetStream
/// acknowledged.
async fn publish_for(
    dp: &DataPlane,
    targets: &[(String, String)],
    seconds: u64,
    limit: Option<u64>,
) -> u64 {
    let end = Instant::now() + Duration::from_secs(seconds);
    let limit = limit.unwrap_or(u64::MAX);
    let mut pending = FuturesUnordered::new();
    let mut sent = 0u64;
    while Instant::now() < end && sent < limit {
        for _ in 0..256.min(limit - sent) {
            let (ns, ty) = &targets[sent as usize % targets.len()];
            let body = serde_json::to_vec(&json!({"type": ty, "data": {"i": sent}})).unwrap();
            let ack = dp
                .js
                .publish(event_subject(ns, ty), body.into())
                .await
                .expect("publish");
            pending.push(ack.into_future());
            sent += 1;
        }
        while pending.len() >= 4096 {
            pending.next().await.expect("pending").expect("publish ack");
        }
    }
    while let Some(ack) = pending.next().await {
        ack.expect("publish ack");
    }
    sent
}

/// What one run with `replicas` dispatchers measured.
struct Run {
    replicas: usize,
    published: u64,
    publish_secs: f64,
    delivered: u64,
    during_publish: u64,
    drain_secs: f64,
    drained: bool,
    per_replica: Vec<(String, Sample, Sample)>,
    per_partition: Vec<(u32, u64, u64, String)>,
    cpu_dispatchers: f64,
    cpu_nats: f64,
    cpu_harness: f64,
    cpu_testenv: f64,
}

impl Run {
    fn rate(&self) -> f64 {
        self.delivered as f64 / self.drain_secs
    }

    fn us(&self, cpu: f64) -> f64 {
        cpu * 1e6 / self.delivered.max(1) as f64
    }

    fn total_cpu(&self) -> f64 {
        self.cpu_dispatchers + self.cpu_nats + self.cpu_harness
    }
}

struct Setup {
    dp: DataPlane,
    counts: Counts,
    targets: Vec<(String, String)>,
    nats_url: String,
    nats_pids: Vec<u32>,
    testenv_pid: u32,
    shards: u32,
    js_replicas: usize,
    /// Cores NATS and the test environment's other process use with no traffic (an idle
    /// API server and etcd share the process with a single embedded NATS): subtracted, as
    /// a fixed cost rather than one per event.
    idle_nats: f64,
    idle_testenv: f64,
}

impl Setup {
    /// CPU of the NATS servers: the cluster's nodes, or the test environment's process
    /// (NATS embedded with an idle API server and etcd) when there is one node.
    fn nats_cpu(&self) -> Duration {
        total_cpu(&self.nats_pids)
    }

    /// Measures [`Setup::idle_nats`] and [`Setup::idle_testenv`] over `window`.
    async fn measure_idle(&mut self, window: Duration) {
        let (nats0, testenv0) = (self.nats_cpu(), cpu_of(self.testenv_pid));
        tokio::time::sleep(window).await;
        let secs = window.as_secs_f64();
        self.idle_nats = (self.nats_cpu() - nats0).as_secs_f64() / secs;
        self.idle_testenv = (cpu_of(self.testenv_pid) - testenv0).as_secs_f64() / secs;
    }

    async fn run(&self, replicas: usize, seconds: u64, limit: Option<u64>) -> Run {
        let procs: Vec<Replica> = (0..replicas)
            .map(|i| {
                Replica::start(
                    &format!("r{replicas}-{i}"),
                    &self.nats_url,
                    self.shards,
                    self.js_replicas,
                )
            })
            .collect();
        let owned = until(Duration::from_secs(120), || async {
            let mut sum = 0.0;
            for r in &procs {
                sum += r.sample().await.owned;
            }
            sum >= f64::from(self.shards)
        })
        .await;
        assert!(owned, "the replicas did not take every shard within 120 s");
        // Warm up: one event per target, every one delivered, before measuring.
        let before = delivered(&self.counts).values().sum::<u64>();
        let warm = publish_for_count(&self.dp, &self.targets).await;
        let warmed = until(Duration::from_secs(120), || async {
            delivered(&self.counts).values().sum::<u64>() >= before + warm
        })
        .await;
        assert!(warmed, "warm-up events were not delivered within 120 s");
        tokio::time::sleep(Duration::from_secs(2)).await;

        let counts0 = delivered(&self.counts);
        let fan0 = fanout_acked(&self.dp, self.shards).await;
        let mut samples0 = Vec::new();
        for r in &procs {
            samples0.push(r.sample().await);
        }
        let (nats0, harness0, testenv0) = (
            self.nats_cpu(),
            cpu_of(std::process::id()),
            cpu_of(self.testenv_pid),
        );
        let start = Instant::now();
        let published = publish_for(&self.dp, &self.targets, seconds, limit).await;
        let publish_secs = start.elapsed().as_secs_f64();
        let total0: u64 = counts0.values().sum();
        let during_publish = delivered(&self.counts).values().sum::<u64>() - total0;
        let drained = until(Duration::from_secs(300), || async {
            delivered(&self.counts).values().sum::<u64>() >= total0 + published
        })
        .await;
        let drain_secs = start.elapsed().as_secs_f64();
        let counts1 = delivered(&self.counts);
        let (nats1, harness1, testenv1) = (
            self.nats_cpu(),
            cpu_of(std::process::id()),
            cpu_of(self.testenv_pid),
        );
        let mut per_replica = Vec::new();
        for (r, s0) in procs.iter().zip(samples0) {
            per_replica.push((r.id.clone(), s0, r.sample().await));
        }
        let fan1 = fanout_acked(&self.dp, self.shards).await;
        let owners = owners(&self.dp, self.shards).await;
        let per_partition = (0..self.shards)
            .map(|p| {
                let n: u64 = counts1
                    .iter()
                    .filter(|(ns, _)| partition_of(ns, self.shards) == p)
                    .map(|(ns, n)| n - counts0[ns])
                    .sum();
                let i = p as usize;
                (p, n, fan1[i] - fan0[i], owners[i].clone())
            })
            .collect();
        for r in procs {
            herald_e2e::stop(r.child).await;
        }
        let cpu_dispatchers = per_replica
            .iter()
            .map(|(_, a, b)| (b.cpu - a.cpu).as_secs_f64())
            .sum();
        // One node: NATS is the test environment's process, and the "rest" is nothing.
        let cpu_testenv = if self.nats_pids == [self.testenv_pid] {
            0.0
        } else {
            ((testenv1 - testenv0).as_secs_f64() - self.idle_testenv * drain_secs).max(0.0)
        };
        Run {
            replicas,
            published,
            publish_secs,
            delivered: counts1.values().sum::<u64>() - total0,
            during_publish,
            drain_secs,
            drained,
            per_replica,
            per_partition,
            cpu_dispatchers,
            cpu_nats: ((nats1 - nats0).as_secs_f64() - self.idle_nats * drain_secs).max(0.0),
            cpu_harness: (harness1 - harness0).as_secs_f64(),
            cpu_testenv,
        }
    }
}

/// One event per target, all acknowledged; how many.
async fn publish_for_count(dp: &DataPlane, targets: &[(String, String)]) -> u64 {
    for (ns, ty) in targets {
        dp.publish(ns, ty, json!({"warm": true})).await;
    }
    targets.len() as u64
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    herald_dispatcher::install_crypto_provider();
    let env = if args.nats_cluster >= 2 {
        herald_e2e::private_cluster_env()
    } else {
        herald_e2e::private_env()
    };
    let nodes = env.nats_nodes().len();
    let js_replicas = nodes.min(3);
    let dir = env.nats_log().parent().expect("env dir").to_owned();
    let testenv_pid: u32 = std::fs::read_to_string(dir.join("pid"))
        .expect("testenv pid")
        .trim()
        .parse()
        .expect("a pid");
    let nats_pids = if nodes >= 2 {
        children_of(testenv_pid)
    } else {
        vec![testenv_pid]
    };

    // The receiver: one path per namespace, counted.
    let mut namespaces = Vec::new();
    let mut per_partition = vec![0usize; args.shards as usize];
    for i in 0.. {
        if per_partition
            .iter()
            .all(|n| *n >= args.namespaces_per_partition)
        {
            break;
        }
        let ns = format!("cap-{i}");
        let p = partition_of(&ns, args.shards) as usize;
        if per_partition[p] < args.namespaces_per_partition {
            per_partition[p] += 1;
            namespaces.push(ns);
        }
    }
    let counts: Counts = Arc::new(
        namespaces
            .iter()
            .map(|ns| (ns.clone(), AtomicU64::new(0)))
            .collect(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = Router::new()
        .route("/{ns}", post(receive))
        .with_state(counts.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });

    // The layout with this run's shard count and replicas, then endpoints and keys as the
    // operator would write them.
    let js = async_nats::jetstream::new(env.nats().await);
    herald_dispatcher::setup::ensure(
        &js,
        herald_dispatcher::setup::DEFAULT_RETENTION,
        args.shards,
        js_replicas,
    )
    .await
    .expect("JetStream layout");
    let dp = DataPlane {
        config: js
            .get_key_value(CONFIG_BUCKET)
            .await
            .expect("config bucket"),
        health: js
            .get_key_value(HEALTH_BUCKET)
            .await
            .expect("health bucket"),
        js,
    };
    let mut targets = Vec::new();
    for ns in &namespaces {
        dp.put_keys(ns, "signing", &[TEST_SECRET]).await;
        for j in 0..args.endpoints_per_namespace {
            let (name, ty) = (format!("e{j}"), format!("t{j}"));
            let mut config = endpoint(
                ns,
                &name,
                json!({"url": format!("{base}/{ns}"), "eventTypes": [ty], "delivery": {"maxInFlight": 64}}),
            );
            config.shard = shard_for(ns, &name, args.shards);
            dp.put_endpoint(&config).await;
            targets.push((ns.clone(), ty));
        }
    }
    let mut setup = Setup {
        dp,
        counts,
        targets,
        nats_url: env.nats_url().to_owned(),
        nats_pids,
        testenv_pid,
        shards: args.shards,
        js_replicas,
        idle_nats: 0.0,
        idle_testenv: 0.0,
    };
    setup
        .measure_idle(Duration::from_secs(args.idle_seconds.max(1)))
        .await;
    let mut runs = Vec::new();
    for &replicas in &args.replicas {
        let run = setup.run(replicas, args.seconds, args.events).await;
        println!(
            "{replicas} replica(s): {:.0} delivered/s, {:.1} µs CPU per event (dispatchers {:.1}, NATS {:.1}, harness {:.1})",
            run.rate(),
            run.us(run.total_cpu()),
            run.us(run.cpu_dispatchers),
            run.us(run.cpu_nats),
            run.us(run.cpu_harness)
        );
        runs.push(run);
    }
    if let Some(path) = &args.json {
        std::fs::write(path, json_summary(&runs).to_string()).expect("writing the JSON");
    }
    let md = report(&args, &setup, &runs);
    match &args.report {
        Some(path) => {
            use std::io::Write as _;
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .expect("opening the report");
            writeln!(file, "{md}").expect("writing the report");
        }
        None => print!("{md}"),
    }
    std::process::exit(0);
}
