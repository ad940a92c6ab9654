//! Memory: a dispatcher process of its own (so only its memory is counted) that owns
//! every shard; `endpoints` idle endpoints added to it, then one event for each of them,
//! delivered, and their delivery state released after `--release-idle-after`. Measured
//! as its resident memory at each step, and its `herald_dispatcher_endpoint_states`.

use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use serde::Serialize;
use serde_json::json;

use super::harness::{Bench, ChildDispatcher, poll};
use super::receiver::Behavior;
use crate::dataplane::{TEST_SECRET, TEST_SHARDS, endpoint};

#[derive(Clone, Debug, Default, Serialize)]
pub struct MemoryRun {
    pub endpoints: usize,
    /// RSS (KiB) with the shards and no endpoints of this run.
    pub rss_empty_kib: u64,
    /// With the endpoints configured, idle.
    pub rss_idle_kib: u64,
    /// The highest RSS seen while their events were delivered.
    pub rss_peak_kib: u64,
    /// Once every endpoint's delivery state was released.
    pub rss_drained_kib: u64,
    /// Delivery states the process held before the run's traffic (endpoints of earlier
    /// scenarios whose state must outlive them: failing ones, say).
    pub states_before: u64,
    pub states_peak: u64,
    pub states_after: u64,
    pub delivered: usize,
    /// Publish start → last delivery.
    pub traffic_seconds: f64,
    /// Last delivery → no delivery state left.
    pub release_seconds: f64,
    pub release_idle_after: String,
}

impl MemoryRun {
    pub fn idle_bytes(&self) -> f64 {
        self.rss_idle_kib.saturating_sub(self.rss_empty_kib) as f64 * 1024.0
            / self.endpoints.max(1) as f64
    }

    pub fn drained_bytes(&self) -> f64 {
        self.rss_drained_kib.saturating_sub(self.rss_empty_kib) as f64 * 1024.0
            / self.endpoints.max(1) as f64
    }

    pub fn complete(&self) -> bool {
        self.delivered == self.endpoints && self.states_after <= self.states_before
    }
}

/// Needs the shards free: the dispatcher of this process stopped.
pub async fn memory(
    b: &Bench,
    bin_dir: &Path,
    nats_url: &str,
    ns: &str,
    endpoints: usize,
    release_idle_after: &str,
) -> MemoryRun {
    let child = ChildDispatcher::start(
        bin_dir,
        nats_url,
        ns,
        &["--release-idle-after", release_idle_after],
    );
    let owned = poll(
        Duration::from_secs(90),
        || child.metric("herald_dispatcher_owned_shards"),
        |n| n.is_some_and(|n| n >= f64::from(TEST_SHARDS)),
    )
    .await;
    assert!(
        owned.is_some(),
        "the memory run's dispatcher did not get every shard within 90 s"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let known = child
        .metric("herald_dispatcher_endpoints")
        .await
        .unwrap_or(0.0);
    let mut run = MemoryRun {
        endpoints,
        rss_empty_kib: child.rss_kib(),
        release_idle_after: release_idle_after.to_owned(),
        ..MemoryRun::default()
    };

    b.dp.put_keys(ns, "signing", &[TEST_SECRET]).await;
    let path = b.rx.path(Behavior::default());
    let url = b.rx.url(path);
    let mut puts = FuturesUnordered::new();
    for j in 0..endpoints {
        let config = endpoint(
            ns,
            &format!("m{j}"),
            json!({"url": url, "eventTypes": [format!("m{j}")]}),
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
    let target = known + endpoints as f64;
    poll(
        Duration::from_secs(300),
        || child.metric("herald_dispatcher_endpoints"),
        |n| n.is_some_and(|n| n >= target),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    run.rss_idle_kib = child.rss_kib();

    run.states_before = child
        .metric("herald_dispatcher_endpoint_states")
        .await
        .unwrap_or(0.0) as u64;
    // One event for each endpoint, while the peak is watched.
    let start = Instant::now();
    let publish = b.publish(ns, endpoints, 0.0, |i| format!("m{i}"), |_| String::new());
    let watch = async {
        let deadline = Instant::now() + Duration::from_secs(120 + endpoints as u64 / 100);
        while b.rx.distinct(&[path]) < endpoints as u64 && Instant::now() < deadline {
            run.rss_peak_kib = run.rss_peak_kib.max(child.rss_kib());
            let states = child.metric("herald_dispatcher_endpoint_states").await;
            run.states_peak = run.states_peak.max(states.unwrap_or(0.0) as u64);
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    };
    let (sent, ()) = tokio::join!(publish, watch);
    let d = b.deliveries(&[path], &sent);
    run.delivered = d.delivered;
    run.traffic_seconds = d.seconds_since(start);
    let last = d.last.unwrap_or_else(Instant::now);
    let before = run.states_before as f64;
    let released = poll(
        Duration::from_secs(300),
        || child.metric("herald_dispatcher_endpoint_states"),
        |n| n.is_some_and(|n| n <= before),
    )
    .await;
    run.release_seconds = last.elapsed().as_secs_f64();
    let states = match released {
        Some(n) => n,
        None => child.metric("herald_dispatcher_endpoint_states").await,
    };
    run.states_after = states.map_or(u64::MAX, |n| n as u64);
    tokio::time::sleep(Duration::from_secs(3)).await;
    run.rss_drained_kib = child.rss_kib();
    child.stop().await;
    run
}
