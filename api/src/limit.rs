//! Per-tenant request limits: a token bucket per namespace, refilled at the namespace's
//! rate up to its burst — herald-api's defaults, or the tenant's own from its Namespace's
//! annotations (`herald.dev/api-rate`, `herald.dev/api-burst`, published by the operator
//! as the tenant policy). Pure (time is passed in); the map is bounded by forgetting
//! buckets that are full again, which behave exactly like new ones.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use herald_core::dataplane::TenantPolicy;

/// Above this many namespaces the full buckets (and stale quotas) are dropped before
/// adding one.
const PRUNE_ABOVE: usize = 10_000;
/// How long a tenant's quota is used before it is read again.
pub const QUOTA_TTL: Duration = Duration::from_secs(10);

/// A namespace's budget: `rate` requests per second, `burst` at once.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Quota {
    pub rate: f64,
    pub burst: f64,
}

impl Quota {
    pub fn new(rate: f64, burst: u32) -> Self {
        Self {
            rate,
            burst: f64::from(burst.max(1)),
        }
    }

    /// The tenant's own rate and burst where its policy sets them, else `self`.
    pub fn with_policy(self, policy: Option<&TenantPolicy>) -> Self {
        let Some(policy) = policy else {
            return self;
        };
        Self {
            rate: policy.api_rate.map_or(self.rate, f64::from),
            burst: policy.api_burst.map_or(self.burst, |b| f64::from(b.max(1))),
        }
    }
}

struct Bucket {
    tokens: f64,
    at: Instant,
    quota: Quota,
}

/// The buckets of every namespace seen.
#[derive(Default)]
pub struct Limits {
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl Limits {
    /// Takes one token of `namespace`'s bucket under `quota`, or says how long until one
    /// is there. A changed quota applies from now on (the tokens kept, within the new
    /// burst).
    pub fn take(&self, namespace: &str, quota: Quota, now: Instant) -> Result<(), Duration> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if buckets.len() >= PRUNE_ABOVE && !buckets.contains_key(namespace) {
            buckets.retain(|_, b| refilled(b, now) < b.quota.burst);
        }
        let bucket = buckets.entry(namespace.to_owned()).or_insert(Bucket {
            tokens: quota.burst,
            at: now,
            quota,
        });
        bucket.tokens = refilled(bucket, now).min(quota.burst);
        bucket.at = now;
        bucket.quota = quota;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - bucket.tokens) / quota.rate))
        }
    }
}

fn refilled(bucket: &Bucket, now: Instant) -> f64 {
    let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
    (bucket.tokens + elapsed * bucket.quota.rate).min(bucket.quota.burst)
}

/// The tenants' quotas as last read, each used for [`QUOTA_TTL`].
#[derive(Default)]
pub struct Quotas {
    read: Mutex<HashMap<String, (Quota, Instant)>>,
}

impl Quotas {
    /// The quota of `namespace` read less than [`QUOTA_TTL`] before `now`.
    pub fn fresh(&self, namespace: &str, now: Instant) -> Option<Quota> {
        let read = self.read.lock().unwrap_or_else(|e| e.into_inner());
        let (quota, at) = read.get(namespace)?;
        (now.saturating_duration_since(*at) < QUOTA_TTL).then_some(*quota)
    }

    /// The quota last read for `namespace`, however old (when reading fails).
    pub fn last(&self, namespace: &str) -> Option<Quota> {
        let read = self.read.lock().unwrap_or_else(|e| e.into_inner());
        read.get(namespace).map(|(quota, _)| *quota)
    }

    pub fn remember(&self, namespace: &str, quota: Quota, now: Instant) {
        let mut read = self.read.lock().unwrap_or_else(|e| e.into_inner());
        if read.len() >= PRUNE_ABOVE && !read.contains_key(namespace) {
            read.retain(|_, (_, at)| now.saturating_duration_since(*at) < QUOTA_TTL);
        }
        read.insert(namespace.to_owned(), (quota, now));
    }
}

/// `Retry-After` in whole seconds, never 0.
pub fn retry_after_secs(wait: Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0).max(u64::from(wait.is_zero()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take(limits: &Limits, namespace: &str, now: Instant) -> Result<(), Duration> {
        limits.take(namespace, Quota::new(2.0, 3), now)
    }

    #[test]
    fn a_burst_then_the_rate_per_namespace() {
        let limits = Limits::default();
        let t = Instant::now();
        for _ in 0..3 {
            assert_eq!(take(&limits, "a", t), Ok(()));
        }
        let wait = take(&limits, "a", t).unwrap_err();
        assert_eq!(wait, Duration::from_millis(500));
        // another tenant is not affected
        assert_eq!(take(&limits, "b", t), Ok(()));
        assert_eq!(take(&limits, "a", t + Duration::from_millis(500)), Ok(()));
        assert!(take(&limits, "a", t + Duration::from_millis(500)).is_err());
        // never above the burst after a long pause
        let later = t + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(take(&limits, "a", later), Ok(()));
        }
        assert!(take(&limits, "a", later).is_err());
    }

    #[test]
    fn a_tenants_policy_sets_its_own_rate_and_burst() {
        let default = Quota::new(20.0, 40);
        assert_eq!(default.with_policy(None), default);
        let policy = TenantPolicy {
            api_rate: Some(5),
            ..TenantPolicy::default()
        };
        let quota = default.with_policy(Some(&policy));
        assert_eq!((quota.rate, quota.burst), (5.0, 40.0));
        let limits = Limits::default();
        let t = Instant::now();
        let small = Quota::new(1.0, 2);
        assert!(limits.take("a", small, t).is_ok());
        assert!(limits.take("a", small, t).is_ok());
        assert_eq!(limits.take("a", small, t), Err(Duration::from_secs(1)));
        // a raised quota refills at its rate from now on: the time before counted at
        // the old one
        let raised = Quota::new(10.0, 20);
        assert!(
            limits
                .take("a", raised, t + Duration::from_millis(100))
                .is_err()
        );
        assert!(
            limits
                .take("a", raised, t + Duration::from_millis(200))
                .is_ok()
        );
        // a lowered burst caps what was kept
        let lowered = Quota::new(1.0, 1);
        let later = t + Duration::from_secs(60);
        assert!(limits.take("a", lowered, later).is_ok());
        assert!(limits.take("a", lowered, later).is_err());
    }

    #[test]
    fn quotas_are_read_again_after_their_ttl() {
        let quotas = Quotas::default();
        let t = Instant::now();
        assert_eq!(quotas.fresh("a", t), None);
        quotas.remember("a", Quota::new(3.0, 3), t);
        assert_eq!(
            quotas.fresh("a", t + QUOTA_TTL / 2),
            Some(Quota::new(3.0, 3))
        );
        assert_eq!(quotas.fresh("a", t + QUOTA_TTL), None);
        assert_eq!(quotas.last("a"), Some(Quota::new(3.0, 3)));
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1500)), 2);
        assert_eq!(retry_after_secs(Duration::from_secs(2)), 2);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
    }
}
