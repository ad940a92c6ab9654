//! Finding a KV watch that fell silent. A watch's consumer is a single replica on one
//! NATS node; when that node is lost the client notices only after two missed idle
//! heartbeats (10 s), and meanwhile the watch delivers nothing. Every [`PROBE`] the
//! watcher asks the server for the newest revision among the keys it watches: when at
//! the previous look the bucket held one the watch had not delivered, and it delivered
//! nothing since, the watch is silent and is started again from the next revision.

use std::time::Duration;

use async_nats::jetstream::kv;
use async_nats::jetstream::stream::LastRawMessageErrorKind;

/// How often a watcher looks.
pub const PROBE: Duration = Duration::from_millis(500);

/// What one look saw: the newest revision the watch had delivered, and the newest stored
/// among the keys it watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    pub seen: u64,
    pub stored: u64,
}

/// Whether the watch fell silent: at the previous probe the bucket held a revision the
/// watch had not delivered, and it delivered nothing since. A watch that is merely busy
/// (reading a large bucket, one entry after another) keeps moving and is left alone.
pub fn silent(previous: Option<Probe>, now: Probe) -> bool {
    previous.is_some_and(|before| before.stored > before.seen && now.seen == before.seen)
}

/// The looks of one watch.
#[derive(Debug, Default)]
pub struct Silence {
    previous: Option<Probe>,
}

impl Silence {
    /// Looks at the newest revision among `filter`'s keys in `store`; true when a watch
    /// that delivered up to `seen` fell silent (and must be started again from
    /// `seen + 1`). No answer within [`PROBE`] (a stream electing its leader) is no look.
    pub async fn check(&mut self, store: &kv::Store, filter: &str, seen: u64) -> Option<u64> {
        let stored = newest(store, filter).await?;
        let now = Probe { seen, stored };
        if silent(self.previous, now) {
            self.previous = None;
            Some(stored)
        } else {
            self.previous = Some(now);
            None
        }
    }
}

/// The newest revision among the keys of `store` that match `filter` (a key or a
/// wildcard), asked of the server; 0 when there is none; `None` when it does not answer
/// within [`PROBE`].
async fn newest(store: &kv::Store, filter: &str) -> Option<u64> {
    let subject = format!("{}{filter}", store.prefix);
    let last = tokio::time::timeout(
        PROBE,
        store.stream.get_last_raw_message_by_subject(&subject),
    )
    .await
    .ok()?;
    match last {
        Ok(message) => Some(message.sequence),
        Err(error) if error.kind() == LastRawMessageErrorKind::NoMessageFound => Some(0),
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::{Probe, silent};

    fn probe(seen: u64, stored: u64) -> Probe {
        Probe { seen, stored }
    }

    #[test]
    fn a_watch_behind_the_bucket_that_delivers_nothing_between_two_probes_is_silent() {
        assert!(silent(Some(probe(7, 9)), probe(7, 9)));
        // More was stored meanwhile: still silent.
        assert!(silent(Some(probe(7, 9)), probe(7, 12)));
    }

    #[test]
    fn a_watch_that_moves_or_has_everything_is_not_silent() {
        // Caught up at the previous probe; what was stored since may be on its way.
        assert!(!silent(Some(probe(9, 9)), probe(9, 10)));
        // Behind, but it delivered something since: a large bucket being read.
        assert!(!silent(Some(probe(7, 900)), probe(300, 900)));
        // The first probe has nothing to compare with.
        assert!(!silent(None, probe(0, 900)));
    }
}
