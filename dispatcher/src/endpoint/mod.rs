//! Per-endpoint delivery state, without any I/O, composed of small parts with one job
//! each: the lanes ([`lanes`]), the adaptive concurrency limit ([`limiter`]), the
//! circuit breaker ([`circuit`]), `Retry-After` and the rate limit ([`pace`]), the
//! success window ([`window`]) and the failure clock ([`failure`]). This module only
//! composes them: may an attempt start, and what an attempt's result teaches each part.
//! What follows an attempt for the delivery itself is decided in `crate::attempt`.
//!
//! An idle endpoint holds no buffer and no statistics window (both are allocated on
//! first use and released when drained), so it costs a few hundred bytes.

pub mod circuit;
pub mod failure;
pub mod lanes;
pub mod learned;
pub mod limiter;
pub mod pace;
mod report;
pub mod window;

use std::sync::Arc;
use std::time::{Duration, Instant};

use herald_core::dataplane::{
    AttemptOutcome, AttemptRecord, DisabledReason, Lane, LastAttempt, LastingState,
};
use herald_core::signing::SigningKey;
use herald_core::v1alpha1::{CircuitState, DeliveryPolicy};

use crate::attempt::{AttemptResult, Decision, Fate};
use crate::index;
use circuit::{Admit, Circuit};
use failure::{Disabled, FailureClock};
pub use lanes::{Item, LaneQueue, Lanes, RefillRange};
pub use limiter::INITIAL_LIMIT;
use limiter::Limiter;
use pace::Pace;
use window::Window;

/// Whether an endpoint can start an attempt now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    Ready(Lane),
    /// Not before this instant (Retry-After, circuit probe, rate limit, in-place retry).
    Until(Instant),
    /// Nothing to do until something changes (no work, at its limit, paused, held,
    /// disabled).
    Idle,
}

/// Everything the dispatcher keeps about one endpoint of an owned shard.
#[derive(Debug)]
pub struct EndpointState {
    /// `None` while the configuration is unknown: work is held, nothing is sent.
    pub ep: Option<Arc<index::Endpoint>>,
    pub keys: Option<Arc<[SigningKey]>>,
    pub lanes: Lanes,
    limiter: Limiter,
    circuit: Circuit,
    pace: Pace,
    failures: FailureClock,
    pub disabled: Option<Disabled>,
    window: Option<Box<Window>>,
    last: Option<LastAttempt>,
    /// Retries waiting in JetStream as schedules (they count as backlog), and the
    /// publish time of the oldest of them (an upper bound on its age: the oldest may
    /// already have fired).
    scheduled: u64,
    oldest_scheduled_ms: Option<u64>,
}

/// What an attempt's end means beyond the endpoint's own state, for the shard to carry
/// out: the endpoint's side of `crate::attempt::decide`.
#[derive(Debug)]
pub struct Finished {
    /// The attempt-log record of the attempt.
    pub record: AttemptRecord,
    /// The attempt disabled the endpoint: report it at once.
    pub disabled: bool,
    /// What must outlive the dispatcher (disabled, failure clock, circuit, pause) may
    /// have changed: save it now, so a crash cannot forget it. (A success of a healthy
    /// endpoint changes none of it.)
    pub save_lasting: bool,
}

fn max_in_flight(ep: Option<&Arc<index::Endpoint>>) -> u32 {
    ep.map_or(INITIAL_LIMIT, |e| e.config.delivery.max_in_flight.max(1))
}

impl EndpointState {
    pub fn new(ep: Option<Arc<index::Endpoint>>, keys: Option<Arc<[SigningKey]>>) -> Self {
        Self {
            limiter: Limiter::new(max_in_flight(ep.as_ref())),
            ep,
            keys,
            lanes: Lanes::default(),
            circuit: Circuit::default(),
            pace: Pace::default(),
            failures: FailureClock::default(),
            disabled: None,
            window: None,
            last: None,
            scheduled: 0,
            oldest_scheduled_ms: None,
        }
    }

    /// Retries a previous owner left waiting as schedules.
    pub fn restore_scheduled(&mut self, count: u64, oldest_ms: Option<u64>) {
        self.scheduled = count;
        self.oldest_scheduled_ms = oldest_ms;
    }

    /// A retry became due: its message arrived on the retry lane.
    pub fn retry_arrived(&mut self) {
        self.scheduled = self.scheduled.saturating_sub(1);
        if self.scheduled == 0 {
            self.oldest_scheduled_ms = None;
        }
    }

    /// Continues from what a previous owner of the endpoint saved, so a restart or
    /// handover keeps the endpoint disabled, its failure clock running, its circuit open
    /// and the receiver's `Retry-After`. State of another endpoint of the same name
    /// (another uid) is ignored.
    pub fn restore(&mut self, saved: &LastingState, now: Instant, now_ms: u64) {
        if self.ep.as_ref().is_some_and(|e| e.config.uid != saved.uid) {
            return;
        }
        if let Some(reason) = saved.disabled_reason {
            self.disabled = Some(Disabled {
                reason,
                message: saved.disabled_message.clone().unwrap_or_default(),
                token: saved.enable_token.clone(),
            });
        }
        self.failures = FailureClock::restore(saved.failing_since_ms);
        if let Some(state) = saved.circuit {
            self.circuit = Circuit::restore(state);
        }
        if let Some(limit) = saved.concurrency_limit {
            self.limiter.restore(limit, max_in_flight(self.ep.as_ref()));
        }
        if let Some(until) = saved.retry_after_until_ms.filter(|u| *u > now_ms) {
            self.pace
                .hold_for(std::time::Duration::from_millis(until - now_ms), now);
        }
        // A configuration that changed the enable token while this replica was away.
        self.configure(self.ep.clone());
    }

    /// Applies a new configuration, keeping delivery state. Returns whether the endpoint
    /// was re-enabled by a new enable token.
    pub fn configure(&mut self, ep: Option<Arc<index::Endpoint>>) -> bool {
        let token = ep.as_ref().and_then(|e| e.config.enable_token.clone());
        if ep.is_some() {
            self.limiter.clamp(max_in_flight(ep.as_ref()));
        }
        self.ep = ep;
        match &self.disabled {
            Some(d) if token.is_some() && d.token != token => {
                self.disabled = None;
                self.failures.on_success();
                self.circuit.close();
                true
            }
            _ => false,
        }
    }

    /// Buffer size per lane: enough to keep the limit busy, never more than 64.
    pub fn buffer_cap(&self) -> usize {
        let max = self
            .ep
            .as_ref()
            .map_or(8, |e| e.config.delivery.max_in_flight as usize);
        (2 * max).clamp(4, 64)
    }

    /// Whether its lanes may buffer beyond [`Self::buffer_cap`]: it is delivering — its
    /// configuration and keys known, not paused, held or disabled, its circuit closed, no
    /// failure since its last success — and not ordered (an ordered endpoint has one
    /// attempt in flight per key: its base cap keeps that busy).
    pub fn delivering(&self) -> bool {
        let Some(ep) = &self.ep else {
            return false;
        };
        let config = &ep.config;
        !config.ordered
            && !config.paused
            && config.held.is_none()
            && self.disabled.is_none()
            && self.keys.is_some()
            && self.circuit.state() == CircuitState::Closed
            && self.failures.streak() == 0
    }

    pub fn is_ordered(&self) -> bool {
        self.ep.as_ref().is_some_and(|e| e.config.ordered)
    }

    pub fn in_flight(&self) -> u64 {
        self.lanes.in_flight()
    }

    pub fn circuit(&self) -> CircuitState {
        self.circuit.state()
    }

    /// Unix milliseconds since which no attempt succeeded.
    pub fn failing_since_ms(&self) -> Option<u64> {
        self.failures.since_ms()
    }

    /// The concurrency limit in force (ordered endpoints without keys: one).
    pub fn limit(&self) -> u32 {
        match &self.ep {
            Some(e) if e.config.ordered && e.config.ordering_key.is_none() => 1,
            _ => self.limiter.limit(),
        }
    }

    pub fn readiness(&mut self, now: Instant) -> Readiness {
        let Some(ep) = &self.ep else {
            return Readiness::Idle;
        };
        let config = &ep.config;
        if config.paused || config.held.is_some() || self.disabled.is_some() || self.keys.is_none()
        {
            return Readiness::Idle;
        }
        if let Some(at) = self.pace.wait(config.delivery.rate_limit.as_ref(), now) {
            return Readiness::Until(at);
        }
        let limit = match self.circuit.admits(now) {
            // One for an ordered endpoint without keys, whichever lane.
            Admit::All => self.limit(),
            Admit::Probe => 1,
            Admit::Until(at) => return Readiness::Until(at),
        };
        if self.lanes.in_flight() >= u64::from(limit) {
            return Readiness::Idle;
        }
        match self.lanes.next_ready(config.ordered, now) {
            Ok(lane) => Readiness::Ready(lane),
            Err(Some(at)) => Readiness::Until(at),
            Err(None) => Readiness::Idle,
        }
    }

    /// The hash of the endpoint's uid, as lane items carry it (`None`: no configuration).
    pub fn uid(&self) -> Option<u64> {
        self.ep
            .as_ref()
            .map(|e| herald_core::dataplane::fnv1a(e.config.uid.bytes()))
    }

    /// Takes the next item of `lane` for an attempt. Items written for an earlier
    /// endpoint of the same name (another uid) are dropped on the way: their endpoint was
    /// deleted; so are items of a replay that `withdrawn` says was deleted.
    pub fn start(
        &mut self,
        lane: Lane,
        now: Instant,
        withdrawn: &dyn Fn(&str) -> bool,
    ) -> Option<Item> {
        let ordered = self.is_ordered();
        let uid = self.uid();
        let item = loop {
            let item = self.lanes.take(lane, ordered, now)?;
            let gone = match (&item.endpoint_uid, uid) {
                (Some(theirs), Some(ours)) if *theirs != ours => Some("endpoint"),
                _ if item.replay.as_deref().is_some_and(withdrawn) => Some("replay"),
                _ => None,
            };
            match gone {
                // Only because the resource that wanted it is gone.
                Some(what) => {
                    tracing::debug!(
                        event_id = &*item.event_id,
                        "dropping a deleted {what}'s delivery"
                    );
                    self.lanes.finished(&item);
                }
                None => break item,
            }
        };
        self.circuit.on_start();
        self.pace.on_start(now);
        Some(item)
    }

    /// Records an attempt's result and carries out the decision's effect on the
    /// endpoint; returns the attempt-log record. An in-place retry goes back to the
    /// head of its lane.
    pub fn finish(
        &mut self,
        mut item: Item,
        result: &AttemptResult,
        decision: &Decision,
        now: Instant,
        now_ms: u64,
    ) -> Finished {
        let was_disabled = self.disabled.is_some();
        let had_lasting = was_disabled || self.failing_since_ms().is_some();
        self.lanes.finished(&item);
        let record = report::record(&item, result, decision, now_ms);
        if let Some(ep) = self.ep.clone() {
            self.learn(&ep.config.delivery, &item.event_id, result, now, now_ms);
            if let Some(reason) = decision.disable {
                self.disable(reason, &ep.config.delivery);
            }
        }
        if let Fate::Retry {
            in_place: false, ..
        } = decision.fate
        {
            self.scheduled += 1;
            let oldest = self.oldest_scheduled_ms.get_or_insert(item.published_ms);
            *oldest = (*oldest).min(item.published_ms);
        }
        if let Fate::Retry {
            delay,
            in_place: true,
        } = decision.fate
        {
            item.not_before = Some(now + delay);
            item.attempt += 1;
            let started_ms = now_ms.saturating_sub(result.latency.as_millis() as u64);
            item.first_attempt_ms.get_or_insert(started_ms);
            self.lanes.requeue(item);
        }
        self.lanes.release_idle_memory();
        Finished {
            record,
            disabled: !was_disabled && self.disabled.is_some(),
            save_lasting: had_lasting || !result.is_success(),
        }
    }

    /// What a result teaches the limit, the circuit, the pace and the failure clock.
    fn learn(
        &mut self,
        delivery: &DeliveryPolicy,
        event_id: &str,
        result: &AttemptResult,
        now: Instant,
        now_ms: u64,
    ) {
        let latency_ms = result.latency.as_millis() as u64;
        self.window.get_or_insert_with(Default::default).record(
            now_ms,
            result.is_success(),
            latency_ms,
        );
        self.last = Some(LastAttempt {
            event_id: event_id.to_owned(),
            http_status: result.status,
            outcome: result.outcome,
            latency_ms,
            time_ms: now_ms,
        });
        let max = delivery.max_in_flight.max(1);
        if result.is_success() {
            if self.circuit.on_success() {
                self.limiter.reset(max);
            }
            self.failures.on_success();
            self.pace.on_success(now);
            let slow = result.latency.as_secs_f64() > 0.8 * delivery.timeout.get().as_secs_f64();
            self.limiter.on_success(slow, max);
        } else {
            let streak = self.failures.on_failure(now_ms);
            self.circuit
                .on_failure(streak, &delivery.circuit_breaker, now);
            match (result.outcome, result.retry_after) {
                // A refusal with a pause: wait as asked, with half the concurrency (kept
                // across a restart), then pace by what the receiver accepted (coming back
                // at full speed trips its limiter again).
                (AttemptOutcome::RateLimited, Some(after)) => {
                    self.limiter.on_failure(true);
                    self.pace.hold_for(after, now);
                    self.pace.on_refused_with_pause(now);
                }
                // A refusal without a pause: a rate limiter tripped; pace by rate, keep
                // the concurrency (a slow receiver needs it for the same rate).
                (AttemptOutcome::RateLimited, None) => {
                    self.limiter.on_failure(false);
                    self.pace.on_refused(now);
                }
                _ => self.limiter.on_failure(result.is_congestion()),
            }
        }
    }

    fn disable(&mut self, reason: DisabledReason, delivery: &DeliveryPolicy) {
        if self.disabled.is_some() {
            return;
        }
        let message = match reason {
            DisabledReason::Gone => "the receiver answered 410 Gone".to_owned(),
            DisabledReason::SustainedFailure => format!(
                "no successful delivery for {} (spec.delivery.disableAfter)",
                delivery.disable_after
            ),
        };
        let token = self.ep.as_ref().and_then(|e| e.config.enable_token.clone());
        self.disabled = Some(Disabled {
            reason,
            message,
            token,
        });
    }

    /// Deliveries waiting for a scheduled retry (in JetStream's schedule, not in a lane).
    pub fn scheduled(&self) -> u64 {
        self.scheduled
    }

    pub fn pending(&self) -> u64 {
        self.lanes.pending()
    }

    /// Whether the state can be released (its endpoint has drained): nothing queued,
    /// scheduled or in flight, nothing that must outlive it (disabled,
    /// failing, an open circuit, a `Retry-After`), and no attempt started for `quiet`.
    /// What is lost is the success and latency windows and the adaptive limit, which
    /// start again with the endpoint's next event; its last health report stays.
    pub fn releasable(&self, now: Instant, quiet: Duration) -> bool {
        self.is_idle()
            && self.in_flight() == 0
            && self.disabled.is_none()
            && self.circuit.state() == CircuitState::Closed
            && self.failures.streak() == 0
            && self.pace.settled(now, quiet)
    }

    /// Whether the state holds nothing worth keeping beyond the configuration.
    pub fn is_idle(&self) -> bool {
        self.pending() == 0 && self.scheduled == 0
    }

    #[cfg(test)]
    fn limiter_mut(&mut self) -> &mut Limiter {
        &mut self.limiter
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_lasting;
