//! The failure clock and the disabled state: how many attempts failed in a row, since
//! when the endpoint has had no success (behind `disableAfter`), and whether it is
//! disabled (by 410 Gone or sustained failure) until a new enable token arrives.

use herald_core::dataplane::DisabledReason;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FailureClock {
    streak: u32,
    since_ms: Option<u64>,
}

impl FailureClock {
    /// Continues a clock that was persisted (restart or handover).
    pub fn restore(since_ms: Option<u64>) -> Self {
        Self {
            streak: 0,
            since_ms,
        }
    }

    pub fn streak(&self) -> u32 {
        self.streak
    }

    /// Unix milliseconds since which no attempt succeeded.
    pub fn since_ms(&self) -> Option<u64> {
        self.since_ms
    }

    pub fn on_success(&mut self) {
        *self = Self::default();
    }

    /// A failure at `now_ms`; returns the streak.
    pub fn on_failure(&mut self, now_ms: u64) -> u32 {
        self.streak += 1;
        self.since_ms.get_or_insert(now_ms);
        self.streak
    }
}

/// Why and since when an endpoint is disabled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disabled {
    pub reason: DisabledReason,
    pub message: String,
    /// The enable token in force when it was disabled; a new one re-enables.
    pub token: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_starts_at_the_first_failure_and_a_success_stops_it() {
        let mut c = FailureClock::default();
        assert_eq!(c.on_failure(100), 1);
        assert_eq!(c.on_failure(200), 2);
        assert_eq!(c.since_ms(), Some(100));
        c.on_success();
        assert_eq!((c.streak(), c.since_ms()), (0, None));
        assert_eq!(FailureClock::restore(Some(7)).since_ms(), Some(7));
    }
}
