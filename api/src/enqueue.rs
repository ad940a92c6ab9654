//! Redelivery on demand: one stored event, every dead delivery, or a synthetic test
//! event, queued on the endpoint's **retry lane** with the lane message fan-out and
//! replay build (`herald_core::dataplane::lane`, origin `Redeliver`), so it goes through
//! the endpoint's own scheduler — its concurrency and rate limits, circuit and `ordered`
//! — and shares its capacity with fresh events like a retry. A redelivered event keeps
//! its id (the same `webhook-id`); its body is rebuilt from the event store by the
//! envelope parser, signed fresh by the attempt. It starts a new delivery: attempt 1
//! with its own retry schedule.
//!
//! Test events (`herald.test`) are not stored: their body travels in the lane message,
//! and their id is `event_id(now, 2^63 | random)` — a valid Herald id (the shard and the
//! schedules read the publish time from it) whose sequence part no event-store event
//! can have, so a test event is never mistaken for a stored one.

use std::sync::Arc;

use herald_core::dataplane::lane::{LaneMessage, Origin};
use herald_core::dataplane::{
    DeliveryState, EndpointConfig, Newest, event_id, event_published_ms, event_sequence,
    event_subject,
};
use herald_core::envelope::{self, HeaderSize};
use herald_core::pattern::Pattern;

use crate::error::ApiError;
use crate::store::{Store, StoredEvent};

/// The type of test events.
pub const TEST_EVENT_TYPE: &str = "herald.test";

/// A fresh request id: a ULID, so request ids sort by time.
pub fn request_id() -> String {
    let now_ms = jiff::Timestamp::now().as_millisecond().max(0) as u64;
    format!("req_{}", ulid::Ulid::from_parts(now_ms, fastrand::u128(..)))
}

/// The id of a new test event published at `now_ms`.
pub fn test_event_id(now_ms: u64) -> String {
    event_id(now_ms, (1 << 63) | (fastrand::u64(..) >> 1))
}

fn event_not_found(namespace: &str, id: &str) -> ApiError {
    ApiError::not_found(
        "EventNotFound",
        format!(
            "event {id} is not in namespace {namespace}'s event store (an unknown id, a test event, or older than the retention window)"
        ),
    )
}

/// Queues one body on the endpoint's retry lane and waits for JetStream to store it.
async fn publish(
    store: &Store,
    config: &EndpointConfig,
    id: &str,
    published_ms: u64,
    body: bytes::Bytes,
    origin: Origin<'_>,
) -> Result<(), ApiError> {
    let message = LaneMessage::for_endpoint(config, id, published_ms, &body, origin);
    let subject = message.subject(&config.key(), config.shard);
    let publish = message.publish(body);
    store
        .js
        .send_publish(subject, publish)
        .await
        .map_err(|e| ApiError::unavailable("queueing the event", e))?
        .await
        .map_err(|e| ApiError::unavailable("queueing the event", e))?;
    Ok(())
}

/// A stored event as fan-out validates it, with the body it delivers.
fn parse_stored(
    stored: &StoredEvent,
    max_bytes: usize,
) -> Result<envelope::Event, envelope::BadEvent> {
    let published = jiff::Timestamp::from_millisecond(stored.published_ms as i64)
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    envelope::parse(
        &stored.subject,
        &stored.payload,
        HeaderSize::of(Some(&stored.headers)),
        published,
        max_bytes,
    )
}

/// The body every delivery of a stored event sends, `{"type","timestamp","data"}`;
/// `None` for an event that was never deliverable.
pub fn delivered_body(stored: &StoredEvent, max_bytes: usize) -> Option<bytes::Bytes> {
    parse_stored(stored, max_bytes).ok().map(|event| event.body)
}

/// Queues stored event `id` for the endpoint again.
pub async fn redeliver(
    store: &Store,
    config: &EndpointConfig,
    id: &str,
    request: &str,
    max_bytes: usize,
) -> Result<(), ApiError> {
    let ns = &config.namespace;
    let stored = store
        .event(ns, id)
        .await?
        .ok_or_else(|| event_not_found(ns, id))?;
    let event = parse_stored(&stored, max_bytes).map_err(|e| {
        ApiError::new(
            axum::http::StatusCode::CONFLICT,
            "EventNotDeliverable",
            format!(
                "event {id} was never deliverable ({}); it is in the dead-letter stream",
                e.reason()
            ),
        )
    })?;
    let takes = config
        .event_types
        .iter()
        .filter_map(|p| p.parse::<Pattern>().ok())
        .any(|p| p.matches(&event.event_type));
    if !takes {
        return Err(ApiError::new(
            axum::http::StatusCode::CONFLICT,
            "TypeNotSubscribed",
            format!(
                "endpoint {} does not take events of type {} (spec.eventTypes)",
                config.name, event.event_type
            ),
        ));
    }
    let origin = Origin::Redeliver(request);
    publish(store, config, id, stored.published_ms, event.body, origin).await
}

/// Most dead deliveries one redrive queues (each is a read of the event store and a
/// publish); the answer says when more are left.
pub const MAX_REDRIVE: usize = 1_000;

/// The events published at or after `complete_from_ms` whose newest record is `dead`,
/// oldest first.
pub fn dead_events(newest: &Newest, complete_from_ms: u64) -> Vec<Arc<str>> {
    let mut dead: Vec<Arc<str>> = newest
        .events_in(&[DeliveryState::Dead])
        .filter(|id| event_published_ms(id).is_some_and(|ms| ms >= complete_from_ms))
        .cloned()
        .collect();
    dead.sort_unstable();
    dead
}

/// Whether `event_id` names a test event (never stored; see [`test_event_id`]).
pub fn is_test_event(event_id: &str) -> bool {
    event_sequence(event_id).is_some_and(|seq| seq >= 1 << 63)
}

/// Queues a test event; returns its id.
pub async fn test_event(
    store: &Store,
    config: &EndpointConfig,
    request: &str,
    max_bytes: usize,
) -> Result<String, ApiError> {
    let now = jiff::Timestamp::now();
    let now_ms = now.as_millisecond().max(0) as u64;
    let id = test_event_id(now_ms);
    let payload = serde_json::json!({
        "type": TEST_EVENT_TYPE,
        "data": {
            "message": "A test event sent by Herald on request.",
            "namespace": config.namespace,
            "endpoint": config.name,
            "requestId": request,
        }
    });
    let payload = serde_json::to_vec(&payload).expect("JSON serializes");
    let event = envelope::parse(
        &event_subject(&config.namespace, TEST_EVENT_TYPE),
        &payload,
        HeaderSize::default(),
        now,
        max_bytes,
    )
    .map_err(|e| ApiError::unavailable("building the test event", e))?;
    publish(
        store,
        config,
        &id,
        now_ms,
        event.body,
        Origin::Test(request),
    )
    .await?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_core::dataplane::{AttemptOutcome, AttemptRecord, event_published_ms};

    #[test]
    fn test_event_ids_are_valid_and_never_an_event_store_sequence() {
        let id = test_event_id(1_700_000_000_000);
        assert_eq!(event_published_ms(&id), Some(1_700_000_000_000));
        assert!(event_sequence(&id).unwrap() >= 1 << 63);
        assert_eq!(event_sequence(&event_id(5, 42)), Some(42));
    }

    #[test]
    fn only_deliveries_whose_newest_record_is_dead_are_redriven() {
        let rec = |id: &str, state| AttemptRecord {
            event_id: id.into(),
            attempt: 1,
            time_ms: 1,
            outcome: AttemptOutcome::HttpError,
            http_status: Some(500),
            latency_ms: 1,
            response: String::new(),
            state,
            next_attempt_ms: None,
            dead_reason: None,
            replay: None,
            event_type: None,
            request_headers: Vec::new(),
            response_headers: Vec::new(),
        };
        let (a, b, c) = (event_id(100, 1), event_id(200, 2), event_id(300, 3));
        let mut newest = Newest::default();
        // Read back from the newest window: sequences say which record is newer.
        newest.add(4, &rec(&c, DeliveryState::Retrying));
        newest.add(5, &rec(&c, DeliveryState::Dead));
        newest.add(3, &rec(&a, DeliveryState::Succeeded));
        newest.add(1, &rec(&a, DeliveryState::Dead));
        newest.add(2, &rec(&b, DeliveryState::Dead));
        let ids = |from| -> Vec<String> {
            dead_events(&newest, from)
                .iter()
                .map(|s| s.to_string())
                .collect()
        };
        assert_eq!(ids(0), [b.clone(), c.clone()]);
        // A read that stopped at 250 knows only events published since.
        assert_eq!(ids(250), [c]);
        assert!(is_test_event(&test_event_id(5)));
        assert!(!is_test_event(&event_id(5, 42)));
    }
}
