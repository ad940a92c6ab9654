//! Publish order per ordering unit. An `ordered` endpoint's lane must hold its events in
//! publish order, per key for one that orders by key: a unit's next lane publish goes
//! out only once its previous one is acknowledged, and sends the previous one again
//! first if it was not (a publish lost in a NATS leader change, while a later one is
//! stored by the new leader, would otherwise put the later event ahead of it). Publishes
//! of other units, and to endpoints that are not ordered, are pipelined meanwhile: one
//! tenant's ordered endpoint holds back neither its other keys nor its neighbours.

use std::collections::HashMap;
use std::future::IntoFuture;
use std::sync::{Arc, Mutex};

use async_nats::jetstream::context::PublishAckFuture;
use async_nats::jetstream::message::PublishMessage;
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};

/// What one lane publish came to: stored, or why not.
pub(super) type Acked = Result<(), Arc<str>>;

/// A lane publish's acknowledgement, as the acker awaits it.
pub(super) enum LaneAck {
    /// A publish no later one has to wait for.
    Plain(PublishAckFuture),
    /// The publish of an ordering unit, shared with the unit's next publish.
    Ordered(Shared<BoxFuture<'static, Acked>>),
}

impl LaneAck {
    pub(super) async fn stored(self) -> Acked {
        match self {
            Self::Plain(ack) => ack.await.map(drop).map_err(|e| e.to_string().into()),
            Self::Ordered(ack) => ack.await,
        }
    }
}

/// Whose events must not overtake each other: an `ordered` endpoint (by its uid), or one
/// of its keys.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Unit {
    pub uid: String,
    pub key: Option<u64>,
}

/// A unit's last publish: its acknowledgement and what to send again if it failed.
pub(super) struct Tail {
    pub ack: Shared<BoxFuture<'static, Acked>>,
    pub subject: String,
    pub publish: PublishMessage,
}

impl Tail {
    pub(super) fn new(ack: PublishAckFuture, subject: String, publish: PublishMessage) -> Self {
        let ack = ack
            .into_future()
            .map(|r| r.map(drop).map_err(|e| Arc::from(e.to_string())))
            .boxed()
            .shared();
        Self {
            ack,
            subject,
            publish,
        }
    }
}

/// Each unit's last publish while it may still be unacknowledged. Units whose last
/// publish is stored are forgotten now and then, so the table stays as small as the
/// units in flight (keys can be many).
#[derive(Default)]
pub(super) struct Tails {
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    last: HashMap<Unit, Tail>,
    /// The table's size after which stored tails are dropped next.
    prune_at: usize,
}

/// Tails are pruned when the table grows past this, or twice what the last prune left.
const PRUNE_MIN: usize = 1024;

impl Tails {
    /// The unit's last publish, taken out: the caller waits for it and puts back the
    /// unit's new tail (or this one, if it must be tried again).
    pub(super) fn take(&self, unit: &Unit) -> Option<Tail> {
        self.lock().last.remove(unit)
    }

    pub(super) fn put(&self, unit: Unit, tail: Tail) {
        let mut table = self.lock();
        table.last.insert(unit, tail);
        if table.last.len() > table.prune_at.max(PRUNE_MIN) {
            table
                .last
                .retain(|_, tail| !matches!(tail.ack.peek(), Some(Ok(()))));
            table.prune_at = table.last.len() * 2;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        // Nothing panics while holding it; a poisoned table is still consistent.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().last.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(key: u64) -> Unit {
        Unit {
            uid: "uid".into(),
            key: Some(key),
        }
    }

    fn tail(result: Acked) -> Tail {
        Tail {
            ack: futures::future::ready(result).boxed().shared(),
            subject: "s".into(),
            publish: PublishMessage::build(),
        }
    }

    #[tokio::test]
    async fn stored_tails_are_forgotten_and_failed_ones_kept() {
        let tails = Tails::default();
        for key in 0..PRUNE_MIN as u64 {
            let t = tail(Ok(()));
            t.ack.clone().await.unwrap();
            tails.put(unit(key), t);
        }
        let failed = tail(Err("lost".into()));
        assert!(failed.ack.clone().await.is_err());
        tails.put(unit(u64::MAX), failed);
        // Past the bound: every stored tail went, the failed one stayed.
        assert_eq!(tails.len(), 1);
        assert!(tails.take(&unit(u64::MAX)).is_some());
        assert!(tails.take(&unit(0)).is_none());
    }

    #[tokio::test]
    async fn a_tail_not_yet_answered_is_kept() {
        let tails = Tails::default();
        let (_tx, rx) = futures::channel::oneshot::channel::<()>();
        let pending = Tail {
            ack: rx.map(|_| Ok(())).boxed().shared(),
            subject: "s".into(),
            publish: PublishMessage::build(),
        };
        tails.put(unit(u64::MAX), pending);
        for key in 0..PRUNE_MIN as u64 {
            let t = tail(Ok(()));
            t.ack.clone().await.unwrap();
            tails.put(unit(key), t);
        }
        assert_eq!(tails.len(), 1);
        assert!(tails.take(&unit(u64::MAX)).is_some());
    }
}
