//! Kubernetes Events (`events.k8s.io/v1`), published the way kube-runtime's `Recorder`
//! publishes them — a repeat of the same event about the same object within
//! [`SERIES_WINDOW`] raises the count of one Event instead of creating another — with a
//! bounded memory of what was published.
//!
//! Why not `Recorder` itself: it keeps every Event it published, whole (about 1.7 KB
//! each), for six minutes, and forgets them only when it publishes again. Herald
//! publishes one Event per endpoint that becomes Ready, so creating 20,000 endpoints left
//! some 12,000 Events in memory — a fifth of the operator's memory per endpoint
//! (docs/scale.md). Here a published Event costs a [`Recent`] entry (its key's hash, name,
//! count and time; under 100 bytes), at most [`RECENT`] of them: client-go's recorder
//! keeps an LRU of 4,096 for the same purpose.
//!
//! Contract: the Event written is the one `Recorder` writes (reporting controller and
//! instance, action, reason, note, `regarding`, `eventTime`, name `<object>.<nanos hex>`
//! in the object's namespace); a repeat within the window is a merge patch of
//! `series` (count from 2, `lastObservedTime`); failures are the caller's to log.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::{Api, Client};
use serde_json::json;

/// How long a repeat counts as the same Event (kube-runtime's and client-go's window).
pub const SERIES_WINDOW: SignedDuration = SignedDuration::from_mins(6);

/// At most this many published Events are remembered for series.
pub const RECENT: usize = 4096;

/// What is remembered of one published Event.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    name: Box<str>,
    count: i32,
    last: Timestamp,
}

/// The published Events of the last [`SERIES_WINDOW`], at most `capacity` of them (pure:
/// time is passed in).
#[derive(Debug)]
pub struct Recent {
    capacity: usize,
    seen: HashMap<u64, Seen>,
}

/// What to write for an Event.
#[derive(Debug, PartialEq)]
pub enum Write {
    /// A new Event with this name.
    Create(Box<str>),
    /// Raise the series of the Event with this name to `count`.
    Repeat { name: Box<str>, count: i32 },
}

impl Recent {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            seen: HashMap::new(),
        }
    }

    /// What to write for an Event with `key` (a hash of what makes two Events the same)
    /// about the object named `object` at `now`.
    pub fn write(&self, key: u64, object: &str, now: Timestamp) -> Write {
        match self.seen.get(&key) {
            Some(seen) if seen.last + SERIES_WINDOW > now => Write::Repeat {
                name: seen.name.clone(),
                count: seen.count.saturating_add(1),
            },
            _ => Write::Create(format!("{object}.{:x}", now.as_nanosecond()).into()),
        }
    }

    /// Remembers a written Event, forgetting expired ones and, when full, the oldest.
    pub fn written(&mut self, key: u64, write: Write, now: Timestamp) {
        let (name, count) = match write {
            Write::Create(name) => (name, 1),
            Write::Repeat { name, count } => (name, count),
        };
        if !self.seen.contains_key(&key) && self.seen.len() >= self.capacity {
            self.seen.retain(|_, s| s.last + SERIES_WINDOW > now);
            if self.seen.len() >= self.capacity {
                let oldest = self
                    .seen
                    .iter()
                    .min_by_key(|(_, s)| s.last)
                    .map(|(k, _)| *k);
                if let Some(oldest) = oldest {
                    self.seen.remove(&oldest);
                }
            }
        }
        self.seen.insert(
            key,
            Seen {
                name,
                count,
                last: now,
            },
        );
    }

    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

/// Publishes Events as one reporter.
pub struct Publisher {
    client: Client,
    reporter: Reporter,
    recent: Mutex<Recent>,
}

impl Publisher {
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter,
            recent: Mutex::new(Recent::new(RECENT)),
        }
    }

    /// What makes two Events the same one (kube-runtime's key: not the note).
    fn key(&self, ev: &Event, regarding: &ObjectReference) -> u64 {
        let mut h = DefaultHasher::new();
        matches!(ev.type_, EventType::Warning).hash(&mut h);
        (&ev.action, &ev.reason).hash(&mut h);
        let r = regarding;
        (&r.api_version, &r.kind, &r.namespace, &r.name, &r.uid).hash(&mut h);
        h.finish()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recent> {
        // Every operation leaves the map consistent: a poisoned lock is still usable.
        self.recent.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publishes `ev` about `regarding`.
    pub async fn publish(
        &self,
        ev: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let key = self.key(ev, regarding);
        let object = regarding
            .name
            .as_deref()
            .unwrap_or(&self.reporter.controller);
        let write = self.lock().write(key, object, now);
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), namespace);
        match &write {
            Write::Create(name) => {
                let event = K8sEvent {
                    action: Some(ev.action.clone()),
                    reason: Some(ev.reason.clone()),
                    event_time: Some(MicroTime(now)),
                    regarding: Some(regarding.clone()),
                    note: ev.note.clone(),
                    metadata: ObjectMeta {
                        namespace: regarding.namespace.clone(),
                        name: Some(name.to_string()),
                        ..Default::default()
                    },
                    reporting_controller: Some(self.reporter.controller.clone()),
                    reporting_instance: Some(
                        self.reporter
                            .instance
                            .clone()
                            .unwrap_or_else(|| self.reporter.controller.clone()),
                    ),
                    type_: Some(
                        match ev.type_ {
                            EventType::Normal => "Normal",
                            EventType::Warning => "Warning",
                        }
                        .into(),
                    ),
                    related: ev.secondary.clone(),
                    ..Default::default()
                };
                api.create(&PostParams::default(), &event).await?;
            }
            Write::Repeat { name, count } => {
                let patch = json!({
                    "series": {"count": count, "lastObservedTime": MicroTime(now)}
                });
                api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
            }
        }
        self.lock().written(key, write, now);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).unwrap()
    }

    #[test]
    fn a_repeat_within_the_window_raises_the_series_of_the_same_event() {
        let mut recent = Recent::new(8);
        let first = recent.write(1, "orders", at(1_000));
        let Write::Create(name) = &first else {
            panic!("{first:?}")
        };
        assert!(name.starts_with("orders."), "{name}");
        let name = name.clone();
        recent.written(1, first, at(1_000));
        for (i, t) in [1_100, 1_300].into_iter().enumerate() {
            let again = recent.write(1, "orders", at(t));
            let count = i32::try_from(i).unwrap() + 2;
            assert_eq!(
                again,
                Write::Repeat {
                    name: name.clone(),
                    count
                }
            );
            recent.written(1, again, at(t));
        }
        // Six minutes after the last one: a new Event.
        assert!(matches!(
            recent.write(1, "orders", at(1_300 + 360)),
            Write::Create(_)
        ));
        assert!(matches!(
            recent.write(2, "orders", at(1_301)),
            Write::Create(_)
        ));
    }

    #[test]
    fn memory_is_bounded_forgetting_expired_then_oldest() {
        let mut recent = Recent::new(3);
        for key in 0..3 {
            let w = recent.write(key, "o", at(1_000 + key as i64));
            recent.written(key, w, at(1_000 + key as i64));
        }
        // Full, nothing expired: the oldest (key 0) goes.
        let w = recent.write(9, "o", at(1_010));
        recent.written(9, w, at(1_010));
        assert_eq!(recent.len(), 3);
        assert!(matches!(recent.write(0, "o", at(1_011)), Write::Create(_)));
        assert!(matches!(
            recent.write(1, "o", at(1_011)),
            Write::Repeat { .. }
        ));
        // Later, everything but the newest has expired: all of it is forgotten at once.
        let late = at(1_010 + 361);
        let w = recent.write(7, "o", late);
        recent.written(7, w, late);
        assert_eq!(recent.len(), 1);
        // A repeat of a remembered key does not evict anything.
        let w = recent.write(7, "o", late);
        recent.written(7, w, late);
        assert_eq!(recent.len(), 1);
    }
}
