//! The runtime of one owned shard: one ordered consumer on `herald.q.<shard>.>` feeds
//! per-endpoint lanes; a single task owns every endpoint's state (no locks) and runs a
//! fair round-robin over endpoints that have work and capacity; each attempt is its own
//! task bounded by its endpoint's timeout, so no endpoint can hold another's worker.
//!
//! The runtime is split by job: [`consume`] reads lanes (and refills them from
//! JetStream) and follows configuration changes; [`attempts`] starts attempts and carries
//! out their decisions (`crate::attempt`); [`upkeep`] purges finished work, reports
//! health ([`report`]) and drains at the end; [`log`] batches attempt records; [`ring`]
//! is the fair scheduler.

mod attempts;
mod budget;
mod consume;
mod lasting;
mod log;
pub mod read;
mod report;
mod ring;
mod upkeep;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use futures::StreamExt;
use herald_core::dataplane::{EndpointKey, LANE_PREFIX, LastingState, TenantPolicy};
use herald_core::ssrf::AddressPolicy;
use tokio::sync::{OwnedSemaphorePermit, mpsc, watch};
use tokio::task::JoinSet;

use crate::endpoint::EndpointState;
use crate::index::{Claim, Index};
use crate::metrics::{Metrics, ShardLabel};
use crate::setup::Layout;
use attempts::Completion;
use consume::Refill;

pub use budget::{DEFAULT_LANE_BUFFER_BYTES, ELASTIC_CAP, LaneBudget};

/// How long a stopped shard waits for its fan-out to acknowledge what it published.
const FANOUT_STOP: Duration = Duration::from_secs(5);

/// Settings shared by all shards of a dispatcher.
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
    /// What the dispatcher's lanes buffer beyond their base caps (see [`budget`]).
    pub buffers: Arc<LaneBudget>,
    /// The replay requests that exist, so a deleted replay's items are not attempted.
    pub replays: Arc<crate::replay::Live>,
    /// What `/readyz` reports; fan-out workers report their part.
    pub readiness: Arc<crate::supervise::Readiness>,
    /// How to reach NATS: each fan-out worker has a connection of its own.
    pub nats: Arc<herald_core::flags::NatsArgs>,
    pub replica_id: Arc<str>,
}

/// Why a shard stopped other than by request.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    #[error("loading the shard's saved endpoint state: {0}")]
    Load(#[source] async_nats::Error),
    #[error("creating the lane consumer: {0}")]
    Consumer(#[source] async_nats::Error),
    #[error("the lane consumer ended")]
    ConsumerEnded,
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// Runs shard `shard` until `stop` becomes true; then lets in-flight attempts finish
/// (up to the grace period), purges what is done, and returns. An error means the shard
/// could not run (its lease holder must give it up or restart it); in-flight attempts
/// are aborted then, and their work stays in the lanes.
pub async fn run(
    shared: Shared,
    shard: u32,
    mut stop: watch::Receiver<bool>,
) -> Result<(), ShardError> {
    // The shard's endpoints and its partition's, in the index before anything is
    // delivered or matched (held until the shard has stopped).
    let Some(_cover) = shared.index.cover(Claim::Shard(shard), &mut stop).await else {
        return Ok(());
    };
    // What a previous owner saved, before anything is delivered.
    let saved = lasting::load(&shared.layout.js, shard)
        .await
        .map_err(ShardError::Load)?;
    if !saved.is_empty() {
        tracing::info!(
            shard,
            endpoints = saved.len(),
            "restored saved endpoint state"
        );
    }
    let scheduled = lasting::load_scheduled(&shared.layout.deliveries, shard)
        .await
        .map_err(ShardError::Load)?;
    // The replays of this shard's endpoints and the fan-out of its ingest partition run
    // beside it and stop with it (aborted when it is).
    let replays = tokio::spawn(crate::replay::run(shared.clone(), shard, stop.clone()));
    let mut fanout = crate::fanout::spawn_for_shard(&shared, shard, &stop);
    let mut runtime = Runtime::new(shared, shard, saved);
    runtime.load_tenants();
    // Endpoints whose work waits only as schedules report their backlog too.
    for (key, (count, oldest)) in scheduled {
        runtime.state(&key).restore_scheduled(count, oldest);
    }
    let result = runtime.run(&mut stop).await;
    replays.abort();
    if result.is_ok() {
        // Stopped: fan-out acknowledges what it published, then ends.
        let _ = tokio::time::timeout(FANOUT_STOP, async {
            while fanout.join_next().await.is_some() {}
        })
        .await;
    }
    if result.is_err() {
        runtime.attempts.abort_all();
    }
    result
}

struct Runtime {
    shared: Shared,
    shard: u32,
    label: ShardLabel,
    endpoints: HashMap<EndpointKey, EndpointState>,
    /// Health a previous owner reported, applied to an endpoint's state when it is
    /// created (then forgotten).
    saved: HashMap<EndpointKey, LastingState>,
    ring: ring::Ring,
    /// Set when the dispatcher's ceiling stopped the last dispatch: the loop then waits
    /// for a permit.
    ceiling_blocked: bool,
    /// A permit the loop waited for, used by the next dispatch.
    spare: Option<OwnedSemaphorePermit>,
    attempts: JoinSet<Completion>,
    refill_tx: mpsc::Sender<Refill>,
    refill_rx: mpsc::Receiver<Refill>,
    log: log::AttemptLog,
    reports: report::Reports,
    saver: tokio::sync::mpsc::UnboundedSender<lasting::Save>,
    /// When each busy endpoint was last purged early (see `upkeep::maybe_purge`).
    last_purge: HashMap<EndpointKey, std::time::Instant>,
}

impl Runtime {
    fn new(shared: Shared, shard: u32, saved: HashMap<EndpointKey, LastingState>) -> Self {
        let (refill_tx, refill_rx) = mpsc::channel(1024);
        let saver = lasting::saver(shared.layout.health.clone());
        let tenants = ring::TenantShare {
            weight: 1,
            max_in_flight: shared.settings.limits.per_tenant,
        };
        Self {
            shared,
            shard,
            label: ShardLabel { shard },
            endpoints: HashMap::new(),
            saved,
            ring: ring::Ring::new(tenants),
            ceiling_blocked: false,
            spare: None,
            attempts: JoinSet::new(),
            refill_tx,
            refill_rx,
            log: log::AttemptLog::default(),
            reports: report::Reports::default(),
            saver,
            last_purge: HashMap::new(),
        }
    }

    async fn run(&mut self, stop: &mut watch::Receiver<bool>) -> Result<(), ShardError> {
        let mut changes = self.shared.index.subscribe();
        let consumer = self
            .shared
            .layout
            .deliveries
            .create_consumer(pull::OrderedConfig {
                filter_subject: format!("{LANE_PREFIX}.{}.>", self.shard),
                deliver_policy: DeliverPolicy::All,
                // Short pull requests, so heartbeats are 2 s apart and a consumer lost with
                // a restarted NATS server is noticed and recreated within seconds (the
                // client's default is 15 s).
                max_expires: Duration::from_secs(4),
                ..Default::default()
            })
            .await
            .map_err(|e| ShardError::Consumer(e.into()))?;
        let mut messages = consumer
            .messages()
            .await
            .map_err(|e| ShardError::Consumer(e.into()))?;
        let mut flush = tokio::time::interval(Duration::from_millis(100));
        flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut housekeeping = tokio::time::interval(Duration::from_secs(1));
        housekeeping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tracing::info!(shard = self.shard, "shard started");
        loop {
            let next_timer = self.ring.next_timer();
            tokio::select! {
                _ = stop.changed() => if *stop.borrow() { break },
                Some(done) = self.attempts.join_next(), if !self.attempts.is_empty() => {
                    match done {
                        Ok(completion) => self.on_completion(completion),
                        // Attempts catch their own panics; this is an abort at shutdown.
                        Err(error) => tracing::debug!(%error, "attempt task ended"),
                    }
                }
                Some(refill) = self.refill_rx.recv() => self.on_refill(refill),
                change = changes.recv() => self.on_change(change),
                message = messages.next() => match message {
                    Some(Ok(message)) => self.on_message(message),
                    Some(Err(error)) => {
                        tracing::warn!(shard = self.shard, %error, "lane consumer");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    None => return Err(ShardError::ConsumerEnded),
                },
                _ = sleep_until(next_timer) => self.on_timers(),
                permit = self.shared.ceiling.clone().acquire_owned(), if self.ceiling_blocked => {
                    self.spare = permit.ok();
                }
                _ = flush.tick() => self.log.flush(&self.shared.layout.js),
                _ = housekeeping.tick() => self.housekeeping(),
            }
            self.dispatch();
        }
        self.drain().await;
        Ok(())
    }

    /// The endpoint's state, created on its first message with its configuration, its
    /// keys and whatever a previous owner saved about it.
    fn state(&mut self, key: &EndpointKey) -> &mut EndpointState {
        let index = &self.shared.index;
        let saved = &mut self.saved;
        let reports = &mut self.reports;
        self.endpoints.entry(key.clone()).or_insert_with(|| {
            let ep = index.endpoint(key);
            let keys = ep
                .as_ref()
                .and_then(|e| index.keys(&e.config.namespace, &e.config.secret));
            let mut state = EndpointState::new(ep, keys);
            if let Some(lasting) = saved.remove(key) {
                state.restore(&lasting, std::time::Instant::now(), now_ms());
                reports.restored(key, lasting);
            }
            state
        })
    }

    /// How a tenant with `policy` shares the shard (the dispatcher's defaults where the
    /// policy says nothing).
    fn tenant_share(&self, policy: TenantPolicy) -> ring::TenantShare {
        ring::TenantShare {
            weight: policy.weight.unwrap_or(1),
            max_in_flight: policy
                .max_in_flight
                .map_or(self.shared.settings.limits.per_tenant, |n| n as usize),
        }
    }

    /// Every tenant's policy, from the index (at start, and after missed changes).
    fn load_tenants(&mut self) {
        let shares = self.shared.index.tenants();
        let shares = shares
            .into_iter()
            .map(|(ns, policy)| (ns, self.tenant_share(policy)))
            .collect();
        self.ring.replace_shares(shares);
    }

    fn mark_ready(&mut self, key: &EndpointKey) {
        if let Some(state) = self.endpoints.get_mut(key) {
            self.ring.push(key, &mut state.queued);
        }
    }

    fn on_timers(&mut self) {
        for key in self.ring.due(std::time::Instant::now()) {
            self.mark_ready(&key);
        }
    }
}

async fn sleep_until(at: Option<std::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => futures::future::pending().await,
    }
}
