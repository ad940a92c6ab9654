//! Reading the lanes: messages from the shard's ordered consumer land in their
//! endpoint's lane buffer; a full buffer leaves the backlog in JetStream and is refilled
//! later with batched direct gets (see [`super::read`]). Configuration changes refresh the endpoints' states; a
//! deleted endpoint's lanes are purged.

use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use bytes::Bytes;
use herald_core::dataplane::{
    EndpointKey, Lane, LaneError, LaneMessage, fnv1a, parse_lane_subject,
};
use tokio::sync::broadcast;

use super::Runtime;
use crate::budget::{ELASTIC_CAP, LaneBudget};
use crate::endpoint::{EndpointState, Item, RefillRange};
use crate::index::Change;

/// What a refill read back.
pub struct Refill {
    key: EndpointKey,
    lane: Lane,
    range: RefillRange,
    items: Vec<Item>,
    /// Where it stopped (`None`: it read the whole range); `Err` when it could not read.
    next: Result<Option<u64>, ()>,
}

/// Turns a lane message into an item.
fn item_from(
    lane: Lane,
    seq: u64,
    headers: Option<&HeaderMap>,
    payload: Bytes,
) -> Result<Item, LaneError> {
    let message = LaneMessage::decode(headers)?;
    let origin = message.origin;
    Ok(Item {
        seq,
        lane,
        event_id: message.event_id.into(),
        body: payload,
        published_ms: message.published_ms,
        attempt: origin.attempt(),
        first_attempt_ms: origin.first_attempt_ms(),
        not_before: None,
        ordering_key: message.ordering_key,
        endpoint_uid: Some(fnv1a(message.endpoint_uid.bytes())),
        replay: origin.replay().map(Arc::from),
    })
}

impl Runtime {
    pub(super) fn on_message(&mut self, message: async_nats::jetstream::Message) {
        let Ok(info) = message.info() else { return };
        let seq = info.stream_sequence;
        let Some((_, key, lane)) = parse_lane_subject(message.subject.as_str()) else {
            return;
        };
        let item = match item_from(lane, seq, message.headers.as_ref(), message.payload.clone()) {
            Ok(item) => item,
            Err(error) => {
                tracing::warn!(
                    seq,
                    subject = message.subject.as_str(),
                    %error,
                    "lane message that is not Herald's; skipped"
                );
                return;
            }
        };
        let buffers = self.shared.buffers.clone();
        let state = self.state(&key);
        if item.fired_retry() {
            state.retry_arrived();
        }
        let cap = lane_cap(&buffers, state);
        state.lanes.queue(lane).offer(item, cap);
        self.changed(&key, Some(lane));
    }

    /// Reports `key`'s buffered bytes to the dispatcher's lane budget (after any change
    /// of its lanes).
    pub(super) fn settle(&mut self, key: &EndpointKey) {
        if let Some(slot) = self.endpoints.get_mut(key) {
            let now = slot.state.lanes.bytes();
            self.shared.buffers.report(slot.budgeted, now);
            slot.budgeted = now;
        }
    }

    /// Gives back to JetStream what `key` buffers beyond its base cap once it is not
    /// delivering (see `super::budget`).
    pub(super) fn shed_if_stalled(&mut self, key: &EndpointKey) {
        if let Some(state) = self.endpoints.get_mut(key).map(|slot| &mut slot.state)
            && !state.delivering()
        {
            let cap = state.buffer_cap();
            state.lanes.shed(cap);
            self.settle(key);
        }
    }

    /// Forgets `key`'s state, and its bytes in the lane budget.
    pub(super) fn drop_state(&mut self, key: &EndpointKey) -> Option<EndpointState> {
        let slot = self.endpoints.remove(key)?;
        self.shared.buffers.report(slot.budgeted, 0);
        Some(slot.state)
    }

    pub(super) fn on_change(&mut self, change: Result<Change, broadcast::error::RecvError>) {
        let keys: Vec<EndpointKey> = match change {
            Ok(Change::Endpoint(key)) => vec![key],
            Ok(Change::Tenant(namespace)) => {
                let policy = self.shared.index.tenant(&namespace);
                let share = policy.map(|p| self.tenant_share(p));
                self.ring.set_share(&namespace, share);
                return;
            }
            Ok(Change::Keys { namespace, secret }) => self
                .endpoints
                .iter()
                .filter(|(k, s)| {
                    k.namespace() == namespace
                        && s.state
                            .ep
                            .as_ref()
                            .is_some_and(|e| e.config.secret == secret)
                })
                .map(|(k, _)| k.clone())
                .collect(),
            Err(_) => {
                self.load_tenants();
                self.endpoints.keys().cloned().collect()
            }
        };
        for key in keys {
            // State exists only for endpoints with traffic on this shard; the others pick
            // their configuration up when their first message arrives.
            let ep = self.shared.index.endpoint(&key);
            if ep.is_none() {
                self.remove_endpoint(&key);
                continue;
            }
            if !self.endpoints.contains_key(&key) {
                continue;
            }
            let keys = ep.as_ref().and_then(|e| {
                self.shared
                    .index
                    .keys(&e.config.namespace, &e.config.secret)
            });
            let state = self.state(&key);
            state.keys = keys;
            if state.configure(ep) {
                tracing::info!(endpoint = %key, "endpoint re-enabled");
                self.save_lasting(&key);
            }
            self.shed_if_stalled(&key);
            self.changed(&key, None);
        }
    }

    /// The endpoint was deleted: stop delivering, drop its queued work (the events stay
    /// in the event store for replay), and forget its state.
    fn remove_endpoint(&mut self, key: &EndpointKey) {
        let Some(mut state) = self.drop_state(key) else {
            return;
        };
        self.reports.forget(key);
        let stream = self.shared.layout.deliveries.clone();
        let uid = state.uid();
        // Bounded: an unbounded purge could run after a re-created endpoint of the same
        // name had its first deliveries written to the same subjects, and drop them.
        let purges = [Lane::New, Lane::Retry].map(|lane| {
            let below = state.lanes.queue(lane).removal_bound(uid);
            (key.lane_subject(self.shard, lane), below)
        });
        tokio::spawn(async move {
            for (subject, below) in purges.into_iter().filter(|(_, below)| *below > 1) {
                if let Err(error) = stream.purge().filter(subject).sequence(below).await {
                    tracing::warn!(%error, "purging a deleted endpoint's lane");
                }
            }
        });
        tracing::info!(endpoint = %key, "endpoint removed; its pending deliveries were dropped");
    }

    pub(super) fn maybe_refill(&mut self, key: &EndpointKey, lane: Lane) {
        let buffers = self.shared.buffers.clone();
        let state = self.state(key);
        let cap = lane_cap(&buffers, state);
        let base = state.buffer_cap();
        let queue = state.lanes.queue(lane);
        let Some(mut range) = queue.refill(cap) else {
            return;
        };
        if cap > base {
            // Beyond the base cap, read what the budget's room holds at this lane's
            // average item size (a soft bound: a refill runs for one lane at a time).
            let average = match queue.buffered() {
                0 => 1024,
                n => queue.bytes() / n,
            };
            range.room = range.room.min((buffers.room() / average.max(1)).max(base));
        }
        let stream = self.shared.layout.deliveries.clone();
        let subject = key.lane_subject(self.shard, lane);
        let tx = self.refill_tx.clone();
        let key = key.clone();
        let client = self.shared.layout.js.client();
        tokio::spawn(async move {
            let read = super::read::range(&client, &stream, subject.as_str(), range).await;
            let (items, next) = match read {
                Ok((read, next)) => {
                    let items = read
                        .into_iter()
                        .filter_map(|m| item_from(lane, m.seq, Some(&m.headers), m.payload).ok())
                        .collect();
                    (items, Ok(next))
                }
                Err(error) => {
                    tracing::debug!(%error, "refill read");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    (Vec::new(), Err(()))
                }
            };
            let _ = tx
                .send(Refill {
                    key,
                    lane,
                    range,
                    items,
                    next,
                })
                .await;
        });
    }

    pub(super) fn on_refill(&mut self, refill: Refill) {
        let Refill {
            key,
            lane,
            range,
            items,
            next,
        } = refill;
        let Some(state) = self.endpoints.get_mut(&key).map(|slot| &mut slot.state) else {
            return;
        };
        match next {
            Ok(next) => state.lanes.queue(lane).refilled(range, items, next),
            Err(()) => state.lanes.queue(lane).refill_failed(),
        }
        self.changed(&key, Some(lane));
    }
}

/// How many items a lane of `state` may buffer now: [`ELASTIC_CAP`] while it is
/// delivering and the dispatcher's lane budget has room, else its base cap.
fn lane_cap(buffers: &LaneBudget, state: &EndpointState) -> usize {
    let base = state.buffer_cap();
    if state.delivering() && buffers.room() > 0 {
        ELASTIC_CAP.max(base)
    } else {
        base
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_core::dataplane::Origin;

    fn item(lane: Lane, origin: Origin<'_>) -> Item {
        let message = LaneMessage {
            event_id: "msg_01ARZ3NDEKTSV4RRFFQ69G5FAV",
            published_ms: 1_700_000_000_000,
            endpoint_uid: "0c1d-uid",
            ordering_key: None,
            origin,
        };
        item_from(lane, 7, Some(&message.headers()), Bytes::new()).unwrap()
    }

    #[test]
    fn an_item_knows_its_endpoint_from_the_message_id_or_the_header() {
        let uid = Some(fnv1a("0c1d-uid".bytes()));
        assert_eq!(item(Lane::New, Origin::FanOut).endpoint_uid, uid);
        assert_eq!(item(Lane::Retry, Origin::Redeliver("q")).endpoint_uid, uid);
    }

    #[test]
    fn a_replay_item_carries_its_replay_and_is_not_a_fired_retry() {
        let retry = |attempt, replay| Origin::Retry {
            attempt,
            first_attempt_ms: 1_700_000_000_500,
            replay,
        };
        let enqueued = item(Lane::Retry, Origin::Replay("r-uid"));
        assert_eq!(enqueued.replay.as_deref(), Some("r-uid"));
        assert_eq!(enqueued.attempt, 1);
        assert!(!enqueued.fired_retry());
        let its_retry = item(Lane::Retry, retry(2, Some("r-uid")));
        assert_eq!(its_retry.replay.as_deref(), Some("r-uid"));
        assert_eq!(its_retry.first_attempt_ms, Some(1_700_000_000_500));
        assert!(its_retry.fired_retry());
        let retry = item(Lane::Retry, retry(3, None));
        assert_eq!(retry.replay, None);
        assert!(retry.fired_retry());
        assert!(!item(Lane::New, Origin::FanOut).fired_retry());
    }

    #[test]
    fn a_message_without_an_event_id_is_no_item() {
        assert_eq!(
            item_from(Lane::New, 1, Some(&HeaderMap::new()), Bytes::new()).err(),
            Some(LaneError::NoEventId)
        );
    }
}
