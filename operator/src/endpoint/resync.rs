//! The periodic re-check of every endpoint (DNS answers change), as one trigger stream
//! instead of a requeue per endpoint.
//!
//! A reconcile that ended with `Action::requeue(5 min)` kept two copies of the endpoint's
//! reference (name, namespace, uid, resourceVersion) in kube-runtime's scheduler until
//! then: about 700 bytes per endpoint, all the time (docs/scale.md). Here one task walks
//! the store once per [`TICK`] and triggers the endpoints whose uid falls in that tick's
//! slot of [`PERIOD`]: every endpoint is re-checked once per period, spread evenly, and
//! nothing is held per endpoint between two checks.
//!
//! Contract: [`due`] puts each uid in exactly one slot of a period; objects that do not
//! decode (reported once, nothing to re-check) and objects being deleted (the finalizer's
//! cleanup retries on its own) are not triggered.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::reflector::{ObjectRef, Store};

use super::Guarded;

/// How often each endpoint is re-checked.
pub const PERIOD: Duration = Duration::from_secs(300);
/// How often the store is walked.
pub const TICK: Duration = Duration::from_secs(1);

/// Whether the endpoint with `uid` is due in `slot` of `slots`.
pub fn due(uid: &str, slot: u64, slots: u64) -> bool {
    let mut h = DefaultHasher::new();
    uid.hash(&mut h);
    h.finish() % slots.max(1) == slot
}

/// The endpoints of `store` to re-check, a slot at a time, forever.
pub fn triggers(store: Store<Guarded>) -> impl Stream<Item = ObjectRef<Guarded>> + Send {
    let slots = (PERIOD.as_millis() / TICK.as_millis()).max(1) as u64;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + TICK, TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    futures::stream::unfold((tick, 0u64), move |(mut tick, slot)| {
        let store = store.clone();
        async move {
            tick.tick().await;
            let due: Vec<ObjectRef<Guarded>> = store
                .state()
                .iter()
                .filter(|guard| {
                    guard.0.as_ref().is_ok_and(|cached| {
                        cached.metadata.deletion_timestamp.is_none()
                            && due(&cached.uid().unwrap_or_default(), slot, slots)
                    })
                })
                .map(|guard| ObjectRef::from_obj(&**guard))
                .collect();
            Some((futures::stream::iter(due), (tick, (slot + 1) % slots)))
        }
    })
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_uid_is_due_in_exactly_one_slot_and_the_slots_spread() {
        let slots = 300;
        let mut per_slot = vec![0u32; slots as usize];
        for i in 0..30_000 {
            let uid = format!("3f2a1b4c-5d6e-4f70-8a9b-{i:012x}");
            let hits: Vec<u64> = (0..slots).filter(|s| due(&uid, *s, slots)).collect();
            assert_eq!(hits.len(), 1, "{uid}");
            per_slot[hits[0] as usize] += 1;
        }
        // 100 per slot on average; no slot holds three times that.
        assert!(per_slot.iter().all(|n| *n < 300), "{per_slot:?}");
        assert!(due("any", 0, 1));
    }
}
