//! The delivery of one owned shard (its owner, `crate::owner`, runs fan-out and replay
//! beside it): one ordered consumer on `herald.q.<shard>.>` feeds
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
mod consume;
mod lasting;
mod log;
pub mod read;
mod report;
mod ring;
mod upkeep;

use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use futures::StreamExt;
use herald_core::dataplane::{EndpointKey, Lane, LastingState, TenantPolicy, shard_lanes_filter};
use tokio::sync::{OwnedSemaphorePermit, mpsc, watch};
use tokio::task::JoinSet;

use crate::context::Shared;
use crate::endpoint::EndpointState;
use crate::metrics::ShardLabel;
use attempts::Completion;
use consume::Refill;
use herald_core::clock::now_ms;

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

/// One owned shard's delivery: its lanes, its endpoints' states and their attempts.
pub struct Delivery {
    runtime: Runtime,
}

impl Delivery {
    /// Loads what a previous owner of `shard` saved (endpoint state, retries waiting as
    /// schedules) before anything is delivered.
    pub async fn load(shared: Shared, shard: u32) -> Result<Self, ShardError> {
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
        let mut runtime = Runtime::new(shared, shard, saved);
        runtime.load_tenants();
        // Endpoints whose work waits only as schedules report their backlog too.
        for (key, (count, oldest)) in scheduled {
            runtime.state(&key).restore_scheduled(count, oldest);
        }
        Ok(Self { runtime })
    }

    /// Delivers until `stop` becomes true; then lets in-flight attempts finish (up to the
    /// grace period), purges what is done, and returns. An error means the shard could
    /// not run (its owner must give it up or restart it); in-flight attempts are aborted
    /// then, and their work stays in the lanes.
    pub async fn run(&mut self, stop: &mut watch::Receiver<bool>) -> Result<(), ShardError> {
        let result = self.runtime.run(stop).await;
        if result.is_err() {
            self.runtime.attempts.abort_all();
        }
        result
    }
}

/// One endpoint of the shard: its delivery state and the shard's bookkeeping about it.
#[derive(Debug)]
struct Slot {
    state: EndpointState,
    /// In the ready ring.
    queued: bool,
    /// The bytes of its lanes last reported to the dispatcher's lane budget.
    budgeted: usize,
    /// Its tenth of the second in housekeeping (`upkeep`): endpoints are purged and
    /// reported a tenth at a time, not all at once.
    phase: u8,
}

struct Runtime {
    shared: Shared,
    shard: u32,
    label: ShardLabel,
    endpoints: HashMap<EndpointKey, Slot>,
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
    cycle: upkeep::Cycle,
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
            cycle: upkeep::Cycle::default(),
        }
    }

    async fn run(&mut self, stop: &mut watch::Receiver<bool>) -> Result<(), ShardError> {
        let mut changes = self.shared.index.subscribe();
        let consumer = self
            .shared
            .layout
            .deliveries
            .create_consumer(pull::OrderedConfig {
                filter_subject: shard_lanes_filter(self.shard),
                deliver_policy: DeliverPolicy::All,
                // Short pull requests, so heartbeats are 1 s apart and a consumer lost with
                // a restarted NATS server, or with the node it lived on (an ordered
                // consumer has one replica), is noticed after two missed heartbeats and
                // recreated within about 4 s (the client's default is 15 s: 60 s).
                max_expires: Duration::from_secs(2),
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
        let mut housekeeping = tokio::time::interval(upkeep::TICK);
        housekeeping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tracing::info!(shard = self.shard, "shard started");
        loop {
            let next_timer = self.ring.next_timer();
            tokio::select! {
                // A stop sender dropped without a word (the lease given up) stops the
                // shard too: `changed` would otherwise answer at once, forever.
                changed = stop.changed() => if changed.is_err() || *stop.borrow() { break },
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
                _ = flush.tick() => self.log.flush(&self.shared.layout.js, std::time::Instant::now(), false),
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
        let cycle = &mut self.cycle;
        let slot = self.endpoints.entry(key.clone()).or_insert_with(|| {
            let ep = index.endpoint(key);
            let keys = ep
                .as_ref()
                .and_then(|e| index.keys(&e.config.namespace, &e.config.secret));
            let mut state = EndpointState::new(ep, keys);
            if let Some(lasting) = saved.remove(key) {
                state.restore(&lasting, std::time::Instant::now(), now_ms());
                reports.restored(key, lasting);
            }
            Slot {
                state,
                queued: false,
                budgeted: 0,
                phase: cycle.assign(),
            }
        });
        &mut slot.state
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
        if let Some(slot) = self.endpoints.get_mut(key) {
            self.ring.push(key, &mut slot.queued);
        }
    }

    /// What follows any change of an endpoint's lanes or state, in one place: its
    /// buffered bytes reported to the lane budget, `lane` refilled from JetStream when
    /// it runs low, and the endpoint back in the ready ring.
    fn changed(&mut self, key: &EndpointKey, lane: Option<Lane>) {
        self.settle(key);
        if let Some(lane) = lane {
            self.maybe_refill(key, lane);
        }
        self.mark_ready(key);
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
