//! Health → status: watches the `herald-health` bucket and feeds the health writer.
//!
//! Contract: [`run`] offers every record's [`coalesce::Prints`] to the [`Board`] and
//! *publishes* an endpoint — triggers the health writer ([`writer`]) for it — at most
//! once per `interval` when something material changed, and at most once per `refresh`
//! when only gauges moved ([`coalesce`]). However often dispatchers report, an
//! endpoint's health fields change at most once per interval, and a health update costs
//! one KV read and one status patch: no DNS lookup, no API read. The operator keeps no
//! health record in memory: the writer reads the newest from the bucket when it renders,
//! so a restarted leader shows what the bucket holds, never "no health".

pub mod coalesce;
pub mod writer;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_nats::jetstream::kv;
use futures::StreamExt;
use futures::channel::mpsc::UnboundedSender;
use herald_core::dataplane::{BucketKey, EndpointHealth, EndpointKey};
use kube::runtime::reflector::ObjectRef;
use tokio::time::Instant;

use crate::endpoint::Guarded;
use coalesce::{Coalescer, Pacing, Prints};

/// The health side of every endpoint of one scope: the [`Coalescer`]'s prints, shared by
/// the watch ([`run`]) and the writer, and the bucket the writer reads records from.
pub struct Board {
    coalescer: Mutex<Coalescer>,
    kv: kv::Store,
}

/// A health record that does not decode.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Nats(#[from] crate::nats::Error),
    #[error("the health record {key} does not decode: {source}")]
    Malformed {
        key: String,
        #[source]
        source: serde_json::Error,
    },
}

impl Board {
    pub fn new(kv: kv::Store, pacing: Pacing) -> Self {
        Self {
            coalescer: Mutex::new(Coalescer::new(pacing)),
            kv,
        }
    }

    /// The newest health record of `key` in the bucket.
    pub async fn read(&self, key: &EndpointKey) -> Result<Option<EndpointHealth>, ReadError> {
        let name = key.config_key();
        match crate::nats::read(&self.kv, &name).await? {
            None => Ok(None),
            Some(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| ReadError::Malformed { key: name, source }),
        }
    }

    /// See [`Coalescer::begin`].
    pub fn begin(&self, key: &EndpointKey, inputs: u64) -> (bool, EndpointKey) {
        self.lock().begin(key, inputs)
    }

    /// See [`Coalescer::rendered`].
    pub fn rendered(&self, key: EndpointKey, inputs: u64, prints: Prints) {
        self.lock().rendered(key, inputs, prints);
    }

    /// See [`Coalescer::failed`].
    pub fn failed(&self, key: &EndpointKey) {
        self.lock().failed(key);
    }

    fn lock(&self) -> MutexGuard<'_, Coalescer> {
        // Every operation leaves the coalescer consistent before it can panic (a map
        // insert or remove at a time), so a poisoned lock is still usable.
        self.coalescer.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A record from the bucket: the endpoint and its health (`None`: deleted).
fn decode(entry: &kv::Entry) -> Option<(EndpointKey, Option<EndpointHealth>)> {
    let Some(BucketKey::Endpoint(key)) = BucketKey::parse(&entry.key) else {
        return None;
    };
    let health = match entry.operation {
        kv::Operation::Put => match serde_json::from_slice::<EndpointHealth>(&entry.value) {
            Ok(h) => Some(h),
            Err(error) => {
                tracing::warn!(key = entry.key, %error, "ignoring a malformed health record");
                return None;
            }
        },
        _ => None,
    };
    Some((key, health))
}

/// What the watch feeds: the board and the writer's trigger.
struct Feed {
    board: Arc<Board>,
    trigger: UnboundedSender<ObjectRef<Guarded>>,
    namespace: Option<String>,
}

impl Feed {
    fn publish(&self, key: &EndpointKey) {
        let obj = ObjectRef::new(&key.name()).within(key.namespace());
        let _ = self.trigger.unbounded_send(obj);
    }

    /// Publishes what became due.
    fn tick(&self) {
        let due = self.board.lock().due(Instant::now());
        for key in &due {
            self.publish(key);
        }
    }

    /// Takes one record from the bucket.
    fn record(&self, entry: &kv::Entry) {
        let namespace = self.namespace.as_deref();
        let record =
            decode(entry).filter(|(key, _)| namespace.is_none_or(|ns| ns == key.namespace()));
        if let Some((key, health)) = record {
            let prints = Prints::of(health.as_ref());
            let published = self.board.lock().offer(key, prints, Instant::now());
            if let Some(key) = published {
                self.publish(&key);
            }
        }
    }
}

/// Watches `herald-health` until `stop` resolves.
pub async fn run(
    board: Arc<Board>,
    trigger: UnboundedSender<ObjectRef<Guarded>>,
    interval: Duration,
    namespace: Option<String>,
    stop: impl Future<Output = ()>,
) {
    let store = board.kv.clone();
    let feed = Feed {
        board,
        trigger,
        namespace,
    };
    let mut tick = tokio::time::interval(
        (interval / 4).clamp(Duration::from_millis(50), Duration::from_secs(1)),
    );
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(stop);
    'outer: loop {
        // Latest value of every endpoint's key first (a restarted operator must see
        // existing health), then every change; `watch_all` would only deliver changes.
        // Only endpoints' records: the bucket also holds the dispatchers' lasting state
        // and replay progress, written often during a replay.
        let mut watch = match store.watch_with_history(BucketKey::endpoint_filter()).await {
            Ok(watch) => watch,
            Err(error) => {
                tracing::warn!(%error, "watching herald-health failed; retrying");
                tokio::select! {
                    _ = &mut stop => break,
                    _ = tokio::time::sleep(Duration::from_secs(2)) => continue,
                }
            }
        };
        loop {
            tokio::select! {
                _ = &mut stop => break 'outer,
                _ = tick.tick() => feed.tick(),
                entry = watch.next() => match entry {
                    Some(Ok(entry)) => feed.record(&entry),
                    Some(Err(error)) => {
                        tracing::warn!(%error, "herald-health watch failed; re-watching");
                        continue 'outer;
                    }
                    None => continue 'outer,
                },
            }
        }
    }
}
