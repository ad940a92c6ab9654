//! The shard's fair scheduler: a ring of endpoints that may have work and capacity, and
//! timers for endpoints that must wait (Retry-After, circuit probes, rate limits,
//! in-place retries). Each turn of the ring gives one endpoint one attempt.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::Instant;

use herald_core::dataplane::EndpointKey;

#[derive(Default)]
pub struct Ring {
    ready: VecDeque<EndpointKey>,
    timers: BinaryHeap<Reverse<(Instant, EndpointKey)>>,
}

impl Ring {
    /// Puts `key` at the back of the ring unless `queued` says it is already in it.
    pub fn push(&mut self, key: &EndpointKey, queued: &mut bool) {
        if !*queued {
            *queued = true;
            self.ready.push_back(key.clone());
        }
    }

    /// The next endpoint to give a turn; the caller clears its `queued` flag.
    pub fn pop(&mut self) -> Option<EndpointKey> {
        self.ready.pop_front()
    }

    pub fn len(&self) -> usize {
        self.ready.len()
    }

    /// Looks at `key` again at `at`.
    pub fn wake_at(&mut self, at: Instant, key: EndpointKey) {
        self.timers.push(Reverse((at, key)));
    }

    pub fn next_timer(&self) -> Option<Instant> {
        self.timers.peek().map(|Reverse((at, _))| *at)
    }

    /// Endpoints whose timers are due at `now`.
    pub fn due(&mut self, now: Instant) -> Vec<EndpointKey> {
        let mut due = Vec::new();
        while let Some(Reverse((at, _))) = self.timers.peek() {
            if *at > now {
                break;
            }
            if let Some(Reverse((_, key))) = self.timers.pop() {
                due.push(key);
            }
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn an_endpoint_is_in_the_ring_once_and_timers_fire_in_order() {
        let mut ring = Ring::default();
        let a = EndpointKey::new("ns", "a");
        let mut queued = false;
        ring.push(&a, &mut queued);
        ring.push(&a, &mut queued);
        assert_eq!(ring.len(), 1);
        let now = Instant::now();
        ring.wake_at(now + Duration::from_secs(2), EndpointKey::new("ns", "late"));
        ring.wake_at(
            now + Duration::from_secs(1),
            EndpointKey::new("ns", "early"),
        );
        assert_eq!(ring.next_timer(), Some(now + Duration::from_secs(1)));
        assert_eq!(
            ring.due(now + Duration::from_secs(1)),
            vec![EndpointKey::new("ns", "early")]
        );
        assert_eq!(ring.due(now + Duration::from_secs(5)).len(), 1);
    }
}
