//! Delivery state that must outlive this process ([`LastingState`]: disabled, the
//! failure clock behind `disableAfter`, an open circuit, a receiver's `Retry-After`),
//! kept under `state.<shard>.<ns>.<name>` in the health bucket. Written at once when it
//! changes, deleted when the endpoint is healthy again, read back by the next owner of
//! the shard before it delivers anything.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use futures::StreamExt;
use herald_core::dataplane::{
    BucketKey, EndpointKey, HEALTH_BUCKET, KV_OPERATION_HEADER, LastingState, event_published_ms,
    parse_schedule_subject, shard_schedules_filter,
};

use super::Runtime;
use crate::supervise::with_retries;
use herald_core::clock::now_ms;

/// How long loading a shard's saved state may take before the shard starts without
/// what is left (it is re-saved by whoever still has it).
const LOAD_TIMEOUT: Duration = Duration::from_secs(10);

/// Reads every saved state of `shard`.
pub async fn load(
    js: &async_nats::jetstream::Context,
    shard: u32,
) -> Result<HashMap<EndpointKey, LastingState>, async_nats::Error> {
    let stream = js.get_stream(format!("KV_{HEALTH_BUCKET}")).await?;
    let prefix = format!("$KV.{HEALTH_BUCKET}.");
    let mut consumer = stream
        .create_consumer(pull::OrderedConfig {
            filter_subject: format!("{prefix}{}", BucketKey::lasting_filter(shard)),
            deliver_policy: DeliverPolicy::LastPerSubject,
            ..Default::default()
        })
        .await?;
    let mut remaining = consumer.info().await?.num_pending;
    let mut saved = HashMap::new();
    if remaining == 0 {
        return Ok(saved);
    }
    let mut messages = consumer.messages().await?;
    let read = async {
        while remaining > 0 {
            let Some(message) = messages.next().await else {
                break;
            };
            let message = message?;
            remaining = message.info().map(|i| i.pending).unwrap_or(0);
            let deleted = message
                .headers
                .as_ref()
                .and_then(|h| h.get(KV_OPERATION_HEADER))
                .is_some_and(|op| op.as_str() != "PUT");
            let key = message
                .subject
                .as_str()
                .strip_prefix(&prefix)
                .and_then(BucketKey::parse);
            if let (false, Some(BucketKey::Lasting { key, .. })) = (deleted, key) {
                match serde_json::from_slice::<LastingState>(&message.payload) {
                    Ok(state) => {
                        saved.insert(key, state);
                    }
                    Err(error) => {
                        tracing::warn!(endpoint = %key, %error, "ignoring unreadable saved state")
                    }
                }
            }
        }
        Ok::<_, async_nats::Error>(())
    };
    match tokio::time::timeout(LOAD_TIMEOUT, read).await {
        Ok(result) => result?,
        Err(_) => tracing::warn!(shard, "loading saved endpoint state timed out; going on"),
    }
    Ok(saved)
}

/// Retries waiting as schedules on `shard`, per endpoint: how many, and the publish time
/// of the oldest (from the event ids in the schedules' subjects).
pub async fn load_scheduled(
    deliveries: &async_nats::jetstream::stream::Stream,
    shard: u32,
) -> Result<HashMap<EndpointKey, (u64, Option<u64>)>, async_nats::Error> {
    use futures::TryStreamExt;
    let filter = shard_schedules_filter(shard);
    let mut subjects = deliveries.info_with_subjects(filter).await?;
    let mut scheduled: HashMap<EndpointKey, (u64, Option<u64>)> = HashMap::new();
    while let Some((subject, count)) = subjects.try_next().await? {
        let Some((_, key, event_id)) = parse_schedule_subject(&subject) else {
            continue;
        };
        let published = event_published_ms(event_id);
        let (n, oldest) = scheduled.entry(key).or_default();
        *n += count as u64;
        *oldest = match (*oldest, published) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    Ok(scheduled)
}

/// A save of one key: the value, or `None` to delete it.
pub type Save = (String, Option<Bytes>);

/// Writes saves in the order they were made (a retried older value never overwrites a
/// newer one), the latest per key only, each retried through a short NATS outage. Ends
/// when the shard drops its sender.
pub fn saver(kv: async_nats::jetstream::kv::Store) -> mpsc::UnboundedSender<Save> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Save>();
    tokio::spawn(async move {
        while let Some(first) = rx.recv().await {
            // Coalesce what queued meanwhile: the latest value of each key wins.
            let mut batch: Vec<Save> = vec![first];
            while let Ok(next) = rx.try_recv() {
                batch.retain(|(name, _)| *name != next.0);
                batch.push(next);
            }
            for (name, value) in batch {
                let save = || async {
                    match &value {
                        Some(value) => kv
                            .put(&name, value.clone())
                            .await
                            .map(|_| ())
                            .map_err(async_nats::Error::from),
                        None => kv.delete(&name).await.map_err(async_nats::Error::from),
                    }
                };
                let _ = with_retries("saving endpoint state", 8, save).await;
            }
        }
    });
    tx
}

impl Runtime {
    /// Saves (or deletes) the endpoint's lasting state when it differs from what was
    /// saved last.
    pub(super) fn save_lasting(&mut self, key: &EndpointKey) {
        let Some(state) = self.endpoints.get(key).map(|slot| &slot.state) else {
            return;
        };
        let lasting = state.lasting(std::time::Instant::now(), now_ms());
        if !self.reports.lasting_changed(key, lasting.as_ref()) {
            return;
        }
        let name = BucketKey::Lasting {
            shard: self.shard,
            key: key.clone(),
        }
        .to_string();
        let value = lasting.map(|l| Bytes::from(serde_json::to_vec(&l).expect("serializes")));
        let _ = self.saver.send((name, value));
    }
}
