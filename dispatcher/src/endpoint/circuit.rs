//! The circuit breaker: `failureThreshold` consecutive failures open it; while open,
//! one probe per `probeInterval` (half-open); a successful probe closes it, a failed one
//! opens it again.

use std::time::Instant;

use herald_core::v1alpha1::{CircuitBreaker, CircuitState};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Circuit {
    state: CircuitState,
    probe_at: Option<Instant>,
}

impl Default for Circuit {
    fn default() -> Self {
        Self {
            state: CircuitState::Closed,
            probe_at: None,
        }
    }
}

/// What the circuit lets through now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Closed: the adaptive limit applies.
    All,
    /// Half-open or a probe is due: one attempt at a time.
    Probe,
    /// Open: nothing before this instant.
    Until(Instant),
}

impl Circuit {
    pub fn state(&self) -> CircuitState {
        self.state
    }

    pub fn admits(&self, now: Instant) -> Admit {
        match (self.state, self.probe_at) {
            (CircuitState::Closed, _) => Admit::All,
            (CircuitState::Open, Some(at)) if at > now => Admit::Until(at),
            _ => Admit::Probe,
        }
    }

    /// An attempt starts: an open circuit's probe makes it half-open.
    pub fn on_start(&mut self) {
        if self.state == CircuitState::Open {
            self.state = CircuitState::HalfOpen;
        }
    }

    /// A success closes it. Returns whether it was not closed (the receiver recovered).
    pub fn on_success(&mut self) -> bool {
        let recovered = self.state != CircuitState::Closed;
        self.close();
        recovered
    }

    /// A failure, the `streak`-th in a row.
    pub fn on_failure(&mut self, streak: u32, policy: &CircuitBreaker, now: Instant) {
        if self.state == CircuitState::HalfOpen
            || (self.state == CircuitState::Closed && streak >= policy.failure_threshold)
        {
            self.state = CircuitState::Open;
            self.probe_at = Some(now + policy.probe_interval.get());
        }
    }

    pub fn close(&mut self) {
        *self = Self::default();
    }

    /// Brings back a state that was persisted (after a restart or handover): an open
    /// circuit probes at once, so a recovered receiver is found quickly.
    pub fn restore(state: CircuitState) -> Self {
        Self {
            state: match state {
                CircuitState::Closed => CircuitState::Closed,
                _ => CircuitState::Open,
            },
            probe_at: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn opens_at_the_threshold_probes_and_closes() {
        let policy: CircuitBreaker = serde_json::from_value(
            serde_json::json!({"failureThreshold": 3, "probeInterval": "10s"}),
        )
        .unwrap();
        let now = Instant::now();
        let mut c = Circuit::default();
        c.on_failure(2, &policy, now);
        assert_eq!(c.admits(now), Admit::All);
        c.on_failure(3, &policy, now);
        assert_eq!(c.state(), CircuitState::Open);
        assert_eq!(c.admits(now), Admit::Until(now + Duration::from_secs(10)));
        let later = now + Duration::from_secs(10);
        assert_eq!(c.admits(later), Admit::Probe);
        c.on_start();
        assert_eq!(c.state(), CircuitState::HalfOpen);
        c.on_failure(4, &policy, later);
        assert_eq!(
            c.state(),
            CircuitState::Open,
            "a failed probe opens it again"
        );
        c.on_start();
        assert!(c.on_success());
        assert_eq!(c.state(), CircuitState::Closed);
        assert!(!c.on_success());
        assert_eq!(
            Circuit::restore(CircuitState::HalfOpen).admits(now),
            Admit::Probe
        );
    }
}
