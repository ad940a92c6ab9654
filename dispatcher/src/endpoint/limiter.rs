//! The adaptive concurrency limit (AIMD): start small, add one after a window of
//! successes, halve on congestion, lower by one per window of slow successes (p95 near
//! the timeout) before anything fails; never above the endpoint's `maxInFlight`.

/// Initial adaptive concurrency limit (capped by the endpoint's `maxInFlight`).
pub const INITIAL_LIMIT: u32 = 4;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limiter {
    limit: u32,
    success_run: u32,
    slow_run: u32,
}

impl Limiter {
    pub fn new(max: u32) -> Self {
        Self {
            limit: INITIAL_LIMIT.min(max.max(1)),
            success_run: 0,
            slow_run: 0,
        }
    }

    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// A new `maxInFlight`: keep the learned limit within it.
    pub fn clamp(&mut self, max: u32) {
        self.limit = self.limit.clamp(1, max.max(1));
    }

    /// Back to the initial limit (after the circuit closed: the receiver just recovered).
    pub fn reset(&mut self, max: u32) {
        *self = Self::new(max);
    }

    /// Continues from a limit a previous owner learned.
    pub fn restore(&mut self, limit: u32, max: u32) {
        self.limit = limit.clamp(1, max.max(1));
    }

    /// A success; `slow` when its latency was close to the timeout.
    pub fn on_success(&mut self, slow: bool, max: u32) {
        if slow {
            self.success_run = 0;
            self.slow_run += 1;
            if self.slow_run >= self.limit {
                self.slow_run = 0;
                self.limit = self.limit.saturating_sub(1).max(1);
            }
        } else {
            self.slow_run = 0;
            self.success_run += 1;
            if self.success_run >= self.limit {
                self.success_run = 0;
                self.limit = (self.limit + 1).min(max.max(1));
            }
        }
    }

    /// A failure; `congestion` (timeout, 429/503, 5xx) halves the limit.
    pub fn on_failure(&mut self, congestion: bool) {
        self.success_run = 0;
        if congestion {
            self.limit = (self.limit / 2).max(1);
        }
    }

    #[cfg(test)]
    pub fn set(&mut self, limit: u32) {
        self.limit = limit;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn additive_increase_multiplicative_decrease() {
        let mut l = Limiter::new(10);
        assert_eq!(l.limit(), INITIAL_LIMIT);
        for _ in 0..4 {
            l.on_success(false, 10);
        }
        assert_eq!(l.limit(), 5, "a window of `limit` successes adds one");
        l.on_failure(true);
        assert_eq!(l.limit(), 2, "congestion halves");
        l.on_failure(false);
        assert_eq!(l.limit(), 2, "a 4xx is not congestion");
        for _ in 0..1000 {
            l.on_success(false, 10);
        }
        assert_eq!(l.limit(), 10, "never above maxInFlight");
        for _ in 0..10 {
            l.on_failure(true);
        }
        assert_eq!(l.limit(), 1, "never below one");
    }

    #[test]
    fn slow_successes_lower_it_by_one_per_window() {
        let mut l = Limiter::new(10);
        for _ in 0..4 {
            l.on_success(true, 10);
        }
        assert_eq!(l.limit(), 3);
        l.clamp(2);
        assert_eq!(l.limit(), 2);
        l.reset(1);
        assert_eq!(l.limit(), 1);
    }
}
