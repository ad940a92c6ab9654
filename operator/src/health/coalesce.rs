//! Pure: decides when an endpoint's newest health may be published into status — at
//! most once per endpoint per interval, always the latest value — and which changes are
//! worth a status write soon ([`material`]) and which only on a slow refresh.
//!
//! Contract: a material change (what a user or a GitOps tool acts on: state, circuit,
//! disabled, success rate, the outcome class of the last delivery — a 200 after a 204 is
//! not a change, a 503 after a 200 is —, a failure run starting or ending, a backlog
//! appearing or draining) is published at most once per
//! [`Pacing::interval`]; a change of gauges alone (which event was last, its latency and
//! time, how large the backlog is, the p95, the concurrency limit) at most once per
//! [`Pacing::refresh`]. An endpoint receiving steady traffic therefore costs one status
//! write per refresh, not one per interval.

use std::collections::HashMap;
use std::time::Duration;

use herald_core::dataplane::{EndpointHealth, EndpointKey};
use tokio::time::Instant;

/// How often one endpoint's status may be written.
#[derive(Clone, Copy, Debug)]
pub struct Pacing {
    /// Shortest time between two publications with a material change.
    pub interval: Duration,
    /// Shortest time between two publications of gauges alone.
    pub refresh: Duration,
}

impl Default for Pacing {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(10),
            refresh: Duration::from_secs(300),
        }
    }
}

/// Whether going from the published `old` to `new` changes something a user acts on
/// (see the module's contract). Absent ↔ present is always material.
pub fn material(old: Option<&EndpointHealth>, new: Option<&EndpointHealth>) -> bool {
    let (Some(old), Some(new)) = (old, new) else {
        return old.is_some() != new.is_some();
    };
    let outcome = |h: &EndpointHealth| h.last_delivery.as_ref().map(|d| d.outcome);
    let draining = |h: &EndpointHealth| h.backlog.unwrap_or(0) > 0;
    (&old.uid, old.generation, old.shard) != (&new.uid, new.generation, new.shard)
        || old.state != new.state
        || old.circuit != new.circuit
        || old.success_permille != new.success_permille
        || old.disabled_reason != new.disabled_reason
        || old.disabled_message != new.disabled_message
        || old.enable_token != new.enable_token
        || old.first_failure_ms != new.first_failure_ms
        || old.oldest_pending_ms.is_some() != new.oldest_pending_ms.is_some()
        || draining(old) != draining(new)
        || outcome(old) != outcome(new)
}

/// Decides when pending health may be published: the pure half of this module.
#[derive(Default)]
pub struct Coalescer {
    pacing: Pacing,
    last: HashMap<EndpointKey, Instant>,
    /// The newest value and how long after the last publication it may go out (boxed:
    /// at steady traffic nearly every endpoint has one, and the table's slots are
    /// allocated for all of them).
    pending: HashMap<EndpointKey, (Option<Box<EndpointHealth>>, Duration)>,
}

impl Coalescer {
    pub fn new(pacing: Pacing) -> Self {
        Self {
            pacing,
            ..Default::default()
        }
    }

    /// Records a new value, `material` or not (compared with what is published); returns
    /// it at once when the endpoint's last publication is long enough ago.
    pub fn offer(
        &mut self,
        key: EndpointKey,
        health: Option<EndpointHealth>,
        material: bool,
        now: Instant,
    ) -> Option<(EndpointKey, Option<EndpointHealth>)> {
        let gap = if material {
            self.pacing.interval
        } else {
            self.pacing.refresh.max(self.pacing.interval)
        };
        let due = self
            .last
            .get(&key)
            .is_none_or(|last| now.duration_since(*last) >= gap);
        if due {
            self.pending.remove(&key);
            self.last.insert(key.clone(), now);
            Some((key, health))
        } else {
            self.pending.insert(key, (health.map(Box::new), gap));
            None
        }
    }

    /// Forgets a pending value: the endpoint went back to what its status shows.
    pub fn cancel(&mut self, key: &EndpointKey) {
        self.pending.remove(key);
    }

    /// Pending values whose interval has passed.
    pub fn due(&mut self, now: Instant) -> Vec<(EndpointKey, Option<EndpointHealth>)> {
        let last = &mut self.last;
        let ready: Vec<EndpointKey> = self
            .pending
            .iter()
            .filter(|(k, (_, gap))| last.get(*k).is_none_or(|t| now.duration_since(*t) >= *gap))
            .map(|(k, _)| k.clone())
            .collect();
        // Forget endpoints quiet for longer than any gap (they are due at once anyway), so
        // the map does not grow with every endpoint ever seen.
        let longest = self.pacing.refresh.max(self.pacing.interval);
        last.retain(|_, t| now.duration_since(*t) < longest);
        ready
            .into_iter()
            .filter_map(|k| {
                let (health, _) = self.pending.remove(&k)?;
                self.last.insert(k.clone(), now);
                Some((k, health.map(|h| *h)))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_core::dataplane::{AttemptOutcome, LastAttempt};

    fn health(permille: u32) -> Option<EndpointHealth> {
        Some(EndpointHealth {
            success_permille: Some(permille),
            ..Default::default()
        })
    }

    const PACING: Pacing = Pacing {
        interval: Duration::from_secs(10),
        refresh: Duration::from_secs(300),
    };

    fn delivered(id: &str, latency_ms: u64, time_ms: u64, status: u16) -> EndpointHealth {
        EndpointHealth {
            uid: "u1".into(),
            state: Some(herald_core::v1alpha1::EndpointState::Active),
            success_permille: Some(1000),
            last_delivery: Some(LastAttempt {
                event_id: id.into(),
                http_status: Some(status),
                outcome: if status < 300 {
                    AttemptOutcome::Success
                } else {
                    AttemptOutcome::HttpError
                },
                latency_ms,
                time_ms,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn only_what_a_user_acts_on_is_material() {
        use herald_core::v1alpha1::{CircuitState, EndpointState};
        let base = delivered("e1", 3, 1_000, 200);
        let with = |f: &dyn Fn(&mut EndpointHealth)| {
            let mut h = base.clone();
            f(&mut h);
            h
        };
        let gauges = [
            with(&|h| {
                h.last_delivery = Some(delivered("e2", 9, 2_000, 204).last_delivery.unwrap())
            }),
            with(&|h| h.p95_latency_ms = Some(40)),
            with(&|h| h.concurrency_limit = Some(7)),
            with(&|h| h.backlog = Some(0)),
        ];
        for new in &gauges {
            assert!(!material(Some(&base), Some(new)), "{new:?}");
        }
        let mut backlogged = with(&|h| h.backlog = Some(3));
        backlogged.oldest_pending_ms = Some(900);
        let flips = [
            with(&|h| h.state = Some(EndpointState::Degraded)),
            with(&|h| h.circuit = Some(CircuitState::Open)),
            with(&|h| h.success_permille = Some(998)),
            with(&|h| h.first_failure_ms = Some(5)),
            with(&|h| {
                h.last_delivery = Some(delivered("e2", 3, 2_000, 500).last_delivery.unwrap())
            }),
            with(&|h| h.disabled_reason = Some(herald_core::dataplane::DisabledReason::Gone)),
            with(&|h| h.uid = "u2".into()),
            backlogged.clone(),
        ];
        for new in &flips {
            assert!(material(Some(&base), Some(new)), "{new:?}");
        }
        let mut more = backlogged.clone();
        more.backlog = Some(30);
        assert!(
            !material(Some(&backlogged), Some(&more)),
            "a larger backlog is a gauge"
        );
        assert!(material(None, Some(&base)));
        assert!(material(Some(&base), None));
        assert!(!material(None, None));
    }

    #[tokio::test(start_paused = true)]
    async fn gauges_alone_wait_for_the_refresh_and_material_changes_do_not() {
        let key = EndpointKey::new("ns", "ep");
        let mut c = Coalescer::new(PACING);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert!(c.offer(key.clone(), health(1), true, t0).is_some());
        // A new last delivery only: not before the refresh, however long it waits.
        assert!(c.offer(key.clone(), health(1), false, at(20)).is_none());
        assert!(c.due(at(60)).is_empty());
        assert!(c.due(at(299)).is_empty());
        assert_eq!(
            c.due(at(300)).len(),
            1,
            "refreshed once the refresh has passed"
        );
        // Then a material change: within the interval, not the refresh.
        assert!(c.offer(key.clone(), health(2), false, at(301)).is_none());
        assert!(c.offer(key.clone(), health(3), true, at(302)).is_none());
        assert_eq!(c.due(at(310)), vec![(key.clone(), health(3))]);
        // Quiet for longer than the refresh: the next change goes out at once.
        assert!(c.offer(key.clone(), health(4), false, at(700)).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn at_most_one_publication_per_interval() {
        let key = EndpointKey::new("ns", "ep");
        let mut c = Coalescer::new(PACING);
        let t0 = Instant::now();
        assert!(c.offer(key.clone(), health(1), true, t0).is_some());
        assert!(
            c.offer(key.clone(), health(2), true, t0 + Duration::from_secs(1))
                .is_none()
        );
        assert!(
            c.offer(key.clone(), health(3), true, t0 + Duration::from_secs(2))
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
                true,
                t0 + Duration::from_secs(11)
            )
            .is_some()
        );
    }
}
