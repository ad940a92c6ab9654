//! The dispatcher's context: the handles, settings and shared state every part of a
//! running dispatcher uses — the owner of a shard and its three tasks (delivery,
//! fan-out, replay), the lease loop, and each attempt task. It sits below all of them
//! and imports none of them; the clock is `herald_core::clock`.

use std::sync::Arc;
use std::time::Duration;

use herald_core::ssrf::AddressPolicy;

use crate::budget::LaneBudget;
use crate::index::Index;
use crate::metrics::Metrics;
use crate::replay::live::Live;
use crate::setup::Layout;

/// The dispatcher's settings, shared by its shards and their tasks.
#[derive(Clone, Debug)]
pub struct ShardSettings {
    /// The installation's shard (and ingest partition) count.
    pub shards: u32,
    /// How attempts share the shard and the dispatcher.
    pub limits: crate::config::Limits,
    /// Minimum time between two health reports of one endpoint.
    pub health_interval: Duration,
    /// How long a drained endpoint stays quiet before its state is released.
    pub release_idle_after: Duration,
    /// How long in-flight attempts may finish at shutdown or handover.
    pub grace: Duration,
    /// The streams' retention: no retry may wait longer.
    pub retention: Duration,
    /// The largest event accepted (a replayed event is checked again like a fresh one).
    pub max_event_bytes: usize,
}

/// Everything a shard needs, cheap to clone (every attempt task holds a clone).
#[derive(Clone)]
pub struct Shared {
    /// Behind an `Arc`: the streams and buckets carry their whole info (configurations,
    /// subjects), dozens of allocations to clone.
    pub layout: Arc<Layout>,
    pub index: Index,
    pub http: crate::http::Client,
    pub policy: Arc<AddressPolicy>,
    pub metrics: Arc<Metrics>,
    pub settings: ShardSettings,
    /// The dispatcher's ceiling on attempts in flight, shared by its shards: an attempt
    /// holds a permit until its task ends (however it ends).
    pub ceiling: Arc<tokio::sync::Semaphore>,
    /// What the dispatcher's lanes buffer beyond their base caps (see [`crate::budget`]).
    pub buffers: Arc<LaneBudget>,
    /// The replay requests that exist, so a deleted replay's items are not attempted.
    pub replays: Arc<Live>,
    /// What `/readyz` reports; fan-out workers report their part.
    pub readiness: Arc<crate::supervise::Readiness>,
    /// How to reach NATS: each fan-out worker has a connection of its own.
    pub nats: Arc<herald_core::flags::NatsArgs>,
    pub replica_id: Arc<str>,
}
