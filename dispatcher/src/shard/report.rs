//! When an endpoint's health is written to the `herald-health` bucket: at most once per
//! interval, only when it changed, and at once when something a tenant must hear about
//! (disabled) or a new owner must keep (a receiver's `Retry-After`) happened.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use herald_core::dataplane::{EndpointHealth, EndpointKey, LastingState};

#[derive(Default)]
pub struct Reports {
    written: HashMap<EndpointKey, (EndpointHealth, Option<Instant>)>,
    lasting: HashMap<EndpointKey, LastingState>,
}

impl Reports {
    /// Whether `health` should be written now; records it as written when so.
    pub fn due(
        &mut self,
        key: &EndpointKey,
        health: &EndpointHealth,
        now: Instant,
        interval: Duration,
    ) -> bool {
        let due = match self.written.get(key) {
            None => true,
            Some((last, at)) => {
                last != health && at.is_none_or(|at| now.duration_since(at) >= interval)
            }
        };
        if due {
            self.written
                .insert(key.clone(), (health.clone(), Some(now)));
        }
        due
    }

    /// The next report of `key` goes out without waiting for the interval.
    pub fn urgent(&mut self, key: &EndpointKey) {
        if let Some((_, at)) = self.written.get_mut(key) {
            *at = None;
        }
    }

    pub fn forget(&mut self, key: &EndpointKey) {
        self.written.remove(key);
        self.lasting.remove(key);
    }

    /// Whether `lasting` differs from what was saved last; records it when so.
    pub fn lasting_changed(&mut self, key: &EndpointKey, lasting: Option<&LastingState>) -> bool {
        if self.lasting.get(key) == lasting {
            return false;
        }
        match lasting {
            Some(l) => self.lasting.insert(key.clone(), l.clone()),
            None => self.lasting.remove(key),
        };
        true
    }

    /// Counts a state restored from the bucket as saved.
    pub fn restored(&mut self, key: &EndpointKey, lasting: LastingState) {
        self.lasting.insert(key.clone(), lasting);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_per_interval_only_on_change_and_at_once_when_urgent() {
        let key = EndpointKey::new("ns", "ep");
        let mut r = Reports::default();
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let a = EndpointHealth::default();
        let b = EndpointHealth {
            backlog: Some(3),
            ..Default::default()
        };
        assert!(r.due(&key, &a, t0, 10 * s));
        assert!(!r.due(&key, &a, t0 + 20 * s, 10 * s), "unchanged");
        assert!(!r.due(&key, &b, t0 + 5 * s, 10 * s), "within the interval");
        assert!(r.due(&key, &b, t0 + 10 * s, 10 * s));
        r.urgent(&key);
        assert!(
            r.due(&key, &a, t0 + 11 * s, 10 * s),
            "urgent skips the interval"
        );
    }
}
