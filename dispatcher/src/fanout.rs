//! Fan-out: every stored event becomes one message on the fresh lane of every matching
//! endpoint — at least once and idempotently.
//!
//! One durable consumer (`herald-fanout`) serves all replicas with a pinned-client
//! priority group, so exactly one replica fans out at a time, in stream order (which keeps
//! `ordered` endpoints' lanes in publish order), and another takes over if it stops.
//! Lane publishes carry `Nats-Msg-Id: <event id>.<endpoint uid>`; the event is acked only
//! after every lane publish is acknowledged, so a crash in between re-delivers the event
//! and JetStream's duplicate window drops the repeated lane messages.

use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{self, PriorityPolicy, pull};
use async_nats::jetstream::context::PublishAckFuture;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, Message};
use futures::StreamExt;
use herald_core::dataplane::{
    self, DEADLETTER_PREFIX, EVENT_ID_HEADER, Lane, ORDERING_KEY_HEADER, PUBLISHED_HEADER,
    REASON_HEADER, SUBJECT_HEADER,
};
use tokio::sync::mpsc;

use crate::envelope::{self, BadEvent};
use crate::index::Index;
use crate::metrics::Metrics;

/// Name of the shared durable consumer.
pub const CONSUMER: &str = "herald-fanout";
const GROUP: &str = "herald";
/// Events fanned out but not yet acked (their lane publishes are in flight).
const PIPELINE: usize = 4096;

pub struct FanOut {
    pub js: jetstream::Context,
    pub events: jetstream::stream::Stream,
    pub index: Index,
    pub metrics: Arc<Metrics>,
    pub max_event_bytes: usize,
}

/// An event whose lane publishes are in flight; acked once they all are.
struct Pending {
    message: Message,
    acks: Vec<PublishAckFuture>,
}

impl FanOut {
    /// Runs until `shutdown` resolves.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), async_nats::Error> {
        let consumer = self
            .events
            .get_or_create_consumer(
                CONSUMER,
                pull::Config {
                    durable_name: Some(CONSUMER.to_owned()),
                    ack_policy: consumer::AckPolicy::Explicit,
                    ack_wait: Duration::from_secs(30),
                    max_ack_pending: 20_000,
                    priority_policy: PriorityPolicy::PinnedClient,
                    priority_groups: vec![GROUP.to_owned()],
                    priority_timeout: Duration::from_secs(10),
                    ..Default::default()
                },
            )
            .await?;
        let mut messages = consumer
            .stream()
            .group(GROUP)
            .max_messages_per_batch(1000)
            .expires(Duration::from_secs(5))
            .heartbeat(Duration::from_secs(2))
            .messages()
            .await?;
        let (tx, rx) = mpsc::channel::<Pending>(PIPELINE);
        let acker = tokio::spawn(ack_in_order(rx, self.metrics.clone()));
        tokio::pin!(shutdown);
        loop {
            let message = tokio::select! {
                _ = &mut shutdown => break,
                next = messages.next() => match next {
                    Some(Ok(message)) => message,
                    Some(Err(error)) => {
                        tracing::debug!(%error, "fan-out pull");
                        continue;
                    }
                    None => break,
                },
            };
            if let Some(pending) = self.fan_out(message).await
                && tx.send(pending).await.is_err()
            {
                break;
            }
        }
        drop(tx);
        let _ = acker.await;
        Ok(())
    }

    /// Publishes the event's lane messages (without waiting for their acks), or its
    /// dead letter.
    async fn fan_out(&self, message: Message) -> Option<Pending> {
        let Ok(info) = message.info() else {
            return None;
        };
        let seq = info.stream_sequence;
        let published_ms = (info.published.unix_timestamp_nanos() / 1_000_000).max(0) as u64;
        let published = jiff::Timestamp::from_millisecond(published_ms as i64)
            .unwrap_or(jiff::Timestamp::UNIX_EPOCH);
        let event_id = dataplane::event_id(published_ms, seq);
        let event = envelope::parse(
            message.subject.as_str(),
            &message.payload,
            published,
            self.max_event_bytes,
        )
        .and_then(
            |event| match self.index.matching(&event.namespace, &event.event_type) {
                Some(endpoints) => Ok((event, endpoints)),
                None => Err(BadEvent::UnknownTenant(event.namespace)),
            },
        );
        let (event, endpoints) = match event {
            Ok(ok) => ok,
            Err(bad) => return self.dead_letter(message, &event_id, bad).await,
        };
        self.metrics.events_ingested.inc();
        let mut acks = Vec::new();
        // Parsed only when an endpoint orders by a key from the event.
        let mut parsed: Option<serde_json::Value> = None;
        for endpoint in &endpoints {
            let mut headers = HeaderMap::new();
            headers.insert(EVENT_ID_HEADER, event_id.as_str());
            headers.insert(PUBLISHED_HEADER, published_ms.to_string().as_str());
            if let (true, Some(pointer)) = (endpoint.config.ordered, &endpoint.config.ordering_key)
            {
                let value = parsed.get_or_insert_with(|| {
                    serde_json::from_slice(&event.body).unwrap_or(serde_json::Value::Null)
                });
                let key = ordering_key_hash(value.pointer(pointer));
                headers.insert(ORDERING_KEY_HEADER, format!("{key:x}").as_str());
            }
            let publish = PublishMessage::build()
                .payload(event.body.clone())
                .headers(headers)
                .message_id(format!("{event_id}.{}", endpoint.config.uid));
            let subject = endpoint.key.lane_subject(endpoint.config.shard, Lane::New);
            match self.js.send_publish(subject, publish).await {
                Ok(ack) => acks.push(ack),
                Err(error) => {
                    // Not acked: JetStream re-delivers the event after ack_wait and the
                    // lane publishes that did go through are deduplicated.
                    tracing::warn!(%error, seq, "fan-out publish failed; the event will be retried");
                    return None;
                }
            }
        }
        Some(Pending { message, acks })
    }

    async fn dead_letter(
        &self,
        message: Message,
        event_id: &str,
        bad: BadEvent,
    ) -> Option<Pending> {
        let reason = bad.reason();
        tracing::warn!(
            subject = message.subject.as_str(),
            event_id,
            reason,
            error = %bad,
            "event cannot be delivered; moved to the dead-letter stream"
        );
        self.metrics
            .dead_letters
            .get_or_create(&ReasonLabel { reason })
            .inc();
        let mut headers = HeaderMap::new();
        headers.insert(REASON_HEADER, bad.to_string().as_str());
        headers.insert(EVENT_ID_HEADER, event_id);
        headers.insert(SUBJECT_HEADER, message.subject.as_str());
        let publish = PublishMessage::build()
            .payload(message.payload.clone())
            .headers(headers)
            .message_id(format!("dl.{event_id}"));
        match self
            .js
            .send_publish(format!("{DEADLETTER_PREFIX}.{reason}"), publish)
            .await
        {
            Ok(ack) => Some(Pending {
                message,
                acks: vec![ack],
            }),
            Err(error) => {
                tracing::warn!(%error, "dead-letter publish failed; the event will be retried");
                None
            }
        }
    }
}

/// FNV-1a of the ordering key's text (a string as is, anything else as JSON; a missing
/// field is the empty key, shared by every event without it).
pub fn ordering_key_hash(value: Option<&serde_json::Value>) -> u64 {
    let text = match value {
        None => String::new(),
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    dataplane::fnv1a(text.bytes())
}

/// Label set of the dead-letter counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

async fn ack_in_order(mut rx: mpsc::Receiver<Pending>, metrics: Arc<Metrics>) {
    while let Some(Pending { message, acks }) = rx.recv().await {
        let mut ok = true;
        for ack in acks {
            if let Err(error) = ack.await {
                tracing::warn!(%error, "lane publish not acknowledged; the event will be retried");
                ok = false;
            }
        }
        if ok {
            metrics.fanned_out.inc();
            if let Err(error) = message.ack().await {
                tracing::debug!(%error, "event ack failed; it will be fanned out again (deduplicated)");
            }
        } else {
            let _ = message
                .ack_with(jetstream::AckKind::Nak(Some(Duration::from_secs(1))))
                .await;
        }
    }
}
