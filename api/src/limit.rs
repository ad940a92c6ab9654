//! Per-tenant request limits: a token bucket per namespace, refilled at `rate` per
//! second up to `burst`. Pure (time is passed in); the map is bounded by forgetting
//! buckets that are full again, which behave exactly like new ones.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Above this many namespaces the full buckets are dropped before adding one.
const PRUNE_ABOVE: usize = 10_000;

struct Bucket {
    tokens: f64,
    at: Instant,
}

/// The buckets of every namespace seen.
pub struct Limits {
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl Limits {
    pub fn new(rate: f64, burst: u32) -> Self {
        Self {
            rate,
            burst: f64::from(burst.max(1)),
            buckets: Mutex::default(),
        }
    }

    /// Takes one token of `namespace`'s bucket, or says how long until one is there.
    pub fn take(&self, namespace: &str, now: Instant) -> Result<(), Duration> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if buckets.len() >= PRUNE_ABOVE && !buckets.contains_key(namespace) {
            let (rate, burst) = (self.rate, self.burst);
            buckets.retain(|_, b| refilled(b, rate, burst, now) < burst);
        }
        let bucket = buckets.entry(namespace.to_owned()).or_insert(Bucket {
            tokens: self.burst,
            at: now,
        });
        bucket.tokens = refilled(bucket, self.rate, self.burst, now);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - bucket.tokens) / self.rate))
        }
    }
}

fn refilled(bucket: &Bucket, rate: f64, burst: f64, now: Instant) -> f64 {
    let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
    (bucket.tokens + elapsed * rate).min(burst)
}

/// `Retry-After` in whole seconds, never 0.
pub fn retry_after_secs(wait: Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0).max(u64::from(wait.is_zero()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_rate_per_namespace() {
        let limits = Limits::new(2.0, 3);
        let t = Instant::now();
        for _ in 0..3 {
            assert_eq!(limits.take("a", t), Ok(()));
        }
        let wait = limits.take("a", t).unwrap_err();
        assert_eq!(wait, Duration::from_millis(500));
        // another tenant is not affected
        assert_eq!(limits.take("b", t), Ok(()));
        assert_eq!(limits.take("a", t + Duration::from_millis(500)), Ok(()));
        assert!(limits.take("a", t + Duration::from_millis(500)).is_err());
        // never above the burst after a long pause
        let later = t + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(limits.take("a", later), Ok(()));
        }
        assert!(limits.take("a", later).is_err());
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1500)), 2);
        assert_eq!(retry_after_secs(Duration::from_secs(2)), 2);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
    }
}
