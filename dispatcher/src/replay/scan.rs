//! Reading a replay's range of the event store: counting what it selects and, unless it
//! is a dry run, queueing each selected event on the endpoint's retry lane with its
//! original id. The cursor is written only after every publish before it was
//! acknowledged, so a worker that stops re-reads at most the events since its last
//! write, and their repeated publishes are dropped by `Nats-Msg-Id`.

use async_nats::jetstream::consumer::pull;
use async_nats::jetstream::context::ConsumerInfoErrorKind;
use async_nats::jetstream::context::PublishAckFuture;
use futures::StreamExt;
use herald_core::dataplane::{
    ATTEMPTS_STREAM, EndpointKey, LaneMessage, Newest, Origin, ReplayProgress, attempt_log,
    event_id, namespace_event_filters, parse_event_subject,
};
use herald_core::envelope::{self, HeaderSize};

use super::{PROGRESS_INTERVAL, Replay, by_start_time, failed, selects, start};
use herald_core::clock::now_ms;

/// Most lane publishes awaiting their acknowledgement.
const PUBLISH_WINDOW: usize = 1024;

impl Replay<'_> {
    /// Reads the range from where `progress` says to its end; `progress.done` after.
    pub(super) async fn scan(
        &self,
        progress: &mut ReplayProgress,
    ) -> Result<(), async_nats::Error> {
        let request = self.request;
        if progress.started_ms == 0 {
            progress.started_ms = now_ms();
        }
        let failed_log = if request.only_failed {
            Some(self.failed_in_log().await?)
        } else {
            None
        };
        let mut consumer = self
            .shared
            .layout
            .events
            .create_consumer(pull::OrderedConfig {
                filter_subjects: namespace_event_filters(&request.namespace),
                deliver_policy: start(request, progress),
                max_batch: herald_core::dataplane::READ_BATCH,
                ..Default::default()
            })
            .await?;
        let mut remaining = consumer.info().await?.num_pending;
        let mut messages = consumer.messages().await?;
        let mut unacked = Unacked::default();
        let mut fanned_out = FannedOut::default();
        let mut last_write = tokio::time::Instant::now();
        while remaining > 0 {
            let Some(message) = messages.next().await else {
                break;
            };
            let message = message?;
            let info = message.info()?;
            remaining = info.pending;
            let published_ms = (info.published.unix_timestamp_nanos() / 1_000_000).max(0) as u64;
            if published_ms >= request.to_ms {
                break;
            }
            let id = event_id(published_ms, info.stream_sequence);
            let selected = parse_event_subject(message.subject.as_str()).is_some_and(|(_, ty)| {
                selects(request, self.endpoint, self.types, ty, published_ms)
            }) && failed_log.as_ref().is_none_or(|f| failed(f, &id));
            if selected {
                // Checked again like a fresh event: one that was never deliverable (it
                // went to the dead-letter stream) is not the endpoint's to replay.
                let event = envelope::parse(
                    message.subject.as_str(),
                    &message.payload,
                    HeaderSize::of(message.headers.as_ref()),
                    jiff::Timestamp::from_millisecond(published_ms as i64)
                        .unwrap_or(jiff::Timestamp::UNIX_EPOCH),
                    self.shared.settings.max_event_bytes,
                );
                if let Ok(event) = event {
                    progress.matched += 1;
                    if !request.dry_run && self.endpoint.config.ordered {
                        fanned_out
                            .wait_past(self, message.subject.as_str(), info.stream_sequence)
                            .await?;
                    }
                    if !request.dry_run {
                        unacked.push(self.enqueue(&id, published_ms, event.body).await?);
                    }
                }
            }
            progress.cursor = info.stream_sequence;
            if unacked.len() >= PUBLISH_WINDOW || last_write.elapsed() >= PROGRESS_INTERVAL {
                progress.enqueued += unacked.settle().await?;
                self.write_progress(progress).await?;
                last_write = tokio::time::Instant::now();
            }
        }
        progress.enqueued += unacked.settle().await?;
        progress.done = true;
        self.write_progress(progress).await?;
        tracing::info!(
            replay = self.key,
            matched = progress.matched,
            enqueued = progress.enqueued,
            "replay range read"
        );
        Ok(())
    }

    /// Publishes one event to the endpoint's retry lane (not waiting for the ack).
    async fn enqueue(
        &self,
        id: &str,
        published_ms: u64,
        body: bytes::Bytes,
    ) -> Result<PublishAckFuture, async_nats::Error> {
        let config = &self.endpoint.config;
        let origin = Origin::Replay(&self.request.uid);
        let message = LaneMessage::for_endpoint(config, id, published_ms, &body, origin);
        let subject = message.subject(&self.endpoint.key, config.shard);
        let publish = message.publish(body);
        Ok(self.shared.layout.js.send_publish(subject, publish).await?)
    }

    /// Where each delivery of the range stands, from the endpoint's attempt log (attempts
    /// of events published at or after `from` are all logged after it): a map of event
    /// ids to a sequence and a state, about 100 bytes an event, no record kept.
    async fn failed_in_log(&self) -> Result<Newest, async_nats::Error> {
        let key = EndpointKey::new(&self.request.namespace, &self.request.endpoint);
        let stream = self.shared.layout.js.get_stream(ATTEMPTS_STREAM).await?;
        let mut consumer = stream
            .create_consumer(pull::OrderedConfig {
                filter_subject: key.attempts_subject(),
                deliver_policy: by_start_time(self.request.from_ms),
                max_batch: herald_core::dataplane::READ_BATCH,
                ..Default::default()
            })
            .await?;
        let mut remaining = consumer.info().await?.num_pending;
        let mut messages = consumer.messages().await?;
        let mut newest = Newest::default();
        while remaining > 0 {
            let Some(message) = messages.next().await else {
                break;
            };
            let message = message?;
            let info = message.info()?;
            remaining = info.pending;
            newest.add_batch(info.stream_sequence, attempt_log::decode(&message.payload));
        }
        Ok(newest)
    }
}

/// How far fan-out has gone, as far as an ordered endpoint's replay has looked: its copy
/// of an event is enqueued only once the event's fresh copy is stored (the fan-out
/// consumer's ack floor has passed it), so it lands on the lanes after it, and the shard
/// sends it after every fresh item stored before it (`Lanes::next_ready`). Without this
/// a replay requested while fan-out catches up (after a failover) would send events the
/// fresh lane has not reached yet, ahead of older ones.
#[derive(Default)]
struct FannedOut {
    /// Ack floor seen per fan-out consumer.
    floors: std::collections::HashMap<String, u64>,
}

/// How often a replay waiting for fan-out looks again.
const FANOUT_POLL: std::time::Duration = std::time::Duration::from_millis(250);

impl FannedOut {
    async fn wait_past(
        &mut self,
        replay: &Replay<'_>,
        subject: &str,
        seq: u64,
    ) -> Result<(), async_nats::Error> {
        let consumer = crate::fanout::Source::of_subject(subject).consumer();
        let floor = self.floors.entry(consumer.clone()).or_default();
        while *floor < seq {
            let info = match replay.shared.layout.events.consumer_info(&consumer).await {
                Ok(info) => info,
                // No worker has ever fanned this source out: nothing to come after.
                Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(e.into()),
            };
            *floor = info.ack_floor.stream_sequence;
            if *floor < seq {
                tokio::time::sleep(FANOUT_POLL).await;
            }
        }
        Ok(())
    }
}

/// Lane publishes sent and not yet known to be stored.
#[derive(Default)]
struct Unacked(Vec<PublishAckFuture>);

impl Unacked {
    fn push(&mut self, ack: PublishAckFuture) {
        self.0.push(ack);
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    /// Waits for every acknowledgement; how many there were.
    async fn settle(&mut self) -> Result<u64, async_nats::Error> {
        let n = self.0.len() as u64;
        for ack in self.0.drain(..) {
            ack.await?;
        }
        Ok(n)
    }
}
