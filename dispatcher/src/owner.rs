//! The owner of a shard: what the replica holding a shard's lease runs. It claims the
//! shard's part of the configuration index, loads the delivery state a previous owner
//! saved, and runs the shard's tasks side by side: delivery (`crate::shard`), the
//! fan-out of the shard's ingest partition (`crate::fanout`), the replays of its
//! endpoints (`crate::replay`) and their verification challenges (`crate::verify`).
//! They stop together.

use std::time::Duration;

use tokio::sync::watch;

use crate::context::Shared;
use crate::index::Claim;
use crate::shard::{Delivery, ShardError};
use crate::supervise::Owned;

/// How long a stopped shard waits for its fan-out to acknowledge what it published.
const FANOUT_STOP: Duration = Duration::from_secs(5);

/// Runs shard `shard` until `stop` becomes true (see [`Delivery::run`]); fan-out, replay
/// and verification run beside its delivery and stop with it (aborted when it fails).
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
    let mut delivery = Delivery::load(shared.clone(), shard).await?;
    // Aborted as this task ends, however it ends (a lost lease aborts it).
    let replays = Owned::new(tokio::spawn(crate::replay::run(
        shared.clone(),
        shard,
        stop.clone(),
    )));
    let verification = Owned::new(tokio::spawn(crate::verify::run(
        shared.clone(),
        shard,
        stop.clone(),
    )));
    let mut fanout = crate::fanout::spawn_for_shard(&shared, shard, &stop);
    let result = delivery.run(&mut stop).await;
    drop(replays);
    drop(verification);
    if result.is_ok() {
        // Stopped: fan-out acknowledges what it published, then ends.
        let _ = tokio::time::timeout(FANOUT_STOP, async {
            while fanout.join_next().await.is_some() {}
        })
        .await;
    }
    result
}
