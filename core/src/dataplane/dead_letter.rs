//! Dead letters on the wire, encoded and decoded only here: an event that cannot be
//! delivered at all (not JSON, too large, no tenant ...) is moved by fan-out to
//! `herald.deadletter.<reason>` in the dead-letter stream, with the reason's text, the
//! event's id and the subject it was published to in headers, and the event itself — or,
//! for one over the size limit, its beginning and its original size.

use async_nats::HeaderMap;
use async_nats::header::NATS_MESSAGE_ID;
use async_nats::jetstream::message::PublishMessage;

use super::{DEADLETTER_PREFIX, EVENT_ID_HEADER, REASON_HEADER, SUBJECT_HEADER, TRUNCATED_HEADER};

/// One dead letter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetter<'a> {
    /// The reason as a token (`NotJson`, `TooLarge` ...): the last part of the subject.
    pub reason: &'a str,
    /// The reason as a person reads it.
    pub text: &'a str,
    /// The id the event was given (`webhook-id`).
    pub event_id: &'a str,
    /// The subject the event was published to (its ingest form).
    pub subject: &'a str,
    /// The event's original size when the payload is only its beginning.
    pub truncated: Option<usize>,
}

impl<'a> DeadLetter<'a> {
    /// `herald.deadletter.<reason>`.
    pub fn subject(&self) -> String {
        format!("{DEADLETTER_PREFIX}.{}", self.reason)
    }

    /// `Nats-Msg-Id`: one dead letter per event, however often fan-out retries.
    pub fn message_id(&self) -> String {
        format!("dl.{}", self.event_id)
    }

    /// The JetStream publish of this dead letter with `payload` (the event, or its
    /// beginning).
    pub fn publish(&self, payload: bytes::Bytes) -> PublishMessage {
        PublishMessage::build()
            .payload(payload)
            .headers(self.headers())
    }

    /// Every header the dead letter carries, `Nats-Msg-Id` included.
    pub fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(NATS_MESSAGE_ID, self.message_id().as_str());
        headers.insert(REASON_HEADER, self.text);
        headers.insert(EVENT_ID_HEADER, self.event_id);
        headers.insert(SUBJECT_HEADER, self.subject);
        if let Some(size) = self.truncated {
            headers.insert(TRUNCATED_HEADER, size.to_string().as_str());
        }
        headers
    }

    /// Reads a dead letter back from its subject and headers; `None` for a message that
    /// is not one.
    pub fn decode(subject: &'a str, headers: &'a HeaderMap) -> Option<Self> {
        let reason = subject
            .strip_prefix(DEADLETTER_PREFIX)?
            .strip_prefix('.')
            .filter(|r| !r.is_empty() && !r.contains('.'))?;
        let text = |name: &str| headers.get(name).map(|v| v.as_str());
        Some(Self {
            reason,
            text: text(REASON_HEADER).unwrap_or_default(),
            event_id: text(EVENT_ID_HEADER)?,
            subject: text(SUBJECT_HEADER).unwrap_or_default(),
            truncated: text(TRUNCATED_HEADER).and_then(|v| v.parse().ok()),
        })
    }

    /// The filter that selects every dead letter.
    pub fn filter() -> String {
        format!("{DEADLETTER_PREFIX}.>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_letter_round_trips() {
        for truncated in [None, Some(2_000_000)] {
            let letter = DeadLetter {
                reason: "TooLarge",
                text: "the event is 2000000 bytes, over the limit of 1048576",
                event_id: "msg_01ARZ3NDEKTSV4RRFFQ69G5FAV",
                subject: "herald.events.shop.order.created",
                truncated,
            };
            let subject = letter.subject();
            assert_eq!(subject, "herald.deadletter.TooLarge");
            let headers = letter.headers();
            assert_eq!(
                headers.get("Nats-Msg-Id").unwrap().as_str(),
                "dl.msg_01ARZ3NDEKTSV4RRFFQ69G5FAV"
            );
            assert_eq!(DeadLetter::decode(&subject, &headers), Some(letter));
        }
        assert_eq!(DeadLetter::filter(), "herald.deadletter.>");
    }

    #[test]
    fn other_messages_are_not_dead_letters() {
        let mut headers = HeaderMap::new();
        headers.insert(EVENT_ID_HEADER, "msg_1");
        for subject in [
            "herald.deadletter",
            "herald.deadletter.",
            "herald.deadletter.a.b",
            "herald.events.shop.a",
        ] {
            assert_eq!(DeadLetter::decode(subject, &headers), None, "{subject}");
        }
        assert_eq!(
            DeadLetter::decode("herald.deadletter.NotJson", &HeaderMap::new()),
            None,
            "no event id"
        );
    }
}
