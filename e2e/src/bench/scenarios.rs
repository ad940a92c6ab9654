//! The scenarios that deliver to healthy receivers, or beside unhealthy ones, through the
//! dispatcher of this process: throughput and latency over a few endpoints and over many,
//! fan-out, ordered delivery, and isolation (a bad neighbour, many bad neighbours, a
//! tenant's burst). Each returns the [`Run`] of one repetition.

use std::time::{Duration, Instant};

use herald_core::dataplane::partition_of;
use serde_json::json;

use super::harness::{Bench, Published, Target, inversions};
use super::receiver::{Behavior, PathId};
use super::stats::Run;

/// How long to wait for `deliveries` at worst (a debug build on a busy machine).
fn patience(deliveries: usize) -> Duration {
    Duration::from_secs(120 + deliveries as u64 / 200)
}

fn healthy(b: &Bench, n: usize) -> Vec<PathId> {
    b.rx.paths(n, Behavior::default())
}

/// `endpoints` endpoints in `ns`, endpoint `j` taking type `t<j>`, each event matching
/// one; `events` published round-robin at `rate` (0: as fast as acknowledged).
pub async fn spread(b: &Bench, ns: &str, endpoints: usize, events: usize, rate: f64) -> Run {
    let paths = healthy(b, endpoints);
    let targets = paths
        .iter()
        .enumerate()
        .map(|(j, p)| {
            let ty = format!("t{j}");
            Target::new(
                format!("e{j}"),
                &ty,
                json!({"maxInFlight": 64}),
                b.rx.url(*p),
            )
        })
        .collect();
    b.endpoints(ns, targets).await;
    let start = Instant::now();
    let sent = b
        .publish(
            ns,
            events,
            rate,
            |i| format!("t{}", i % endpoints),
            |_| String::new(),
        )
        .await;
    let publish_seconds = start.elapsed().as_secs_f64();
    b.wait(&paths, events, patience(events)).await;
    let d = b.deliveries(&paths, &sent);
    let seconds = d.seconds_since(start);
    Run {
        events,
        expected: events,
        delivered: d.delivered,
        seconds,
        rate: d.delivered as f64 / seconds,
        publish_seconds,
        ..d.timing()
    }
}

/// One event type subscribed by `endpoints` endpoints; `events` published at `rate`.
pub async fn fanout(b: &Bench, ns: &str, endpoints: usize, events: usize, rate: f64) -> Run {
    let paths = healthy(b, endpoints);
    let targets = paths
        .iter()
        .enumerate()
        .map(|(j, p)| {
            Target::new(
                format!("e{j}"),
                "order.created",
                json!({"maxInFlight": 64}),
                b.rx.url(*p),
            )
        })
        .collect();
    b.endpoints(ns, targets).await;
    let start = Instant::now();
    let sent = b
        .publish(
            ns,
            events,
            rate,
            |_| "order.created".into(),
            |_| String::new(),
        )
        .await;
    let publish_seconds = start.elapsed().as_secs_f64();
    let expected = events * endpoints;
    b.wait(&paths, expected, patience(expected)).await;
    let d = b.deliveries(&paths, &sent);
    let seconds = d.seconds_since(start);
    Run {
        events,
        expected,
        delivered: d.delivered,
        seconds,
        rate: d.delivered as f64 / seconds,
        publish_seconds,
        completion: Some(d.completion()),
        ..d.timing()
    }
}

/// One `ordered` endpoint (with `keys` > 0: `orderingKey: /data/k` over that many keys),
/// `events` published at once; order is checked on the first arrivals (per key).
pub async fn ordered(b: &Bench, ns: &str, events: usize, keys: usize) -> Run {
    let path = b.rx.path(Behavior::default());
    let mut target = Target::new("ordered", "o", json!({"maxInFlight": 64}), b.rx.url(path));
    target.spec["ordered"] = json!(true);
    if keys > 0 {
        target.spec["orderingKey"] = json!("/data/k");
    }
    b.endpoints(ns, vec![target]).await;
    let start = Instant::now();
    let key = |i: usize| i % keys.max(1);
    let extra = |i: usize| {
        if keys > 0 {
            format!(r#","k":{}"#, key(i))
        } else {
            String::new()
        }
    };
    let sent = b.publish(ns, events, 0.0, |_| "o".into(), extra).await;
    let publish_seconds = start.elapsed().as_secs_f64();
    b.wait(&[path], events, patience(events)).await;
    let d = b.deliveries(&[path], &sent);
    let firsts = b.rx.first_accepted(path);
    let inversions = (0..keys.max(1))
        .map(|k| {
            inversions(
                firsts
                    .iter()
                    .map(|(i, _)| *i)
                    .filter(|i| keys == 0 || key(*i as usize) == k),
            )
        })
        .sum();
    let seconds = d.seconds_since(start);
    Run {
        events,
        expected: events,
        delivered: d.delivered,
        seconds,
        rate: d.delivered as f64 / seconds,
        publish_seconds,
        inversions: Some(inversions),
        ..d.timing()
    }
}

/// A bad neighbour: how the bad endpoints answer and their `timeout`.
#[derive(Clone, Copy, Debug)]
pub struct Bad {
    /// Every `every`-th endpoint is bad (1 of 10: `every` = 10, and so on).
    pub every: usize,
    pub delay: Duration,
    pub timeout: &'static str,
}

/// `endpoints` endpoints, each of its own type, events at `rate` for `seconds`, some of
/// them `bad`; the run of the healthy endpoints only.
pub async fn isolation(
    b: &Bench,
    ns: &str,
    endpoints: usize,
    bad: Option<Bad>,
    rate: f64,
    seconds: f64,
) -> Run {
    let is_bad = |j: usize| bad.is_some_and(|bad| j.is_multiple_of(bad.every));
    let paths: Vec<PathId> = (0..endpoints)
        .map(|j| match bad {
            Some(bad) if is_bad(j) => b.rx.path(Behavior::delayed(bad.delay)),
            _ => b.rx.path(Behavior::default()),
        })
        .collect();
    let targets = paths
        .iter()
        .enumerate()
        .map(|(j, p)| {
            let timeout = match bad {
                Some(bad) if is_bad(j) => bad.timeout,
                _ => "15s",
            };
            let delivery =
                json!({"maxInFlight": 64, "timeout": timeout, "retry": {"schedule": ["1s"]}});
            Target::new(format!("e{j}"), &format!("t{j}"), delivery, b.rx.url(*p))
        })
        .collect();
    b.endpoints(ns, targets).await;
    let events = (rate * seconds).round() as usize;
    let start = Instant::now();
    let sent = b
        .publish(
            ns,
            events,
            rate,
            |i| format!("t{}", i % endpoints),
            |_| String::new(),
        )
        .await;
    let publish_seconds = start.elapsed().as_secs_f64();
    let healthy: Vec<PathId> = (0..endpoints)
        .filter(|j| !is_bad(*j))
        .map(|j| paths[j])
        .collect();
    let expected = (0..events).filter(|i| !is_bad(i % endpoints)).count();
    b.wait(&healthy, expected, patience(expected)).await;
    let d = b.deliveries(&healthy, &sent);
    let seconds = d.seconds_since(start);
    Run {
        events,
        expected,
        delivered: d.delivered,
        seconds,
        rate: d.delivered as f64 / seconds,
        publish_seconds,
        ..d.timing()
    }
}

/// Two namespaces of one ingest partition (the harder case: one fan-out worker reads
/// both), `<prefix>-a` and the first `<prefix>-b<n>` that shares its partition.
pub fn same_partition(prefix: &str) -> (String, String) {
    let a = format!("{prefix}-a");
    let shards = crate::dataplane::TEST_SHARDS;
    let p = partition_of(&a, shards);
    let b = (0..)
        .map(|n| format!("{prefix}-b{n}"))
        .find(|b| partition_of(b, shards) == p)
        .expect("a namespace of the same partition");
    (a, b)
}

/// A steady tenant (10 endpoints, `steady` events/s) beside another tenant of the same
/// ingest partition publishing `factor` × as much, both for `seconds`; the steady
/// tenant's run, and the other's.
pub async fn burst(b: &Bench, prefix: &str, steady: f64, factor: f64, seconds: f64) -> (Run, Run) {
    let (ns_a, ns_b) = same_partition(prefix);
    let paths_a = healthy(b, 10);
    let paths_b = healthy(b, 10);
    let targets = |paths: &[PathId]| {
        paths
            .iter()
            .enumerate()
            .map(|(j, p)| {
                let ty = format!("t{j}");
                Target::new(
                    format!("e{j}"),
                    &ty,
                    json!({"maxInFlight": 64}),
                    b.rx.url(*p),
                )
            })
            .collect()
    };
    b.endpoints(&ns_a, targets(&paths_a)).await;
    b.endpoints(&ns_b, targets(&paths_b)).await;
    let n_a = (steady * seconds).round() as usize;
    let n_b = (steady * factor * seconds).round() as usize;
    let start = Instant::now();
    let (sent_a, sent_b) = tokio::join!(
        b.publish(
            &ns_a,
            n_a,
            steady,
            |i| format!("t{}", i % 10),
            |_| String::new()
        ),
        b.publish(
            &ns_b,
            n_b,
            steady * factor,
            |i| format!("t{}", i % 10),
            |_| String::new()
        ),
    );
    let publish_seconds = start.elapsed().as_secs_f64();
    b.wait(&paths_a, n_a, patience(n_a)).await;
    b.wait(&paths_b, n_b, patience(n_b)).await;
    let run = |paths: &[PathId], sent: &Published, n: usize| {
        let d = b.deliveries(paths, sent);
        let seconds = d.seconds_since(start);
        Run {
            events: n,
            expected: n,
            delivered: d.delivered,
            seconds,
            rate: d.delivered as f64 / seconds,
            publish_seconds,
            ..d.timing()
        }
    };
    (run(&paths_a, &sent_a, n_a), run(&paths_b, &sent_b, n_b))
}
