//! Pure: decides when an endpoint's newest health may be published into status — at
//! most once per endpoint per interval, always the latest value — and which changes are
//! worth a status write soon ([`Prints::material`]) and which only on a slow refresh.
//!
//! Contract: a material change (what a user or a GitOps tool acts on: state, circuit,
//! disabled, success rate, the outcome class of the last delivery — a 200 after a 204 is
//! not a change, a 503 after a 200 is —, a failure run starting or ending, a backlog
//! appearing or draining) is published at most once per
//! [`Pacing::interval`]; a change of gauges alone (which event was last, its latency and
//! time, how large the backlog is, the p95, the concurrency limit) at most once per
//! [`Pacing::refresh`]. An endpoint receiving steady traffic therefore costs one status
//! write per refresh, not one per interval.
//!
//! It keeps no health record, only [`Prints`] of them (two `u64`s): what status shows,
//! and the newest while it waits. The health writer reads the record itself from the
//! bucket when it renders (`super::writer`), so the operator's memory per endpoint does
//! not hold one or two copies of every endpoint's health (docs/scale.md).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
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

impl Pacing {
    /// How long after a publication the next may go out.
    fn gap(&self, material: bool) -> Duration {
        if material {
            self.interval
        } else {
            self.refresh.max(self.interval)
        }
    }
}

impl Default for Pacing {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(10),
            refresh: Duration::from_secs(300),
        }
    }
}

/// Fingerprints of one health record (or of none): equal records have equal prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prints {
    /// Of the whole record.
    pub all: u64,
    /// Of what a user acts on (see the module's contract).
    pub material: u64,
}

fn hash(value: &impl Hash) -> u64 {
    let mut hasher = DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

impl Prints {
    /// The prints of `health` (`None`: no record).
    pub fn of(health: Option<&EndpointHealth>) -> Self {
        let Some(h) = health else {
            return Self {
                all: 0,
                material: 0,
            };
        };
        let material = (
            1u8,
            (&h.uid, h.generation, h.shard),
            (h.state, h.circuit),
            h.success_permille,
            h.disabled_reason,
            (&h.disabled_message, &h.enable_token),
            h.first_failure_ms,
            h.oldest_pending_ms.is_some(),
            h.backlog.unwrap_or(0) > 0,
            h.last_delivery.as_ref().map(|d| d.outcome),
        );
        Self {
            all: hash(&(1u8, serde_json::to_vec(h).unwrap_or_default())),
            material: hash(&material),
        }
    }

    /// Whether going from `self` (shown) to `new` changes something a user acts on.
    pub fn material(&self, new: &Prints) -> bool {
        self.material != new.material
    }
}

/// What is known of one endpoint (48 bytes: one per endpoint with health).
#[derive(Debug)]
pub struct Slot {
    /// Of the record status shows (or is about to: published, not rendered yet).
    shown: Prints,
    /// The newest record while it waits (see `flags`).
    pending: Prints,
    /// What the writer rendered from last time (`Cached::inputs`; 0: nothing yet), so a
    /// trigger that changes none of it (its own status write coming back) renders
    /// nothing.
    rendered: u64,
    /// When a record was last published: [`Coalescer::tick`] + 1 (0: never).
    last: u32,
    /// [`WAITING`], [`MATERIAL`] (what waits may go out an interval after `last`, else a
    /// refresh after it), [`DUE`] (published, the writer has not rendered it yet).
    flags: u8,
}

const WAITING: u8 = 1;
const MATERIAL: u8 = 2;
const DUE: u8 = 4;

impl Default for Slot {
    fn default() -> Self {
        Self {
            shown: Prints::of(None),
            pending: Prints::of(None),
            rendered: 0,
            last: 0,
            flags: 0,
        }
    }
}

impl Slot {
    fn waiting(&self) -> Option<(Prints, bool)> {
        (self.flags & WAITING != 0).then_some((self.pending, self.flags & MATERIAL != 0))
    }

    fn wait(&mut self, prints: Prints, material: bool) {
        self.pending = prints;
        self.flags = (self.flags & DUE) | WAITING | if material { MATERIAL } else { 0 };
    }

    fn cancel(&mut self) {
        self.flags &= DUE;
    }
}

/// Decides when pending health may be published: the pure half of this module.
pub struct Coalescer {
    pacing: Pacing,
    slots: HashMap<EndpointKey, Slot>,
    /// Times are kept as tenths of a second since this.
    epoch: Instant,
}

/// The resolution of publication times.
const TICK: Duration = Duration::from_millis(100);

impl Coalescer {
    pub fn new(pacing: Pacing) -> Self {
        Self {
            pacing,
            slots: HashMap::new(),
            epoch: Instant::now(),
        }
    }

    /// `now` in tenths of a second since the epoch (a `u32` lasts 13 years).
    fn tick(&self, now: Instant) -> u32 {
        let ticks = now.saturating_duration_since(self.epoch).as_millis() / TICK.as_millis();
        u32::try_from(ticks).unwrap_or(u32::MAX - 1)
    }

    /// Whether a publication may go out at `now` after the one at `last`.
    fn passed(&self, last: u32, now: Instant, material: bool) -> bool {
        let Some(at) = last.checked_sub(1) else {
            return true;
        };
        let since = self.tick(now).saturating_sub(at);
        TICK * since >= self.pacing.gap(material)
    }

    /// Records the prints of a new record; returns the key when it is published at once
    /// (its endpoint's last publication is long enough ago). A record equal to what
    /// status shows cancels whatever was waiting.
    pub fn offer(&mut self, key: EndpointKey, new: Prints, now: Instant) -> Option<EndpointKey> {
        let (shown, last) = match self.slots.get(&key) {
            Some(slot) => (slot.shown, slot.last),
            None => (Prints::of(None), 0),
        };
        if new == shown {
            if let Some(slot) = self.slots.get_mut(&key) {
                slot.cancel();
            }
            return None;
        }
        let material = shown.material(&new);
        if self.passed(last, now, material) {
            self.publish(key, new, now)
        } else {
            self.slots.entry(key).or_default().wait(new, material);
            None
        }
    }

    /// Marks `key` published with `prints`; a record that is gone forgets the endpoint.
    fn publish(&mut self, key: EndpointKey, prints: Prints, now: Instant) -> Option<EndpointKey> {
        if prints == Prints::of(None) {
            self.slots.remove(&key);
            return Some(key);
        }
        let last = self.tick(now) + 1;
        let slot = self.slots.entry(key.clone()).or_default();
        slot.shown = prints;
        slot.last = last;
        slot.flags = DUE;
        Some(key)
    }

    /// The endpoints whose waiting record may go out now, marked published.
    pub fn due(&mut self, now: Instant) -> Vec<EndpointKey> {
        let ready: Vec<(EndpointKey, Prints)> = self
            .slots
            .iter()
            .filter_map(|(key, slot)| {
                let (prints, material) = slot.waiting()?;
                self.passed(slot.last, now, material)
                    .then(|| (key.clone(), prints))
            })
            .collect();
        ready
            .into_iter()
            .filter_map(|(key, prints)| self.publish(key, prints, now))
            .collect()
    }

    /// The writer starts on `key` with `inputs`: whether it must render (something was
    /// published, or what it renders from changed since it last did) and the endpoint's
    /// key as held here, to share rather than allocate again.
    pub fn begin(&mut self, key: &EndpointKey, inputs: u64) -> (bool, EndpointKey) {
        match self.slots.get_key_value(key) {
            Some((held, slot)) => {
                let render = slot.flags & DUE != 0 || slot.rendered == 0 || slot.rendered != inputs;
                let held = held.clone();
                if let Some(slot) = self.slots.get_mut(key) {
                    slot.flags &= !DUE;
                }
                (render, held)
            }
            None => (true, key.clone()),
        }
    }

    /// The writer rendered `key` from `inputs` and the record with `prints`, and status
    /// now shows it. An endpoint without a record is not remembered: rendering it again
    /// reads nothing that could be early.
    pub fn rendered(&mut self, key: EndpointKey, inputs: u64, prints: Prints) {
        if prints == Prints::of(None) {
            if let Some(slot) = self.slots.get_mut(&key) {
                slot.rendered = inputs;
            }
            return;
        }
        let slot = self.slots.entry(key).or_default();
        slot.shown = prints;
        slot.rendered = inputs;
        if slot.waiting().is_some_and(|(waiting, _)| waiting == prints) {
            slot.cancel();
        }
    }

    /// The writer failed on `key`: it renders again on its retry.
    pub fn failed(&mut self, key: &EndpointKey) {
        if let Some(slot) = self.slots.get_mut(key) {
            slot.flags |= DUE;
        }
    }

    /// Endpoints known.
    #[cfg(test)]
    fn known(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_core::dataplane::{AttemptOutcome, LastAttempt};

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

    fn material(old: Option<&EndpointHealth>, new: Option<&EndpointHealth>) -> bool {
        Prints::of(old).material(&Prints::of(new))
    }

    /// A record that differs from `delivered("e0", ..)` in gauges only (`n` > 0).
    fn gauge(n: u64) -> Prints {
        Prints::of(Some(&delivered(&format!("e{n}"), n, n * 1000, 200)))
    }

    /// A record that differs from the gauges' in something material.
    fn flip(permille: u32) -> Prints {
        let mut h = delivered("e0", 0, 0, 200);
        h.success_permille = Some(permille);
        Prints::of(Some(&h))
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
            assert_ne!(Prints::of(Some(&base)), Prints::of(Some(new)), "{new:?}");
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
        assert_eq!(Prints::of(Some(&base)), Prints::of(Some(&base.clone())));
    }

    #[tokio::test(start_paused = true)]
    async fn gauges_alone_wait_for_the_refresh_and_material_changes_do_not() {
        let key = EndpointKey::new("ns", "ep");
        let mut c = Coalescer::new(PACING);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert!(c.offer(key.clone(), gauge(1), t0).is_some());
        // A new last delivery only: not before the refresh, however long it waits.
        assert!(c.offer(key.clone(), gauge(2), at(20)).is_none());
        assert!(c.due(at(60)).is_empty());
        assert!(c.due(at(299)).is_empty());
        assert_eq!(
            c.due(at(300)).len(),
            1,
            "refreshed once the refresh has passed"
        );
        // Then a material change: within the interval, not the refresh.
        assert!(c.offer(key.clone(), gauge(3), at(301)).is_none());
        assert!(c.offer(key.clone(), flip(990), at(302)).is_none());
        assert_eq!(c.due(at(310)), vec![key.clone()]);
        assert_eq!(
            c.slots[&key].shown,
            flip(990),
            "the newest is what went out"
        );
        // Quiet for longer than the refresh: the next change goes out at once.
        assert!(c.offer(key.clone(), flip(980), at(700)).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn at_most_one_publication_per_interval() {
        let key = EndpointKey::new("ns", "ep");
        let mut c = Coalescer::new(PACING);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert!(c.offer(key.clone(), flip(1), t0).is_some());
        assert!(c.offer(key.clone(), flip(2), at(1)).is_none());
        assert!(c.offer(key.clone(), flip(3), at(2)).is_none());
        assert!(c.due(at(9)).is_empty());
        assert_eq!(c.due(at(10)), vec![key.clone()]);
        assert_eq!(c.slots[&key].shown, flip(3), "only the latest is published");
        assert!(c.due(at(30)).is_empty());
        // Back to what status shows: nothing waits any more.
        assert!(c.offer(key.clone(), flip(4), at(12)).is_none());
        assert!(c.offer(key.clone(), flip(3), at(13)).is_none());
        assert!(c.due(at(60)).is_empty());
        // Other endpoints are not held back.
        let other = EndpointKey::new("ns", "other");
        assert!(c.offer(other, flip(5), at(11)).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn the_writer_renders_what_was_published_or_changed_and_nothing_else() {
        let key = EndpointKey::new("ns", "ep");
        let mut c = Coalescer::new(PACING);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        // Never rendered: render.
        assert!(c.begin(&key, 7).0);
        assert_eq!(c.known(), 0, "an endpoint without health is not remembered");
        let published = c.offer(key.clone(), gauge(1), t0).unwrap();
        assert!(c.begin(&key, 7).0, "published");
        c.rendered(published, 7, gauge(1));
        // Its own write coming back (same inputs, nothing published): nothing.
        assert!(!c.begin(&key, 7).0);
        // A gauge waiting for the refresh does not sneak out with another trigger …
        assert!(c.offer(key.clone(), gauge(2), at(20)).is_none());
        assert!(!c.begin(&key, 7).0);
        // … but a change of what it renders from does render (with the newest record,
        // which then no longer waits).
        assert!(c.begin(&key, 8).0);
        c.rendered(key.clone(), 8, gauge(2));
        assert!(c.due(at(400)).is_empty(), "rendered already");
        // A failed render is rendered again on the retry.
        assert!(c.offer(key.clone(), flip(900), at(401)).is_some());
        assert!(c.begin(&key, 8).0);
        c.failed(&key);
        assert!(c.begin(&key, 8).0);
        // The record deleted: published once, then the endpoint is forgotten.
        assert_eq!(
            c.offer(key.clone(), Prints::of(None), at(500)),
            Some(key.clone())
        );
        assert_eq!(c.known(), 0);
        assert!(c.begin(&key, 8).0);
    }

    #[test]
    fn what_is_kept_per_endpoint_stays_small() {
        // One per endpoint with health (docs/scale.md): no record, only prints.
        assert!(std::mem::size_of::<Slot>() <= 48);
    }

    #[test]
    fn the_key_is_shared_not_copied() {
        let mut c = Coalescer::new(PACING);
        let key = EndpointKey::new("ns", "ep");
        c.rendered(key.clone(), 1, gauge(1));
        let (_, held) = c.begin(&EndpointKey::new("ns", "ep"), 1);
        assert!(held.shares(&key));
    }
}
