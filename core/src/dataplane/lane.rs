//! What a message on an endpoint's lane carries, built in one place for everyone who
//! enqueues: fan-out (fresh events), replay (a `WebhookReplay`'s events) and on-demand
//! redelivery (the HTTP API). The shard reads it back in `dispatcher/src/shard/consume.rs`.
//!
//! The payload is the event's request body as [`crate::envelope::parse`] builds it; the
//! headers say which event (its id, so the same `webhook-id`, and its publish time), for
//! which endpoint, in which order group, and why it is queued. `Nats-Msg-Id` makes every
//! enqueue idempotent inside JetStream's duplicate window.

use async_nats::HeaderMap;
use async_nats::header::NATS_MESSAGE_ID;
use async_nats::jetstream::message::PublishMessage;

use super::{
    ENDPOINT_UID_HEADER, EVENT_ID_HEADER, EndpointConfig, ORDERING_KEY_HEADER, PUBLISHED_HEADER,
    REPLAY_HEADER, fnv1a,
};

/// Why a message is on a lane; decides its `Nats-Msg-Id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin<'a> {
    /// Fan-out of a fresh event: `<event id>.<endpoint uid>`. The endpoint's uid is read
    /// back from the id (no header of its own, to keep the most common message small).
    FanOut,
    /// A `WebhookReplay` (its uid): `<event id>.<endpoint uid>.replay.<replay uid>`, and
    /// `Herald-Replay` so its completions are counted for the replay's status.
    Replay(&'a str),
    /// A redelivery asked for on demand (a request id):
    /// `<event id>.<endpoint uid>.redeliver.<request id>`.
    Redeliver(&'a str),
}

/// One event queued for one endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaneMessage<'a> {
    pub event_id: &'a str,
    pub published_ms: u64,
    pub endpoint_uid: &'a str,
    /// The hash of the event's ordering key, for an `ordered` endpoint with
    /// `orderingKey` ([`ordering_key`]).
    pub ordering_key: Option<u64>,
    pub origin: Origin<'a>,
}

impl<'a> LaneMessage<'a> {
    /// One event queued for `config`'s endpoint alone: the ordering key, when the
    /// endpoint orders by one, is read from `body` (callers that queue one event for many
    /// endpoints parse it once and fill [`Self::ordering_key`] themselves).
    pub fn for_endpoint(
        config: &'a EndpointConfig,
        event_id: &'a str,
        published_ms: u64,
        body: &[u8],
        origin: Origin<'a>,
    ) -> Self {
        let ordering_key = ordering_pointer(config).map(|pointer| {
            let value = serde_json::from_slice(body).unwrap_or(serde_json::Value::Null);
            ordering_key(&value, pointer)
        });
        Self {
            event_id,
            published_ms,
            endpoint_uid: &config.uid,
            ordering_key,
            origin,
        }
    }

    /// The JetStream publish of this message with `body`.
    pub fn publish(&self, body: bytes::Bytes) -> PublishMessage {
        PublishMessage::build()
            .payload(body)
            .headers(self.headers())
    }

    /// `Nats-Msg-Id`: unique per event, endpoint and reason for queueing it.
    pub fn message_id(&self) -> String {
        let base = format!("{}.{}", self.event_id, self.endpoint_uid);
        match self.origin {
            Origin::FanOut => base,
            Origin::Replay(uid) => format!("{base}.replay.{uid}"),
            Origin::Redeliver(id) => format!("{base}.redeliver.{id}"),
        }
    }

    /// Every header the message carries, `Nats-Msg-Id` included.
    pub fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(NATS_MESSAGE_ID, self.message_id().as_str());
        headers.insert(EVENT_ID_HEADER, self.event_id);
        headers.insert(PUBLISHED_HEADER, self.published_ms.to_string().as_str());
        if let Some(key) = self.ordering_key {
            headers.insert(ORDERING_KEY_HEADER, format!("{key:x}").as_str());
        }
        match self.origin {
            Origin::FanOut => {}
            Origin::Replay(uid) => {
                headers.insert(ENDPOINT_UID_HEADER, self.endpoint_uid);
                headers.insert(REPLAY_HEADER, uid);
            }
            Origin::Redeliver(_) => {
                headers.insert(ENDPOINT_UID_HEADER, self.endpoint_uid);
            }
        }
        headers
    }
}

/// The JSON pointer an endpoint orders by, if it orders by a key of the event.
pub fn ordering_pointer(config: &EndpointConfig) -> Option<&str> {
    config
        .ordered
        .then_some(config.ordering_key.as_deref())
        .flatten()
}

/// The ordering-key hash of an event for an endpoint that orders by `pointer`:
/// `parsed` is the event's request body as JSON (parsed once per event by callers that
/// queue it for several endpoints).
pub fn ordering_key(parsed: &serde_json::Value, pointer: &str) -> u64 {
    ordering_key_hash(parsed.pointer(pointer))
}

/// FNV-1a of the ordering key's text (a string as is, anything else as JSON; a missing
/// field is the empty key, shared by every event without it).
fn ordering_key_hash(value: Option<&serde_json::Value>) -> u64 {
    let text = match value {
        None => String::new(),
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    fnv1a(text.bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(origin: Origin<'_>) -> LaneMessage<'_> {
        LaneMessage {
            event_id: "evt_1",
            published_ms: 1_700_000_000_000,
            endpoint_uid: "uid-a",
            ordering_key: Some(0xabc),
            origin,
        }
    }

    #[test]
    fn the_message_id_says_why_the_event_is_queued() {
        assert_eq!(message(Origin::FanOut).message_id(), "evt_1.uid-a");
        assert_eq!(
            message(Origin::Replay("r1")).message_id(),
            "evt_1.uid-a.replay.r1"
        );
        assert_eq!(
            message(Origin::Redeliver("q1")).message_id(),
            "evt_1.uid-a.redeliver.q1"
        );
    }

    #[test]
    fn only_messages_whose_id_does_not_end_in_the_uid_carry_it_as_a_header() {
        let fan_out = message(Origin::FanOut).headers();
        assert_eq!(fan_out.get(ENDPOINT_UID_HEADER), None);
        assert_eq!(fan_out.get(REPLAY_HEADER), None);
        assert_eq!(fan_out.get(ORDERING_KEY_HEADER).unwrap().as_str(), "abc");
        assert_eq!(
            fan_out.get(PUBLISHED_HEADER).unwrap().as_str(),
            "1700000000000"
        );
        let replay = message(Origin::Replay("r1")).headers();
        assert_eq!(replay.get(ENDPOINT_UID_HEADER).unwrap().as_str(), "uid-a");
        assert_eq!(replay.get(REPLAY_HEADER).unwrap().as_str(), "r1");
        let redeliver = message(Origin::Redeliver("q1")).headers();
        assert_eq!(
            redeliver.get(ENDPOINT_UID_HEADER).unwrap().as_str(),
            "uid-a"
        );
        assert_eq!(redeliver.get(REPLAY_HEADER), None);
        assert_eq!(
            redeliver.get(NATS_MESSAGE_ID).unwrap().as_str(),
            "evt_1.uid-a.redeliver.q1"
        );
    }

    #[test]
    fn the_ordering_key_is_the_text_of_the_pointed_field() {
        let event = serde_json::json!({"data": {"order": "o-1", "n": 7}});
        assert_eq!(ordering_key(&event, "/data/order"), fnv1a("o-1".bytes()));
        assert_eq!(ordering_key(&event, "/data/n"), fnv1a("7".bytes()));
        assert_eq!(ordering_key(&event, "/data/missing"), fnv1a("".bytes()));
    }
}
