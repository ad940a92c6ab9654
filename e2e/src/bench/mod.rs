//! Herald's benchmark (`herald-bench`, `make bench`): the data plane on this machine —
//! NATS, the dispatcher, a receiver and a publisher together — in its scenarios ([`Scenario`]),
//! each repeated and reported as the median with its range, with plots drawn from
//! the same data. [`run`] runs the scenarios [`Options`] selects against an environment
//! and returns their [`Results`]; [`report`] and [`plots`] write them out;
//! [`Results::problems`] says what is missing (the smoke, `e2e/tests/bench.rs`, asserts
//! there is nothing).

pub mod calibrate;
pub mod harness;
pub mod measured;
pub mod memory;
pub mod options;
pub mod plots;
pub mod receiver;
pub mod recovery;
pub mod replicas;
pub mod report;
pub mod scenarios;
pub mod stats;

use std::time::{Duration, Instant};

use crate::TestEnv;
use crate::dataplane::DataPlane;
use harness::{Bench, Dispatcher};
use receiver::Receiver;
use recovery::Capacity;
use scenarios::Bad;

pub use measured::{Case, LoadPoint, Meta, Results, load_average};
pub use options::{Options, Scenario};
pub use stats::Run;

/// `cases` in the order of round `n`: rotated by one each round, so no case always runs
/// first (after another scenario) or last.
fn rotated<T>(mut cases: Vec<T>, n: usize) -> Vec<T> {
    if !cases.is_empty() {
        let len = cases.len();
        cases.rotate_left(n % len);
    }
    cases
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
            // A fast receiver and a slow one answering 429 without `Retry-After`, and the
            // fast one asking for a second's pause with each 429.
            for (delay, retry_after) in [(0, None), (o.recovery_slow_ms, None), (0, Some(1))] {
                let capacity = Capacity {
                    rate: o.recovery_rate,
                    burst: o.recovery_burst,
                    delay: Duration::from_millis(delay),
                    retry_after,
                };
                progress(
                    start,
                    &format!(
                        "recovery ({delay} ms receiver, Retry-After {retry_after:?}) run {}/{}: {} events while down; ideal drain {:.0} s",
                        n + 1,
                        o.recovery_runs,
                        o.recovery_events,
                        (o.recovery_events as f64 - o.recovery_burst).max(0.0) / o.recovery_rate
                    ),
                );
                let pause = retry_after.map_or(String::new(), |s| format!("-ra{s}"));
                let ns = ns(format!("rec-{n}-{delay}{pause}"));
                let run = recovery::recovery(&b, &ns, o.recovery_events, capacity).await;
                progress(
                    start,
                    &format!(
                        "recovery ({}): drained {} of {} in {:.1} s ({:.2}× the ideal), {} of {} requests refused ({:.1} %)",
                        run.receiver(),
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
