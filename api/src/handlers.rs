//! The tenant routes: each one is `guard` (authenticate, authorize, rate), the
//! endpoint's configuration (404 when Herald does not deliver to it), then the work in
//! `deliveries`, `ingest` or `enqueue`.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use herald_core::api::{self as wire, time};
use herald_core::clock::now_ms;
use herald_core::dataplane::event_published_ms;
use herald_core::pattern::Pattern;

use crate::App;
use crate::auth::Caller;
use crate::auth::{CREATE_EVENTS, GET_DELIVERY, LIST_DELIVERIES, REDELIVER};
use crate::deliveries::{self, Cursor, Filter};
use crate::enqueue;
use crate::error::ApiError;
use crate::ingest;

/// Default page size.
pub const DEFAULT_LIMIT: usize = 50;

type Answer = Result<Response, ApiError>;

/// `since`/`until`: RFC 3339, or a duration (`2h`, `30m`) meaning that long ago.
pub fn parse_time(name: &str, text: &str, now_ms: u64) -> Result<u64, ApiError> {
    if let Ok(at) = text.parse::<jiff::Timestamp>() {
        return Ok(at.as_millisecond().max(0) as u64);
    }
    if let Ok(ago) = herald_core::duration::parse_std(text) {
        return Ok(now_ms.saturating_sub(ago.as_millis() as u64));
    }
    Err(ApiError::bad_request(
        "InvalidTime",
        format!(
            "{name}={text:?} is neither an RFC 3339 time (2026-12-01T10:00:00Z) nor a duration ago (2h, 30m)"
        ),
    ))
}

fn filter(q: &HashMap<String, String>, now: u64) -> Result<Filter, ApiError> {
    let mut filter = Filter::default();
    if let Some(status) = q.get("status").filter(|s| !s.is_empty()) {
        filter.states = Some(Filter::states(status)?);
    }
    if let Some(ty) = q.get("type").filter(|s| !s.is_empty()) {
        filter.event_type = Some(
            ty.parse::<Pattern>()
                .map_err(|e| ApiError::bad_request("InvalidType", format!("type={ty:?} {e}")))?,
        );
    }
    filter.since_ms = q
        .get("since")
        .map(|t| parse_time("since", t, now))
        .transpose()?;
    filter.until_ms = q
        .get("until")
        .map(|t| parse_time("until", t, now))
        .transpose()?;
    Ok(filter)
}

fn limit(q: &HashMap<String, String>, max: usize) -> Result<usize, ApiError> {
    let Some(text) = q.get("limit") else {
        return Ok(DEFAULT_LIMIT.min(max));
    };
    let limit: usize = text.parse().ok().filter(|l| *l > 0).ok_or_else(|| {
        ApiError::bad_request(
            "InvalidLimit",
            format!("limit={text:?} is not a number from 1 to {max}"),
        )
    })?;
    if limit > max {
        return Err(ApiError::bad_request(
            "LimitTooLarge",
            format!("limit={limit} is above the largest page, {max}"),
        ));
    }
    Ok(limit)
}

fn check_event_id(id: &str) -> Result<(), ApiError> {
    event_published_ms(id).map(drop).ok_or_else(|| {
        ApiError::bad_request(
            "InvalidEventId",
            format!("{id:?} is not a Herald event id (msg_<ULID>)"),
        )
    })
}

pub async fn list_deliveries(
    State(app): State<Arc<App>>,
    Path((ns, name)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
    caller: Caller,
) -> Answer {
    app.guard(&caller, &ns, LIST_DELIVERIES, Some(&name))
        .await?;
    let now = now_ms();
    let filter = filter(&q, now)?;
    let limit = limit(&q, app.settings.max_page)?;
    let cursor = q
        .get("cursor")
        .filter(|c| !c.is_empty())
        .map(|c| Cursor::decode(c))
        .transpose()?;
    let store = app.store()?;
    let config = store.endpoint(&ns, &name).await?;
    let cursor = match cursor {
        Some(cursor) => cursor,
        None => {
            let (attempts_seq, lanes_seq) = store.high_water(&config).await?;
            Cursor {
                attempts_seq,
                lanes_seq,
                after: None,
            }
        }
    };
    // The log is read back from now, window by window, until the page is certain:
    // every record of an event published since `t` is logged after `t`, so once the
    // read is back to `t` the events published since are final. Attempts of events
    // published since `since` are all logged after it: the read goes no further.
    let mut fold = deliveries::Fold::new(&cursor, &filter);
    store
        .queued(&config, None)
        .await?
        .into_iter()
        .for_each(|q| fold.queued(q));
    let mut scan = store
        .scan_back(
            &config.key(),
            filter.since_ms.unwrap_or(0),
            app.budget(&ns).await?,
        )
        .await?;
    while scan
        .next_window(|seq, record| fold.record(seq, record))
        .await?
    {
        if fold.complete(&filter, scan.read_back_to(), now) > limit {
            break;
        }
    }
    let complete_from = scan.complete_from();
    let truncated = scan.truncated();
    let mut page = fold.page(&filter, complete_from, limit, now);
    // Records written before the dispatcher logged the type: the page's few are looked
    // up in the event store (a direct get each).
    for d in page.items.iter_mut().filter(|d| d.event_type.is_none()) {
        d.event_type = stored_type(store, &ns, &d.event_id).await?;
    }
    Ok(Json(wire::Page {
        items: page.items,
        next_cursor: page.next.map(|c| c.encode()),
        truncated,
    })
    .into_response())
}

pub async fn get_delivery(
    State(app): State<Arc<App>>,
    Path((ns, name, event_id)): Path<(String, String, String)>,
    caller: Caller,
) -> Answer {
    let (store, config) = app.endpoint(&caller, &ns, &name, GET_DELIVERY).await?;
    check_event_id(&event_id)?;
    let (attempts_seq, lanes_seq) = store.high_water(&config).await?;
    let published = event_published_ms(&event_id).unwrap_or_default();
    // An id claims its publish time; a stored event's is checked against the store, so
    // a made-up id cannot send the read back through the whole log.
    if !enqueue::is_test_event(&event_id) && store.event(&ns, &event_id).await?.is_none() {
        return Err(no_delivery(&ns, &name, &event_id));
    }
    // Every record of the event is logged after its publish time.
    let mut records = Vec::new();
    let mut scan = store
        .scan_back(&config.key(), published, app.budget(&ns).await?)
        .await?;
    while scan
        .next_window(|seq, record| {
            if *record.event_id == *event_id {
                records.push(deliveries::Logged { seq, record });
            }
        })
        .await?
    {}
    records.sort_by_key(|l| l.seq);
    let queued = store.queued(&config, Some(&event_id)).await?;
    let attempts: Vec<wire::Attempt> = records
        .iter()
        .filter(|l| l.seq <= attempts_seq)
        .map(|l| {
            let r = &l.record;
            wire::Attempt {
                attempt: r.attempt,
                time: time::from_ms(r.time_ms),
                outcome: r.outcome.into(),
                status: r.http_status,
                latency_ms: r.latency_ms,
                response: r.response.clone(),
                state: Some(r.state.into()),
                next_attempt_time: r.next_attempt_ms.map(time::from_ms),
                request_headers: r
                    .request_headers
                    .iter()
                    .map(wire::HeaderField::from_pair)
                    .collect(),
                response_headers: r
                    .response_headers
                    .iter()
                    .map(wire::HeaderField::from_pair)
                    .collect(),
            }
        })
        .collect();
    let at = Cursor {
        attempts_seq,
        lanes_seq,
        after: None,
    };
    let Some(delivery) = deliveries::summarize(records, queued, &at, now_ms()).pop() else {
        return Err(no_delivery(&ns, &name, &event_id));
    };
    // The event as delivered: its type when the log did not say, and the body.
    let stored = store.event(&ns, &event_id).await?;
    let event_type = delivery.event_type.or_else(|| {
        stored
            .as_ref()
            .and_then(crate::store::StoredEvent::event_type)
    });
    let request_body = stored
        .as_ref()
        .and_then(|e| crate::enqueue::delivered_body(e, app.settings.max_event_bytes))
        .map(|body| wire::RequestBody::redacted(&body, &config.delivery.redact_response_fields));
    Ok(Json(wire::DeliveryDetail {
        event_id: delivery.event_id,
        event_type,
        state: delivery.state,
        next_attempt_time: delivery.next_attempt_time,
        attempts,
        request_body,
        truncated: scan.truncated(),
    })
    .into_response())
}

fn no_delivery(ns: &str, name: &str, event_id: &str) -> ApiError {
    ApiError::not_found(
        "DeliveryNotFound",
        format!(
            "endpoint {name} in namespace {ns} has no delivery of event {event_id} in its log or queue"
        ),
    )
}

/// The type of a stored event, from its subject (`None`: not in the store any more).
async fn stored_type(
    store: &crate::store::Store,
    namespace: &str,
    event_id: &str,
) -> Result<Option<String>, ApiError> {
    let stored = store.event(namespace, event_id).await?;
    Ok(stored
        .as_ref()
        .and_then(crate::store::StoredEvent::event_type))
}

pub async fn create_event(
    State(app): State<Arc<App>>,
    Path(ns): Path<String>,
    caller: Caller,
    headers: HeaderMap,
    body: Body,
) -> Answer {
    app.guard(&caller, &ns, CREATE_EVENTS, None).await?;
    let max = app.settings.max_event_bytes;
    let body = axum::body::to_bytes(body, max)
        .await
        .map_err(|_| ingest::too_large(max + 1, max))?;
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok());
    let checked = ingest::check(&ns, key, &body, max)?;
    let store = app.store()?;
    let accepted = ingest::publish(store, &ns, checked, body).await?;
    let result = if accepted.duplicate {
        "duplicate"
    } else {
        "accepted"
    };
    app.metrics
        .ingested
        .get_or_create(&crate::metrics::ResultLabel { result })
        .inc();
    Ok((StatusCode::ACCEPTED, Json(accepted)).into_response())
}

fn count_enqueued(app: &App, kind: &'static str, n: usize) {
    app.metrics
        .enqueued
        .get_or_create(&crate::metrics::KindLabel { kind })
        .inc_by(n as u64);
}

pub async fn redeliver(
    State(app): State<Arc<App>>,
    Path((ns, name, event_id)): Path<(String, String, String)>,
    caller: Caller,
) -> Answer {
    let (store, config) = app.endpoint(&caller, &ns, &name, REDELIVER).await?;
    check_event_id(&event_id)?;
    let request = enqueue::request_id();
    enqueue::redeliver(
        store,
        &config,
        &event_id,
        &request,
        app.settings.max_event_bytes,
    )
    .await?;
    count_enqueued(&app, "redeliver", 1);
    tracing::info!(
        namespace = ns,
        endpoint = name,
        event_id,
        request,
        "redelivery queued"
    );
    let body = wire::Queued {
        event_id,
        request_id: request,
    };
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

pub async fn redrive_dead(
    State(app): State<Arc<App>>,
    Path((ns, name)): Path<(String, String)>,
    caller: Caller,
) -> Answer {
    let (store, config) = app.endpoint(&caller, &ns, &name, REDELIVER).await?;
    let request = enqueue::request_id();
    // The newest record of each event says whether it is dead; the log is read back
    // from now, so the newest come first, and with a bound only events published since
    // where the read stopped are known for certain.
    let mut newest = herald_core::dataplane::Newest::default();
    let mut scan = store
        .scan_back(&config.key(), 0, app.budget(&ns).await?)
        .await?;
    while scan
        .next_window(|seq, record| newest.add(seq, &record))
        .await?
    {}
    let complete_from = scan.complete_from();
    let mut truncated = scan.truncated();
    let mut dead = enqueue::dead_events(&newest, complete_from);
    drop(newest);
    if dead.len() > enqueue::MAX_REDRIVE {
        // The oldest first: what is left is asked for again.
        dead.truncate(enqueue::MAX_REDRIVE);
        truncated = Some(wire::Truncated {
            limit: wire::Limit::Count.into(),
            read_back_to: truncated.and_then(|t| t.read_back_to),
        });
    }
    let mut event_ids = Vec::new();
    let mut skipped = Vec::new();
    for id in dead {
        match enqueue::redeliver(store, &config, &id, &request, app.settings.max_event_bytes).await
        {
            Ok(()) => event_ids.push(id),
            // A test event, one past the retention window, or one the endpoint no longer
            // subscribes to: reported, not sent.
            Err(e) if e.status != StatusCode::SERVICE_UNAVAILABLE => skipped.push(id),
            Err(e) => return Err(e),
        }
    }
    count_enqueued(&app, "redrive", event_ids.len());
    tracing::info!(
        namespace = ns,
        endpoint = name,
        request,
        count = event_ids.len(),
        "dead deliveries queued again"
    );
    let body = wire::Redrive {
        request_id: request,
        count: event_ids.len() as u64,
        event_ids,
        skipped,
        truncated,
    };
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

pub async fn send_test_event(
    State(app): State<Arc<App>>,
    Path((ns, name)): Path<(String, String)>,
    caller: Caller,
) -> Answer {
    let (store, config) = app.endpoint(&caller, &ns, &name, REDELIVER).await?;
    let request = enqueue::request_id();
    let event_id =
        enqueue::test_event(store, &config, &request, app.settings.max_event_bytes).await?;
    count_enqueued(&app, "test", 1);
    let body = wire::Queued {
        event_id,
        request_id: request,
    };
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_or_durations_ago() {
        let now = 10_000_000;
        assert_eq!(parse_time("since", "2h", now).unwrap(), now - 7_200_000);
        assert_eq!(parse_time("since", "30s", now).unwrap(), now - 30_000);
        assert_eq!(
            parse_time("since", "1970-01-01T00:00:01Z", now).unwrap(),
            1000
        );
        assert_eq!(
            parse_time("since", "yesterday", now).unwrap_err().code,
            "InvalidTime"
        );
    }

    #[test]
    fn the_page_size_has_a_default_and_a_ceiling() {
        let q = |v: &str| HashMap::from([("limit".to_owned(), v.to_owned())]);
        assert_eq!(limit(&HashMap::new(), 500).unwrap(), 50);
        assert_eq!(limit(&q("500"), 500).unwrap(), 500);
        assert_eq!(limit(&q("501"), 500).unwrap_err().code, "LimitTooLarge");
        assert_eq!(limit(&q("0"), 500).unwrap_err().code, "InvalidLimit");
        assert_eq!(limit(&q("x"), 500).unwrap_err().code, "InvalidLimit");
    }
}
