//! What every scenario uses: the dispatcher in this process (with a stop, so the memory
//! scenarios can have the shards to a process of their own), endpoints written as the
//! operator would, a paced publisher, waits for deliveries, latencies from the
//! receiver's arrivals, and dispatcher processes of their own with their RSS and metrics.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use herald_core::dataplane::{EndpointConfig, event_subject};
use herald_dispatcher::index::Index;
use serde_json::{Value, json};

use super::receiver::{PathId, Receiver};
use super::stats::Percentiles;
use super::stats::Run;
use crate::TestEnv;
use crate::dataplane::{DataPlane, TEST_SECRET, endpoint};

/// A dispatcher on a thread and runtime of its own in this process (2 worker threads
/// on this machine), stopped gracefully by [`Dispatcher::stop`] (its leases released).
pub struct Dispatcher {
    pub index: Index,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Dispatcher {
    pub fn start(env: &TestEnv) -> Self {
        let index = Index::default();
        let theirs = index.clone();
        let config = herald_dispatcher::Config::for_tests(
            env.nats_url(),
            &format!("bench-{}", std::process::id()),
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            herald_dispatcher::install_crypto_provider();
            let runtime = tokio::runtime::Runtime::new().expect("dispatcher runtime");
            let shutdown = async {
                let _ = stopped.await;
            };
            let run = herald_dispatcher::run_with_index(config, theirs, shutdown);
            if let Err(error) = runtime.block_on(run) {
                panic!("dispatcher failed: {error}");
            }
        });
        Self {
            index,
            stop,
            thread,
        }
    }

    pub async fn stop(self) {
        let _ = self.stop.send(());
        let thread = self.thread;
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
}

/// One scenario's access to the data plane.
#[derive(Clone)]
pub struct Bench {
    pub dp: DataPlane,
    pub index: Index,
    pub rx: Receiver,
}

/// One endpoint to create: its name, its spec (the `WebhookEndpoint` spec as JSON,
/// without `url`) and where it delivers.
pub struct Target {
    pub name: String,
    pub spec: Value,
    pub url: String,
}

impl Target {
    /// An endpoint `name` for event type `ty` with `delivery` settings.
    pub fn new(name: impl Into<String>, ty: &str, delivery: Value, url: String) -> Self {
        Self {
            name: name.into(),
            spec: json!({"eventTypes": [ty], "delivery": delivery}),
            url,
        }
    }
}

impl Bench {
    /// Writes the signing keys of `ns` and the endpoints, and waits until the dispatcher
    /// of this process uses every one of them.
    pub async fn endpoints(&self, ns: &str, targets: Vec<Target>) -> Vec<EndpointConfig> {
        self.dp.put_keys(ns, "signing", &[TEST_SECRET]).await;
        let configs: Vec<EndpointConfig> = targets
            .into_iter()
            .map(|t| {
                let mut spec = t.spec;
                spec["url"] = json!(t.url);
                endpoint(ns, &t.name, spec)
            })
            .collect();
        {
            let mut puts = FuturesUnordered::new();
            for config in &configs {
                puts.push(self.dp.put_endpoint(config));
                while puts.len() >= 256 {
                    puts.next().await;
                }
            }
            while puts.next().await.is_some() {}
        }
        let index = self.index.clone();
        let applied = |configs: &[EndpointConfig]| {
            configs
                .iter()
                .all(|c| index.endpoint(&c.key()).is_some_and(|e| e.config == *c))
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        while !applied(&configs) {
            assert!(
                Instant::now() < deadline,
                "the dispatcher did not apply the {} endpoints of {ns} within 120 s",
                configs.len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        configs
    }

    /// Publishes `n` events to `ns` at `rate` per second (0: as fast as JetStream
    /// acknowledges, up to 2,048 unacknowledged), event `i` of type `ty(i)` with data
    /// `{"i": i<extra(i)>}`; returns when each publish was sent and when its
    /// acknowledgement came back. Between paced publishes the acknowledgements are
    /// awaited as they arrive, so an ack's time is when this task saw it (at overload,
    /// when the window of 2,048 made room: later than it arrived).
    pub async fn publish(
        &self,
        ns: &str,
        n: usize,
        rate: f64,
        ty: impl Fn(usize) -> String,
        extra: impl Fn(usize) -> String,
    ) -> Published {
        let mut sent = Vec::with_capacity(n);
        let mut acked = vec![None; n];
        let mut pending = FuturesUnordered::new();
        let start = Instant::now();
        let mut record = |(i, ack): (usize, Result<_, _>)| {
            let _: async_nats::jetstream::publish::PublishAck = ack.expect("publish ack");
            acked[i] = Some(Instant::now());
        };
        for i in 0..n {
            if rate > 0.0 {
                let due = start + Duration::from_secs_f64(i as f64 / rate);
                let sleep = tokio::time::sleep_until(due.into());
                tokio::pin!(sleep);
                loop {
                    tokio::select! {
                        biased;
                        Some(done) = pending.next(), if !pending.is_empty() => record(done),
                        _ = &mut sleep => break,
                    }
                }
            }
            let ty = ty(i);
            let body = format!(r#"{{"type":"{ty}","data":{{"i":{i}{}}}}}"#, extra(i));
            sent.push(Instant::now());
            let ack = self
                .dp
                .js
                .publish(event_subject(ns, &ty), body.into())
                .await
                .expect("publish");
            pending.push(async move { (i, ack.into_future().await) });
            while pending.len() >= 2048 {
                record(pending.next().await.expect("pending"));
            }
        }
        while let Some(done) = pending.next().await {
            record(done);
        }
        let acked = acked
            .into_iter()
            .map(|at| at.expect("every publish acknowledged"))
            .collect();
        Published { sent, acked }
    }

    /// Waits until `paths` accepted `expected` distinct events in all (or `limit`
    /// passed); whether they did.
    pub async fn wait(&self, paths: &[PathId], expected: usize, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            if self.rx.distinct(paths) >= expected as u64 {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// What `paths` received of the events `published`: distinct deliveries, the last
    /// first arrival, and the latencies of each first arrival.
    pub fn deliveries(&self, paths: &[PathId], published: &Published) -> Deliveries {
        let mut out = Deliveries::default();
        for path in paths {
            for (i, at) in self.rx.first_accepted(*path) {
                let (Some(sent), Some(acked)) = (
                    published.sent.get(i as usize),
                    published.acked.get(i as usize),
                ) else {
                    continue;
                };
                out.delivered += 1;
                out.last = out.last.max(Some(at));
                let latency = at.saturating_duration_since(*sent);
                out.latencies.push(latency);
                out.acked.push(at.saturating_duration_since(*acked));
                let done = out.completion.entry(i).or_default();
                *done = (*done).max(latency);
            }
        }
        out
    }
}

/// When each event of a [`Bench::publish`] was published.
pub struct Published {
    /// The publish was sent.
    pub sent: Vec<Instant>,
    /// Its acknowledgement (the event is stored) was seen.
    pub acked: Vec<Instant>,
}

/// What a set of paths received.
#[derive(Default)]
pub struct Deliveries {
    pub delivered: usize,
    pub last: Option<Instant>,
    /// Publish sent → first arrival.
    pub latencies: Vec<Duration>,
    /// Publish acknowledged → first arrival (the brief's definition).
    pub acked: Vec<Duration>,
    /// Per event, the latency of its last endpoint (fan-out complete).
    pub completion: HashMap<u64, Duration>,
}

impl Deliveries {
    pub fn percentiles(&self) -> Percentiles {
        Percentiles::of(&self.latencies)
    }

    /// The latency fields of a [`Run`]: from the publish and from its ack, and the
    /// samples from the ack (for figures pooled over runs).
    pub fn timing(&self) -> Run {
        Run {
            latency: self.percentiles(),
            acked: Percentiles::of(&self.acked),
            samples: self
                .acked
                .iter()
                .map(|d| (d.as_secs_f64() * 1e3) as f32)
                .collect(),
            ..Run::default()
        }
    }

    pub fn completion(&self) -> Percentiles {
        Percentiles::of(&self.completion.values().copied().collect::<Vec<_>>())
    }

    /// From `start` to the last delivery (at least a millisecond).
    pub fn seconds_since(&self, start: Instant) -> f64 {
        self.last
            .map_or(0.0, |last| {
                last.saturating_duration_since(start).as_secs_f64()
            })
            .max(1e-3)
    }
}

/// Order violations in a sequence of event indices: arrivals of an index lower than one
/// that arrived before it.
pub fn inversions(indices: impl IntoIterator<Item = u64>) -> usize {
    let mut highest = None;
    let mut out = 0;
    for i in indices {
        if highest.is_some_and(|h| i < h) {
            out += 1;
        }
        highest = highest.max(Some(i));
    }
    out
}

/// A `herald-test-dispatcher` process (from `bin_dir`) with its metrics on a free port.
pub struct ChildDispatcher {
    pub child: Child,
    pub metrics: String,
}

impl ChildDispatcher {
    pub fn start(bin_dir: &Path, nats_url: &str, id: &str, extra: &[&str]) -> Self {
        let port = crate::free_port();
        let exe = bin_dir.join("herald-test-dispatcher");
        let child = Command::new(&exe)
            .args(["--nats-url", nats_url, "--replica-id", id, "--shards"])
            .arg(crate::dataplane::TEST_SHARDS.to_string())
            .args(["--allow-network", "127.0.0.0/8", "--allow-http"])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "starting {}: {e} (cargo build -p herald-e2e --bins builds it)",
                    exe.display()
                )
            });
        Self {
            child,
            metrics: format!("http://127.0.0.1:{port}/metrics"),
        }
    }

    /// The sum of every sample of metric `name`, if the process answers.
    pub async fn metric(&self, name: &str) -> Option<f64> {
        let response = reqwest::Client::new()
            .get(&self.metrics)
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .ok()?;
        let text = response.text().await.ok()?;
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

    /// Resident memory, KiB.
    pub fn rss_kib(&self) -> u64 {
        rss_kib_of(self.child.id())
    }

    pub async fn stop(self) {
        crate::stop(self.child).await;
    }
}

pub fn rss_kib_of(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Polls `probe` every 250 ms until `done` holds for its value or `limit` passes.
pub async fn poll<T, F, Fut>(limit: Duration, mut probe: F, done: impl Fn(&T) -> bool) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = T>,
{
    let deadline = Instant::now() + limit;
    loop {
        let value = probe().await;
        if done(&value) {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The directory of this executable (where cargo puts the workspace's binaries).
pub fn own_bin_dir() -> PathBuf {
    std::env::current_exe()
        .expect("own path")
        .parent()
        .expect("a directory")
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inversions_count_arrivals_that_overtook() {
        assert_eq!(inversions([0, 1, 2, 3]), 0);
        assert_eq!(inversions([0, 2, 1, 3]), 1);
        assert_eq!(inversions([3, 2, 1, 0]), 3);
        assert_eq!(inversions([]), 0);
    }
}
