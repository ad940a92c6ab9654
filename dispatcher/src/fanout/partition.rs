//! Which events a fan-out worker reads, and where workers run: partition `p` on the owner
//! of shard `p`, the events stored without a partition on the owner of shard 0, and
//! partition workers only after those stored before partitioning (an upgrade).

use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::context::ConsumerInfoErrorKind;
use herald_core::dataplane;
use tokio::sync::watch;

use super::{CONSUMER, FanOut, PART};

/// How long fan-out waits for a publish ack or an API answer before it tries again
/// (async-nats waits 5 s for an ack and 10 s for an API answer by default; a new stream
/// leader is elected within a few seconds of a node's loss, and a retried publish is
/// deduplicated by its `Nats-Msg-Id`).
pub(super) const FANOUT_TIMEOUT: Duration = Duration::from_secs(2);
use crate::index::Claim;
use crate::metrics::PartitionLabel;

/// What one fan-out worker reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// One ingest partition.
    Partition(u32),
    /// Events stored without a partition.
    Unpartitioned,
}

impl Source {
    /// The worker that fans out an event stored under `subject`.
    pub fn of_subject(subject: &str) -> Self {
        subject
            .strip_prefix(dataplane::STORED_PREFIX)
            .and_then(|rest| rest.strip_prefix('.')?.split_once('.'))
            .and_then(|(partition, _)| partition.parse().ok())
            .map_or(Self::Unpartitioned, Self::Partition)
    }

    /// The durable consumer's name.
    pub fn consumer(self) -> String {
        match self {
            Self::Partition(p) => format!("{CONSUMER}-{p}"),
            Self::Unpartitioned => CONSUMER.to_owned(),
        }
    }

    /// The consumer's filter subject.
    pub fn filter(self) -> String {
        match self {
            Self::Partition(p) => dataplane::partition_filter(p),
            Self::Unpartitioned => format!("{}.>", dataplane::EVENTS_PREFIX),
        }
    }

    /// Events read ahead of fan-out. A partition's tenants take turns; events stored
    /// without a partition are few (those of an upgrade, and dead letters) and keep one
    /// worker's claim on every endpoint only while it fans them out, so they go one at
    /// a time.
    pub(super) fn read_ahead(self) -> usize {
        match self {
            Self::Partition(_) => super::READ_AHEAD,
            Self::Unpartitioned => 1,
        }
    }

    pub(super) fn label(self) -> PartitionLabel {
        PartitionLabel {
            partition: match self {
                Self::Partition(p) => p.to_string(),
                Self::Unpartitioned => "none".to_owned(),
            },
        }
    }
}

/// Runs the fan-out of the partition of `shard` (and, for shard 0, of the events stored
/// without a partition), each supervised, until `stop`; dropping the set aborts them.
pub fn spawn_for_shard(
    shared: &crate::context::Shared,
    shard: u32,
    stop: &watch::Receiver<bool>,
) -> tokio::task::JoinSet<()> {
    let mut workers = tokio::task::JoinSet::new();
    let mut sources = vec![Source::Partition(shard)];
    if shard == 0 {
        sources.push(Source::Unpartitioned);
    }
    for source in sources {
        let (shared, stop) = (shared.clone(), stop.clone());
        let readiness = shared.readiness.clone();
        workers.spawn(crate::supervise::supervise(
            PART,
            readiness.clone(),
            stop.clone(),
            move || {
                let (shared, readiness, mut stop) =
                    (shared.clone(), readiness.clone(), stop.clone());
                async move {
                    // The worker's own claim on the shard's part of the index, dropped
                    // only with the worker: the index forgets the partition's namespaces
                    // after the worker has stopped, never while it matches an event (it
                    // would dead-letter an accepted event as `UnknownTenant`). The
                    // shard's claim alone is dropped when the shard task is aborted,
                    // while an aborted worker may still run until its next yield.
                    let Some(_cover) = shared.index.cover(Claim::Shard(shard), &mut stop).await
                    else {
                        return Ok(());
                    };
                    // A connection of its own: another partition's burst of publishes
                    // (and their acks) never queues in front of this one's.
                    let name = format!(
                        "herald-dispatcher/{}/fanout-{}",
                        shared.replica_id,
                        source.label().partition
                    );
                    // Acks and API calls wait at most FANOUT_TIMEOUT: a publish sent to a
                    // stream leader that just died gets no answer at all, and an ordered
                    // endpoint's next event sends it again first.
                    let js = jetstream::ContextBuilder::new()
                        .timeout(FANOUT_TIMEOUT)
                        .build(shared.nats.connect(&name).await?);
                    let fanout = FanOut {
                        events: js.get_stream(dataplane::EVENTS_STREAM).await?,
                        js,
                        index: shared.index.clone(),
                        metrics: shared.metrics.clone(),
                        max_event_bytes: shared.settings.max_event_bytes,
                        source,
                        tails: Default::default(),
                    };
                    fanout.run(readiness, stop).await
                }
            },
        ));
    }
    workers
}

impl FanOut {
    /// Waits until every event stored before partitioning is fanned out, before the
    /// first partitioned event (`first`, later than all of them) is: `herald-fanout` has
    /// nothing pending, or its ack floor has passed `first`. No wait when it does not
    /// exist (nothing was stored before partitioning, or a fresh installation).
    pub(super) async fn after_unpartitioned(
        &self,
        first: u64,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<(), async_nats::Error> {
        if self.source == Source::Unpartitioned {
            return Ok(());
        }
        let mut waited = false;
        loop {
            let info = match self.events.consumer_info(CONSUMER).await {
                Ok(info) => info,
                Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(e.into()),
            };
            let unpartitioned_filter = info.config.filter_subject == Source::Unpartitioned.filter();
            let drained = info.num_pending == 0 && info.num_ack_pending == 0;
            if unpartitioned_filter && (drained || info.ack_floor.stream_sequence + 1 >= first) {
                if waited {
                    tracing::info!(source = ?self.source, "events stored before partitioning are fanned out; starting");
                }
                return Ok(());
            }
            if !waited {
                tracing::info!(source = ?self.source, "waiting for events stored before partitioning to be fanned out first");
                waited = true;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = stop.wait_for(|s| *s) => return Err("stopped".into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_fanned_out_by_its_partitions_worker() {
        let stored = format!("{}.3.shop.order.created", dataplane::STORED_PREFIX);
        assert_eq!(Source::of_subject(&stored), Source::Partition(3));
        let unpartitioned = dataplane::event_subject("shop", "order.created");
        assert_eq!(Source::of_subject(&unpartitioned), Source::Unpartitioned);
    }
}
