//! What a message on an endpoint's lane carries, encoded and decoded only here: by
//! fan-out (fresh events), replay (a `WebhookReplay`'s events), on-demand redelivery and
//! test events (the HTTP API), and the attempt task's retry schedules; read back by the
//! shard (`dispatcher/src/shard/consume.rs`) and the HTTP API's delivery log.
//!
//! The payload is the event's request body as [`crate::envelope::parse`] builds it; the
//! headers say which event (its id, so the same `webhook-id`, and its publish time), for
//! which endpoint, in which order group, and why it is queued ([`Origin`]). `Nats-Msg-Id`
//! makes every enqueue idempotent inside JetStream's duplicate window. A retry is the same
//! message again with its attempt number and first-attempt time, published as a JetStream
//! schedule ([`LaneMessage::schedule`]) that lands on the retry lane when due.

use async_nats::HeaderMap;
use async_nats::header::NATS_MESSAGE_ID;
use async_nats::jetstream::message::PublishMessage;

use super::{
    ATTEMPT_HEADER, ENDPOINT_UID_HEADER, EVENT_ID_HEADER, EndpointConfig, EndpointKey,
    FIRST_ATTEMPT_HEADER, Lane, ORDERING_KEY_HEADER, PUBLISHED_HEADER, REPLAY_HEADER,
    SCHEDULE_HEADER, SCHEDULE_TARGET_HEADER, fnv1a,
};

/// Why a message is on a lane; decides its lane and its `Nats-Msg-Id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin<'a> {
    /// Fan-out of a fresh event, on the new lane: `<event id>.<endpoint uid>`. The
    /// endpoint's uid is read back from the id (no header of its own, to keep the most
    /// common message small).
    FanOut,
    /// A `WebhookReplay` (its uid), on the retry lane:
    /// `<event id>.<endpoint uid>.replay.<replay uid>`, and `Herald-Replay` so its
    /// completions are counted for the replay's status.
    Replay(&'a str),
    /// A redelivery asked for on demand (a request id), on the retry lane:
    /// `<event id>.<endpoint uid>.redeliver.<request id>`.
    Redeliver(&'a str),
    /// A test event sent on demand (a request id), on the retry lane:
    /// `<event id>.<endpoint uid>.test.<request id>`.
    Test(&'a str),
    /// A retry of an earlier attempt, published by its schedule on the retry lane (no
    /// `Nats-Msg-Id`: each schedule is published once, by the attempt that failed).
    /// `replay` is the replay that enqueued the event, kept so its outcome is counted.
    Retry {
        attempt: u32,
        first_attempt_ms: u64,
        replay: Option<&'a str>,
    },
}

impl<'a> Origin<'a> {
    const REPLAY: &'static str = "replay";
    const REDELIVER: &'static str = "redeliver";
    const TEST: &'static str = "test";

    /// The lane the message is queued on: fresh events on the new lane, everything sent
    /// again (and test events) on the retry lane, where it shares the endpoint's capacity
    /// with fresh events like a retry.
    pub fn lane(self) -> Lane {
        match self {
            Self::FanOut => Lane::New,
            _ => Lane::Retry,
        }
    }

    /// The number of the attempt the message makes (1 unless it is a retry).
    pub fn attempt(self) -> u32 {
        match self {
            Self::Retry { attempt, .. } => attempt,
            _ => 1,
        }
    }

    /// When the event's first attempt was made, for a retry.
    pub fn first_attempt_ms(self) -> Option<u64> {
        match self {
            Self::Retry {
                first_attempt_ms, ..
            } => Some(first_attempt_ms),
            _ => None,
        }
    }

    /// The `WebhookReplay` whose event this is (also on its retries).
    pub fn replay(self) -> Option<&'a str> {
        match self {
            Self::Replay(uid) => Some(uid),
            Self::Retry { replay, .. } => replay,
            _ => None,
        }
    }

    /// The suffix of the message id after `<event id>.<endpoint uid>`.
    fn id_suffix(self) -> Option<(&'static str, &'a str)> {
        match self {
            Self::Replay(uid) => Some((Self::REPLAY, uid)),
            Self::Redeliver(id) => Some((Self::REDELIVER, id)),
            Self::Test(id) => Some((Self::TEST, id)),
            Self::FanOut | Self::Retry { .. } => None,
        }
    }
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

/// A lane message that cannot be read back: what is missing or malformed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LaneError {
    #[error("the message has no headers")]
    NoHeaders,
    #[error("the message has no {EVENT_ID_HEADER} header")]
    NoEventId,
    #[error("the message names no endpoint ({ENDPOINT_UID_HEADER} or Nats-Msg-Id)")]
    NoEndpoint,
    #[error("header {header} is not a number: {value:?}")]
    NotANumber { header: &'static str, value: String },
    #[error("a retry without {FIRST_ATTEMPT_HEADER}")]
    NoFirstAttempt,
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

    /// The subject the message is queued on for `key`, on `shard`.
    pub fn subject(&self, key: &EndpointKey, shard: u32) -> String {
        key.lane_subject(shard, self.origin.lane())
    }

    /// The JetStream publish of this message with `body`.
    pub fn publish(&self, body: bytes::Bytes) -> PublishMessage {
        PublishMessage::build()
            .payload(body)
            .headers(self.headers())
    }

    /// This message (a [`Origin::Retry`]) as a JetStream schedule that publishes it with
    /// `body` to `target` (its retry lane) at `due`, rounded up to the whole second
    /// schedules resolve, so a retry never comes early.
    pub fn schedule(
        &self,
        target: &str,
        due: jiff::Timestamp,
        body: bytes::Bytes,
    ) -> PublishMessage {
        PublishMessage::build()
            .payload(body)
            .headers(self.schedule_headers(target, due))
    }

    /// The headers of [`Self::schedule`]: the message's and the schedule's.
    pub fn schedule_headers(&self, target: &str, due: jiff::Timestamp) -> HeaderMap {
        let due = match due.subsec_nanosecond() {
            0 => due,
            _ => jiff::Timestamp::from_second(due.as_second().saturating_add(1)).unwrap_or(due),
        };
        let mut headers = self.headers();
        headers.insert(
            SCHEDULE_HEADER,
            format!("@at {}", due.strftime("%Y-%m-%dT%H:%M:%SZ")).as_str(),
        );
        headers.insert(SCHEDULE_TARGET_HEADER, target);
        headers
    }

    /// `Nats-Msg-Id`: unique per event, endpoint and reason for queueing it (none for a
    /// retry).
    pub fn message_id(&self) -> Option<String> {
        if let Origin::Retry { .. } = self.origin {
            return None;
        }
        let base = format!("{}.{}", self.event_id, self.endpoint_uid);
        Some(match self.origin.id_suffix() {
            None => base,
            Some((kind, id)) => format!("{base}.{kind}.{id}"),
        })
    }

    /// Every header the message carries, `Nats-Msg-Id` included.
    pub fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(id) = self.message_id() {
            headers.insert(NATS_MESSAGE_ID, id.as_str());
        }
        headers.insert(EVENT_ID_HEADER, self.event_id);
        headers.insert(PUBLISHED_HEADER, self.published_ms.to_string().as_str());
        if let Some(key) = self.ordering_key {
            headers.insert(ORDERING_KEY_HEADER, format!("{key:x}").as_str());
        }
        if self.origin != Origin::FanOut {
            headers.insert(ENDPOINT_UID_HEADER, self.endpoint_uid);
        }
        if let Some(replay) = self.origin.replay() {
            headers.insert(REPLAY_HEADER, replay);
        }
        if let Origin::Retry {
            attempt,
            first_attempt_ms,
            ..
        } = self.origin
        {
            headers.insert(ATTEMPT_HEADER, attempt.to_string().as_str());
            headers.insert(FIRST_ATTEMPT_HEADER, first_attempt_ms.to_string().as_str());
        }
        headers
    }

    /// Reads a lane message back from its headers (a fired schedule's extra headers are
    /// ignored). A message without a publish time (written by a version that did not
    /// record it) reads as published at 0.
    pub fn decode(headers: Option<&'a HeaderMap>) -> Result<Self, LaneError> {
        let headers = headers.ok_or(LaneError::NoHeaders)?;
        let text = |name: &str| headers.get(name).map(|v| v.as_str());
        let number = |name: &'static str, radix: u32| -> Result<Option<u64>, LaneError> {
            text(name)
                .map(|v| {
                    u64::from_str_radix(v, radix).map_err(|_| LaneError::NotANumber {
                        header: name,
                        value: v.to_owned(),
                    })
                })
                .transpose()
        };
        let event_id = text(EVENT_ID_HEADER).ok_or(LaneError::NoEventId)?;
        // `<event id>.<endpoint uid>[.<kind>.<id>]`: event ids and uids hold no dots.
        let message_id = headers.get(NATS_MESSAGE_ID).map(|v| v.as_str());
        let mut id_parts = message_id.map(|id| id.splitn(4, '.'));
        let id_uid = id_parts.as_mut().and_then(|p| p.nth(1));
        let suffix = id_parts.and_then(|mut p| Some((p.next()?, p.next()?)));
        let endpoint_uid = text(ENDPOINT_UID_HEADER)
            .or(id_uid)
            .ok_or(LaneError::NoEndpoint)?;
        let replay = text(REPLAY_HEADER);
        let origin = match (number(ATTEMPT_HEADER, 10)?, replay, suffix) {
            (Some(attempt), _, _) => Origin::Retry {
                attempt: u32::try_from(attempt).unwrap_or(u32::MAX),
                first_attempt_ms: number(FIRST_ATTEMPT_HEADER, 10)?
                    .ok_or(LaneError::NoFirstAttempt)?,
                replay,
            },
            (None, Some(uid), _) => Origin::Replay(uid),
            (None, None, Some((Origin::REDELIVER, id))) => Origin::Redeliver(id),
            (None, None, Some((Origin::TEST, id))) => Origin::Test(id),
            (None, None, _) => Origin::FanOut,
        };
        Ok(Self {
            event_id,
            published_ms: number(PUBLISHED_HEADER, 10)?.unwrap_or_default(),
            endpoint_uid,
            ordering_key: number(ORDERING_KEY_HEADER, 16)?,
            origin,
        })
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

    const ORIGINS: [Origin<'static>; 7] = [
        Origin::FanOut,
        Origin::Replay("r1"),
        Origin::Redeliver("q1"),
        Origin::Test("q2"),
        Origin::Retry {
            attempt: 2,
            first_attempt_ms: 1_700_000_000_500,
            replay: None,
        },
        Origin::Retry {
            attempt: 7,
            first_attempt_ms: 1_700_000_000_500,
            replay: Some("r1"),
        },
        Origin::Retry {
            attempt: u32::MAX,
            first_attempt_ms: 0,
            replay: None,
        },
    ];

    #[test]
    fn every_origin_round_trips() {
        for origin in ORIGINS {
            for ordering_key in [None, Some(0), Some(u64::MAX)] {
                let sent = LaneMessage {
                    ordering_key,
                    ..message(origin)
                };
                let headers = sent.headers();
                assert_eq!(LaneMessage::decode(Some(&headers)), Ok(sent.clone()));
                // What a fired schedule delivers: the same headers and the schedule's.
                let due = jiff::Timestamp::from_second(1_700_000_100).unwrap();
                let fired = sent.schedule_headers("herald.q.1.shop.a.retry", due);
                assert_eq!(LaneMessage::decode(Some(&fired)), Ok(sent));
            }
        }
    }

    #[test]
    fn the_message_id_says_why_the_event_is_queued() {
        let ids: Vec<Option<String>> = ORIGINS.map(|o| message(o).message_id()).into();
        assert_eq!(
            ids,
            [
                Some("evt_1.uid-a".to_owned()),
                Some("evt_1.uid-a.replay.r1".to_owned()),
                Some("evt_1.uid-a.redeliver.q1".to_owned()),
                Some("evt_1.uid-a.test.q2".to_owned()),
                None,
                None,
                None,
            ]
        );
    }

    #[test]
    fn fresh_events_go_to_the_new_lane_everything_else_to_the_retry_lane() {
        let key = EndpointKey::new("shop", "orders");
        assert_eq!(
            message(Origin::FanOut).subject(&key, 3),
            "herald.q.3.shop.orders.new"
        );
        for origin in &ORIGINS[1..] {
            assert_eq!(
                message(*origin).subject(&key, 3),
                "herald.q.3.shop.orders.retry"
            );
        }
    }

    #[test]
    fn only_messages_whose_id_does_not_end_in_the_uid_carry_it_as_a_header() {
        let fan_out = message(Origin::FanOut).headers();
        assert_eq!(fan_out.get(ENDPOINT_UID_HEADER), None);
        assert_eq!(fan_out.get(REPLAY_HEADER), None);
        assert_eq!(fan_out.get(ATTEMPT_HEADER), None);
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
        let retry = message(ORIGINS[5]).headers();
        assert_eq!(retry.get(NATS_MESSAGE_ID), None);
        assert_eq!(retry.get(ATTEMPT_HEADER).unwrap().as_str(), "7");
        assert_eq!(
            retry.get(FIRST_ATTEMPT_HEADER).unwrap().as_str(),
            "1700000000500"
        );
        assert_eq!(retry.get(REPLAY_HEADER).unwrap().as_str(), "r1");
    }

    #[test]
    fn a_schedule_is_due_at_the_next_whole_second() {
        let at = |due: jiff::Timestamp| {
            let headers = message(ORIGINS[4]).schedule_headers("herald.q.1.shop.a.retry", due);
            assert_eq!(
                headers.get(SCHEDULE_TARGET_HEADER).unwrap().as_str(),
                "herald.q.1.shop.a.retry"
            );
            headers.get(SCHEDULE_HEADER).unwrap().as_str().to_owned()
        };
        let whole = jiff::Timestamp::from_second(1_700_000_000).unwrap();
        assert_eq!(at(whole), "@at 2023-11-14T22:13:20Z");
        let later = whole
            .checked_add(jiff::SignedDuration::from_millis(1))
            .unwrap();
        assert_eq!(at(later), "@at 2023-11-14T22:13:21Z");
    }

    #[test]
    fn a_message_that_cannot_be_read_back_says_what_is_wrong() {
        assert_eq!(LaneMessage::decode(None), Err(LaneError::NoHeaders));
        let cases: [(&[(&str, &str)], LaneError); 4] = [
            (&[("Nats-Msg-Id", "evt_1.uid-a")], LaneError::NoEventId),
            (&[(EVENT_ID_HEADER, "evt_1")], LaneError::NoEndpoint),
            (
                &[
                    (EVENT_ID_HEADER, "evt_1"),
                    (ENDPOINT_UID_HEADER, "u"),
                    (ATTEMPT_HEADER, "two"),
                ],
                LaneError::NotANumber {
                    header: ATTEMPT_HEADER,
                    value: "two".into(),
                },
            ),
            (
                &[
                    (EVENT_ID_HEADER, "evt_1"),
                    (ENDPOINT_UID_HEADER, "u"),
                    (ATTEMPT_HEADER, "2"),
                ],
                LaneError::NoFirstAttempt,
            ),
        ];
        for (pairs, want) in cases {
            let mut headers = HeaderMap::new();
            for (name, value) in pairs {
                headers.insert(*name, *value);
            }
            assert_eq!(
                LaneMessage::decode(Some(&headers)),
                Err(want.clone()),
                "{pairs:?}"
            );
            assert!(!want.to_string().is_empty());
        }
    }

    #[test]
    fn the_ordering_key_is_the_text_of_the_pointed_field() {
        let event = serde_json::json!({"data": {"order": "o-1", "n": 7}});
        assert_eq!(ordering_key(&event, "/data/order"), fnv1a("o-1".bytes()));
        assert_eq!(ordering_key(&event, "/data/n"), fnv1a("7".bytes()));
        assert_eq!(ordering_key(&event, "/data/missing"), fnv1a("".bytes()));
    }
}
