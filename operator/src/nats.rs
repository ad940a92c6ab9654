//! The operator's side of the data-plane contract in NATS: the `herald-config` bucket it
//! writes and the `herald-health` bucket it reads.
//!
//! Contract: [`Buckets::ensure`] is idempotent and safe to race with the dispatcher
//! (both sides create the buckets with the same settings); [`put_if_changed`] writes a
//! key only when its value differs and [`delete_if_present`] only deletes a live key, so
//! a resync of every object does not wake every dispatcher.

use async_nats::jetstream::{self, kv};
use herald_core::dataplane::{CONFIG_BUCKET, HEALTH_BUCKET};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("connecting to NATS: {0}")]
    Connect(#[source] async_nats::ConnectError),
    #[error("opening KV bucket {bucket}: {message}")]
    Bucket {
        bucket: &'static str,
        message: String,
    },
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
}

impl Buckets {
    /// Connects and opens (creating when missing) both buckets.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        let client = async_nats::ConnectOptions::new()
            .name("herald-operator")
            // Keep retrying after start-up instead of failing the whole operator while
            // NATS restarts; KV calls then fail and reconciles requeue.
            .retry_on_initial_connect()
            .connect(url)
            .await
            .map_err(Error::Connect)?;
        let js = jetstream::new(client);
        Ok(Self {
            config: ensure(&js, CONFIG_BUCKET).await?,
            health: ensure(&js, HEALTH_BUCKET).await?,
        })
    }
}

/// Opens `bucket`, creating it with the settings the dispatcher uses too.
async fn ensure(js: &jetstream::Context, bucket: &'static str) -> Result<kv::Store, Error> {
    if let Ok(store) = js.get_key_value(bucket).await {
        return Ok(store);
    }
    let created = js
        .create_key_value(kv::Config {
            bucket: bucket.to_owned(),
            history: 1,
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        })
        .await;
    match created {
        Ok(store) => Ok(store),
        // Lost a race with the dispatcher or another replica: the bucket exists now.
        Err(create) => js.get_key_value(bucket).await.map_err(|_| Error::Bucket {
            bucket,
            message: create.to_string(),
        }),
    }
}

/// Puts `value` under `key` unless it is already there. Returns whether it wrote.
pub async fn put_if_changed(store: &kv::Store, key: &str, value: Vec<u8>) -> Result<bool, Error> {
    let current = store.get(key).await.map_err(|source| Error::Read {
        key: key.to_owned(),
        source,
    })?;
    if current.as_deref() == Some(value.as_slice()) {
        return Ok(false);
    }
    store
        .put(key, value.into())
        .await
        .map_err(|source| Error::Write {
            key: key.to_owned(),
            source,
        })?;
    Ok(true)
}

/// Deletes `key` if it holds a value. Returns whether it deleted.
pub async fn delete_if_present(store: &kv::Store, key: &str) -> Result<bool, Error> {
    let current = store.get(key).await.map_err(|source| Error::Read {
        key: key.to_owned(),
        source,
    })?;
    if current.is_none() {
        return Ok(false);
    }
    store.delete(key).await.map_err(|source| Error::Delete {
        key: key.to_owned(),
        source,
    })?;
    Ok(true)
}
