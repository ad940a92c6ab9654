//! Running attempts: the fair round-robin that starts them, the attempt task (HTTP, then
//! the pure decision of `crate::attempt`, then publishing a retry's schedule), and
//! applying a finished attempt to its endpoint's state.
//!
//! Contract: an item stays in flight — so the lane's low-water mark cannot pass it —
//! until its attempt task has returned, which for a scheduled retry is after JetStream
//! acknowledged the schedule. A panicking attempt comes back as a failed attempt retried
//! in place, never as a lost slot.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use herald_core::dataplane::{AttemptOutcome, DeadReason, EndpointKey, LaneMessage, Origin};
use herald_core::operational;
use herald_core::signing::SigningKey;
use tokio::sync::OwnedSemaphorePermit;

use super::Runtime;
use crate::attempt::{self, AttemptResult, Decision, Facts, Fate};
use crate::context::Shared;
use crate::endpoint::{Item, Readiness};
use crate::metrics::{AttemptLabel, NamespaceLabel, ResultLabel};
use crate::{http, index};
use herald_core::clock::now_ms;

/// A retry is never scheduled closer than this to the end of the retention window.
const RETENTION_MARGIN: Duration = Duration::from_secs(300);
/// How soon an attempt whose task panicked is tried again (in place).
const PANIC_RETRY: Duration = Duration::from_secs(5);

/// A finished attempt, back from its task.
pub struct Completion {
    key: EndpointKey,
    item: Item,
    result: AttemptResult,
    decision: Decision,
}

impl Runtime {
    /// Starts attempts round-robin: fair across tenants, then one per endpoint per turn
    /// (see [`super::ring`]), within the shard's pool, the dispatcher's ceiling and the
    /// bound on one endpoint's slots.
    pub(super) fn dispatch(&mut self) {
        let now = Instant::now();
        let limits = self.shared.settings.limits;
        let mut turns = self.ring.len();
        self.ceiling_blocked = false;
        while turns > 0 && self.attempts.len() < limits.per_shard {
            let permit = match self.spare.take() {
                Some(permit) => permit,
                None => match self.shared.ceiling.clone().try_acquire_owned() {
                    Ok(permit) => permit,
                    Err(_) => {
                        self.ceiling_blocked = true;
                        break;
                    }
                },
            };
            turns -= 1;
            let Some(key) = self.ring.pop() else {
                break;
            };
            let Some(slot) = self.endpoints.get_mut(&key) else {
                self.spare = Some(permit);
                continue;
            };
            slot.queued = false;
            let state = &mut slot.state;
            // Back in the ring when one of its attempts finishes.
            let full = state.in_flight() >= limits.per_endpoint as u64;
            match state.readiness(now) {
                Readiness::Ready(_) if full => self.spare = Some(permit),
                Readiness::Ready(lane) => {
                    let replays = &self.shared.replays;
                    let Some(item) = state.start(lane, now, &|uid| replays.withdrawn(uid)) else {
                        // Everything it could start belonged to a deleted replay or
                        // endpoint and was dropped: the lane shrank, so it may need a
                        // refill (nothing else would ask for one: no attempt of it ends).
                        self.spare = Some(permit);
                        self.changed(&key, Some(lane));
                        continue;
                    };
                    self.spawn_attempt(&key, item, permit);
                    // Back of the ring: the next endpoint gets the next turn.
                    self.changed(&key, Some(lane));
                    turns += 1;
                }
                Readiness::Until(at) => {
                    self.spare = Some(permit);
                    self.ring.wake_at(at, key);
                }
                Readiness::Idle => self.spare = Some(permit),
            }
        }
        // A permit not used now goes back to the other shards.
        self.spare = None;
        self.shared
            .metrics
            .in_flight
            .get_or_create(&self.label)
            .set(self.attempts.len() as i64);
    }

    fn spawn_attempt(&mut self, key: &EndpointKey, item: Item, permit: OwnedSemaphorePermit) {
        let Some(state) = self.endpoints.get(key).map(|slot| &slot.state) else {
            return;
        };
        let (Some(ep), Some(keys)) = (state.ep.clone(), state.keys.clone()) else {
            return;
        };
        let task = AttemptTask {
            shared: self.shared.clone(),
            shard: self.shard,
            key: key.clone(),
            ep,
            keys,
            failing_since_ms: state.failing_since_ms(),
        };
        if item.attempt == 1 {
            let waited_ms = now_ms().saturating_sub(item.published_ms);
            self.shared
                .metrics
                .first_attempt_latency
                .get_or_create(&NamespaceLabel::new(key.namespace()))
                .observe(waited_ms as f64 / 1e3);
        }
        let fallback = (key.clone(), item.clone());
        self.attempts.spawn(async move {
            // Held until the task ends, also when it is aborted.
            let _permit = permit;
            AssertUnwindSafe(task.run(item))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| panicked(fallback))
        });
        self.ring.started(key.namespace());
    }

    pub(super) fn on_completion(&mut self, completion: Completion) {
        let Completion {
            key,
            item,
            result,
            decision,
        } = completion;
        self.ring.finished(key.namespace());
        self.count(&key, &item, &result, &decision);
        let lane = item.lane;
        // The endpoint was deleted while the attempt ran: nothing to record.
        let Some(slot) = self.endpoints.get_mut(&key) else {
            return;
        };
        let state = &mut slot.state;
        let now = Instant::now();
        let finished = state.finish(item, &result, &decision, now, now_ms());
        self.log.push(&key, finished.record, now);
        if finished.disabled
            && let Some(disabled) = &state.disabled
        {
            tracing::warn!(endpoint = %key, reason = disabled.reason.as_str(), "endpoint disabled: {}", disabled.message);
            // Report at once: a tenant should hear about this.
            self.reports.urgent(&key);
        }
        if finished.save_lasting {
            self.save_lasting(&key);
        }
        if !result.is_success() {
            tracing::debug!(endpoint = %key, outcome = result.outcome.as_str(), status = ?result.status, "attempt failed");
        }
        self.shed_if_stalled(&key);
        self.maybe_purge(&key, lane);
        self.changed(&key, Some(lane));
    }
}

impl Runtime {
    fn count(&self, key: &EndpointKey, item: &Item, result: &AttemptResult, decision: &Decision) {
        let metrics = &self.shared.metrics;
        let namespace = key.namespace();
        let label = AttemptLabel::new(namespace, result.outcome, result.status);
        metrics.attempts.get_or_create(&label).inc();
        // One label for both per-tenant families: an allocation fewer per attempt.
        let tenant = NamespaceLabel::new(namespace);
        metrics
            .attempt_duration
            .get_or_create(&tenant)
            .observe(result.latency.as_secs_f64());
        let ended = match decision.fate {
            Fate::Done => "delivered",
            Fate::Dead(_) => {
                metrics.dead_deliveries.get_or_create(&tenant).inc();
                "dead"
            }
            Fate::Retry { .. } => return,
        };
        metrics
            .delivery_attempts
            .get_or_create(&ResultLabel { result: ended })
            .observe(f64::from(item.attempt));
    }
}

/// What an attempt task needs.
struct AttemptTask {
    shared: Shared,
    shard: u32,
    key: EndpointKey,
    ep: Arc<index::Endpoint>,
    keys: Arc<[SigningKey]>,
    failing_since_ms: Option<u64>,
}

impl AttemptTask {
    /// Sends, decides, and publishes a retry's schedule when the decision says so.
    async fn run(self, item: Item) -> Completion {
        let Self {
            shared,
            shard,
            key,
            ep,
            keys,
            failing_since_ms,
        } = self;
        let result = http::send(
            &shared.http,
            &shared.policy,
            http::Attempt::to(&ep.config, &item.event_id, item.body.clone(), &keys),
        )
        .await;
        let delivery = &ep.config.delivery;
        let facts = Facts {
            policy: delivery,
            ordered: ep.config.ordered,
            attempt: item.attempt,
            first_attempt_ms: item.first_attempt_ms,
            failing_since_ms,
            max_delay: shared.settings.retention.saturating_sub(RETENTION_MARGIN),
        };
        let now = now_ms();
        let mut decision = attempt::decide(&facts, &result, now, fastrand::f64());
        if let Fate::Retry {
            delay,
            in_place: false,
        } = decision.fate
        {
            let first = item.first_attempt_ms.unwrap_or(now);
            if let Err(error) =
                schedule_retry(&shared, shard, &key, &ep.config.uid, &item, first, delay).await
            {
                tracing::warn!(%error, endpoint = %key, "could not schedule a retry; retrying in place");
                decision.fate = Fate::Retry {
                    delay,
                    in_place: true,
                };
            }
        }
        if let Fate::Dead(reason) = decision.fate {
            announce_dead(&shared, &key, &item, reason).await;
        }
        Completion {
            key,
            item,
            result,
            decision,
        }
    }
}

/// How long publishing `herald.delivery.dead` may hold the attempt's slot.
const DEAD_EVENT_TIMEOUT: Duration = Duration::from_secs(2);

/// Publishes `herald.delivery.dead` into the endpoint's namespace (not for a dead
/// operational event: no event about failing to deliver one). A failure is logged; the
/// delivery's own record in the attempt log says it is dead either way.
async fn announce_dead(shared: &Shared, key: &EndpointKey, item: &Item, reason: DeadReason) {
    let Some(event) = operational::delivery_dead(
        key.namespace(),
        &key.name(),
        &item.event_id,
        herald_core::envelope::body_type(&item.body),
        reason.as_str(),
        item.attempt,
    ) else {
        return;
    };
    if let Err(error) = event.publish(&shared.layout.js, DEAD_EVENT_TIMEOUT).await {
        tracing::warn!(endpoint = %key, event_id = &*item.event_id, %error, "could not publish herald.delivery.dead");
    }
}

/// The completion of an attempt whose task panicked: a failure retried in place, so
/// its in-flight slot and the lane's low-water mark are released.
fn panicked((key, item): (EndpointKey, Item)) -> Completion {
    tracing::error!(endpoint = %key, "an attempt task panicked; retrying in place");
    Completion {
        key,
        item,
        result: AttemptResult::failed(
            AttemptOutcome::RequestError,
            Duration::ZERO,
            "internal error in the dispatcher".into(),
        ),
        decision: Decision {
            fate: Fate::Retry {
                delay: PANIC_RETRY,
                in_place: true,
            },
            disable: None,
        },
    }
}

/// Publishes the retry of `item` as a JetStream schedule that lands on the endpoint's
/// retry lane after `delay`.
async fn schedule_retry(
    shared: &Shared,
    shard: u32,
    key: &EndpointKey,
    uid: &str,
    item: &Item,
    first_attempt_ms: u64,
    delay: Duration,
) -> Result<(), async_nats::Error> {
    let due = jiff::Timestamp::now().checked_add(jiff::SignedDuration::try_from(delay)?)?;
    let retry = LaneMessage {
        event_id: &item.event_id,
        published_ms: item.published_ms,
        endpoint_uid: uid,
        ordering_key: item.ordering_key,
        origin: Origin::Retry {
            attempt: item.attempt + 1,
            first_attempt_ms,
            replay: item.replay.as_deref(),
        },
    };
    let target = retry.subject(key, shard);
    let publish = retry.schedule(&target, due, item.body.clone());
    shared
        .layout
        .js
        .send_publish(key.schedule_subject(shard, &item.event_id), publish)
        .await?
        .await?;
    Ok(())
}
