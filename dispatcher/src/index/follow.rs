//! Following the `herald-config` bucket into the [`Index`]: the bucket's content, then
//! its changes; read again from the start when the scope grows, and watched again from
//! where it stopped when it falls silent while the bucket has more.

use std::sync::Arc;

use futures::StreamExt;
use tokio::sync::watch;

use super::Index;
use crate::silence::{self, Silence};
use crate::supervise::Readiness;

#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    #[error("watching the configuration bucket: {0}")]
    Watch(#[from] async_nats::jetstream::kv::WatchError),
    #[error("reading the configuration bucket: {0}")]
    Read(#[source] async_nats::Error),
    #[error("the configuration watch ended")]
    Ended,
}

/// The readiness part [`follow`] reports.
pub const PART: &str = "config";

/// Follows the configuration bucket into `index` until `stop` is set: applies the
/// bucket's current content and marks the index loaded only once all of it is applied
/// (an error before that is returned, never taken for an empty bucket), then applies
/// every change. When the scope grows (a shard acquired) it reads the bucket again from
/// the start, for the entries it skipped. Returns an error when the watch fails or ends,
/// for the supervisor to start it again; the index keeps its last known content
/// meanwhile.
pub async fn follow(
    index: Index,
    bucket: async_nats::jetstream::kv::Store,
    readiness: Arc<Readiness>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), FollowError> {
    let mut wanted = index.passes.wanted.subscribe();
    loop {
        let generation = *wanted.borrow_and_update();
        match pass(
            &index,
            &bucket,
            &readiness,
            &mut stop,
            &mut wanted,
            generation,
        )
        .await?
        {
            Pass::Stopped => return Ok(()),
            Pass::Grown => {
                tracing::info!("the configuration scope grew; reading the bucket again");
            }
        }
    }
}

/// Why a [`pass`] ended without an error.
enum Pass {
    Stopped,
    /// The scope grew: entries skipped so far must be read again.
    Grown,
}

/// One pass: the bucket's content, then its changes, until the scope grows.
async fn pass(
    index: &Index,
    bucket: &async_nats::jetstream::kv::Store,
    readiness: &Readiness,
    stop: &mut watch::Receiver<bool>,
    wanted: &mut watch::Receiver<u64>,
    generation: u64,
) -> Result<Pass, FollowError> {
    // Complete once the watch has delivered the bucket's last revision as of now (it
    // sends the latest entry of every key, in stream order).
    // Asked of the server now: `Store::status` answers from the handle's cached stream
    // info (as of when the bucket was opened), which after a restart of this watch would
    // be a stale target.
    let mut stream = bucket.stream.clone();
    let last = stream
        .info()
        .await
        .map_err(|e| FollowError::Read(e.into()))?
        .state
        .last_sequence;
    let mut watch = bucket.watch_with_history(">").await?;
    let mut complete = false;
    let mut seen = 0;
    let mut probe = tokio::time::interval(silence::PROBE);
    probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut silence = Silence::default();
    let read = |complete: &mut bool| {
        *complete = true;
        index.mark_read(generation);
        readiness.set(PART, true);
        tracing::info!(
            endpoints = index.endpoint_count(),
            generation,
            "configuration read"
        );
    };
    if last == 0 {
        read(&mut complete);
    }
    loop {
        let entry = tokio::select! {
            _ = stop.wait_for(|s| *s) => return Ok(Pass::Stopped),
            Ok(()) = wanted.changed() => return Ok(Pass::Grown),
            entry = watch.next() => Some(entry),
            _ = probe.tick() => None,
        };
        let Some(entry) = entry else {
            if let Some(stored) = silence.check(bucket, ">", seen).await {
                tracing::warn!(
                    seen,
                    stored,
                    "the configuration watch fell silent; watching again from where it stopped"
                );
                // The next revision on, in stream order: what the silent watch would
                // have delivered. Before the bucket was read completely that includes
                // older revisions of some keys, applied in order, so the newest wins.
                watch = bucket.watch_from_revision(">", seen + 1).await?;
            }
            continue;
        };
        let entry = match entry {
            Some(Ok(entry)) => entry,
            Some(Err(error)) => return Err(FollowError::Read(error.into())),
            None => return Err(FollowError::Ended),
        };
        let value = matches!(entry.operation, async_nats::jetstream::kv::Operation::Put)
            .then_some(&entry.value[..]);
        index.apply(&entry.key, value);
        seen = entry.revision;
        if !complete && (entry.revision >= last || entry.delta == 0) {
            read(&mut complete);
        }
    }
}
