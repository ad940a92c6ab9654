//! Taking over from a dead fan-out worker: the events it took and never acknowledged are
//! re-published, in order, before any newer event — JetStream would redeliver them only
//! after their ack wait, behind newer events, which would reorder `ordered` endpoints.

use std::time::Duration;

use async_nats::jetstream::consumer::{self, pull};
use async_nats::jetstream::stream::DirectGetErrorKind;
use tokio::sync::{mpsc, watch};

use super::{FanOut, Pending, Stored};
use crate::supervise::Backoff;

impl FanOut {
    /// Re-publishes, in order, the events below `first` that were delivered to a
    /// previous worker and never acknowledged.
    pub(super) async fn catch_up(
        &self,
        consumer: &consumer::Consumer<pull::Config>,
        first: u64,
        tx: &mpsc::Sender<Pending>,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<(), async_nats::Error> {
        let info = consumer.get_info().await?;
        let from = info.ack_floor.stream_sequence + 1;
        // Up to what the consumer handed out: the first message this worker got may be a
        // redelivery, with the predecessor's newer (unacknowledged) events above it.
        let to = info.delivered.stream_sequence.max(first.saturating_sub(1));
        if from > to {
            return Ok(());
        }
        tracing::info!(
            from,
            to,
            "re-publishing events a previous fan-out worker left unacknowledged"
        );
        for seq in from..=to {
            let Some(stored) = self.read_back(seq, stop).await? else {
                continue;
            };
            let Some(pending) = self.fan_out_retrying(&stored, None, stop).await else {
                return Ok(());
            };
            tx.send(pending)
                .await
                .map_err(|_| "the fan-out acker stopped")?;
        }
        Ok(())
    }

    /// Reads event `seq` back from the stream for a catch-up: `None` when it is gone
    /// (deleted or aged out). Any other error is retried — skipping an event that exists
    /// would deliver it out of order, after its redelivery. An error is returned only when
    /// `stop` is set meanwhile.
    async fn read_back(
        &self,
        seq: u64,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<Option<Stored>, async_nats::Error> {
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(5));
        loop {
            match self.events.direct_get(seq).await {
                Ok(m) => {
                    return Ok(Some(Stored {
                        seq,
                        published_ms: (m.time.unix_timestamp_nanos() / 1_000_000).max(0) as u64,
                        subject: m.subject,
                        payload: m.payload,
                    }));
                }
                Err(e) if matches!(e.kind(), DirectGetErrorKind::NotFound) => return Ok(None),
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
