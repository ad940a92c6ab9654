//! HTTP ingest for producers that cannot speak NATS: `POST /v1/namespaces/{ns}/events`
//! with an `Idempotency-Key`. The event is checked exactly as fan-out will check it
//! (`herald_core::envelope::parse`, the same size limit, headers included) and published
//! to `herald.events.<ns>.<type>`.
//!
//! One key means one stored event, whoever retries, for the idempotency window
//! (`--idempotency-window`, 24 h): the first request claims the key in the
//! `herald-idempotency` bucket under its namespace (`herald_core::dataplane::idempotency`)
//! with a random `Nats-Msg-Id` and the body's hash, publishes with that id, and records
//! the event id. A retry finds the claim: the same body is answered with the original
//! event id (`duplicate: true`), another body is refused (409 `IdempotencyKeyReused`); a
//! claim whose publish never answered (a crashed replica, a concurrent retry) is
//! published again with its id, which JetStream's duplicate window (2 minutes) drops if
//! the first publish was stored after all. No header another producer can set reaches
//! this: its ids are not the claim's, and a key is only ever looked up in its own
//! namespace.

use async_nats::HeaderMap;
use async_nats::header::NATS_MESSAGE_ID;
use async_nats::jetstream::kv;
use async_nats::jetstream::stream::RawMessageErrorKind;
use axum::http::StatusCode;
use herald_core::api::EventAccepted as Accepted;
use herald_core::clock::now_ms;
use herald_core::dataplane::idempotency::{Claim, body_hash, entry_key};
use herald_core::dataplane::{event_id, event_subject, parse_event_subject};
use herald_core::envelope::{self, BadEvent, HeaderSize};
use herald_core::pattern::validate_event_type;

use crate::error::ApiError;
use crate::store::Store;

/// Longest `Idempotency-Key` taken.
pub const MAX_KEY_LEN: usize = 255;

pub fn too_large(size: usize, limit: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "TooLarge",
        format!("the event is {size} bytes or more; the limit is {limit} (--max-event-bytes)"),
    )
}

/// A checked request: where to publish, and the key.
#[derive(Debug)]
pub struct Checked<'a> {
    pub subject: String,
    pub key: &'a str,
}

/// Checks the key and the body.
pub fn check<'a>(
    namespace: &str,
    key: Option<&'a str>,
    body: &[u8],
    max_bytes: usize,
) -> Result<Checked<'a>, ApiError> {
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
    if herald_core::operational::is_operational(ty) {
        return Err(ApiError::bad_request(
            "ReservedType",
            format!(
                "\"type\" {ty:?}: types starting with \"{}\" are Herald's own operational events; choose another prefix",
                herald_core::operational::TYPE_PREFIX
            ),
        ));
    }
    if !object.contains_key("data") {
        return Err(ApiError::bad_request(
            "MissingData",
            "the body has no \"data\" member (use null for an event without data)",
        ));
    }
    let subject = event_subject(namespace, ty);
    // Exactly what fan-out will check, with the headers that will be stored (a message
    // id of the claim's length).
    let mut headers = HeaderMap::new();
    let sample = Claim::new(namespace, body, 0, 0);
    headers.insert(NATS_MESSAGE_ID, sample.message_id.as_str());
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
    Ok(Checked { subject, key })
}

/// Most turns of claim, publish and record for one request (another request of the same
/// key may be doing the same at once).
const TURNS: usize = 4;

/// Publishes a checked event under its key; returns its id (the original's for a repeat).
pub async fn publish(
    store: &Store,
    namespace: &str,
    checked: Checked<'_>,
    body: bytes::Bytes,
) -> Result<Accepted, ApiError> {
    let kv = &store.idempotency;
    let entry = entry_key(namespace, checked.key);
    let failed = |e: &dyn std::fmt::Display| ApiError::unavailable("the idempotency key", e);
    for _ in 0..TURNS {
        let fresh = Claim::new(namespace, &body, now_ms(), fastrand::u128(..));
        let (claim, revision, ours) = match kv.create(&entry, fresh.encode()).await {
            Ok(revision) => (fresh, revision, true),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                let Some(found) = kv.entry(&entry).await.map_err(|e| failed(&e))? else {
                    continue; // expired meanwhile: claim it again
                };
                if found.operation != kv::Operation::Put {
                    continue;
                }
                let claim = Claim::decode(&found.value).map_err(|e| failed(&e))?;
                (claim, found.revision, false)
            }
            Err(e) => return Err(failed(&e)),
        };
        if claim.body != body_hash(&body) {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "IdempotencyKeyReused",
                format!(
                    "Idempotency-Key {:?} was used for another event{} within the idempotency window; use a new key for a new event",
                    checked.key,
                    claim
                        .event_id
                        .as_deref()
                        .map(|id| format!(" ({id})"))
                        .unwrap_or_default()
                ),
            ));
        }
        if let Some(event_id) = claim.event_id {
            return Ok(Accepted {
                event_id,
                duplicate: true,
            });
        }
        // Ours, or a claim whose publish has not answered: publish with its id (a
        // repeat within JetStream's window is dropped and answered with the original).
        let (event_id, stored_before) = send(
            store,
            namespace,
            &checked.subject,
            &claim.message_id,
            body.clone(),
        )
        .await?;
        let answered = Claim {
            event_id: Some(event_id.clone()),
            ..claim
        };
        match kv.update(&entry, answered.encode(), revision).await {
            Ok(_) => {
                return Ok(Accepted {
                    event_id,
                    duplicate: !ours || stored_before,
                });
            }
            // Another request of the key recorded it first: read what it recorded.
            Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => continue,
            Err(e) => return Err(failed(&e)),
        }
    }
    Err(ApiError::unavailable(
        "the idempotency key",
        "too many concurrent requests with one key",
    ))
}

/// Publishes with `message_id`; the event id, and whether JetStream had it already.
async fn send(
    store: &Store,
    namespace: &str,
    subject: &str,
    message_id: &str,
    body: bytes::Bytes,
) -> Result<(String, bool), ApiError> {
    let mut headers = HeaderMap::new();
    headers.insert(NATS_MESSAGE_ID, message_id);
    let ack = store
        .js
        .publish_with_headers(subject.to_owned(), headers, body)
        .await
        .map_err(|e| ApiError::unavailable("publishing the event", e))?
        .await
        .map_err(|e| ApiError::unavailable("publishing the event", e))?;
    // From the stream's leader, which stored it before acknowledging: a direct get may
    // be answered by a replica that has not applied the message yet and says "not
    // found" for an event that is stored.
    let stored = match store.events.get_raw_message(ack.sequence).await {
        Ok(message) => message,
        Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => {
            return Err(ApiError::unavailable(
                "reading the stored event back",
                "not found (removed by its retention?)",
            ));
        }
        Err(e) => return Err(ApiError::unavailable("reading the stored event back", e)),
    };
    // The id is random and this API's alone; a stored message of another namespace
    // under it would mean it was not.
    let ours = parse_event_subject(stored.subject.as_str()).is_some_and(|(ns, _)| ns == namespace);
    if !ours {
        return Err(ApiError::unavailable(
            "publishing the event",
            "JetStream answered with another namespace's message",
        ));
    }
    let published_ms = (stored.time.unix_timestamp_nanos() / 1_000_000).max(0) as u64;
    Ok((event_id(published_ms, ack.sequence), ack.duplicate))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(r: Result<Checked<'_>, ApiError>) -> &'static str {
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
        assert_eq!(
            code(check(
                "shop",
                Some("k"),
                br#"{"type":"herald.endpoint.disabled","data":{}}"#,
                1024
            )),
            "ReservedType"
        );
        let big = format!(r#"{{"type":"a","data":"{}"}}"#, "x".repeat(2000));
        let e = check("shop", Some("k"), big.as_bytes(), 1024).unwrap_err();
        assert_eq!(
            (e.status, e.code),
            (StatusCode::PAYLOAD_TOO_LARGE, "TooLarge")
        );
    }
}
