//! Shard ownership: membership heartbeats and shard leases in the `herald-shards` KV
//! bucket (whose max age is the lease TTL).
//!
//! Every replica heartbeats `member.<id>`. The desired owner of shard `s` is the live
//! member with the highest rendezvous hash of `(s, member)`, so adding or removing a
//! replica moves only that replica's share. A lease `shard.<s>` is taken with `create`
//! (refused while another holds it) and renewed with compare-and-swap.
//!
//! Contract:
//! - renewals never wait for anything else: every held lease is renewed each period,
//!   concurrently and under a timeout, also while its shard drains (a handover, a
//!   shutdown), so a lease cannot lapse while its attempts still run;
//! - a lease that could not be renewed for [`GIVE_UP_AFTER`] (well inside the TTL) is
//!   lost: its shard task is aborted at once, which aborts its in-flight attempts, before
//!   anyone else can take the lease;
//! - a shard task that ends on its own (its consumer failed) gives its lease up and is
//!   started again after a back-off; until then `/readyz` says `shards` is not ready;
//! - a shard cannot notice its lanes' stream being deleted (the ordered consumer retries
//!   such a stream forever, silently), nor deleted and created again (sequences start
//!   over, so a consumer position or a purge point from before means nothing in it):
//!   the loop checks the stream each period and fails every shard when it is gone or
//!   replaced; they start again, from the new stream's beginning, once it exists.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::kv;
use futures::StreamExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use herald_core::dataplane::{LeaseKey, layout};

use crate::context::Shared;
use crate::shard;
use crate::supervise::{Backoff, Readiness};

/// Renewal period of leases and heartbeats.
const RENEW_EVERY: Duration = Duration::from_secs(2);
/// A lease not renewed for this long is given up by its holder (TTL minus a margin for
/// clock and scheduling delays).
const GIVE_UP_AFTER: Duration = Duration::from_secs(6);
/// A shard that has run this long since it was taken is healthy again: its failure
/// back-off starts over (it would otherwise grow across every failure of a long life).
const HEALTHY_AFTER: Duration = Duration::from_secs(60);
/// Longest wait for one KV call of the lease loop.
const CALL_TIMEOUT: Duration = Duration::from_secs(1);
/// The readiness part this loop reports.
pub const PART: &str = "shards";

/// FNV-1a of (shard, member): stable across processes.
fn rendezvous(shard: u32, member: &str) -> u64 {
    herald_core::dataplane::fnv1a(shard.to_be_bytes().into_iter().chain(member.bytes()))
}

/// The member that should own `shard`.
pub fn desired_owner(shard: u32, members: &BTreeSet<String>) -> Option<&str> {
    members
        .iter()
        .max_by_key(|m| rendezvous(shard, m))
        .map(String::as_str)
}

fn lease_key(shard: u32) -> String {
    LeaseKey::Shard(shard).to_string()
}

struct Held {
    revision: u64,
    acquired: Instant,
    renewed: Instant,
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<(), shard::ShardError>>,
    /// Asked to stop (handover or shutdown); the lease is kept until it has.
    draining: bool,
}

/// The leases of one replica.
struct Leases {
    shared: Shared,
    id: String,
    kv: kv::Store,
    held: HashMap<u32, Held>,
    /// Shards whose task failed: not taken again before the instant.
    failed: HashMap<u32, (Backoff, Instant)>,
}

impl Leases {
    /// Renews every held lease concurrently; aborts the shards whose lease is lost.
    async fn renew(&mut self) {
        let (kv, id) = (&self.kv, &self.id);
        let renewals = self.held.iter().map(|(shard, lease)| async move {
            let update = kv.update(lease_key(*shard), id.clone().into(), lease.revision);
            (*shard, tokio::time::timeout(CALL_TIMEOUT, update).await)
        });
        for (shard, outcome) in futures::future::join_all(renewals).await {
            let Some(lease) = self.held.get_mut(&shard) else {
                continue;
            };
            match outcome {
                Ok(Ok(revision)) => {
                    lease.revision = revision;
                    lease.renewed = Instant::now();
                    if lease.acquired.elapsed() >= HEALTHY_AFTER {
                        self.failed.remove(&shard);
                    }
                }
                _ if lease.renewed.elapsed() < GIVE_UP_AFTER => {
                    tracing::debug!(shard, "lease renewal failed; retrying");
                }
                _ => {
                    tracing::warn!(shard, "lease lost; aborting the shard's attempts");
                    if let Some(lease) = self.held.remove(&shard) {
                        lease.task.abort();
                    }
                }
            }
        }
    }

    /// Releases the leases of shards whose task has ended: handed over, or failed (then
    /// taken again after a back-off).
    async fn reap(&mut self) {
        let finished: Vec<u32> = self
            .held
            .iter()
            .filter(|(_, lease)| lease.task.is_finished())
            .map(|(shard, _)| *shard)
            .collect();
        for shard in finished {
            let Some(lease) = self.held.remove(&shard) else {
                continue;
            };
            let outcome = lease.task.await;
            match (lease.draining, outcome) {
                (true, _) => tracing::info!(shard, "shard handed over"),
                (false, Ok(Err(error))) => self.failed(shard, &error.to_string()),
                (false, Err(error)) => self.failed(shard, &error.to_string()),
                (false, Ok(Ok(()))) => self.failed(shard, "it stopped unasked"),
            }
            self.release(shard, lease.revision).await;
        }
    }

    /// Aborts every shard (their lanes cannot be read) and gives their leases up.
    async fn fail_all(&mut self, why: &str) {
        for (shard, lease) in std::mem::take(&mut self.held) {
            lease.task.abort();
            self.failed(shard, why);
            self.release(shard, lease.revision).await;
        }
    }

    async fn release(&self, shard: u32, revision: u64) {
        let delete = self
            .kv
            .delete_expect_revision(lease_key(shard), Some(revision));
        if let Ok(Err(error)) = tokio::time::timeout(CALL_TIMEOUT, delete).await {
            tracing::debug!(%error, shard, "lease release");
        }
    }

    fn failed(&mut self, shard: u32, why: &str) {
        let (backoff, retry_at) = self.failed.entry(shard).or_insert_with(|| {
            (
                Backoff::new(Duration::from_secs(1), Duration::from_secs(60)),
                Instant::now(),
            )
        });
        let delay = backoff.next_delay(fastrand::f64());
        *retry_at = Instant::now() + delay;
        tracing::error!(shard, error = why, retry_in = ?delay, "shard stopped; its lease is given up");
    }

    /// Stops shards this replica should no longer own (they drain while their lease is
    /// kept) and takes the ones it should own.
    async fn balance(&mut self, members: &BTreeSet<String>, shards: u32) {
        for shard in 0..shards {
            let mine = desired_owner(shard, members) == Some(self.id.as_str());
            match self.held.get_mut(&shard) {
                Some(lease) if !mine && !lease.draining => {
                    let _ = lease.stop.send(true);
                    lease.draining = true;
                }
                Some(_) => {}
                None if mine => self.acquire(shard).await,
                None => {}
            }
        }
    }

    async fn acquire(&mut self, shard: u32) {
        if self
            .failed
            .get(&shard)
            .is_some_and(|(_, at)| *at > Instant::now())
        {
            return;
        }
        let create = self.kv.create(lease_key(shard), self.id.clone().into());
        let Ok(Ok(revision)) = tokio::time::timeout(CALL_TIMEOUT, create).await else {
            return;
        };
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(crate::owner::run(self.shared.clone(), shard, stop_rx));
        self.held.insert(
            shard,
            Held {
                revision,
                acquired: Instant::now(),
                renewed: Instant::now(),
                stop,
                task,
                draining: false,
            },
        );
        tracing::info!(shard, "shard acquired");
    }

    fn drain_all(&mut self) {
        for lease in self.held.values_mut().filter(|l| !l.draining) {
            let _ = lease.stop.send(true);
            lease.draining = true;
        }
    }

    /// Shards whose task failed recently and are not running.
    fn failing(&self) -> bool {
        let now = Instant::now();
        self.failed
            .iter()
            .any(|(shard, (_, at))| *at > now && !self.held.contains_key(shard))
    }
}

/// Runs the lease loop until `stop` becomes true; then stops every owned shard
/// gracefully (renewing its lease meanwhile) and releases its lease so another replica
/// can take over at once.
pub async fn run(
    shared: Shared,
    id: String,
    shards: u32,
    readiness: Arc<Readiness>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), async_nats::Error> {
    let kv = shared.layout.shards.clone();
    let mut leases = Leases {
        shared: shared.clone(),
        id: id.clone(),
        kv: kv.clone(),
        held: HashMap::new(),
        failed: HashMap::new(),
    };
    let mut lanes = LanesWatch::default();
    let mut tick = tokio::time::interval(RENEW_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A stop sender dropped without a word stops the replica too; `changed` is not asked
    // again then (it would answer at once, forever).
    let mut stop_open = true;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            changed = stop.changed(), if stop_open => stop_open = changed.is_ok(),
        }
        leases.renew().await;
        if let Some(why) = lanes.check(&shared.layout.js).await {
            leases.fail_all(&why).await;
        }
        leases.reap().await;
        if !stop_open || *stop.borrow() {
            leases.drain_all();
            if leases.held.is_empty() {
                break;
            }
            continue;
        }
        let heartbeat = kv.put(LeaseKey::Member(id.clone()).to_string(), id.clone().into());
        if let Ok(Err(error)) = tokio::time::timeout(CALL_TIMEOUT, heartbeat).await {
            tracing::warn!(%error, "membership heartbeat failed");
        }
        let members = live_members(&kv)
            .await
            .unwrap_or_else(|| [id.clone()].into());
        leases.balance(&members, shards).await;
        readiness.set(PART, !leases.failing());
        shared.metrics.owned_shards.set(leases.held.len() as i64);
    }
    let _ = tokio::time::timeout(
        CALL_TIMEOUT,
        kv.delete(LeaseKey::Member(id.clone()).to_string()),
    )
    .await;
    shared.metrics.owned_shards.set(0);
    Ok(())
}

/// Notices the lanes' stream deleted or replaced (see the module's contract).
#[derive(Default)]
struct LanesWatch {
    /// When the stream this replica's shards read was created (ns since the epoch).
    created: Option<i128>,
}

impl LanesWatch {
    /// Why the shards cannot run, if the stream is gone or was replaced since the last
    /// check. A check that fails otherwise (NATS unreachable) says nothing: the shards'
    /// consumers and the leases ride such outages out on their own.
    async fn check(&mut self, js: &async_nats::jetstream::Context) -> Option<String> {
        let lookup = js.get_stream(herald_core::dataplane::DELIVERIES_STREAM);
        match tokio::time::timeout(CALL_TIMEOUT, lookup).await {
            Ok(Ok(stream)) => {
                let created = stream.cached_info().created.unix_timestamp_nanos();
                match self.created.replace(created) {
                    Some(before) if before != created => {
                        Some("the lanes' stream was deleted and created again".into())
                    }
                    _ => None,
                }
            }
            Ok(Err(error)) if layout::stream_missing(&error) => {
                Some("the lanes' stream does not exist".into())
            }
            _ => None,
        }
    }
}

async fn live_members(kv: &kv::Store) -> Option<BTreeSet<String>> {
    let read = async {
        let mut keys = kv.keys().await.ok()?;
        let mut members = BTreeSet::new();
        while let Some(Ok(key)) = keys.next().await {
            if let Some(LeaseKey::Member(member)) = LeaseKey::parse(&key) {
                members.insert(member);
            }
        }
        (!members.is_empty()).then_some(members)
    };
    tokio::time::timeout(CALL_TIMEOUT, read)
        .await
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendezvous_moves_only_the_changed_members_share() {
        let two: BTreeSet<String> = ["a".into(), "b".into()].into();
        let three: BTreeSet<String> = ["a".into(), "b".into(), "c".into()].into();
        let mut moved = 0;
        for shard in 0..64 {
            let before = desired_owner(shard, &two).unwrap();
            let after = desired_owner(shard, &three).unwrap();
            if before != after {
                assert_eq!(after, "c", "a shard moved between surviving members");
                moved += 1;
            }
        }
        assert!(
            (10..=35).contains(&moved),
            "{moved} of 64 shards moved to the new member"
        );
    }
}
