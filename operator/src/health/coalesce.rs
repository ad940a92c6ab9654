//! Pure: decides when an endpoint's newest health may be published into status — at
//! most once per endpoint per interval, always the latest value.

use std::collections::HashMap;
use std::time::Duration;

use herald_core::dataplane::{EndpointHealth, EndpointKey};
use tokio::time::Instant;

/// Decides when pending health may be published: the pure half of this module.
#[derive(Default)]
pub struct Coalescer {
    interval: Duration,
    last: HashMap<EndpointKey, Instant>,
    pending: HashMap<EndpointKey, Option<EndpointHealth>>,
}

impl Coalescer {
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            ..Default::default()
        }
    }

    /// Records a new value; returns it at once when the endpoint's last publication is
    /// at least an interval ago.
    pub fn offer(
        &mut self,
        key: EndpointKey,
        health: Option<EndpointHealth>,
        now: Instant,
    ) -> Option<(EndpointKey, Option<EndpointHealth>)> {
        let due = self
            .last
            .get(&key)
            .is_none_or(|last| now.duration_since(*last) >= self.interval);
        if due {
            self.pending.remove(&key);
            self.last.insert(key.clone(), now);
            Some((key, health))
        } else {
            self.pending.insert(key, health);
            None
        }
    }

    /// Forgets a pending value: the endpoint went back to what its status shows.
    pub fn cancel(&mut self, key: &EndpointKey) {
        self.pending.remove(key);
    }

    /// Pending values whose interval has passed.
    pub fn due(&mut self, now: Instant) -> Vec<(EndpointKey, Option<EndpointHealth>)> {
        let interval = self.interval;
        let last = &mut self.last;
        let ready: Vec<EndpointKey> = self
            .pending
            .keys()
            .filter(|k| {
                last.get(*k)
                    .is_none_or(|t| now.duration_since(*t) >= interval)
            })
            .cloned()
            .collect();
        // Forget endpoints that have been quiet for a while, so the map does not grow
        // with every endpoint ever seen.
        last.retain(|_, t| now.duration_since(*t) < interval * 2);
        ready
            .into_iter()
            .filter_map(|k| {
                let health = self.pending.remove(&k)?;
                self.last.insert(k.clone(), now);
                Some((k, health))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(permille: u32) -> Option<EndpointHealth> {
        Some(EndpointHealth {
            success_permille: Some(permille),
            ..Default::default()
        })
    }

    #[tokio::test(start_paused = true)]
    async fn at_most_one_publication_per_interval() {
        let key = EndpointKey::new("ns", "ep");
        let mut c = Coalescer::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert!(c.offer(key.clone(), health(1), t0).is_some());
        assert!(
            c.offer(key.clone(), health(2), t0 + Duration::from_secs(1))
                .is_none()
        );
        assert!(
            c.offer(key.clone(), health(3), t0 + Duration::from_secs(2))
                .is_none()
        );
        assert!(c.due(t0 + Duration::from_secs(9)).is_empty());
        let due = c.due(t0 + Duration::from_secs(10));
        assert_eq!(
            due,
            vec![(key.clone(), health(3))],
            "only the latest is published"
        );
        assert!(c.due(t0 + Duration::from_secs(30)).is_empty());
        // Other endpoints are not held back.
        assert!(
            c.offer(
                EndpointKey::new("ns", "other"),
                health(5),
                t0 + Duration::from_secs(11)
            )
            .is_some()
        );
    }
}
