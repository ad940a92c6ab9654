//! Health → status: watches the `herald-health` bucket and decides when an endpoint's
//! status may show new health.
//!
//! Contract: the endpoint controller is the only writer of `WebhookEndpoint` status
//! (one field manager, one complete status, no two writers racing). This module feeds it:
//! it keeps the latest record per endpoint and *publishes* it into [`Published`] — which
//! is what the controller renders — at most once per endpoint per `interval`, then
//! triggers a reconcile. However often dispatchers report, and however often the
//! endpoint reconciles for other reasons, its health fields change at most once per
//! interval.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::kv;
use futures::StreamExt;
use futures::channel::mpsc::UnboundedSender;
use herald_core::dataplane::{EndpointHealth, EndpointKey};
use herald_core::v1alpha1::WebhookEndpoint;
use kube::runtime::reflector::ObjectRef;
use tokio::time::Instant;

/// The health each endpoint's status shows now.
#[derive(Default)]
pub struct Published {
    map: Mutex<HashMap<EndpointKey, EndpointHealth>>,
}

impl Published {
    pub fn get(&self, key: &EndpointKey) -> Option<EndpointHealth> {
        self.lock().get(key).cloned()
    }

    fn set(&self, key: EndpointKey, health: Option<EndpointHealth>) {
        let mut map = self.lock();
        match health {
            Some(h) => map.insert(key, h),
            None => map.remove(&key),
        };
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<EndpointKey, EndpointHealth>> {
        // A panic while holding the lock cannot leave the map half-updated (every
        // operation is a single insert or remove), so a poisoned lock is still usable.
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Decides when pending health may be published: the pure half of this module.
#[derive(Default)]
pub struct Coalescer {
    interval: Duration,
    last: HashMap<EndpointKey, Instant>,
    pending: HashMap<EndpointKey, Option<EndpointHealth>>,
}

impl Coalescer {
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            ..Default::default()
        }
    }

    /// Records a new value; returns it at once when the endpoint's last publication is
    /// at least an interval ago.
    pub fn offer(
        &mut self,
        key: EndpointKey,
        health: Option<EndpointHealth>,
        now: Instant,
    ) -> Option<(EndpointKey, Option<EndpointHealth>)> {
        let due = self
            .last
            .get(&key)
            .is_none_or(|last| now.duration_since(*last) >= self.interval);
        if due {
            self.pending.remove(&key);
            self.last.insert(key.clone(), now);
            Some((key, health))
        } else {
            self.pending.insert(key, health);
            None
        }
    }

    /// Forgets a pending value: the endpoint went back to what its status shows.
    pub fn cancel(&mut self, key: &EndpointKey) {
        self.pending.remove(key);
    }

    /// Pending values whose interval has passed.
    pub fn due(&mut self, now: Instant) -> Vec<(EndpointKey, Option<EndpointHealth>)> {
        let interval = self.interval;
        let last = &mut self.last;
        let ready: Vec<EndpointKey> = self
            .pending
            .keys()
            .filter(|k| {
                last.get(*k)
                    .is_none_or(|t| now.duration_since(*t) >= interval)
            })
            .cloned()
            .collect();
        // Forget endpoints that have been quiet for a while, so the map does not grow
        // with every endpoint ever seen.
        last.retain(|_, t| now.duration_since(*t) < interval * 2);
        ready
            .into_iter()
            .filter_map(|k| {
                let health = self.pending.remove(&k)?;
                self.last.insert(k.clone(), now);
                Some((k, health))
            })
            .collect()
    }
}

/// Watches `herald-health` until `stop` resolves.
pub async fn run(
    store: kv::Store,
    published: Arc<Published>,
    trigger: UnboundedSender<ObjectRef<WebhookEndpoint>>,
    interval: Duration,
    namespace: Option<String>,
    stop: impl Future<Output = ()>,
) {
    let mut coalescer = Coalescer::new(interval);
    let mut tick = tokio::time::interval(
        (interval / 4).clamp(Duration::from_millis(50), Duration::from_secs(1)),
    );
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let publish = |(key, health): (EndpointKey, Option<EndpointHealth>)| {
        let obj = ObjectRef::new(&key.name()).within(key.namespace());
        published.set(key, health);
        let _ = trigger.unbounded_send(obj);
    };
    tokio::pin!(stop);
    'outer: loop {
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
                _ = tick.tick() => coalescer.due(Instant::now()).into_iter().for_each(publish),
                entry = watch.next() => match entry {
                    Some(Ok(entry)) => {
                        let Some(key) = entry.key.strip_prefix("ep.").and_then(EndpointKey::parse) else {
                            continue;
                        };
                        if namespace.as_deref().is_some_and(|ns| ns != key.namespace()) {
                            continue;
                        }
                        let health = match entry.operation {
                            kv::Operation::Put => match serde_json::from_slice::<EndpointHealth>(&entry.value) {
                                Ok(h) => Some(h),
                                Err(error) => {
                                    tracing::warn!(key = entry.key, %error, "ignoring a malformed health record");
                                    continue;
                                }
                            },
                            _ => None,
                        };
                        if published.get(&key) == health {
                            coalescer.cancel(&key);
                            continue;
                        }
                        if let Some(ready) = coalescer.offer(key, health, Instant::now()) {
                            publish(ready);
                        }
                    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn health(permille: u32) -> Option<EndpointHealth> {
        Some(EndpointHealth {
            success_permille: Some(permille),
            ..Default::default()
        })
    }

    #[tokio::test(start_paused = true)]
    async fn at_most_one_publication_per_interval() {
        let key = EndpointKey::new("ns", "ep");
        let mut c = Coalescer::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert!(c.offer(key.clone(), health(1), t0).is_some());
        assert!(
            c.offer(key.clone(), health(2), t0 + Duration::from_secs(1))
                .is_none()
        );
        assert!(
            c.offer(key.clone(), health(3), t0 + Duration::from_secs(2))
                .is_none()
        );
        assert!(c.due(t0 + Duration::from_secs(9)).is_empty());
        let due = c.due(t0 + Duration::from_secs(10));
        assert_eq!(
            due,
            vec![(key.clone(), health(3))],
            "only the latest is published"
        );
        assert!(c.due(t0 + Duration::from_secs(30)).is_empty());
        // Other endpoints are not held back.
        assert!(
            c.offer(
                EndpointKey::new("ns", "other"),
                health(5),
                t0 + Duration::from_secs(11)
            )
            .is_some()
        );
    }
}
