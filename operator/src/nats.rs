//! The operator's side of the data-plane contract in NATS: the `herald-config` bucket it
//! writes, the `herald-health` bucket it reads, and the event store's configuration
//! (its retention, for replays; never an event).
//!
//! Contract: [`Buckets::connect`] is idempotent and safe to race with the dispatcher
//! (both sides create the buckets with the same settings); [`put_if_changed`] writes a
//! key only when its value differs and [`delete_if_present`] only deletes a live key, so
//! a resync of every object does not wake every dispatcher.

use async_nats::jetstream::{self, kv};
use herald_core::dataplane::layout::{self, LayoutError};
use herald_core::flags::NatsArgs;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Connect(#[from] herald_core::flags::NatsConnectError),
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("reading {key} from KV: {source}")]
    Read {
        key: String,
        #[source]
        source: kv::EntryError,
    },
    #[error("writing {key} to KV: {source}")]
    Write {
        key: String,
        #[source]
        source: kv::PutError,
    },
    #[error("deleting {key} from KV: {source}")]
    Delete {
        key: String,
        #[source]
        source: kv::DeleteError,
    },
}

/// The two buckets of the contract.
#[derive(Clone)]
pub struct Buckets {
    pub config: kv::Store,
    pub health: kv::Store,
    /// For [`layout::event_retention`] only: the operator's NATS identity may read the
    /// event store's configuration, nothing else of it.
    pub js: jetstream::Context,
}

impl Buckets {
    /// Connects and opens (creating when missing, with the dispatchers' settings) both
    /// buckets.
    pub async fn connect(nats: &NatsArgs, shards: u32) -> Result<Self, Error> {
        // Retries the initial connection instead of failing the whole operator while
        // NATS restarts; KV calls then fail and reconciles requeue.
        let client = nats.connect("herald-operator").await?;
        let js = jetstream::new(client);
        // The operator's own messages are small (configurations and key sets).
        layout::check_server(&js, layout::LANE_HEADER_ROOM).await?;
        let replicas = usize::from(nats.replicas);
        let config = layout::ensure_bucket(&js, layout::CONFIG, replicas).await?;
        layout::check_shard_count(&config, shards).await?;
        Ok(Self {
            config,
            health: layout::ensure_bucket(&js, layout::HEALTH, replicas).await?,
            js,
        })
    }
}

/// The value under `key`, if it holds one.
pub async fn read(store: &kv::Store, key: &str) -> Result<Option<Vec<u8>>, Error> {
    let value = store.get(key).await.map_err(|source| Error::Read {
        key: key.to_owned(),
        source,
    })?;
    Ok(value.map(|v| v.to_vec()))
}

/// Puts `value` under `key`.
pub async fn put(store: &kv::Store, key: &str, value: Vec<u8>) -> Result<(), Error> {
    store
        .put(key, value.into())
        .await
        .map_err(|source| Error::Write {
            key: key.to_owned(),
            source,
        })?;
    Ok(())
}

/// Puts `value` under `key` unless it is already there. Returns whether it wrote.
pub async fn put_if_changed(store: &kv::Store, key: &str, value: Vec<u8>) -> Result<bool, Error> {
    if read(store, key).await?.as_deref() == Some(value.as_slice()) {
        return Ok(false);
    }
    put(store, key, value).await?;
    Ok(true)
}

/// Deletes `key` if it holds a value. Returns whether it deleted.
pub async fn delete_if_present(store: &kv::Store, key: &str) -> Result<bool, Error> {
    if read(store, key).await?.is_none() {
        return Ok(false);
    }
    store.delete(key).await.map_err(|source| Error::Delete {
        key: key.to_owned(),
        source,
    })?;
    Ok(true)
}
