//! Which replay requests exist, for the shards: an item queued by a deleted replay is
//! not attempted. Written by the replay runners, read by every shard's dispatch turn.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{PoisonError, RwLock};

/// The replay requests that exist (key → uid), as the runners watch them: an item of a
/// replay that is not among them once the watch has loaded belongs to a deleted replay
/// and is not attempted. Before the watch has loaded, nothing counts as withdrawn.
#[derive(Debug, Default)]
pub struct Live {
    requests: RwLock<HashMap<String, String>>,
    loaded: AtomicBool,
}

impl Live {
    pub(super) fn put(&self, key: &str, uid: &str) {
        let mut requests = self
            .requests
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        requests.insert(key.to_owned(), uid.to_owned());
    }

    pub(super) fn delete(&self, key: &str) {
        let mut requests = self
            .requests
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        requests.remove(key);
    }

    pub(super) fn mark_loaded(&self) {
        self.loaded.store(true, Ordering::Release);
    }

    /// Whether the replay `uid` is known to be deleted.
    pub fn withdrawn(&self, uid: &str) -> bool {
        if !self.loaded.load(Ordering::Acquire) {
            return false;
        }
        let requests = self.requests.read().unwrap_or_else(PoisonError::into_inner);
        !requests.values().any(|live| live == uid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deleted_replay_counts_as_withdrawn_only_once_the_requests_are_loaded() {
        let live = Live::default();
        live.put("replay.shop.a", "uid-a");
        assert!(
            !live.withdrawn("uid-gone"),
            "not loaded: nothing is withdrawn"
        );
        live.mark_loaded();
        assert!(live.withdrawn("uid-gone"));
        assert!(!live.withdrawn("uid-a"));
        live.delete("replay.shop.a");
        assert!(live.withdrawn("uid-a"));
        // The same name again is a new replay: the old uid stays withdrawn.
        live.put("replay.shop.a", "uid-a2");
        assert!(live.withdrawn("uid-a"));
        assert!(!live.withdrawn("uid-a2"));
    }
}
