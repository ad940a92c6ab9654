//! The JetStream layout the dispatcher uses, created or brought up to date at start
//! through `herald_core::dataplane::layout` (idempotent, so every replica runs it).

use std::time::Duration;

use async_nats::jetstream::{self, kv, stream};
use herald_core::dataplane::layout::{self, LayoutError};

pub use herald_core::dataplane::layout::{DEFAULT_RETENTION, LEASE_TTL};

/// Handles on everything the dispatcher uses.
///
/// Two JetStream contexts, because a context's in-flight publish limit is shared by
/// everything published through it: lease renewals (the `shards` bucket) must not wait
/// behind the shards' schedules and health (`js`). Each fan-out worker publishes through
/// a context of its own (`crate::fanout`), so one partition's burst, or publishes a NATS
/// leader change never acknowledges, cannot stall another partition or the shards.
#[derive(Clone)]
pub struct Layout {
    pub js: jetstream::Context,
    pub events: stream::Stream,
    pub deliveries: stream::Stream,
    pub config: kv::Store,
    pub health: kv::Store,
    pub shards: kv::Store,
}

/// Creates or updates the streams and buckets. `retention` is the event store's window
/// (and that of the lanes, the attempt log and the dead letters); `shards` the
/// installation's shard count, also its number of ingest partitions (checked against the
/// recorded one before any stream is touched); `replicas` the JetStream replicas of each
/// (existing streams are never lowered).
pub async fn ensure(
    js: &jetstream::Context,
    retention: Duration,
    shards: u32,
    replicas: usize,
) -> Result<Layout, LayoutError> {
    let config = layout::ensure_bucket(js, layout::CONFIG, replicas).await?;
    layout::check_shard_count(&config, shards).await?;
    let [events, deliveries, attempts, deadletter] = layout::streams(retention, shards);
    let events = layout::ensure_stream(js, &events, replicas).await?;
    let deliveries = layout::ensure_stream(js, &deliveries, replicas).await?;
    layout::ensure_stream(js, &attempts, replicas).await?;
    layout::ensure_stream(js, &deadletter, replicas).await?;
    let leases = jetstream::new(js.client());
    Ok(Layout {
        js: js.clone(),
        events,
        deliveries,
        config,
        health: layout::ensure_bucket(js, layout::HEALTH, replicas).await?,
        shards: layout::ensure_bucket(&leases, layout::SHARDS, replicas).await?,
    })
}
