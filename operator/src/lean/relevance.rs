//! Which watch events are worth an endpoint reconcile: a change of its spec, the enable
//! annotation, its finalizers or deletion — not a status change (our own writes).
//!
//! kube-runtime's `predicate_filter` does this with a cache entry per object that holds
//! its name, namespace and uid as strings (about 220 bytes per endpoint); [`Fingerprints`]
//! keeps two `u64`s per endpoint instead (docs/scale.md).
//!
//! Contract: an object passes when its [`relevant`] fingerprint differs from the last one
//! passed for the same namespace and name (so a re-created object, another uid, passes);
//! a deletion forgets it; a relist (`Init` … `InitDone`) forgets whatever it did not list
//! again, so nothing is kept for an object deleted while the watch was down.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use futures::{Stream, StreamExt};
use herald_core::names;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

use super::cached::Guarded;

/// What makes an endpoint worth reconciling: its spec (generation), the enable
/// annotation, its finalizers, deletion and uid.
pub fn relevant(obj: &Guarded) -> u64 {
    let mut hasher = DefaultHasher::new();
    obj.meta().generation.hash(&mut hasher);
    obj.annotations()
        .get(names::ENABLE_ANNOTATION)
        .hash(&mut hasher);
    obj.meta()
        .deletion_timestamp
        .as_ref()
        .map(|t| t.0.as_nanosecond())
        .hash(&mut hasher);
    // A decoded endpoint keeps its uid and finalizer compactly (`cached::slim`).
    match &obj.0 {
        Ok(cached) => (cached.finalizers(), cached.uid()).hash(&mut hasher),
        Err(_) => (obj.finalizers(), &obj.meta().uid).hash(&mut hasher),
    }
    hasher.finish()
}

fn key(obj: &Guarded) -> u64 {
    let mut hasher = DefaultHasher::new();
    (&obj.meta().namespace, &obj.meta().name).hash(&mut hasher);
    hasher.finish()
}

/// The fingerprint last passed per object (by a hash of namespace and name).
#[derive(Default)]
pub struct Fingerprints {
    passed: HashMap<u64, u64>,
    /// During a relist: what was known before it, not listed again yet.
    before: Option<HashMap<u64, u64>>,
}

impl Fingerprints {
    /// The object of `event` if it should be reconciled.
    pub fn filter(&mut self, event: watcher::Event<Guarded>) -> Option<Guarded> {
        match event {
            watcher::Event::Apply(obj) | watcher::Event::InitApply(obj) => {
                let (key, print) = (key(&obj), relevant(&obj));
                let last = match self.before.as_mut() {
                    Some(before) => before.remove(&key).or(self.passed.get(&key).copied()),
                    None => self.passed.get(&key).copied(),
                };
                self.passed.insert(key, print);
                (last != Some(print)).then_some(obj)
            }
            watcher::Event::Delete(obj) => {
                self.passed.remove(&key(&obj));
                None
            }
            watcher::Event::Init => {
                let known = std::mem::take(&mut self.passed);
                self.before = Some(known);
                None
            }
            watcher::Event::InitDone => {
                self.before = None;
                None
            }
        }
    }

    pub fn len(&self) -> usize {
        self.passed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.passed.is_empty()
    }
}

/// The objects of `events` worth reconciling (errors passed on).
pub fn changed(
    events: impl Stream<Item = Result<watcher::Event<Guarded>, watcher::Error>>,
) -> impl Stream<Item = Result<Guarded, watcher::Error>> {
    let mut prints = Fingerprints::default();
    events.filter_map(move |event| {
        let out = match event {
            Ok(event) => prints.filter(event).map(Ok),
            Err(error) => Some(Err(error)),
        };
        std::future::ready(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ep(name: &str, uid: &str, generation: i64, status: &str) -> Guarded {
        serde_json::from_value(json!({
            "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookEndpoint",
            "metadata": {"name": name, "namespace": "shop", "uid": uid,
                "generation": generation},
            "spec": {"url": "https://hooks.example.com/", "eventTypes": ["order.*"],
                "secretRef": {"name": "s"}},
            "status": {"successRate": status}
        }))
        .unwrap()
    }

    /// Feeds `steps` in order: each event, whether it passes, and why.
    fn run(steps: Vec<(watcher::Event<Guarded>, bool, &str)>) -> Fingerprints {
        let mut prints = Fingerprints::default();
        for (event, passes, why) in steps {
            assert_eq!(prints.filter(event).is_some(), passes, "{why}");
        }
        prints
    }

    #[test]
    fn spec_changes_pass_and_status_changes_do_not() {
        use watcher::Event::{Apply, Delete};
        let mut enabled = ep("a", "u1", 2, "2%");
        enabled.meta_mut().annotations =
            Some([(names::ENABLE_ANNOTATION.to_owned(), "1".to_owned())].into());
        let prints = run(vec![
            (Apply(ep("a", "u1", 1, "1%")), true, "first seen"),
            (Apply(ep("a", "u1", 1, "2%")), false, "status only"),
            (Apply(ep("a", "u1", 2, "2%")), true, "new generation"),
            (Apply(enabled), true, "enable annotation"),
            (Apply(ep("b", "u2", 1, "")), true, "another object"),
            (Apply(ep("a", "u3", 1, "")), true, "re-created"),
            (Delete(ep("a", "u3", 1, "")), false, "deleted"),
            (Delete(ep("b", "u2", 1, "")), false, "deleted"),
        ]);
        assert!(prints.is_empty(), "deletions are forgotten");
    }

    #[test]
    fn a_relist_passes_only_changes_and_forgets_what_it_did_not_list() {
        use watcher::Event::{Apply, Init, InitApply, InitDone};
        let prints = run(vec![
            (Apply(ep("a", "a", 1, "")), true, "first seen"),
            (Apply(ep("b", "b", 1, "")), true, "first seen"),
            (Apply(ep("c", "c", 1, "")), true, "first seen"),
            (Init, false, "relist"),
            (InitApply(ep("a", "a", 1, "x")), false, "unchanged"),
            (InitApply(ep("b", "b", 2, "")), true, "changed meanwhile"),
            (InitDone, false, "relisted"),
        ]);
        assert_eq!(prints.len(), 2, "c was deleted while the watch was down");
    }
}
