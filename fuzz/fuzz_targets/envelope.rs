//! `herald_core::envelope::parse`: the event a producer published.
//!
//! - an event over the size limit (payload and headers) or with too many headers is never
//!   accepted;
//! - an accepted event's body is the JSON object `{"type","timestamp","data"}` with the
//!   subject's type and the payload's `data` copied byte for byte;
//! - a refusal has one of the fixed, low-cardinality reasons, and its bounded text (which
//!   becomes a NATS header of the dead letter) is short and on one line.
#![no_main]

use arbitrary::Arbitrary;
use herald_core::pattern::validate_event_type;
use herald_core::envelope::{HeaderSize, MAX_EVENT_HEADERS, MAX_REASON_BYTES, parse};
use libfuzzer_sys::fuzz_target;

const REASONS: [&str; 6] = [
    "BadSubject",
    "TooLarge",
    "TooManyHeaders",
    "NotJson",
    "TypeMismatch",
    "UnknownTenant",
];

/// The body Herald builds, or (without `timestamp`) the event a producer sent.
#[derive(serde::Deserialize)]
struct Object<'a> {
    #[serde(rename = "type")]
    ty: String,
    timestamp: Option<String>,
    #[serde(borrow)]
    data: &'a serde_json::value::RawValue,
}

#[derive(Arbitrary, Debug)]
struct Input {
    /// Most subjects get the real prefix, so the fuzzer spends its time past it.
    raw_subject: bool,
    subject: String,
    /// A payload shaped like an event (type and data given) or raw bytes.
    shaped: Option<(String, String)>,
    payload: Vec<u8>,
    header_count: u8,
    header_bytes: u16,
    max_bytes: u16,
    /// JetStream's publish time: milliseconds since 1970, here up to jiff's end of 9999 (RFC 3339 has four-digit years,
    /// and a JetStream clock is never before 1970).
    published_ms: u64,
}

fuzz_target!(|input: Input| {
    let subject = if input.raw_subject {
        input.subject.clone()
    } else {
        format!("herald.events.{}", input.subject)
    };
    let payload = match &input.shaped {
        Some((ty, data)) => {
            format!(r#"{{"type":{},"data":{data}}}"#, serde_json::json!(ty)).into_bytes()
        }
        None => input.payload.clone(),
    };
    let max_bytes = usize::from(input.max_bytes);
    let headers = HeaderSize {
        count: usize::from(input.header_count),
        bytes: usize::from(input.header_bytes),
    };
    let size = payload.len() + headers.bytes;
    let published_ms = input.published_ms % 253_402_207_200_001;
    let published = jiff::Timestamp::from_millisecond(published_ms as i64).expect("in range");

    match parse(&subject, &payload, headers, published, max_bytes) {
        Ok(event) => {
            assert!(size <= max_bytes, "accepted {size} > {max_bytes} bytes");
            assert!(headers.count <= MAX_EVENT_HEADERS, "accepted {headers:?}");
            assert_eq!(
                subject,
                format!("herald.events.{}.{}", event.namespace, event.event_type)
            );
            assert!(!event.namespace.is_empty() && !event.namespace.contains('.'));
            assert_eq!(validate_event_type(&event.event_type), Ok(()));
            // Raw values: `data` may hold numbers beyond f64 (valid JSON, copied as is),
            // which serde_json::Value refuses.
            let body: Object = serde_json::from_slice(&event.body).expect("the body is JSON");
            assert_eq!(body.ty, event.event_type);
            let timestamp = body.timestamp.expect("a timestamp");
            assert_eq!(timestamp.parse::<jiff::Timestamp>().ok(), Some(published));
            // data is the producer's text, byte for byte.
            let incoming: Object = serde_json::from_slice(&payload).expect("accepted payload");
            assert_eq!(body.data.get(), incoming.data.get());
            assert!(
                std::str::from_utf8(&event.body)
                    .expect("UTF-8 body")
                    .ends_with(&format!(",\"data\":{}}}", incoming.data.get()))
            );
        }
        Err(bad) => {
            assert!(REASONS.contains(&bad.reason()), "{}", bad.reason());
            let message = bad.bounded_text();
            assert!(
                message.len() <= MAX_REASON_BYTES,
                "{}-byte message for a {}-byte event: {}...",
                message.len(),
                payload.len(),
                &message[..message.floor_char_boundary(200)]
            );
            assert!(
                !message.contains(['\r', '\n', '\0']),
                "message is not one header line: {message:?}"
            );
            if size > max_bytes && bad.reason() != "BadSubject" {
                assert_eq!(bad.reason(), "TooLarge");
            }
        }
    }
});
