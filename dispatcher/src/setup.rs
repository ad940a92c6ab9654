//! The JetStream layout the dispatcher uses, created or brought up to date at start
//! through `herald_core::dataplane::layout` (idempotent, so every replica runs it).

use std::time::Duration;

use async_nats::jetstream::{self, kv, stream};
use herald_core::dataplane::layout::{self, LayoutError};

pub use herald_core::dataplane::layout::{DEFAULT_RETENTION, LEASE_TTL};

/// Handles on everything the dispatcher uses.
///
/// Three JetStream contexts, because a context's in-flight publish limit is shared by
/// everything published through it: fan-out's (`fanout_js`) can fill with publishes a
/// NATS leader change never acknowledges, and that must not stall lease renewals (the
/// `shards` bucket has a context of its own) or the shards' schedules and health (`js`).
#[derive(Clone)]
pub struct Layout {
    pub js: jetstream::Context,
    pub fanout_js: jetstream::Context,
    pub events: stream::Stream,
    pub deliveries: stream::Stream,
    pub config: kv::Store,
    pub health: kv::Store,
    pub shards: kv::Store,
}

/// Creates or updates the streams and buckets. `retention` is the event store's window
/// (and that of the lanes, the attempt log and the dead letters); `replicas` the
/// JetStream replicas of each (existing streams are never lowered).
pub async fn ensure(
    js: &jetstream::Context,
    retention: Duration,
    replicas: usize,
) -> Result<Layout, LayoutError> {
    let [events, deliveries, attempts, deadletter] = layout::streams(retention);
    let events = layout::ensure_stream(js, &events, replicas).await?;
    let deliveries = layout::ensure_stream(js, &deliveries, replicas).await?;
    layout::ensure_stream(js, &attempts, replicas).await?;
    layout::ensure_stream(js, &deadletter, replicas).await?;
    let client = js.client();
    let leases = jetstream::new(client.clone());
    Ok(Layout {
        js: js.clone(),
        fanout_js: jetstream::new(client),
        events,
        deliveries,
        config: layout::ensure_bucket(js, layout::CONFIG, replicas).await?,
        health: layout::ensure_bucket(js, layout::HEALTH, replicas).await?,
        shards: layout::ensure_bucket(&leases, layout::SHARDS, replicas).await?,
    })
}
