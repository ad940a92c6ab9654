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
mod tests {
    use super::*;
    use serde_json::json;

    const HOUR: u64 = 3_600_000;

    fn policy(delivery: serde_json::Value) -> DeliveryPolicy {
        serde_json::from_value(delivery).unwrap()
    }

    fn result(outcome: AttemptOutcome, status: Option<u16>) -> AttemptResult {
        AttemptResult {
            outcome,
            status,
            latency: Duration::from_millis(5),
            snippet: String::new(),
            retry_after: None,
        }
    }

    fn facts(policy: &DeliveryPolicy) -> Facts<'_> {
        Facts {
            policy,
            ordered: false,
            attempt: 1,
            first_attempt_ms: None,
            failing_since_ms: None,
            max_delay: Duration::from_secs(30 * 24 * 3600),
        }
    }

    fn retry(delay: u64, in_place: bool) -> Fate {
        Fate::Retry {
            delay: Duration::from_secs(delay),
            in_place,
        }
    }

    /// The table: (policy, facts change, outcome, status, Retry-After, now) → decision.
    #[test]
    fn decisions_by_outcome_status_attempt_and_time() {
        use AttemptOutcome::*;
        let schedule = policy(json!({"retry": {"schedule": ["10s", "1m"]},
                                     "finalStatusCodes": [400, 422]}));
        let gone = policy(json!({"retry": {"schedule": ["10s"]}}));
        let keep = policy(json!({"retry": {"schedule": ["10s"]}, "disableOnGone": false}));
        let t0 = 100 * HOUR;
        type Case<'a> = (
            &'a str,
            &'a DeliveryPolicy,
            fn(&mut Facts),
            AttemptOutcome,
            Option<u16>,
            Option<u64>,
            u64,
            Fate,
            Option<DisabledReason>,
        );
        let cases: Vec<Case> = vec![
            (
                "2xx is done",
                &schedule,
                |_| {},
                Success,
                Some(204),
                None,
                t0,
                Fate::Done,
                None,
            ),
            (
                "5xx retries on the schedule",
                &schedule,
                |_| {},
                HttpError,
                Some(500),
                None,
                t0,
                retry(10, false),
                None,
            ),
            (
                "the second retry takes the second step",
                &schedule,
                |f| f.attempt = 2,
                HttpError,
                Some(500),
                None,
                t0,
                retry(60, false),
                None,
            ),
            (
                "the schedule ends",
                &schedule,
                |f| f.attempt = 3,
                HttpError,
                Some(500),
                None,
                t0,
                Fate::Dead(DeadReason::RetriesExhausted),
                None,
            ),
            (
                "a final status is dead at once",
                &schedule,
                |_| {},
                HttpError,
                Some(422),
                None,
                t0,
                Fate::Dead(DeadReason::FinalStatus),
                None,
            ),
            (
                "404 is not final unless listed",
                &schedule,
                |_| {},
                HttpError,
                Some(404),
                None,
                t0,
                retry(10, false),
                None,
            ),
            (
                "timeouts retry",
                &schedule,
                |_| {},
                Timeout,
                None,
                None,
                t0,
                retry(10, false),
                None,
            ),
            (
                "connection errors retry",
                &schedule,
                |_| {},
                ConnectError,
                None,
                None,
                t0,
                retry(10, false),
                None,
            ),
            (
                "a redirect is a failure",
                &schedule,
                |_| {},
                Redirect,
                Some(302),
                None,
                t0,
                retry(10, false),
                None,
            ),
            (
                "Retry-After lengthens the delay",
                &schedule,
                |_| {},
                RateLimited,
                Some(429),
                Some(30),
                t0,
                retry(30, false),
                None,
            ),
            (
                "Retry-After never shortens it",
                &schedule,
                |_| {},
                RateLimited,
                Some(503),
                Some(1),
                t0,
                retry(10, false),
                None,
            ),
            (
                "ordered endpoints retry in place",
                &schedule,
                |f| f.ordered = true,
                HttpError,
                Some(500),
                None,
                t0,
                retry(10, true),
                None,
            ),
            (
                "410 disables and keeps the delivery",
                &gone,
                |_| {},
                Gone,
                Some(410),
                None,
                t0,
                retry(10, false),
                Some(DisabledReason::Gone),
            ),
            (
                "410 without disableOnGone only retries",
                &keep,
                |_| {},
                Gone,
                Some(410),
                None,
                t0,
                retry(10, false),
                None,
            ),
            (
                "72 h of failure disables",
                &schedule,
                |f| f.failing_since_ms = Some(28 * HOUR),
                HttpError,
                Some(500),
                None,
                t0,
                retry(10, false),
                Some(DisabledReason::SustainedFailure),
            ),
            (
                "71 h of failure does not",
                &schedule,
                |f| f.failing_since_ms = Some(29 * HOUR + 1),
                HttpError,
                Some(500),
                None,
                t0,
                retry(10, false),
                None,
            ),
            (
                "a success never disables",
                &schedule,
                |f| f.failing_since_ms = Some(0),
                Success,
                Some(200),
                None,
                t0,
                Fate::Done,
                None,
            ),
            (
                "retries never outlive the retention",
                &schedule,
                |f| f.max_delay = Duration::from_secs(3),
                HttpError,
                Some(500),
                None,
                t0,
                retry(3, false),
                None,
            ),
        ];
        for (name, policy, change, outcome, status, retry_after, now, fate, disable) in cases {
            let mut f = facts(policy);
            change(&mut f);
            let mut r = result(outcome, status);
            r.retry_after = retry_after.map(Duration::from_secs);
            assert_eq!(
                decide(&f, &r, now, 0.5),
                Decision { fate, disable },
                "{name}"
            );
        }
    }

    #[test]
    fn the_exponential_deadline_counts_from_the_first_attempt() {
        let p = policy(
            json!({"retry": {"exponential": {"base": "1s", "cap": "1h", "deadline": "1h"}}}),
        );
        let mut f = facts(&p);
        f.attempt = 5;
        f.first_attempt_ms = Some(0);
        let late = decide(&f, &result(AttemptOutcome::HttpError, Some(500)), HOUR, 0.5);
        assert_eq!(late.fate, Fate::Dead(DeadReason::RetriesExhausted));
        f.first_attempt_ms = Some(HOUR - 1000);
        let early = decide(&f, &result(AttemptOutcome::HttpError, Some(500)), HOUR, 0.5);
        assert_eq!(
            early.retry_delay(),
            Some(Duration::from_secs(8)),
            "jitter 0.5 of 16 s"
        );
    }

    #[test]
    fn congestion_is_timeouts_rate_limits_and_5xx() {
        assert!(result(AttemptOutcome::Timeout, None).is_congestion());
        assert!(result(AttemptOutcome::RateLimited, Some(429)).is_congestion());
        assert!(result(AttemptOutcome::HttpError, Some(502)).is_congestion());
        assert!(!result(AttemptOutcome::HttpError, Some(404)).is_congestion());
        assert!(!result(AttemptOutcome::ConnectError, None).is_congestion());
    }
}
