//! HTTP ingest for producers that cannot speak NATS: `POST /v1/namespaces/{ns}/events`
//! with an `Idempotency-Key`. The event is checked exactly as fan-out will check it
//! (`herald_core::envelope::parse`, the same size limit, headers included) and published
//! to `herald.events.<ns>.<type>` with `Nats-Msg-Id: http.<ns>.<SHA-256 of the key>`,
//! so JetStream's duplicate window (2 minutes) drops a repeat and acknowledges it with
//! the original's sequence; the event id is then the original's, from its publish time
//! read back with a direct get. One key means one stored event, whoever retries.

use async_nats::HeaderMap;
use async_nats::header::NATS_MESSAGE_ID;
use async_nats::jetstream::stream::DirectGetErrorKind;
use axum::http::StatusCode;
use herald_core::api::EventAccepted as Accepted;
use herald_core::dataplane::{event_id, event_subject};
use herald_core::envelope::{self, BadEvent, HeaderSize};
use herald_core::pattern::validate_event_type;
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::store::Store;

/// Longest `Idempotency-Key` taken.
pub const MAX_KEY_LEN: usize = 255;

/// `Nats-Msg-Id` of an HTTP-ingested event: the namespace and a hash of the key, so
/// two tenants' keys never collide and the key itself is not stored.
pub fn message_id(namespace: &str, key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("http.{namespace}.{hex}")
}

pub fn too_large(size: usize, limit: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "TooLarge",
        format!("the event is {size} bytes or more; the limit is {limit} (--max-event-bytes)"),
    )
}

/// Checks the key and the body; returns the subject and the headers to publish with.
pub fn check(
    namespace: &str,
    key: Option<&str>,
    body: &[u8],
    max_bytes: usize,
) -> Result<(String, HeaderMap), ApiError> {
    let key = key.map(str::trim).filter(|k| !k.is_empty()).ok_or_else(|| {
        ApiError::bad_request(
            "MissingIdempotencyKey",
            "the Idempotency-Key header is required: a unique string per event (e.g. a UUID), the same when the request is retried",
        )
    })?;
    if key.len() > MAX_KEY_LEN {
        return Err(ApiError::bad_request(
            "InvalidIdempotencyKey",
            format!(
                "the Idempotency-Key header is {} characters; at most {MAX_KEY_LEN}",
                key.len()
            ),
        ));
    }
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request("NotJson", format!("the body is not JSON: {e}")))?;
    let Some(object) = value.as_object() else {
        return Err(ApiError::bad_request(
            "NotJson",
            "the body must be a JSON object {\"type\": ..., \"data\": ...}",
        ));
    };
    let Some(ty) = object.get("type").and_then(|t| t.as_str()) else {
        return Err(ApiError::bad_request(
            "MissingType",
            "the body has no \"type\" string: {\"type\": \"order.created\", \"data\": ...}",
        ));
    };
    validate_event_type(ty)
        .map_err(|e| ApiError::bad_request("InvalidType", format!("\"type\" {ty:?} {e}")))?;
    if !object.contains_key("data") {
        return Err(ApiError::bad_request(
            "MissingData",
            "the body has no \"data\" member (use null for an event without data)",
        ));
    }
    let subject = event_subject(namespace, ty);
    let mut headers = HeaderMap::new();
    headers.insert(NATS_MESSAGE_ID, message_id(namespace, key).as_str());
    // Exactly what fan-out will check, with the headers that will be stored.
    envelope::parse(
        &subject,
        body,
        HeaderSize::of(Some(&headers)),
        jiff::Timestamp::now(),
        max_bytes,
    )
    .map_err(|e| match e {
        BadEvent::TooLarge { size, limit } => too_large(size, limit),
        BadEvent::TypeMismatch { .. } => ApiError::bad_request("TypeMismatch", e.to_string()),
        BadEvent::Subject(_) | BadEvent::SubjectType(_) => ApiError::bad_request(
            "InvalidNamespace",
            format!("namespace {namespace:?} cannot be part of an event subject"),
        ),
        other => ApiError::bad_request("InvalidEvent", other.bounded_text()),
    })?;
    Ok((subject, headers))
}

/// Publishes a checked event; returns its id (the original's for a duplicate).
pub async fn publish(
    store: &Store,
    subject: String,
    headers: HeaderMap,
    body: bytes::Bytes,
) -> Result<Accepted, ApiError> {
    let ack = store
        .js
        .publish_with_headers(subject, headers, body)
        .await
        .map_err(|e| ApiError::unavailable("publishing the event", e))?
        .await
        .map_err(|e| ApiError::unavailable("publishing the event", e))?;
    let stored = match store.events.direct_get(ack.sequence).await {
        Ok(message) => message,
        Err(e) if e.kind() == DirectGetErrorKind::NotFound => {
            return Err(ApiError::unavailable(
                "reading the stored event back",
                "not found (removed by its retention?)",
            ));
        }
        Err(e) => return Err(ApiError::unavailable("reading the stored event back", e)),
    };
    let published_ms = (stored.time.unix_timestamp_nanos() / 1_000_000).max(0) as u64;
    Ok(Accepted {
        event_id: event_id(published_ms, ack.sequence),
        duplicate: ack.duplicate,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(r: Result<(String, HeaderMap), ApiError>) -> &'static str {
        r.err().map(|e| e.code).unwrap_or("ok")
    }

    #[test]
    fn every_bad_request_says_what_is_wrong() {
        let ok = br#"{"type":"order.created","data":{"id":1}}"#;
        assert_eq!(code(check("shop", Some("k1"), ok, 1024)), "ok");
        assert_eq!(code(check("shop", None, ok, 1024)), "MissingIdempotencyKey");
        assert_eq!(
            code(check("shop", Some(" "), ok, 1024)),
            "MissingIdempotencyKey"
        );
        let long = "k".repeat(300);
        assert_eq!(
            code(check("shop", Some(&long), ok, 1024)),
            "InvalidIdempotencyKey"
        );
        assert_eq!(code(check("shop", Some("k"), b"nope", 1024)), "NotJson");
        assert_eq!(code(check("shop", Some("k"), b"[1]", 1024)), "NotJson");
        assert_eq!(
            code(check("shop", Some("k"), br#"{"data":1}"#, 1024)),
            "MissingType"
        );
        assert_eq!(
            code(check(
                "shop",
                Some("k"),
                br#"{"type":"a..b","data":1}"#,
                1024
            )),
            "InvalidType"
        );
        assert_eq!(
            code(check(
                "shop",
                Some("k"),
                br#"{"type":"a.*","data":1}"#,
                1024
            )),
            "InvalidType"
        );
        assert_eq!(
            code(check("shop", Some("k"), br#"{"type":"a"}"#, 1024)),
            "MissingData"
        );
        let big = format!(r#"{{"type":"a","data":"{}"}}"#, "x".repeat(2000));
        let e = check("shop", Some("k"), big.as_bytes(), 1024).unwrap_err();
        assert_eq!(
            (e.status, e.code),
            (StatusCode::PAYLOAD_TOO_LARGE, "TooLarge")
        );
    }

    #[test]
    fn keys_are_namespaced_and_hashed() {
        let a = message_id("shop", "key-1");
        assert_eq!(a, message_id("shop", "key-1"));
        assert_ne!(a, message_id("bank", "key-1"));
        assert!(a.starts_with("http.shop.") && !a.contains("key-1"));
    }
}
