//! Events handed out but never fanned out are re-published, in order, before any newer
//! event: those a dead predecessor took and never acknowledged (at take-over), and those
//! this worker's own pull lost on the way (a gap in the sequence, e.g. when its NATS node
//! died). JetStream would redeliver them only after their ack wait, behind newer events,
//! which would reorder `ordered` endpoints.

use std::time::Duration;

use async_nats::jetstream::consumer::{self, pull};
use async_nats::jetstream::stream::RawMessageErrorKind;
use tokio::sync::watch;

use super::intake::Intake;
use super::{FanOut, LaneAck, Stored};
use crate::supervise::Backoff;
use herald_core::envelope::HeaderSize;

/// Re-published events whose lane publishes are awaited at a time.
const CATCH_UP_WINDOW: usize = 256;

impl FanOut {
    /// Before the message `seq` is fanned out: the catch-up of a new worker (`expected`
    /// is `None`), or of the gap below `seq` when it is beyond `expected`.
    pub(super) async fn fill_gaps(
        &self,
        consumer: &consumer::Consumer<pull::Config>,
        seq: u64,
        intake: &mut Intake,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<(), async_nats::Error> {
        match intake.expected {
            None => {
                // Everything the consumer had handed out is re-published now: the next
                // message to expect is beyond it, even when this first one is a
                // redelivery from further back (else the next new message would look
                // like a gap and the same range would be re-published again).
                let covered = match self.catch_up(consumer, seq, stop).await? {
                    Some((from, to)) => {
                        // Stopped meanwhile, not everything is stored: nothing to record.
                        if !*stop.borrow() {
                            intake.republished.record(from, to, Some(seq));
                        }
                        to
                    }
                    None => 0,
                };
                intake.expected = Some((seq + 1).max(covered + 1));
                return Ok(());
            }
            Some(next) if seq > next => {
                tracing::warn!(
                    source = ?self.source,
                    from = next,
                    to = seq - 1,
                    "events lost on the way to fan-out; re-publishing them first"
                );
                self.catch_up_range(next, seq - 1, stop).await?;
                if !*stop.borrow() {
                    intake.republished.record(next, seq - 1, None);
                }
            }
            Some(_) => {}
        }
        intake.expected = Some(intake.expected.map_or(seq + 1, |e| e.max(seq + 1)));
        Ok(())
    }

    /// Re-publishes, in order, the events below `first` that were delivered to a
    /// previous worker and never acknowledged; the range it covered, if any.
    pub(super) async fn catch_up(
        &self,
        consumer: &consumer::Consumer<pull::Config>,
        first: u64,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<Option<(u64, u64)>, async_nats::Error> {
        let info = consumer.get_info().await?;
        let from = info.ack_floor.stream_sequence + 1;
        // Up to what the consumer handed out: the first message this worker got may be a
        // redelivery, with the predecessor's newer (unacknowledged) events above it.
        let to = info.delivered.stream_sequence.max(first.saturating_sub(1));
        if from > to {
            return Ok(None);
        }
        tracing::info!(
            source = ?self.source,
            first,
            from,
            to,
            "re-publishing events a previous fan-out worker left unacknowledged"
        );
        self.catch_up_range(from, to, stop).await?;
        Ok(Some((from, to)))
    }

    /// Re-publishes, in order, the stored events `from..=to` of this worker's source
    /// (those that still exist), each until its lane publishes are stored.
    pub(super) async fn catch_up_range(
        &self,
        from: u64,
        to: u64,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<(), async_nats::Error> {
        let mut seq = from;
        let mut window = Vec::new();
        while seq <= to {
            let Some(stored) = self.read_next(seq, stop).await? else {
                break;
            };
            if stored.seq > to {
                break;
            }
            seq = stored.seq + 1;
            let Some(pending) = self.fan_out_retrying(&stored, None, stop).await else {
                return Ok(());
            };
            window.push((stored, pending.acks));
            if window.len() >= CATCH_UP_WINDOW {
                self.settle(&mut window, stop).await;
            }
        }
        self.settle(&mut window, stop).await;
        Ok(())
    }

    /// Waits for the lane publishes of `window`'s events and fans out again, in order,
    /// each event one of whose publishes was not stored, until every one is (or `stop`).
    /// A re-published event has no message of this worker's to nak: nothing else would
    /// bring it back before the consumer's ack wait (30 s) — the tail of a failover's
    /// latency. Publishes already stored are dropped as duplicates.
    async fn settle(
        &self,
        window: &mut Vec<(Stored, Vec<LaneAck>)>,
        stop: &mut watch::Receiver<bool>,
    ) {
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
        while !window.is_empty() {
            let outcomes =
                futures::future::join_all(window.drain(..).map(|(stored, acks)| async {
                    let results =
                        futures::future::join_all(acks.into_iter().map(LaneAck::stored)).await;
                    (stored, results.iter().all(Result::is_ok))
                }))
                .await;
            let failed: Vec<Stored> = outcomes
                .into_iter()
                .filter(|(_, stored)| !stored)
                .map(|(event, _)| event)
                .collect();
            if failed.is_empty() {
                return;
            }
            tracing::warn!(source = ?self.source, events = failed.len(), "re-published events not stored; fanning them out again");
            tokio::select! {
                _ = tokio::time::sleep(backoff.next_delay(fastrand::f64())) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            for stored in failed {
                let Some(pending) = self.fan_out_retrying(&stored, None, stop).await else {
                    return;
                };
                window.push((stored, pending.acks));
            }
        }
    }

    /// Whether an event of this worker's source is stored between `next` and `seq`
    /// (exclusive): one handed to a pull of ours that never arrived. A partition's
    /// sequences are not consecutive (the stream holds every partition), so a message
    /// beyond `next` is usually no loss at all.
    pub(super) async fn lost_before(
        &self,
        next: u64,
        seq: u64,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<bool, async_nats::Error> {
        Ok(self
            .read_next(next, stop)
            .await?
            .is_some_and(|first| first.seq < seq))
    }

    /// Reads back the first stored event of this worker's source at or after `seq`:
    /// `None` when there is none. Any other error is retried — skipping an event that
    /// exists would deliver it out of order, after its redelivery. An error is returned
    /// only when `stop` is set meanwhile.
    async fn read_next(
        &self,
        seq: u64,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<Option<Stored>, async_nats::Error> {
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(5));
        let filter = self.source.filter();
        loop {
            // From the leader: a lagging replica's "not found" would skip an event.
            match self
                .events
                .get_first_raw_message_by_subject(&filter, seq)
                .await
            {
                Ok(m) => {
                    return Ok(Some(Stored {
                        seq: m.sequence,
                        published_ms: (m.time.unix_timestamp_nanos() / 1_000_000).max(0) as u64,
                        headers: HeaderSize::of(Some(&m.headers)),
                        subject: m.subject,
                        payload: m.payload,
                    }));
                }
                Err(e) if matches!(e.kind(), RawMessageErrorKind::NoMessageFound) => {
                    return Ok(None);
                }
                Err(error) => {
                    tracing::debug!(%error, seq, "reading an event back; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff.next_delay(fastrand::f64())) => {}
                        _ = stop.wait_for(|s| *s) => return Err("stopped during a catch-up".into()),
                    }
                }
            }
        }
    }
}
