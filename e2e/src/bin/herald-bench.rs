//! Herald's benchmark (`make bench`): the scenarios of `herald_e2e::bench` against a
//! private test environment, the Markdown report (`--report docs/benchmark.md`), its
//! plots and data (`--plots docs/bench`). `--smoke` runs every scenario at a tiny size
//! and fails unless each produced numbers and delivered everything (CI runs the same
//! as `e2e/tests/bench.rs`). `--profile-seconds` is the steady load `scripts/profile.sh`
//! records.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use herald_core::dataplane::event_subject;
use herald_e2e::bench::harness::{Bench, Dispatcher, Target};
use herald_e2e::bench::receiver::{Behavior, Receiver};
use herald_e2e::bench::{self, Options};
use herald_e2e::dataplane::DataPlane;
use serde_json::json;

/// The dispatcher binary's allocator (`dispatcher/src/main.rs`), so what is measured is
/// what runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    options: Options,
    /// Every scenario at a tiny size, once; exits non-zero unless each produced numbers
    /// and delivered every event.
    #[arg(long)]
    smoke: bool,
    /// Write the Markdown report here (else stdout).
    #[arg(long)]
    report: Option<PathBuf>,
    /// Write the plots (SVG) and the run's data (benchmark.json) into this directory.
    #[arg(long)]
    plots: Option<PathBuf>,
    /// Run only the throughput set-up, as a steady load for this many seconds, and no
    /// report (`make profile`, `scripts/profile.sh`): attaches to the environment of
    /// `HERALD_TESTENV_DIR`, keeps at most `PROFILE_BACKLOG` events published and not yet
    /// delivered, and writes its counters to `--profile-stats` every 250 ms.
    #[arg(long, requires = "profile_stats")]
    profile_seconds: Option<u64>,
    /// Where `--profile-seconds` writes its counters (`key value` lines, replaced whole).
    #[arg(long)]
    profile_stats: Option<PathBuf>,
    /// Endpoints of the `--profile-seconds` load (each event matches one, in turn).
    #[arg(long, default_value_t = 10)]
    profile_endpoints: usize,
}

/// Events published and not yet delivered under `--profile-seconds`: enough to keep every
/// stage busy, few enough that publishing runs at the delivery rate (a steady state whose
/// CPU can be divided by the deliveries).
const PROFILE_BACKLOG: u64 = 20_000;

/// The plots' directory relative to the report's (for the report's links).
fn relative(plots: &Path, report: Option<&Path>) -> String {
    let base = report.and_then(Path::parent).unwrap_or(Path::new(""));
    plots
        .strip_prefix(base)
        .unwrap_or(plots)
        .display()
        .to_string()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    herald_dispatcher::install_crypto_provider();
    if let (Some(seconds), Some(stats)) = (args.profile_seconds, args.profile_stats) {
        // The environment `scripts/profile.sh` started: its NATS is the process profiled.
        profile(
            herald_e2e::env(),
            seconds,
            stats,
            args.profile_endpoints.max(1),
        )
        .await;
        std::process::exit(0);
    }
    let options = if args.smoke {
        args.options.smoke()
    } else {
        args.options
    };
    let results = bench::run(herald_e2e::private_benchmark_env(), &options).await;
    let plots_rel = args.plots.as_deref().map_or_else(
        || "bench".to_owned(),
        |p| relative(p, args.report.as_deref()),
    );
    let md = bench::report::markdown(&results, &options, &plots_rel);
    if let Some(dir) = &args.plots {
        let written = bench::plots::write_all(&results, &options, dir).expect("drawing the plots");
        let data = serde_json::to_string_pretty(&results).expect("the results as JSON");
        std::fs::write(dir.join("benchmark.json"), data).expect("writing benchmark.json");
        println!(
            "wrote {} and benchmark.json in {}",
            written.join(", "),
            dir.display()
        );
    }
    match &args.report {
        Some(path) => {
            std::fs::write(path, &md).expect("writing the report");
            println!("wrote {}", path.display());
        }
        None => print!("{md}"),
    }
    let problems = results.problems(&options);
    for problem in &problems {
        eprintln!("herald-bench: {problem}");
    }
    println!(
        "herald-bench: {} scenarios in {:.0} s, {}",
        options.scenarios.len(),
        results.meta.seconds,
        if problems.is_empty() {
            "every event delivered".to_owned()
        } else {
            format!("{} problems", problems.len())
        }
    );
    std::process::exit(if problems.is_empty() { 0 } else { 1 });
}

/// `--profile-seconds`: the throughput set-up (`endpoints` endpoints, each event to one
/// in turn) under a steady load for `seconds`, never more than [`PROFILE_BACKLOG`] ahead
/// of the receiver, while a task writes [`profile_counters`] to `stats` every 250 ms.
async fn profile(
    env: &'static herald_e2e::TestEnv,
    seconds: u64,
    stats: PathBuf,
    endpoints: usize,
) {
    let dispatcher = Dispatcher::start(env);
    let b = Bench {
        dp: DataPlane::new(env.nats().await).await,
        index: dispatcher.index.clone(),
        rx: Receiver::start().await,
    };
    let ns = "bench-throughput";
    let paths = b.rx.paths(endpoints, Behavior::default());
    let targets = paths
        .iter()
        .enumerate()
        .map(|(j, p)| {
            let ty = format!("t{j}");
            Target::new(
                format!("tp{j}"),
                &ty,
                json!({"maxInFlight": 64}),
                b.rx.url(*p),
            )
        })
        .collect();
    b.endpoints(ns, targets).await;
    profile_load(&b, ns, seconds, stats, endpoints as u64).await;
}

async fn profile_load(b: &Bench, ns: &str, seconds: u64, stats: PathBuf, endpoints: u64) {
    let published = Arc::new(AtomicU64::new(0));
    let writer = {
        let (js, rx, published) = (b.dp.js.clone(), b.rx.clone(), published.clone());
        tokio::spawn(async move {
            let tmp = stats.with_extension("tmp");
            loop {
                let n = published.load(Ordering::Relaxed);
                let text = profile_counters(&js, rx.total_requests(), n).await;
                if std::fs::write(&tmp, text).is_ok() {
                    let _ = std::fs::rename(&tmp, &stats);
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut pending = FuturesUnordered::new();
    let mut i = 0u64;
    while Instant::now() < end {
        if i.saturating_sub(b.rx.total_requests()) >= PROFILE_BACKLOG {
            while let Some(()) = futures::FutureExt::now_or_never(pending.next()).flatten() {}
            tokio::time::sleep(Duration::from_millis(2)).await;
            continue;
        }
        for _ in 0..256 {
            let ty = format!("t{}", i % endpoints);
            let body = format!(r#"{{"type":"{ty}","data":{{"i":{i}}}}}"#);
            let ack =
                b.dp.js
                    .publish(event_subject(ns, &ty), body.into())
                    .await
                    .expect("publish");
            pending.push(async move {
                ack.await.expect("publish ack");
            });
            i += 1;
            while pending.len() >= 2048 {
                pending.next().await;
            }
        }
        published.store(i, Ordering::Relaxed);
    }
    while pending.next().await.is_some() {}
    writer.abort();
}

/// Counters of the benchmark and of JetStream, as `key value` lines: deliveries seen by
/// the receiver, events published, and per stream its last sequence and bytes, per
/// consumer its deliveries and (explicit-ack consumers) acks, and the account's API
/// requests. `scripts/profile.sh` subtracts two snapshots.
async fn profile_counters(
    js: &async_nats::jetstream::Context,
    delivered: u64,
    published: u64,
) -> String {
    use async_nats::jetstream::consumer::AckPolicy;
    let mut out = format!("delivered {delivered}\npublished {published}\n");
    if let Ok(account) = js.query_account().await {
        writeln!(out, "api {}", account.requests.total).unwrap();
    }
    let mut streams = js.streams();
    let mut names = Vec::new();
    while let Some(Ok(info)) = streams.next().await {
        let name = info.config.name.clone();
        writeln!(out, "stream.{name}.msgs {}", info.state.last_sequence).unwrap();
        writeln!(out, "stream.{name}.bytes {}", info.state.bytes).unwrap();
        names.push(name);
    }
    for name in names {
        let Ok(stream) = js.get_stream(&name).await else {
            continue;
        };
        let mut consumers = stream.consumers();
        while let Some(Ok(c)) = consumers.next().await {
            writeln!(
                out,
                "consumer.{name}.{}.delivered {}",
                c.name, c.delivered.consumer_sequence
            )
            .unwrap();
            if c.config.ack_policy != AckPolicy::None {
                writeln!(
                    out,
                    "consumer.{name}.{}.acked {}",
                    c.name, c.ack_floor.consumer_sequence
                )
                .unwrap();
            }
        }
    }
    out
}
