//! The checks of a soak over what happened: which events each endpoint had to get,
//! requests that came when none should have, retries that came before their schedule.
//! Pure functions of the record of the run and of the receiver's log.

use std::time::{Duration, Instant};

use super::schedule::Role;
use crate::faults::Published;
use crate::receiver::{Answer, Exchange};

/// How long the dispatchers may take to learn of a change (a KV watch, a NATS node that
/// died under the watch and its reconnect) before the checks hold them to it.
pub const GRACE: Duration = Duration::from_secs(5);

/// One life of an endpoint: from its creation to its deletion, on a receiver path of
/// its own (a re-created endpoint of the same name gets a new uid and a new path).
#[derive(Debug, Clone)]
pub struct Life {
    pub role: Role,
    pub path: String,
    /// When its configuration was written; `None`: before the first event.
    pub created: Option<Instant>,
    pub deleted: Option<Instant>,
    /// Paused from, until (`None`: still paused).
    pub pauses: Vec<(Instant, Option<Instant>)>,
}

impl Life {
    /// The events this life had to receive: every accepted event if it existed before
    /// the first one and was never deleted; those accepted from [`GRACE`] after its
    /// creation if it was created later; none if it was deleted (its pending deliveries
    /// were dropped with it).
    pub fn owed(&self, published: &Published) -> Published {
        let mut owed = Published::default();
        if self.deleted.is_some() {
            return owed;
        }
        let from = self.created.map(|at| at + GRACE);
        owed.acked = published
            .acked
            .iter()
            .filter(|(_, a)| from.is_none_or(|from| a.at >= from))
            .map(|(n, a)| (*n, *a))
            .collect();
        owed
    }

    /// Requests that arrived more than [`GRACE`] after the endpoint was deleted or
    /// paused (and before it was resumed).
    pub fn unwanted(&self, exchanges: &[Exchange]) -> Vec<String> {
        let mut found = Vec::new();
        for x in exchanges {
            if let Some(gone) = self.deleted
                && x.at > gone + GRACE
            {
                found.push(format!(
                    "/{}: a request {:.1?} after the endpoint was deleted (event {:?})",
                    self.path,
                    x.at - gone,
                    x.data
                ));
            }
            for (from, until) in &self.pauses {
                if x.at > *from + GRACE && until.is_none_or(|until| x.at < until) {
                    found.push(format!(
                        "/{}: a request {:.1?} into a pause (event {:?})",
                        self.path,
                        x.at - *from,
                        x.data
                    ));
                }
            }
        }
        found
    }
}

/// A change of an endpoint's entry in `herald-config`, as a watch of the bucket saw it.
#[derive(Debug, Clone)]
pub struct ConfigChange {
    pub at: Instant,
    /// The endpoint's URL; `None`: the entry was deleted.
    pub url: Option<String>,
    pub paused: bool,
}

impl Life {
    /// The life as the dispatchers could know it when its changes go through the
    /// operator (`changes`: the endpoint's configuration entry, in order): its creation,
    /// pauses and deletion count from when the entry shows them, never from before the
    /// user made them. A pause the entry never showed (lifted before the operator got to
    /// it) holds the dispatchers to nothing; a creation or deletion it never showed
    /// keeps the user's time (the operator owed it, and a loss or a late request then
    /// shows).
    pub fn as_configured(&self, changes: &[ConfigChange]) -> Life {
        let tail = format!("/{}", self.path);
        let mine = |c: &ConfigChange| c.url.as_deref().is_some_and(|u| u.ends_with(&tail));
        let since = |from: Instant| changes.iter().filter(move |c| c.at >= from);
        let created = self
            .created
            .map(|at| since(at).find(|c| mine(c)).map_or(at, |c| c.at));
        let deleted = self
            .deleted
            .map(|at| since(at).find(|c| !mine(c)).map_or(at, |c| c.at));
        let pauses = self
            .pauses
            .iter()
            .filter_map(|(from, until)| {
                let shown = since(*from)
                    .take_while(|c| until.is_none_or(|until| c.at < until))
                    .find(|c| mine(c) && c.paused)?;
                Some((shown.at, *until))
            })
            .collect();
        Life {
            created,
            deleted,
            pauses,
            ..self.clone()
        }
    }
}

/// Retries of one path that came sooner than the schedule says: after the `k`-th
/// failed request of an event (0-based) the next one is due `schedule[k]` later (the
/// last entry repeats). A pair with a `disruption` (a dispatcher or NATS node killed)
/// between 2 s before the failure and the next request is not judged: a crash loses
/// what was in flight, and the event is delivered again at once, as at-least-once
/// allows. `tolerance` absorbs clock reading.
pub fn early_retries(
    path: &str,
    exchanges: &[Exchange],
    schedule: &[Duration],
    disruptions: &[Instant],
    tolerance: Duration,
) -> Vec<String> {
    let mut by_event: std::collections::HashMap<&str, Vec<&Exchange>> = Default::default();
    for x in exchanges {
        by_event.entry(&x.webhook_id).or_default().push(x);
    }
    let mut found = Vec::new();
    for (id, tries) in by_event {
        let mut failures = 0;
        for pair in tries.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            if !failed(&a.answer) {
                continue;
            }
            let due = schedule[failures.min(schedule.len() - 1)];
            failures += 1;
            let disrupted = disruptions
                .iter()
                .any(|d| *d + Duration::from_secs(2) >= a.at && *d <= b.at);
            let gap = b.at.saturating_duration_since(a.at);
            if !disrupted && gap + tolerance < due {
                found.push(format!(
                    "/{path}: {id} retried {gap:.2?} after a failure, due after {due:?}"
                ));
            }
        }
    }
    found.sort();
    found
}

fn failed(answer: &Answer) -> bool {
    match answer {
        Answer::Status(code) => !(200..300).contains(code),
        Answer::Fault(fault) => fault.fails(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::Accepted;

    fn x(at: Instant, id: &str, status: u16) -> Exchange {
        Exchange {
            at,
            webhook_id: id.to_owned(),
            data: Some(1),
            answer: Answer::Status(status),
        }
    }

    #[test]
    fn a_life_owes_what_was_accepted_after_it_began_and_nothing_once_deleted() {
        let t0 = Instant::now();
        let mut published = Published::default();
        for n in 0..20u64 {
            let at = t0 + Duration::from_secs(n);
            published.acked.insert(n, Accepted { seq: n + 1, at });
        }
        let mut life = Life {
            role: Role::Plain,
            path: "plain-1".into(),
            created: Some(t0 + Duration::from_secs(10)),
            deleted: None,
            pauses: Vec::new(),
        };
        let owed: Vec<u64> = life.owed(&published).acked.keys().copied().collect();
        assert_eq!(owed, (15..20).collect::<Vec<_>>());
        life.created = None;
        assert_eq!(life.owed(&published).acked.len(), 20);
        life.deleted = Some(t0);
        assert!(life.owed(&published).acked.is_empty());
    }

    #[test]
    fn requests_after_a_deletion_or_into_a_pause_are_found() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let life = Life {
            role: Role::Plain,
            path: "plain-0".into(),
            created: None,
            deleted: Some(t0 + s(100)),
            pauses: vec![(t0 + s(10), Some(t0 + s(30)))],
        };
        let ok = [
            x(t0 + s(12), "a", 200),
            x(t0 + s(31), "b", 200),
            x(t0 + s(103), "c", 200),
        ];
        assert!(life.unwanted(&ok).is_empty(), "{:?}", life.unwanted(&ok));
        let bad = [x(t0 + s(20), "a", 200), x(t0 + s(110), "b", 200)];
        assert_eq!(life.unwanted(&bad).len(), 2);
    }

    #[test]
    fn through_the_operator_a_life_counts_from_when_its_configuration_showed_each_change() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let change = |at: u64, url: Option<&str>, paused: bool| ConfigChange {
            at: t0 + s(at),
            url: url.map(str::to_owned),
            paused,
        };
        let asked = Life {
            role: Role::Plain,
            path: "plain-1".into(),
            created: Some(t0 + s(10)),
            deleted: Some(t0 + s(90)),
            pauses: vec![
                (t0 + s(20), Some(t0 + s(40))),
                (t0 + s(50), Some(t0 + s(52))),
            ],
        };
        let changes = [
            // The previous life's entry, then this one's, 3 s late (an operator failover).
            change(1, Some("http://rx/plain-0"), false),
            change(13, Some("http://rx/plain-1"), false),
            change(27, Some("http://rx/plain-1"), true),
            change(41, Some("http://rx/plain-1"), false),
            // The second pause was lifted before the operator wrote it.
            change(95, None, false),
        ];
        let seen = asked.as_configured(&changes);
        assert_eq!(seen.created, Some(t0 + s(13)));
        assert_eq!(seen.pauses, vec![(t0 + s(27), Some(t0 + s(40)))]);
        assert_eq!(seen.deleted, Some(t0 + s(95)));
        // Never shown: the user's times stand.
        let unseen = asked.as_configured(&changes[..1]);
        assert_eq!(unseen.created, asked.created);
        assert_eq!(unseen.deleted, asked.deleted);
        assert!(unseen.pauses.is_empty());
    }

    #[test]
    fn a_retry_before_its_schedule_is_found_unless_a_crash_came_between() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let schedule = [ms(1000), ms(2000)];
        let kept = [
            x(t0, "a", 500),
            x(t0 + ms(1010), "a", 500),
            x(t0 + ms(3020), "a", 200),
        ];
        assert!(early_retries("p", &kept, &schedule, &[], ms(50)).is_empty());
        let early = [
            x(t0, "a", 500),
            x(t0 + ms(1010), "a", 500),
            x(t0 + ms(1100), "a", 200),
        ];
        assert_eq!(early_retries("p", &early, &schedule, &[], ms(50)).len(), 1);
        let crash = [t0 + ms(1050)];
        assert!(early_retries("p", &early, &schedule, &crash, ms(50)).is_empty());
    }
}
