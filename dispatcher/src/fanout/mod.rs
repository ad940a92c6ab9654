//! Fan-out: every stored event becomes one message on the fresh lane of every matching
//! endpoint — at least once, idempotently, and in publish order.
//!
//! Partitioned: the event store stores every event under
//! `herald.stored.<partition>.<ns>.<type>`, its namespace hashed by the server into one
//! of as many partitions as there are shards, and partition `p` is fanned out by the
//! owner of shard `p` (one durable consumer `herald-fanout-<p>` each), so fan-out runs on
//! every replica and one tenant's burst lengthens only its own partition's backlog. The
//! owner of shard 0 also runs `herald-fanout` on `herald.events.>`: events stored
//! without a partition (those stored before partitioning, and subjects without a type,
//! which are dead letters). Each consumer has a pinned-client priority group, so two
//! workers never fan out one partition at once, even while its shard changes hands; the
//! new owner unpins the old one instead of waiting for its pin to time out. Lane
//! publishes carry `Nats-Msg-Id: <event id>.<endpoint uid>`; the event is acked only
//! after every lane publish is acknowledged, so a crash in between re-delivers the event
//! and JetStream's duplicate window drops the repeated lane messages.
//!
//! Lane publishes are pipelined, except that an `ordered` endpoint's next publish (per
//! key, for one that orders by key) waits for its previous one's ack (`order`).
//!
//! Tenants of a partition take turns: a worker reads up to `READ_AHEAD` events ahead
//! into one queue per namespace and fans out one event of each in turn (`turns`), so a
//! tenant's burst waits behind itself, not in front of its neighbours; a namespace's
//! events keep their order.
//!
//! Contract:
//! - nothing is fanned out before the configuration is completely loaded (an event is
//!   never skipped or dead-lettered because its endpoints are not known yet);
//! - a lane publish that cannot be sent is retried in place, before any later event is
//!   looked at; one that is sent but not stored is retried by redelivery, and first, in
//!   place, by the next event of its ordering unit, so a transient failure cannot put a
//!   later event ahead of an earlier one on an `ordered` endpoint;
//! - a new fan-out worker first re-publishes the events its predecessor had taken but not
//!   acknowledged (from the consumer's ack floor), before any newer event: JetStream
//!   would only redeliver those after their ack wait, behind newer events, which would
//!   reorder `ordered` endpoints after a crash;
//! - a partition's worker fans nothing out while `herald-fanout` still holds events
//!   stored before partitioning (an upgrade): they are older than any partitioned event.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{self, PriorityPolicy, pull};
use async_nats::jetstream::{self, Message};
use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use herald_core::dataplane::{self, DeadLetter, LaneMessage, Origin, lane};
use tokio::sync::{mpsc, watch};

mod ack;
mod catch_up;
mod intake;
mod order;
mod partition;
mod turns;

pub use partition::{Source, spawn_for_shard};

use crate::index::Index;
use crate::metrics::{Metrics, PartitionLabel, ReasonLabel};
use crate::supervise::{Backoff, Owned, Readiness};
use herald_core::envelope::{self, BadEvent, HeaderSize};
use intake::Intake;
use order::{LaneAck, Tail, Tails, Unit};
use turns::Turns;

/// Name of the durable consumer of events stored without a partition; partition `p`'s is
/// `herald-fanout-<p>`.
pub const CONSUMER: &str = "herald-fanout";
/// The readiness part fan-out reports.
pub const PART: &str = "fanout";
const GROUP: &str = "herald";
/// Events fanned out but not yet acked (their lane publishes are in flight).
const PIPELINE: usize = 4096;
/// Events a partition's worker reads ahead of what it fans out, so that its tenants
/// take turns (`turns`): with the acker's `PIPELINE`, under the consumer's
/// `max_ack_pending`.
const READ_AHEAD: usize = 10_000;
/// Bytes of events read ahead, at most (one event is always taken).
const READ_AHEAD_BYTES: usize = 32 << 20;
/// How often events waiting in the read-ahead tell JetStream they are in progress; well
/// under the consumer's ack wait.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);
/// How often the fan-out lag gauge is refreshed from the consumer's state.
const LAG_INTERVAL: Duration = Duration::from_secs(5);
/// Bytes of an event kept in its dead letter when the event itself is too large: the
/// dead letter must fit NATS' `max_payload` with its own headers, or its publish would
/// fail forever and hold fan-out up.
const DEAD_LETTER_SAMPLE: usize = 4096;

pub struct FanOut {
    pub js: jetstream::Context,
    pub events: jetstream::stream::Stream,
    pub index: Index,
    pub metrics: Arc<Metrics>,
    pub max_event_bytes: usize,
    pub source: Source,
    /// The last publish of each ordering unit, until it is stored.
    tails: Tails,
}

/// A stored event, from the consumer or read back from the stream.
struct Stored {
    seq: u64,
    published_ms: u64,
    subject: async_nats::Subject,
    payload: Bytes,
    headers: HeaderSize,
}

impl Stored {
    fn from_message(message: &Message) -> Option<Self> {
        let info = message.info().ok()?;
        Some(Self {
            seq: info.stream_sequence,
            published_ms: (info.published.unix_timestamp_nanos() / 1_000_000).max(0) as u64,
            subject: message.subject.clone(),
            payload: message.payload.clone(),
            headers: HeaderSize::of(message.headers.as_ref()),
        })
    }
}

/// An event whose lane publishes are in flight; acked once they all are.
struct Pending {
    message: Option<Message>,
    acks: Vec<LaneAck>,
}

/// The publishes could not be sent; try the event again.
struct Retry;

impl FanOut {
    /// Runs until `stop` is set. An error is for the supervisor (it restarts).
    pub async fn run(
        self,
        readiness: Arc<Readiness>,
        mut stop: watch::Receiver<bool>,
    ) -> Result<(), async_nats::Error> {
        tokio::select! {
            _ = self.index.wait_loaded() => {}
            _ = stop.wait_for(|s| *s) => return Ok(()),
        }
        let (consumer, mut messages) = self.consume().await?;
        readiness.set(PART, true);
        tracing::info!(source = ?self.source, "fan-out running");
        let (tx, rx) = mpsc::channel::<Pending>(PIPELINE);
        let acker = tokio::spawn(ack::ack_in_order(rx, self.metrics.clone()));
        let lag = Owned::new(tokio::spawn(report_lag(
            consumer.clone(),
            self.metrics.clone(),
            self.source.label(),
        )));
        let mut intake = Intake::default();
        let mut turns = Turns::new(self.source.read_ahead(), READ_AHEAD_BYTES);
        // A worker's first message, or one after a gap, waits until the read-ahead is
        // fanned out: the events it re-publishes first are older than it, and than
        // nothing queued (see `catch_up`).
        let mut held: Option<Message> = None;
        let mut progress = tokio::time::Instant::now();
        let result = loop {
            if *stop.borrow() || stop.has_changed().is_err() {
                // Asked to stop, or its shard gone. What is read ahead is not acked: the
                // next worker re-publishes it first.
                break Ok(());
            }
            // Take in what has arrived, without waiting, up to the read-ahead's bound.
            let mut ended = ControlFlow::Continue(());
            while held.is_none() && !turns.is_full() {
                let message = match messages.next().now_or_never() {
                    Some(Some(Ok(message))) => message,
                    Some(Some(Err(error))) => {
                        tracing::debug!(%error, "fan-out pull");
                        continue;
                    }
                    Some(None) => {
                        ended = ControlFlow::Break(Err("the fan-out consumer ended".into()));
                        break;
                    }
                    None => break,
                };
                if !turns.is_empty() {
                    match self.catch_up_first(&message, &mut intake, &mut stop).await {
                        Ok(false) => {}
                        Ok(true) => {
                            held = Some(message);
                            break;
                        }
                        Err(error) => {
                            ended = ControlFlow::Break(Err(error));
                            break;
                        }
                    }
                }
                ended = self
                    .admit(message, &mut intake, &mut turns, &consumer, &mut stop)
                    .await;
                if ended.is_break() {
                    break;
                }
            }
            if let ControlFlow::Break(result) = ended {
                break result;
            }
            if turns.is_empty() {
                let message = match held.take() {
                    Some(message) => message,
                    None => tokio::select! {
                        _ = stop.wait_for(|s| *s) => break Ok(()),
                        next = messages.next() => match next {
                            Some(Ok(message)) => message,
                            Some(Err(error)) => {
                                tracing::debug!(%error, "fan-out pull");
                                continue;
                            }
                            None => break Err("the fan-out consumer ended".into()),
                        },
                    },
                };
                if let ControlFlow::Break(result) = self
                    .admit(message, &mut intake, &mut turns, &consumer, &mut stop)
                    .await
                {
                    break result;
                }
                continue;
            }
            if progress.elapsed() >= PROGRESS_EVERY {
                // Read ahead is not forgotten: JetStream would redeliver an event still
                // queued here after its ack wait.
                for (_, message) in turns.iter() {
                    if let Err(error) = message.ack_with(jetstream::AckKind::Progress).await {
                        tracing::debug!(%error, "extending a queued event's ack wait");
                    }
                }
                progress = tokio::time::Instant::now();
            }
            let Some((stored, message)) = turns.pop() else {
                continue;
            };
            let Some(pending) = self
                .fan_out_retrying(&stored, Some(message), &mut stop)
                .await
            else {
                break Ok(());
            };
            if tx.send(pending).await.is_err() {
                break Err("the fan-out acker stopped".into());
            }
            if turns.is_empty() && intake.drained {
                intake.everything = None;
            }
        };
        tracing::info!(source = ?self.source, expected = ?intake.expected, ?result, "fan-out worker stopped");
        drop(tx);
        let _ = acker.await;
        drop(lag);
        self.metrics.fanout_pending.remove(&self.source.label());
        result
    }

    /// The source's durable consumer and its message stream. The filter of an existing
    /// consumer is brought up to date (`herald-fanout` had none before partitioning), and
    /// a predecessor's pin is lifted: this worker runs because its replica holds the
    /// shard's lease, so the predecessor has stopped or is stopping.
    async fn consume(
        &self,
    ) -> Result<(consumer::Consumer<pull::Config>, consumer::pull::Stream), async_nats::Error> {
        let name = self.source.consumer();
        let config = pull::Config {
            durable_name: Some(name.clone()),
            filter_subject: self.source.filter(),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(30),
            max_ack_pending: 20_000,
            priority_policy: PriorityPolicy::PinnedClient,
            priority_groups: vec![GROUP.to_owned()],
            priority_timeout: Duration::from_secs(10),
            ..Default::default()
        };
        let mut consumer = self
            .events
            .get_or_create_consumer(&name, config.clone())
            .await?;
        if consumer.cached_info().config.filter_subject != config.filter_subject {
            tracing::info!(
                consumer = name,
                filter = config.filter_subject,
                "updating the fan-out consumer's filter"
            );
            self.events.update_consumer(config).await?;
            consumer = self.events.get_consumer(&name).await?;
        }
        if let Err(error) = self.events.unpin_consumer(&name, GROUP).await {
            tracing::debug!(%error, consumer = name, "unpinning the fan-out consumer");
        }
        let messages = consumer
            .stream()
            .group(GROUP)
            .max_messages_per_batch(1000)
            .expires(Duration::from_secs(5))
            .heartbeat(Duration::from_secs(2))
            .messages()
            .await?;
        Ok((consumer, messages))
    }

    /// [`Self::fan_out`] until its publishes are sent (or `stop`: `None`).
    async fn fan_out_retrying(
        &self,
        stored: &Stored,
        message: Option<Message>,
        stop: &mut watch::Receiver<bool>,
    ) -> Option<Pending> {
        // Capped at 1 s: once a new stream leader answers, the partition goes on within
        // a second.
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
        let mut message = message;
        loop {
            if let Ok(acks) = self.fan_out(stored).await {
                return Some(Pending { message, acks });
            }
            tracing::warn!(
                seq = stored.seq,
                "fan-out publish failed; retrying the event before any later one"
            );
            tokio::select! {
                _ = tokio::time::sleep(backoff.next_delay(fastrand::f64())) => {}
                _ = stop.wait_for(|s| *s) => {
                    // Not acked: redelivered to the next worker.
                    message.take();
                    return None;
                }
            }
        }
    }

    /// Publishes the event's lane messages (without waiting for their acks, but an
    /// ordering unit's previous one's), or its dead letter.
    async fn fan_out(&self, stored: &Stored) -> Result<Vec<LaneAck>, Retry> {
        let published = jiff::Timestamp::from_millisecond(stored.published_ms as i64)
            .unwrap_or(jiff::Timestamp::UNIX_EPOCH);
        let event_id = dataplane::event_id(stored.published_ms, stored.seq);
        let event = envelope::parse(
            stored.subject.as_str(),
            &stored.payload,
            stored.headers,
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
            Err(bad) => return self.dead_letter(stored, &event_id, bad).await,
        };
        self.metrics.events_ingested.inc();
        let mut acks = Vec::with_capacity(endpoints.len());
        // Parsed only when an endpoint orders by a key from the event.
        let mut parsed: Option<serde_json::Value> = None;
        for endpoint in &endpoints {
            let ordering_key = lane::ordering_pointer(&endpoint.config).map(|pointer| {
                let value = parsed.get_or_insert_with(|| {
                    serde_json::from_slice(&event.body).unwrap_or(serde_json::Value::Null)
                });
                lane::ordering_key(value, pointer)
            });
            let message = LaneMessage {
                event_id: &event_id,
                published_ms: stored.published_ms,
                endpoint_uid: &endpoint.config.uid,
                ordering_key,
                origin: Origin::FanOut,
            };
            let publish = message.publish(event.body.clone());
            let subject = message.subject(&endpoint.key, endpoint.config.shard);
            if !endpoint.config.ordered {
                // The publishes that went through are deduplicated when it is retried.
                let ack = self
                    .js
                    .send_publish(subject, publish)
                    .await
                    .map_err(|_| Retry)?;
                acks.push(LaneAck::Plain(ack));
                continue;
            }
            let unit = Unit {
                uid: endpoint.config.uid.clone(),
                key: ordering_key,
            };
            self.after_tail(&unit).await?;
            let ack = self
                .js
                .send_publish(subject.clone(), publish.clone())
                .await
                .map_err(|_| Retry)?;
            let tail = Tail::new(ack, subject, publish);
            acks.push(LaneAck::Ordered(tail.ack.clone()));
            self.tails.put(unit, tail);
        }
        Ok(acks)
    }

    /// Waits until the unit's previous publish is stored, sending it again (once) if it
    /// was not; `Retry` (its tail kept) if that failed too.
    async fn after_tail(&self, unit: &Unit) -> Result<(), Retry> {
        let Some(tail) = self.tails.take(unit) else {
            return Ok(());
        };
        if tail.ack.clone().await.is_ok() {
            return Ok(());
        }
        let again = match self
            .js
            .send_publish(tail.subject.clone(), tail.publish.clone())
            .await
        {
            Ok(ack) => ack.await.map(drop).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match again {
            Ok(()) => Ok(()),
            Err(error) => {
                tracing::warn!(%error, "an ordered endpoint's earlier lane publish failed again; later events of it wait");
                self.tails.put(unit.clone(), tail);
                Err(Retry)
            }
        }
    }

    async fn dead_letter(
        &self,
        stored: &Stored,
        event_id: &str,
        bad: BadEvent,
    ) -> Result<Vec<LaneAck>, Retry> {
        let reason = bad.reason();
        tracing::warn!(
            subject = %dataplane::ingest_subject(stored.subject.as_str()),
            event_id,
            reason,
            error = %bad,
            "event cannot be delivered; moved to the dead-letter stream"
        );
        self.metrics
            .dead_letters
            .get_or_create(&ReasonLabel { reason })
            .inc();
        let mut payload = stored.payload.clone();
        let size = payload.len();
        // Over the limit whatever the reason (a bad subject is found before the size).
        let oversized = size > self.max_event_bytes
            || matches!(
                bad,
                BadEvent::TooLarge { .. } | BadEvent::TooManyHeaders { .. }
            );
        let truncated = (oversized && size > DEAD_LETTER_SAMPLE).then_some(size);
        if truncated.is_some() {
            payload.truncate(DEAD_LETTER_SAMPLE);
        }
        let text = bad.bounded_text();
        let subject = dataplane::ingest_subject(stored.subject.as_str());
        let letter = DeadLetter {
            reason,
            text: &text,
            event_id,
            subject: &subject,
            truncated,
        };
        let publish = letter.publish(payload);
        match self.js.send_publish(letter.subject(), publish).await {
            Ok(ack) => Ok(vec![LaneAck::Plain(ack)]),
            Err(_) => Err(Retry),
        }
    }
}

/// Fan-out lag of one partition, from its consumer's state every few seconds: events
/// stored but not yet fanned out (not delivered to a worker, or delivered and not
/// acknowledged).
async fn report_lag(
    consumer: consumer::Consumer<pull::Config>,
    metrics: Arc<Metrics>,
    label: PartitionLabel,
) {
    let mut tick = tokio::time::interval(LAG_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match consumer.get_info().await {
            Ok(info) => {
                let pending = info.num_pending + info.num_ack_pending as u64;
                metrics
                    .fanout_pending
                    .get_or_create(&label)
                    .set(pending as i64);
            }
            Err(error) => tracing::debug!(%error, "fan-out consumer info"),
        }
    }
}
