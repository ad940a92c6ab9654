//! Acknowledging events: an event is acked once all its lane publishes are, in stream
//! order; one that was not is left to be redelivered (and fanned out again,
//! deduplicated).

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, Message};
use futures::StreamExt;
use futures::stream::FuturesOrdered;
use tokio::sync::mpsc;

use super::{LaneAck, PIPELINE, Pending};
use crate::metrics::Metrics;

/// Acks events in order once all their lane publishes are acknowledged. Every event's
/// acks are awaited from the moment it arrives (not one event after another), so a
/// batch of publishes that NATS lost costs one ack timeout, not one per event. An event
/// whose publishes were not acknowledged is not acked: it is redelivered and fanned out
/// again (deduplicated).
pub(super) async fn ack_in_order(mut rx: mpsc::Receiver<Pending>, metrics: Arc<Metrics>) {
    let mut inflight = FuturesOrdered::new();
    let mut open = true;
    while open || !inflight.is_empty() {
        tokio::select! {
            Some((message, ok)) = inflight.next(), if !inflight.is_empty() => {
                settle(message, ok, &metrics).await;
            }
            pending = rx.recv(), if open && inflight.len() < PIPELINE => match pending {
                Some(Pending { message, acks }) => inflight.push_back(async move {
                    // Polled as soon as it is queued, and all of the event's acks at once:
                    // publishes NATS lost cost one ack timeout, not one each.
                    let results =
                        futures::future::join_all(acks.into_iter().map(LaneAck::stored)).await;
                    let lost = results.iter().filter(|r| r.is_err()).count();
                    if let Some(Err(error)) = results.into_iter().find(Result::is_err) {
                        tracing::warn!(%error, lost, "lane publishes not acknowledged; the event will be retried");
                    }
                    (message, lost == 0)
                }),
                None => open = false,
            },
        }
    }
}

async fn settle(message: Option<Message>, ok: bool, metrics: &Metrics) {
    let Some(message) = message else {
        return;
    };
    if ok {
        metrics.fanned_out.inc();
        if let Ok(info) = message.info() {
            let accepted_ms = (info.published.unix_timestamp_nanos() / 1_000_000).max(0) as u64;
            let waited_ms = herald_core::clock::now_ms().saturating_sub(accepted_ms);
            metrics.fanout_latency.observe(waited_ms as f64 / 1e3);
        }
        if let Err(error) = message.ack().await {
            tracing::debug!(%error, "event ack failed; it will be fanned out again (deduplicated)");
        }
    } else {
        let _ = message
            .ack_with(jetstream::AckKind::Nak(Some(Duration::from_secs(1))))
            .await;
    }
}
