//! After an attempt: one pure step from what came back to what happens next.
//!
//! Contract: [`decide`] is a function of the endpoint's policy, the delivery, the
//! attempt's result, the time and a jitter value; it does no IO and reads no clock. Its
//! [`Decision`] says what becomes of the delivery ([`Fate`]: done, retry after a delay —
//! in place or through a JetStream schedule —, or dead with a typed reason) and whether
//! the endpoint must be disabled (typed reason). The shard runtime only carries
//! decisions out.

use std::time::Duration;

use herald_core::dataplane::{AttemptOutcome, DeadReason, DisabledReason};
use herald_core::v1alpha1::DeliveryPolicy;

use crate::retry;

/// What one attempt came back with.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptResult {
    pub outcome: AttemptOutcome,
    pub status: Option<u16>,
    pub latency: Duration,
    /// The first bytes of the body, or the error, for the attempt log.
    pub snippet: String,
    /// The receiver's `Retry-After`, when it sent one.
    pub retry_after: Option<Duration>,
    /// The request's headers as sent, redacted (`herald_core::dataplane::AttemptRecord`).
    pub request_headers: Vec<(String, String)>,
    /// The response's headers, bounded and redacted.
    pub response_headers: Vec<(String, String)>,
}

impl AttemptResult {
    /// A result without a response (timeout, refused connection...).
    pub fn failed(outcome: AttemptOutcome, latency: Duration, snippet: String) -> Self {
        Self {
            outcome,
            status: None,
            latency,
            snippet,
            retry_after: None,
            request_headers: Vec::new(),
            response_headers: Vec::new(),
        }
    }

    pub fn is_success(&self) -> bool {
        self.outcome == AttemptOutcome::Success
    }

    /// The receiver is overloaded or unreachable: the adaptive limit halves.
    pub fn is_congestion(&self) -> bool {
        matches!(
            self.outcome,
            AttemptOutcome::Timeout | AttemptOutcome::RateLimited
        ) || self.status.is_some_and(|s| s >= 500)
    }
}

/// What becomes of the delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Delivered.
    Done,
    /// Try again after `delay`: `in_place` keeps the item in the endpoint's lane (ordered
    /// endpoints, so nothing overtakes it, or when a schedule could not be published);
    /// otherwise a JetStream schedule carries it to the retry lane.
    Retry { delay: Duration, in_place: bool },
    /// Given up; kept in the attempt log and replayable.
    Dead(DeadReason),
}

/// The one decision after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub fate: Fate,
    /// Stop delivering to the endpoint (its events keep queueing).
    pub disable: Option<DisabledReason>,
}

impl Decision {
    /// The delay of a retry, if the delivery is retried.
    pub fn retry_delay(&self) -> Option<Duration> {
        match self.fate {
            Fate::Retry { delay, .. } => Some(delay),
            _ => None,
        }
    }
}

/// What the decision depends on besides the result.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    pub policy: &'a DeliveryPolicy,
    /// Ordered endpoints retry in place.
    pub ordered: bool,
    /// The number of the attempt just made (1 for the first).
    pub attempt: u32,
    /// Unix milliseconds of the delivery's first attempt; `None` when this was it.
    pub first_attempt_ms: Option<u64>,
    /// Unix milliseconds since which the endpoint has had no success; `None` when it was
    /// not failing before this attempt.
    pub failing_since_ms: Option<u64>,
    /// The longest a retry may wait: a schedule kept longer than the stream's retention
    /// would expire undelivered.
    pub max_delay: Duration,
}

/// Decides what follows an attempt, at `now_ms`, with `jitter` uniform in [0, 1).
pub fn decide(facts: &Facts, result: &AttemptResult, now_ms: u64, jitter: f64) -> Decision {
    if result.is_success() {
        return Decision {
            fate: Fate::Done,
            disable: None,
        };
    }
    let policy = facts.policy;
    let failing_for = now_ms.saturating_sub(facts.failing_since_ms.unwrap_or(now_ms));
    let disable = if result.outcome == AttemptOutcome::Gone && policy.disable_on_gone {
        Some(DisabledReason::Gone)
    } else if u128::from(failing_for) >= policy.disable_after.get().as_millis() {
        Some(DisabledReason::SustainedFailure)
    } else {
        None
    };
    let fate = if result
        .status
        .is_some_and(|s| policy.final_status_codes.contains(&s))
    {
        Fate::Dead(DeadReason::FinalStatus)
    } else {
        let elapsed = now_ms.saturating_sub(facts.first_attempt_ms.unwrap_or(now_ms));
        match retry::next(
            &policy.retry,
            facts.attempt,
            Duration::from_millis(elapsed),
            jitter,
            result.retry_after,
        ) {
            None => Fate::Dead(DeadReason::RetriesExhausted),
            Some(delay) => Fate::Retry {
                delay: delay.min(facts.max_delay),
                in_place: facts.ordered,
            },
        }
    };
    Decision { fate, disable }
}

#[cfg(test)]
mod tests;
