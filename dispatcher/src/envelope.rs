//! Turning a producer's event into the Standard Webhooks request body, or refusing it.
//!
//! Producers publish `{"type": "...", "data": ...}` to `herald.events.<ns>.<type>`. The
//! body Herald signs and sends is `{"type","timestamp","data"}`, built once per event
//! (not per endpoint or attempt), with `data` copied byte for byte.

use bytes::Bytes;
use herald_core::dataplane::parse_event_subject;
use herald_core::pattern::{PatternError, validate_event_type};
use serde::Deserialize;
use serde_json::value::RawValue;

/// Default largest event accepted.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 256 * 1024;

/// A valid event, ready to fan out.
#[derive(Debug, Clone)]
pub struct Event {
    pub namespace: String,
    pub event_type: String,
    /// `{"type","timestamp","data"}`.
    pub body: Bytes,
}

/// Why an event cannot be delivered at all. Each one goes to the dead-letter subject
/// `herald.deadletter.<reason>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadEvent {
    #[error("subject {0:?} is not herald.events.<namespace>.<type>")]
    Subject(String),
    #[error("event type in the subject is invalid: {0}")]
    SubjectType(PatternError),
    #[error("event is {size} bytes; the limit is {limit}")]
    TooLarge { size: usize, limit: usize },
    #[error("event is not a JSON object with \"type\" and \"data\": {0}")]
    NotJson(String),
    #[error("event type {body:?} differs from the subject's {subject:?}")]
    TypeMismatch { subject: String, body: String },
    #[error("namespace {0:?} has no webhook endpoints")]
    UnknownTenant(String),
}

impl BadEvent {
    /// Low-cardinality reason: the dead-letter subject token and the metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Subject(_) | Self::SubjectType(_) => "BadSubject",
            Self::TooLarge { .. } => "TooLarge",
            Self::NotJson(_) => "NotJson",
            Self::TypeMismatch { .. } => "TypeMismatch",
            Self::UnknownTenant(_) => "UnknownTenant",
        }
    }
}

#[derive(Deserialize)]
struct Incoming<'a> {
    #[serde(rename = "type", borrow)]
    ty: &'a str,
    #[serde(borrow)]
    data: &'a RawValue,
}

/// Validates one stored event and builds its body. `published` is the JetStream publish
/// time, which becomes the body's `timestamp`.
pub fn parse(
    subject: &str,
    payload: &[u8],
    published: jiff::Timestamp,
    max_bytes: usize,
) -> Result<Event, BadEvent> {
    let (namespace, event_type) =
        parse_event_subject(subject).ok_or_else(|| BadEvent::Subject(subject.to_owned()))?;
    validate_event_type(event_type).map_err(BadEvent::SubjectType)?;
    if payload.len() > max_bytes {
        return Err(BadEvent::TooLarge {
            size: payload.len(),
            limit: max_bytes,
        });
    }
    let incoming: Incoming =
        serde_json::from_slice(payload).map_err(|e| BadEvent::NotJson(e.to_string()))?;
    if incoming.ty != event_type {
        return Err(BadEvent::TypeMismatch {
            subject: event_type.to_owned(),
            body: incoming.ty.to_owned(),
        });
    }
    let ty = serde_json::to_string(event_type).expect("a string serializes");
    let timestamp = published.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string();
    let data = incoming.data.get();
    let mut body = Vec::with_capacity(ty.len() + timestamp.len() + data.len() + 40);
    body.extend_from_slice(b"{\"type\":");
    body.extend_from_slice(ty.as_bytes());
    body.extend_from_slice(b",\"timestamp\":\"");
    body.extend_from_slice(timestamp.as_bytes());
    body.extend_from_slice(b"\",\"data\":");
    body.extend_from_slice(data.as_bytes());
    body.push(b'}');
    Ok(Event {
        namespace: namespace.to_owned(),
        event_type: event_type.to_owned(),
        body: body.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> jiff::Timestamp {
        jiff::Timestamp::from_millisecond(1_700_000_000_123).unwrap()
    }

    #[test]
    fn builds_the_standard_webhooks_body() {
        let e = parse(
            "herald.events.shop.order.created",
            br#"{"type":"order.created","data":{"id": 7, "items":[1,2]}}"#,
            at(),
            1024,
        )
        .unwrap();
        assert_eq!(e.namespace, "shop");
        assert_eq!(e.event_type, "order.created");
        let body: serde_json::Value = serde_json::from_slice(&e.body).unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "type": "order.created",
                "timestamp": "2023-11-14T22:13:20.123Z",
                "data": {"id": 7, "items": [1, 2]}
            })
        );
        // data is copied byte for byte, whitespace included
        assert!(
            std::str::from_utf8(&e.body)
                .unwrap()
                .contains(r#"{"id": 7, "items":[1,2]}"#)
        );
    }

    #[test]
    fn refuses_bad_events_with_a_reason() {
        let p = |subject: &str, payload: &[u8]| parse(subject, payload, at(), 64).unwrap_err();
        assert_eq!(p("herald.events.shop.a", b"not json").reason(), "NotJson");
        assert_eq!(
            p("herald.events.shop.a", br#"{"data":1}"#).reason(),
            "NotJson"
        );
        assert_eq!(
            p("herald.events.shop.a", br#"{"type":"a"}"#).reason(),
            "NotJson"
        );
        assert_eq!(
            p("herald.events.shop.a", br#"{"type":"b","data":1}"#).reason(),
            "TypeMismatch"
        );
        assert_eq!(p("herald.events.shop", br#"{}"#).reason(), "BadSubject");
        assert_eq!(p("herald.events.shop.a", &[b' '; 65]).reason(), "TooLarge");
        let msg = p("herald.events.shop.a", &[b' '; 65]).to_string();
        assert!(msg.contains("65 bytes") && msg.contains("64"), "{msg}");
    }
}
