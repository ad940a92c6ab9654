//! When the next attempt happens: full-jitter exponential backoff, the explicit
//! schedule form, and `Retry-After`. Pure functions of the policy and the attempt count.

use std::time::Duration;

use herald_core::v1alpha1::{ExponentialBackoff, RetryPolicy};

/// Longest `Retry-After` honoured; a receiver cannot park an endpoint for days.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// The delay before the next attempt after attempt number `attempt` (1-based) failed,
/// `elapsed` after the first attempt; `None` when the retry budget is spent (the
/// delivery is dead). `jitter` is uniform in [0, 1); `retry_after` is the receiver's
/// own request.
pub fn next(
    policy: &RetryPolicy,
    attempt: u32,
    elapsed: Duration,
    jitter: f64,
    retry_after: Option<Duration>,
) -> Option<Duration> {
    let (delay, deadline) = match &policy.schedule {
        Some(schedule) => (
            schedule.get(attempt.saturating_sub(1) as usize)?.get(),
            None,
        ),
        None => {
            let default = ExponentialBackoff::default();
            let exp = policy.exponential.as_ref().unwrap_or(&default);
            (full_jitter(exp, attempt, jitter), Some(exp.deadline.get()))
        }
    };
    let delay = match retry_after {
        Some(asked) => delay.max(asked.min(MAX_RETRY_AFTER)),
        None => delay,
    };
    match deadline {
        Some(deadline) if elapsed + delay > deadline => None,
        _ => Some(delay),
    }
}

/// `random(0, min(cap, base * 2^(attempt-1)))`.
pub fn full_jitter(exp: &ExponentialBackoff, attempt: u32, jitter: f64) -> Duration {
    let exponent = attempt.saturating_sub(1).min(40);
    let ceiling = exp
        .base
        .get()
        .saturating_mul(1u32 << exponent.min(31))
        .min(exp.cap.get());
    ceiling.mul_f64(jitter.clamp(0.0, 1.0))
}

/// Parses `Retry-After`: delay-seconds, or an HTTP date relative to `now_unix`.
pub fn parse_retry_after(value: &str, now_unix: i64) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = jiff::fmt::rfc2822::parse(value)
        .ok()?
        .timestamp()
        .as_second();
    Some(Duration::from_secs(
        at.saturating_sub(now_unix).max(0) as u64
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_core::duration::Duration as SpecDuration;
    use proptest::prelude::*;

    fn exp(base: u64, cap: u64, deadline: u64) -> RetryPolicy {
        RetryPolicy {
            exponential: Some(ExponentialBackoff {
                base: SpecDuration::from_secs(base),
                cap: SpecDuration::from_secs(cap),
                deadline: SpecDuration::from_secs(deadline),
            }),
            schedule: None,
        }
    }

    #[test]
    fn explicit_schedule_is_followed_then_gives_up() {
        let policy = RetryPolicy {
            exponential: None,
            schedule: Some(vec![SpecDuration::from_secs(1), SpecDuration::from_secs(7)]),
        };
        assert_eq!(
            next(&policy, 1, Duration::ZERO, 0.5, None),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            next(&policy, 2, Duration::ZERO, 0.5, None),
            Some(Duration::from_secs(7))
        );
        assert_eq!(next(&policy, 3, Duration::ZERO, 0.5, None), None);
    }

    #[test]
    fn retry_after_raises_the_delay_but_is_capped() {
        let policy = exp(1, 10, 1_000_000);
        assert_eq!(
            next(
                &policy,
                1,
                Duration::ZERO,
                0.0,
                Some(Duration::from_secs(30))
            ),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            next(
                &policy,
                1,
                Duration::ZERO,
                0.0,
                Some(Duration::from_secs(86_400))
            ),
            Some(MAX_RETRY_AFTER)
        );
    }

    #[test]
    fn the_deadline_ends_retries() {
        let policy = exp(5, 3600, 100);
        assert_eq!(next(&policy, 30, Duration::from_secs(99), 1.0, None), None);
        assert!(next(&policy, 1, Duration::ZERO, 1.0, None).is_some());
    }

    #[test]
    fn default_policy_retries_within_seconds_and_spreads_to_an_hour() {
        let policy = RetryPolicy::default();
        assert_eq!(
            next(&policy, 1, Duration::ZERO, 0.999_999, None),
            Some(Duration::from_secs(5).mul_f64(0.999_999))
        );
        let Some(late) = next(&policy, 20, Duration::ZERO, 0.999_999, None) else {
            panic!()
        };
        assert!(late > Duration::from_secs(3500) && late <= Duration::from_secs(3600));
    }

    #[test]
    fn parses_retry_after_forms() {
        assert_eq!(parse_retry_after("120", 0), Some(Duration::from_secs(120)));
        let now = 1_700_000_000;
        let date = jiff::Timestamp::from_second(now + 30)
            .unwrap()
            .strftime("%a, %d %b %Y %H:%M:%S GMT")
            .to_string();
        assert_eq!(parse_retry_after(&date, now), Some(Duration::from_secs(30)));
        assert_eq!(parse_retry_after("soon", now), None);
    }

    proptest! {
        // Full jitter never exceeds min(cap, base * 2^(n-1)) and is never negative.
        #[test]
        fn jitter_stays_within_the_ceiling(base in 1u64..60, cap in 60u64..100_000,
                                           attempt in 1u32..100, jitter in 0.0f64..1.0) {
            let e = ExponentialBackoff {
                base: SpecDuration::from_secs(base),
                cap: SpecDuration::from_secs(cap),
                deadline: SpecDuration::from_secs(1),
            };
            let ceiling = Duration::from_secs(base)
                .saturating_mul(1u32 << (attempt - 1).min(31))
                .min(Duration::from_secs(cap));
            prop_assert!(full_jitter(&e, attempt, jitter) <= ceiling);
        }
    }
}
