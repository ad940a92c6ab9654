//! When an endpoint may start its next attempt, apart from its concurrency: the
//! receiver's `Retry-After` and the endpoint's optional rate limit (a token bucket of
//! `perSecond` with `burst`).

use std::time::{Duration, Instant};

use herald_core::v1alpha1::RateLimit;

/// Longest `Retry-After` honoured; a receiver cannot park an endpoint for days.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pace {
    not_before: Option<Instant>,
    /// Tokens and when they were counted; `None` until the first attempt of an endpoint
    /// with a rate limit.
    bucket: Option<(f64, Instant)>,
}

impl Pace {
    /// `Some(at)` when nothing may start before `at`.
    pub fn wait(&mut self, rate: Option<&RateLimit>, now: Instant) -> Option<Instant> {
        if let Some(at) = self.not_before {
            if at > now {
                return Some(at);
            }
            self.not_before = None;
        }
        let rate = rate?;
        let per_second = f64::from(rate.per_second.max(1));
        let burst = f64::from(rate.burst.unwrap_or(rate.per_second).max(1));
        let (tokens, at) = self.bucket.unwrap_or((burst, now));
        let tokens =
            (tokens + now.saturating_duration_since(at).as_secs_f64() * per_second).min(burst);
        self.bucket = Some((tokens, now));
        (tokens < 1.0).then(|| now + Duration::from_secs_f64((1.0 - tokens) / per_second))
    }

    /// An attempt started: it spends a token.
    pub fn on_start(&mut self) {
        if let Some((tokens, _)) = &mut self.bucket {
            *tokens -= 1.0;
        }
    }

    /// The receiver asked for a pause (`Retry-After` on 429/503), capped.
    pub fn hold_for(&mut self, after: Duration, now: Instant) {
        let until = now + after.min(MAX_RETRY_AFTER);
        self.not_before = Some(self.not_before.map_or(until, |t| t.max(until)));
    }

    /// The instant the receiver's pause ends, if one is in force.
    pub fn held_until(&self) -> Option<Instant> {
        self.not_before
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_holds_and_is_capped() {
        let now = Instant::now();
        let mut p = Pace::default();
        assert_eq!(p.wait(None, now), None);
        p.hold_for(Duration::from_secs(3), now);
        assert_eq!(p.wait(None, now), Some(now + Duration::from_secs(3)));
        p.hold_for(Duration::from_secs(1), now);
        assert_eq!(
            p.held_until(),
            Some(now + Duration::from_secs(3)),
            "the longer wins"
        );
        assert_eq!(p.wait(None, now + Duration::from_secs(3)), None);
        p.hold_for(Duration::from_secs(86_400), now);
        assert_eq!(p.held_until(), Some(now + MAX_RETRY_AFTER));
    }

    #[test]
    fn the_bucket_allows_a_burst_then_the_rate() {
        let rate = RateLimit {
            per_second: 10,
            burst: Some(2),
        };
        let now = Instant::now();
        let mut p = Pace::default();
        for _ in 0..2 {
            assert_eq!(p.wait(Some(&rate), now), None);
            p.on_start();
        }
        let at = p.wait(Some(&rate), now).expect("the burst is spent");
        assert_eq!(at, now + Duration::from_millis(100));
        assert_eq!(p.wait(Some(&rate), at), None);
    }
}
