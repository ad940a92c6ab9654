//! A numbered event stream published at a steady rate, remembering which events
//! JetStream acknowledged and when.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, message::PublishMessage};
use herald_core::api::EventAccepted;
use herald_core::dataplane::{event_sequence, event_subject};
use serde_json::json;

/// An event JetStream acknowledged.
#[derive(Debug, Clone, Copy)]
pub struct Accepted {
    /// Its sequence in `HERALD_EVENTS`.
    pub seq: u64,
    /// When the acknowledgement arrived.
    pub at: Instant,
}

/// What the publisher of a stream saw.
#[derive(Debug, Default)]
pub struct Published {
    /// Event number (its `data`) -> its acknowledgement.
    pub acked: BTreeMap<u64, Accepted>,
    /// Events never acknowledged within the per-event deadline (not accepted: they do
    /// not count as lost if missing).
    pub given_up: Vec<u64>,
    /// Publish attempts that failed or timed out (each retried with the same
    /// `Nats-Msg-Id`).
    pub failed_attempts: u64,
    /// Acks that JetStream flagged as duplicates (an earlier attempt was stored).
    pub duplicate_acks: u64,
    pub last_error: Option<String>,
    /// From the first publish to the last ack.
    pub elapsed: Duration,
}

impl Published {
    /// Adds what another publisher of the same scenario saw.
    pub fn merge(&mut self, other: Published) {
        self.acked.extend(other.acked);
        self.given_up.extend(other.given_up);
        self.failed_attempts += other.failed_attempts;
        self.duplicate_acks += other.duplicate_acks;
        self.last_error = other.last_error.or(self.last_error.take());
        self.elapsed += other.elapsed;
    }

    /// The acknowledged events ordered by stream sequence (the publish order).
    pub fn in_publish_order(&self) -> Vec<u64> {
        let mut by_seq: Vec<(u64, u64)> = self.acked.iter().map(|(n, a)| (a.seq, *n)).collect();
        by_seq.sort_unstable();
        by_seq.into_iter().map(|(_, n)| n).collect()
    }
}

/// The event stream of a scenario.
#[derive(Debug, Clone)]
pub struct StreamSpec {
    pub namespace: String,
    pub event_type: String,
    /// Events numbered `first..first + count`; an event's `data` is its number.
    pub first: u64,
    pub count: u64,
    /// Events per second.
    pub rate: f64,
}

/// How long one event may take to be acknowledged, retries included, before it is given
/// up (and then not counted as accepted).
const EVENT_DEADLINE: Duration = Duration::from_secs(60);
/// How long one publish attempt waits for its ack.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);

/// Where a stream's events are published.
#[derive(Debug, Clone)]
pub enum Publisher {
    /// JetStream directly, each event with `Nats-Msg-Id` `<namespace>-<n>`.
    Nats(jetstream::Context),
    /// `POST /v1/namespaces/<ns>/events` of herald-api at this base URL (no credentials:
    /// an API in development mode), each event with `Idempotency-Key` `<namespace>-<n>`.
    Http {
        base: String,
        client: reqwest::Client,
    },
}

impl Publisher {
    /// One attempt to publish event `n`: its stream sequence, whether it was a
    /// duplicate, or what went wrong.
    async fn publish(&self, spec: &StreamSpec, n: u64, body: &[u8]) -> Result<(u64, bool), String> {
        let key = format!("{}-{n}", spec.namespace);
        match self {
            Publisher::Nats(js) => {
                let subject = event_subject(&spec.namespace, &spec.event_type);
                let ack = js
                    .send_publish(
                        subject,
                        PublishMessage::build()
                            .payload(body.to_vec().into())
                            .message_id(key),
                    )
                    .await
                    .map_err(|e| e.to_string())?
                    .await
                    .map_err(|e| e.to_string())?;
                Ok((ack.sequence, ack.duplicate))
            }
            Publisher::Http { base, client } => {
                let url = format!("{base}/v1/namespaces/{}/events", spec.namespace);
                let response = client
                    .post(url)
                    .header("content-type", "application/json")
                    .header("idempotency-key", key)
                    .body(body.to_vec())
                    .send()
                    .await
                    .map_err(|e| e.to_string())?;
                let status = response.status();
                let answer = response.bytes().await.map_err(|e| e.to_string())?;
                if status.as_u16() != 202 {
                    return Err(format!("{status}: {}", String::from_utf8_lossy(&answer)));
                }
                let accepted: EventAccepted =
                    serde_json::from_slice(&answer).map_err(|e| e.to_string())?;
                let seq = event_sequence(&accepted.event_id)
                    .ok_or_else(|| format!("not an event id: {}", accepted.event_id))?;
                Ok((seq, accepted.duplicate))
            }
        }
    }
}

/// Publishes the stream in the background, one event at a time at a steady rate (a
/// stall — a fault — delays the rest rather than bursting it), each with a key
/// (`<namespace>-<n>`) so a retried publish is stored once. `progress` counts events
/// done (acknowledged or given up).
pub fn publish_stream(
    js: jetstream::Context,
    spec: StreamSpec,
    progress: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<Published> {
    publish_stream_to(Publisher::Nats(js), spec, progress)
}

/// [`publish_stream`] through `publisher`.
pub fn publish_stream_to(
    publisher: Publisher,
    spec: StreamSpec,
    progress: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<Published> {
    tokio::spawn(async move {
        let mut out = Published::default();
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / spec.rate.max(0.1)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let started = Instant::now();
        for n in spec.first..spec.first + spec.count {
            tick.tick().await;
            let body = serde_json::to_vec(&json!({"type": spec.event_type, "data": n}))
                .expect("event JSON");
            let deadline = Instant::now() + EVENT_DEADLINE;
            loop {
                let attempt = publisher.publish(&spec, n, &body);
                let error = match tokio::time::timeout(ATTEMPT_TIMEOUT, attempt).await {
                    Ok(Ok((seq, duplicate))) => {
                        out.duplicate_acks += u64::from(duplicate);
                        out.acked.insert(
                            n,
                            Accepted {
                                seq,
                                at: Instant::now(),
                            },
                        );
                        break;
                    }
                    Ok(Err(e)) => e,
                    Err(_) => format!("no ack within {ATTEMPT_TIMEOUT:?}"),
                };
                out.failed_attempts += 1;
                out.last_error = Some(error);
                if Instant::now() > deadline {
                    out.given_up.push(n);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            progress.store(n + 1 - spec.first, Ordering::SeqCst);
        }
        out.elapsed = started.elapsed();
        out
    })
}

/// Waits (up to 2 minutes) until [`publish_stream`]'s `progress` has counted `n` events.
pub async fn progress_at(progress: &AtomicU64, n: u64) {
    crate::eventually(
        &format!("{n} events published"),
        Duration::from_secs(120),
        || async move { (progress.load(Ordering::SeqCst) >= n).then_some(()) },
    )
    .await;
}
