//! Health → status: watches the `herald-health` bucket and feeds the health writer.
//!
//! Contract: [`run`] keeps the latest record per endpoint and *publishes* it into
//! [`Published`] — what the health writer ([`writer`]) renders — at most once per endpoint
//! per `interval` when something material changed, and at most once per `refresh` when
//! only gauges moved ([`coalesce`]), then triggers the writer for that endpoint. However
//! often dispatchers report, an endpoint's health fields change at most once per
//! interval, and a health update costs one status patch: no DNS lookup, no API read, no
//! KV read. [`Published::synced`] resolves once the bucket's existing records are loaded,
//! so a new leader does not first write "no health" over every endpoint's status.

pub mod coalesce;
pub mod writer;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::kv;
use futures::StreamExt;
use futures::channel::mpsc::UnboundedSender;
use herald_core::dataplane::{BucketKey, EndpointHealth, EndpointKey};
use kube::runtime::reflector::ObjectRef;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::endpoint::Guarded;
use coalesce::{Coalescer, Pacing};

/// Give up waiting for the initial records after this long: status without health is
/// better than no status.
const SYNC_TIMEOUT: Duration = Duration::from_secs(10);

/// The health each endpoint's status shows now (boxed: a table slot is then 24 bytes
/// instead of 232, and the table keeps room for more endpoints than it holds).
pub struct Published {
    map: Mutex<HashMap<EndpointKey, Box<EndpointHealth>>>,
    synced: watch::Sender<bool>,
}

impl Default for Published {
    fn default() -> Self {
        Self {
            map: Mutex::default(),
            synced: watch::Sender::new(false),
        }
    }
}

impl Published {
    pub fn get(&self, key: &EndpointKey) -> Option<EndpointHealth> {
        self.lock().get(key).map(|h| EndpointHealth::clone(h))
    }

    /// Resolves once the records that existed when watching began are published (or
    /// after [`SYNC_TIMEOUT`]).
    pub async fn synced(&self) {
        let mut rx = self.synced.subscribe();
        let _ = tokio::time::timeout(SYNC_TIMEOUT, rx.wait_for(|synced| *synced)).await;
    }

    fn mark_synced(&self) {
        self.synced
            .send_if_modified(|synced| !std::mem::replace(synced, true));
    }

    fn set(&self, key: EndpointKey, health: Option<EndpointHealth>) {
        let mut map = self.lock();
        match health {
            Some(h) => {
                map.insert(key, Box::new(h));
            }
            None => {
                map.remove(&key);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<EndpointKey, Box<EndpointHealth>>> {
        // A panic while holding the lock cannot leave the map half-updated (every
        // operation is a single insert or remove), so a poisoned lock is still usable.
        self.map.lock().unwrap_or_else(|e| e.into_inner())
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

/// What the watch feeds: the coalescer, the published health and the writer's trigger.
struct Feed {
    coalescer: Coalescer,
    published: Arc<Published>,
    trigger: UnboundedSender<ObjectRef<Guarded>>,
    namespace: Option<String>,
}

impl Feed {
    fn publish(&self, (key, health): (EndpointKey, Option<EndpointHealth>)) {
        let obj = ObjectRef::new(&key.name()).within(key.namespace());
        self.published.set(key, health);
        let _ = self.trigger.unbounded_send(obj);
    }

    /// Publishes what became due.
    fn tick(&mut self) {
        for ready in self.coalescer.due(Instant::now()) {
            self.publish(ready);
        }
    }

    /// Takes one record from the bucket.
    fn record(&mut self, entry: &kv::Entry) {
        let namespace = self.namespace.as_deref();
        let record =
            decode(entry).filter(|(key, _)| namespace.is_none_or(|ns| ns == key.namespace()));
        if let Some((key, health)) = record {
            let published = self.published.get(&key);
            if published == health {
                self.coalescer.cancel(&key);
            } else {
                let material = coalesce::material(published.as_ref(), health.as_ref());
                if let Some(ready) = self.coalescer.offer(key, health, material, Instant::now()) {
                    self.publish(ready);
                }
            }
        }
        if entry.delta == 0 || entry.seen_current {
            self.published.mark_synced();
        }
    }
}

/// Watches `herald-health` until `stop` resolves.
pub async fn run(
    store: kv::Store,
    published: Arc<Published>,
    trigger: UnboundedSender<ObjectRef<Guarded>>,
    pacing: Pacing,
    namespace: Option<String>,
    stop: impl Future<Output = ()>,
) {
    let interval = pacing.interval;
    let mut feed = Feed {
        coalescer: Coalescer::new(pacing),
        published,
        trigger,
        namespace,
    };
    let mut tick = tokio::time::interval(
        (interval / 4).clamp(Duration::from_millis(50), Duration::from_secs(1)),
    );
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(stop);
    'outer: loop {
        // An empty bucket sends nothing to wait for.
        if store.status().await.is_ok_and(|s| s.values() == 0) {
            feed.published.mark_synced();
        }
        // Latest value of every key first (a restarted operator must see existing health),
        // then every change; `watch_all` would only deliver changes.
        let mut watch = match store.watch_with_history(">").await {
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
