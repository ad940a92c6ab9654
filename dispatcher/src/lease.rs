//! Shard ownership: membership heartbeats and shard leases in the `herald-shards` KV
//! bucket (whose max age is the lease TTL).
//!
//! Every replica heartbeats `member.<id>`. The desired owner of shard `s` is the live
//! member with the highest rendezvous hash of `(s, member)`, so adding or removing a
//! replica moves only that replica's share. A lease `shard.<s>` is taken with `create`
//! (refused while another holds it) and renewed with compare-and-swap; a replica that
//! cannot renew stops the shard well before the TTL runs out, and nobody can take it
//! before it runs out, so two replicas never deliver for one endpoint at once.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use async_nats::jetstream::kv;
use futures::StreamExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::shard::{self, Shared};

/// Renewal period of leases and heartbeats.
const RENEW_EVERY: Duration = Duration::from_secs(2);
/// A lease not renewed for this long is given up by its holder (TTL minus a margin for
/// clock and scheduling delays).
const GIVE_UP_AFTER: Duration = Duration::from_secs(6);

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

struct Held {
    revision: u64,
    renewed: Instant,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// Runs the lease loop until `shutdown`; then stops every owned shard gracefully and
/// releases its lease so another replica can take over at once.
pub async fn run(
    shared: Shared,
    id: String,
    shards: u32,
    shutdown: impl Future<Output = ()>,
) -> Result<(), async_nats::Error> {
    let kv = shared.layout.shards.clone();
    let mut held: HashMap<u32, Held> = HashMap::new();
    let mut tick = tokio::time::interval(RENEW_EVERY);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tick.tick() => {}
        }
        if let Err(error) = kv.put(format!("member.{id}"), id.clone().into()).await {
            tracing::warn!(%error, "membership heartbeat failed");
        }
        let members = live_members(&kv)
            .await
            .unwrap_or_else(|| [id.clone()].into());
        for shard in 0..shards {
            let key = format!("shard.{shard}");
            let mine = desired_owner(shard, &members) == Some(id.as_str());
            if let Some(lease) = held.get_mut(&shard) {
                if !mine {
                    let lease = held.remove(&shard).expect("held");
                    release(&kv, &key, lease).await;
                    tracing::info!(shard, "shard handed over");
                    continue;
                }
                match kv.update(&key, id.clone().into(), lease.revision).await {
                    Ok(revision) => {
                        lease.revision = revision;
                        lease.renewed = Instant::now();
                    }
                    Err(error) if lease.renewed.elapsed() >= GIVE_UP_AFTER => {
                        tracing::warn!(shard, %error, "lease lost; stopping the shard");
                        let lease = held.remove(&shard).expect("held");
                        let _ = lease.stop.send(true);
                        let _ = lease.task.await;
                    }
                    Err(error) => tracing::debug!(shard, %error, "lease renewal failed; retrying"),
                }
            } else if mine && let Ok(revision) = kv.create(&key, id.clone().into()).await {
                let (stop, stop_rx) = watch::channel(false);
                let task = tokio::spawn(shard::run(shared.clone(), shard, stop_rx));
                held.insert(
                    shard,
                    Held {
                        revision,
                        renewed: Instant::now(),
                        stop,
                        task,
                    },
                );
                tracing::info!(shard, "shard acquired");
            }
        }
        shared.metrics.owned_shards.set(held.len() as i64);
        shared
            .metrics
            .endpoints
            .set(shared.index.endpoint_count() as i64);
    }
    for (shard, lease) in held.drain() {
        release(&kv, &format!("shard.{shard}"), lease).await;
    }
    let _ = kv.delete(format!("member.{id}")).await;
    shared.metrics.owned_shards.set(0);
    Ok(())
}

async fn release(kv: &kv::Store, key: &str, lease: Held) {
    let _ = lease.stop.send(true);
    let _ = lease.task.await;
    if let Err(error) = kv.delete_expect_revision(key, Some(lease.revision)).await {
        tracing::debug!(%error, key, "lease release");
    }
}

async fn live_members(kv: &kv::Store) -> Option<BTreeSet<String>> {
    let mut keys = kv.keys().await.ok()?;
    let mut members = BTreeSet::new();
    while let Some(Ok(key)) = keys.next().await {
        if let Some(member) = key.strip_prefix("member.") {
            members.insert(member.to_owned());
        }
    }
    (!members.is_empty()).then_some(members)
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
