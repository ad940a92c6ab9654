//! Once a second per endpoint: purge finished work below each lane's low-water mark,
//! report health (through [`super::report`]), and forget the state of endpoints whose
//! configuration is gone and that hold nothing — a tenth of the endpoints every 100 ms,
//! so the purges and health writes of many endpoints do not come in one burst; the
//! shard's gauges once a second, when every tenth was seen. At the end: drain.

use std::time::{Duration, Instant};

use herald_core::dataplane::{EndpointKey, Lane};
use herald_core::v1alpha1::CircuitState;

use super::Runtime;
use crate::context::Shared;
use crate::endpoint::lanes::EARLY_PURGE_GAP;
use crate::metrics::ShardPending;
use herald_core::clock::now_ms;

/// Deletes a lane's messages below `below` (done work) in the background.
fn purge(shared: &Shared, shard: u32, key: &EndpointKey, lane: Lane, below: u64) {
    let stream = shared.layout.deliveries.clone();
    let subject = key.lane_subject(shard, lane);
    tokio::spawn(async move {
        if let Err(error) = stream.purge().filter(subject).sequence(below).await {
            tracing::debug!(%error, "lane purge");
        }
    });
}

/// How often housekeeping runs; each endpoint comes up every [`PHASES`] ticks.
pub(super) const TICK: Duration = Duration::from_millis(100);
const PHASES: u8 = 10;

/// Housekeeping's round through the tenths of a second, and the gauges it adds up on
/// the way.
#[derive(Default)]
pub(super) struct Cycle {
    phase: u8,
    /// The phase the last new endpoint got (round robin, so tenths stay even).
    assigned: u8,
    sums: Sums,
}

/// The shard's gauges, added up over a round.
#[derive(Default)]
struct Sums {
    open: i64,
    disabled: i64,
    pending: ShardPending,
}

impl Cycle {
    /// A new endpoint's phase.
    pub(super) fn assign(&mut self) -> u8 {
        self.assigned = (self.assigned + 1) % PHASES;
        self.assigned
    }
}

impl Runtime {
    pub(super) fn housekeeping(&mut self) {
        let now = Instant::now();
        let ms = now_ms();
        let phase = self.cycle.phase;
        let Sums {
            open,
            disabled,
            pending,
        } = &mut self.cycle.sums;
        let mut gone = Vec::new();
        for (key, slot) in &mut self.endpoints {
            if slot.phase != phase {
                continue;
            }
            let state = &mut slot.state;
            for lane in [Lane::New, Lane::Retry] {
                if let Some(below) = state.lanes.queue(lane).purge_point() {
                    purge(&self.shared, self.shard, key, lane, below);
                }
            }
            *open += i64::from(state.circuit() != CircuitState::Closed);
            *disabled += i64::from(state.disabled.is_some());
            let Some(health) = state.health(ms) else {
                if state.is_idle() && state.in_flight() == 0 {
                    gone.push(key.clone());
                }
                continue;
            };
            let backlog = health.backlog.unwrap_or_default();
            if backlog > 0 {
                let tenant = pending.tenants.entry(key.namespace().to_owned());
                let scheduled = state.scheduled();
                tenant
                    .or_default()
                    .add(backlog, scheduled, health.oldest_pending_ms);
                if let Some(oldest) = health.oldest_pending_ms {
                    pending.consider(key, oldest);
                }
            }
            if self
                .reports
                .due(key, &health, now, self.shared.settings.health_interval)
            {
                let kv = self.shared.layout.health.clone();
                let config_key = key.config_key();
                let value = serde_json::to_vec(&health).expect("health serializes");
                tracing::debug!(endpoint = %key, "reporting health");
                tokio::spawn(async move {
                    if let Err(error) = kv.put(config_key, value.into()).await {
                        tracing::warn!(%error, "health write failed; retried at the next change");
                    }
                });
            } else if !slot.queued && state.releasable(now, self.shared.settings.release_idle_after)
            {
                // Drained, out of the ring, quiet and reported: nothing here is needed
                // any more.
                gone.push(key.clone());
            }
        }
        for key in gone {
            self.forget(&key);
        }
        self.cycle.phase = (self.cycle.phase + 1) % PHASES;
        if self.cycle.phase == 0 {
            self.gauges();
        }
    }

    /// The shard's gauges, from a whole round of housekeeping.
    fn gauges(&mut self) {
        let Sums {
            open,
            disabled,
            pending,
        } = std::mem::take(&mut self.cycle.sums);
        let metrics = &self.shared.metrics;
        metrics
            .endpoint_states
            .get_or_create(&self.label)
            .set(self.endpoints.len() as i64);
        metrics.open_circuits.get_or_create(&self.label).set(open);
        metrics
            .lane_buffer_bytes
            .set(self.shared.buffers.used() as i64);
        metrics
            .disabled_endpoints
            .get_or_create(&self.label)
            .set(disabled);
        metrics.pending.set(self.shard, pending);
    }

    /// Purges a busy lane early, so a crash redelivers little of it.
    pub(super) fn maybe_purge(&mut self, key: &EndpointKey, lane: Lane) {
        let now = Instant::now();
        let Some(state) = self.endpoints.get_mut(key).map(|slot| &mut slot.state) else {
            return;
        };
        let queue = state.lanes.queue(lane);
        if self
            .last_purge
            .get(key)
            .is_some_and(|at| now.duration_since(*at) < EARLY_PURGE_GAP)
        {
            return;
        }
        if let Some(below) = queue.early_purge_point() {
            self.last_purge.insert(key.clone(), now);
            purge(&self.shared, self.shard, key, lane, below);
        }
    }

    fn forget(&mut self, key: &EndpointKey) {
        self.drop_state(key);
        self.reports.forget(key);
        self.last_purge.remove(key);
    }

    /// Stop: no new attempts; let in-flight ones finish within the grace period (their
    /// retries get scheduled), abort the rest (they stay in the lanes and are delivered
    /// again by the next owner), write what is done.
    pub(super) async fn drain(&mut self) {
        let deadline = tokio::time::Instant::now() + self.shared.settings.grace;
        while !self.attempts.is_empty() {
            match tokio::time::timeout_at(deadline, self.attempts.join_next()).await {
                Ok(Some(Ok(completion))) => self.on_completion(completion),
                Ok(Some(Err(_))) => {}
                Ok(None) => break,
                Err(_) => {
                    self.attempts.abort_all();
                    break;
                }
            }
        }
        self.log
            .flush(&self.shared.layout.js, std::time::Instant::now(), true);
        for (key, slot) in &mut self.endpoints {
            for lane in [Lane::New, Lane::Retry] {
                if let Some(below) = slot.state.lanes.queue(lane).purge_point() {
                    let subject = key.lane_subject(self.shard, lane);
                    let purge = self
                        .shared
                        .layout
                        .deliveries
                        .purge()
                        .filter(subject)
                        .sequence(below);
                    let _ = tokio::time::timeout(Duration::from_secs(2), purge.into_future()).await;
                }
            }
        }
        tracing::info!(shard = self.shard, "shard stopped");
    }
}

/// However a shard ends, its numbers leave with it: the next owner reports them.
impl Drop for Runtime {
    fn drop(&mut self) {
        for slot in self.endpoints.values() {
            self.shared.buffers.report(slot.budgeted, 0);
        }
        let metrics = &self.shared.metrics;
        metrics.pending.remove(self.shard);
        for gauge in [
            &metrics.in_flight,
            &metrics.open_circuits,
            &metrics.disabled_endpoints,
            &metrics.endpoint_states,
        ] {
            gauge.remove(&self.label);
        }
    }
}
