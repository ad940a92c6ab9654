//! Turning a producer's event into the Standard Webhooks request body, or refusing it.
//!
//! Producers publish `{"type": "...", "data": ...}` to `herald.events.<ns>.<type>`. The
//! body Herald signs and sends is `{"type","timestamp","data"}`, built once per event
//! (not per endpoint or attempt), with `data` copied byte for byte.

use crate::dataplane::parse_event_subject;
use crate::pattern::{PatternError, validate_event_type};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

/// Default largest event accepted.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 256 * 1024;
/// Most NATS headers an event may carry. Herald reads none but `Nats-Msg-Id` and never
/// forwards them; a producer that sends more is broken or hostile.
pub const MAX_EVENT_HEADERS: usize = 64;
/// Longest reason text a dead letter carries (a producer's type or subject is quoted in
/// it and could otherwise be as large as the event).
pub const MAX_REASON_BYTES: usize = 512;

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
    #[error("event is {size} bytes (headers included); the limit is {limit}")]
    TooLarge { size: usize, limit: usize },
    #[error("event carries {count} headers; the limit is {limit}")]
    TooManyHeaders { count: usize, limit: usize },
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
            Self::TooManyHeaders { .. } => "TooManyHeaders",
            Self::NotJson(_) => "NotJson",
            Self::TypeMismatch { .. } => "TypeMismatch",
            Self::UnknownTenant(_) => "UnknownTenant",
        }
    }

    /// The reason as text, at most [`MAX_REASON_BYTES`] (cut at a character boundary).
    pub fn bounded_text(&self) -> String {
        let mut text = self.to_string();
        if text.len() > MAX_REASON_BYTES {
            let mut end = MAX_REASON_BYTES - 3;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
            text.push_str("...");
        }
        text
    }
}

/// What a stored event's NATS headers amount to: how many, and their size on the wire.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeaderSize {
    pub count: usize,
    pub bytes: usize,
}

impl HeaderSize {
    pub fn of(headers: Option<&async_nats::HeaderMap>) -> Self {
        let Some(headers) = headers else {
            return Self::default();
        };
        let mut size = Self::default();
        for (name, values) in headers.iter() {
            for value in values {
                size.count += 1;
                // "Name: value\r\n"
                size.bytes += AsRef::<str>::as_ref(name).len() + value.as_str().len() + 4;
            }
        }
        size
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
/// time, which becomes the body's `timestamp`; `headers` are the event's NATS headers,
/// which count towards `max_bytes` (they are stored with it).
pub fn parse(
    subject: &str,
    payload: &[u8],
    headers: HeaderSize,
    published: jiff::Timestamp,
    max_bytes: usize,
) -> Result<Event, BadEvent> {
    let (namespace, event_type) =
        parse_event_subject(subject).ok_or_else(|| BadEvent::Subject(subject.to_owned()))?;
    validate_event_type(event_type).map_err(BadEvent::SubjectType)?;
    let size = payload.len() + headers.bytes;
    if size > max_bytes {
        return Err(BadEvent::TooLarge {
            size,
            limit: max_bytes,
        });
    }
    if headers.count > MAX_EVENT_HEADERS {
        return Err(BadEvent::TooManyHeaders {
            count: headers.count,
            limit: MAX_EVENT_HEADERS,
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

/// The event type of a body [`parse`] built (`{"type":"<type>",...`), read without
/// parsing the rest: a valid type needs no JSON escape, so the text up to the next quote
/// is the whole type. `None` for anything else. Cheap enough for every attempt (the
/// dispatcher logs it with each attempt record).
pub fn body_type(body: &[u8]) -> Option<&str> {
    let rest = body.strip_prefix(b"{\"type\":\"")?;
    let end = rest.iter().position(|b| *b == b'"')?;
    let ty = std::str::from_utf8(&rest[..end]).ok()?;
    validate_event_type(ty).is_ok().then_some(ty)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_type_is_read_from_the_front_of_a_body() {
        let e = parse(
            "herald.events.shop.order.created",
            br#"{"data":{"type":"x"},"type":"order.created"}"#,
            HeaderSize::default(),
            at(),
            1024,
        )
        .unwrap();
        assert_eq!(body_type(&e.body), Some("order.created"));
        assert_eq!(body_type(br#"{"type":"a\"b","data":1}"#), None);
        assert_eq!(body_type(br#"{"data":1,"type":"a"}"#), None);
        assert_eq!(body_type(b""), None);
    }

    fn at() -> jiff::Timestamp {
        jiff::Timestamp::from_millisecond(1_700_000_000_123).unwrap()
    }

    #[test]
    fn builds_the_standard_webhooks_body() {
        let e = parse(
            "herald.events.shop.order.created",
            br#"{"type":"order.created","data":{"id": 7, "items":[1,2]}}"#,
            HeaderSize::default(),
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
        let p = |subject: &str, payload: &[u8]| {
            parse(subject, payload, HeaderSize::default(), at(), 64).unwrap_err()
        };
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
        assert_eq!(p("herald.events.shop.a", b"").reason(), "NotJson");
        assert_eq!(
            p("herald.events.shop.a", br#"{"type":7,"data":1}"#).reason(),
            "NotJson"
        );
        assert_eq!(p("herald.events.shop.A!", br#"{}"#).reason(), "BadSubject");
    }

    #[test]
    fn headers_count_towards_the_limit() {
        let event = br#"{"type":"a","data":1}"#;
        let parse_with = |count, bytes| {
            parse(
                "herald.events.shop.a",
                event,
                HeaderSize { count, bytes },
                at(),
                event.len() + 100,
            )
        };
        assert!(parse_with(1, 100).is_ok());
        assert_eq!(parse_with(1, 101).unwrap_err().reason(), "TooLarge");
        assert_eq!(
            parse_with(MAX_EVENT_HEADERS + 1, 100).unwrap_err().reason(),
            "TooManyHeaders"
        );
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", "abc");
        headers.append("X-Trace", "0123456789");
        headers.append("X-Trace", "x");
        let size = HeaderSize::of(Some(&headers));
        assert_eq!(size.count, 3);
        assert_eq!(size.bytes, (11 + 3 + 4) + (7 + 10 + 4) + (7 + 1 + 4));
    }

    #[test]
    fn a_reason_is_bounded_whatever_the_producer_sent() {
        let huge_type = "é".repeat(100_000);
        let payload = format!(r#"{{"type":"{huge_type}","data":1}}"#);
        let bad = parse(
            "herald.events.shop.a",
            payload.as_bytes(),
            HeaderSize::default(),
            at(),
            1 << 20,
        )
        .unwrap_err();
        assert_eq!(bad.reason(), "TypeMismatch");
        let text = bad.bounded_text();
        assert!(text.len() <= MAX_REASON_BYTES, "{}", text.len());
        assert!(text.ends_with("..."), "{text}");
        assert!(text.starts_with("event type"), "{text}");
    }
}
