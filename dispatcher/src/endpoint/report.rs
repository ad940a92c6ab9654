//! What an endpoint's state reports: its health record (the one place its state is
//! decided in the data plane), the state that must outlive the process, and the
//! attempt-log record of an attempt.

use std::time::Instant;

use herald_core::dataplane::{AttemptRecord, DeliveryState, EndpointHealth, LastingState};
use herald_core::v1alpha1::{CircuitState, EndpointState as State};

use super::{EndpointState, Item};
use crate::attempt::{AttemptResult, Decision, Fate};

impl EndpointState {
    /// The health record to report, given the current time: the one place an
    /// endpoint's state is decided in the data plane.
    pub fn health(&self, now_ms: u64) -> Option<EndpointHealth> {
        let ep = self.ep.as_ref()?;
        let success = self
            .window
            .as_ref()
            .and_then(|w| w.success_permille(now_ms));
        let p95 = self.window.as_ref().and_then(|w| w.p95_ms(now_ms));
        let timeout_ms = ep.config.delivery.timeout.get().as_millis() as u64;
        let state = if self.disabled.is_some() {
            State::Disabled
        } else if ep.config.paused {
            State::Paused
        } else if self.circuit.state() != CircuitState::Closed
            || self.failures.streak() > 0
            || success.is_some_and(|s| s < 950)
            || p95.is_some_and(|p| p * 10 > timeout_ms * 8)
        {
            State::Degraded
        } else {
            State::Active
        };
        Some(EndpointHealth {
            uid: ep.config.uid.clone(),
            generation: ep.config.generation,
            shard: ep.config.shard,
            state: Some(state),
            circuit: Some(self.circuit.state()),
            concurrency_limit: Some(self.limit()),
            backlog: Some(self.pending() + self.scheduled),
            oldest_pending_ms: self
                .lanes
                .oldest_published_ms()
                .into_iter()
                .chain(self.oldest_scheduled_ms.filter(|_| self.scheduled > 0))
                .min(),
            last_delivery: self.last.clone(),
            success_permille: success,
            p95_latency_ms: p95,
            first_failure_ms: self.failures.since_ms(),
            disabled_reason: self.disabled.as_ref().map(|d| d.reason),
            disabled_message: self.disabled.as_ref().map(|d| d.message.clone()),
            enable_token: self.disabled.as_ref().and_then(|d| d.token.clone()),
        })
    }

    /// What must outlive this process about the endpoint; `None` when nothing does (a
    /// healthy endpoint, or one whose configuration is unknown).
    pub fn lasting(&self, now: Instant, now_ms: u64) -> Option<LastingState> {
        let ep = self.ep.as_ref()?;
        let retry_after_until_ms = self
            .pace
            .held_until()
            .filter(|at| *at > now)
            .map(|at| now_ms + at.duration_since(now).as_millis() as u64);
        let circuit = self.circuit.state();
        let state = LastingState {
            uid: ep.config.uid.clone(),
            disabled_reason: self.disabled.as_ref().map(|d| d.reason),
            disabled_message: self.disabled.as_ref().map(|d| d.message.clone()),
            enable_token: self.disabled.as_ref().and_then(|d| d.token.clone()),
            failing_since_ms: self.failures.since_ms(),
            circuit: (circuit != CircuitState::Closed).then_some(circuit),
            retry_after_until_ms,
            concurrency_limit: self.failures.since_ms().map(|_| self.limiter.limit()),
        };
        let default = LastingState {
            uid: state.uid.clone(),
            ..Default::default()
        };
        (state != default).then_some(state)
    }
}

/// The attempt-log record of one attempt and its decision.
pub(super) fn record(
    item: &Item,
    result: &AttemptResult,
    decision: &Decision,
    now_ms: u64,
) -> AttemptRecord {
    let (state, next_attempt_ms, dead_reason) = match decision.fate {
        Fate::Done => (DeliveryState::Succeeded, None, None),
        Fate::Dead(reason) => (DeliveryState::Dead, None, Some(reason)),
        Fate::Retry { delay, .. } => (
            DeliveryState::Retrying,
            Some(now_ms + delay.as_millis() as u64),
            None,
        ),
    };
    AttemptRecord {
        event_id: item.event_id.clone(),
        attempt: item.attempt,
        time_ms: now_ms,
        outcome: result.outcome,
        http_status: result.status,
        latency_ms: result.latency.as_millis() as u64,
        response: result.snippet.clone(),
        state,
        next_attempt_ms,
        dead_reason,
        replay: item.replay.clone(),
        event_type: herald_core::envelope::body_type(&item.body).map(str::to_owned),
        request_headers: result.request_headers.clone(),
        response_headers: result.response_headers.clone(),
    }
}
