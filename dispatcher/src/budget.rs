//! The memory all lanes of a dispatcher hold, and the budget that bounds what they hold
//! beyond their base caps.
//!
//! Every lane buffers up to its endpoint's base cap (twice `maxInFlight`, at most 64
//! items): enough to keep its limit busy. A lane that fills it drops what the shard's
//! consumer delivers next and reads it back later from JetStream (a refill), so under a
//! backlog each lane message is read twice (`docs/bench/profile.md`: about 25 µs of CPU
//! per event). A delivering endpoint may buffer more — up to [`ELASTIC_CAP`] items a
//! lane — while the dispatcher's lanes together hold less than the budget
//! (`--lane-buffer-bytes`); an endpoint that stops delivering (failing, an open circuit,
//! paused, disabled) gives what it holds beyond its base cap back to JetStream. So a
//! failing endpoint's backlog still waits in JetStream, and memory stays bounded by the
//! budget plus the base caps.
//!
//! Contract: [`LaneBudget::used`] is the sum of what each endpoint state last reported
//! with [`LaneBudget::report`] (the shard reports after every change of a lane and
//! withdraws a state's bytes when it forgets the state); [`LaneBudget::room`] is the part
//! of the budget not used.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Most items one lane of a delivering endpoint buffers while the budget lasts.
pub const ELASTIC_CAP: usize = 16_384;

/// The default of `--lane-buffer-bytes`.
pub const DEFAULT_LANE_BUFFER_BYTES: usize = 64 << 20;

#[derive(Debug)]
pub struct LaneBudget {
    limit: usize,
    used: AtomicUsize,
}

impl LaneBudget {
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            used: AtomicUsize::new(0),
        }
    }

    /// An endpoint state that had `before` bytes buffered now has `now`.
    pub fn report(&self, before: usize, now: usize) {
        if now > before {
            self.used.fetch_add(now - before, Ordering::Relaxed);
        } else if before > now {
            let less = before - now;
            // Never below zero, whatever the order of reports across shards.
            let _ = self
                .used
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                    Some(used.saturating_sub(less))
                });
        }
    }

    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Bytes still free.
    pub fn room(&self) -> usize {
        self.limit.saturating_sub(self.used())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_add_up_and_never_go_below_zero() {
        let budget = LaneBudget::new(1000);
        budget.report(0, 600);
        budget.report(0, 300);
        assert_eq!((budget.used(), budget.room()), (900, 100));
        budget.report(600, 200);
        assert_eq!(budget.used(), 500);
        budget.report(300, 0);
        budget.report(200, 0);
        assert_eq!((budget.used(), budget.room()), (0, 1000));
        budget.report(50, 0);
        assert_eq!(budget.used(), 0);
        budget.report(0, 1500);
        assert_eq!(budget.room(), 0);
    }
}
