//! The JetStream layout, created or brought up to date at start (idempotent, so every
//! replica runs it). See `docs/architecture.md` for what each piece is for.

use std::time::Duration;

use async_nats::jetstream::{self, kv, stream};
use herald_core::dataplane::{
    ATTEMPTS_PREFIX, ATTEMPTS_STREAM, CONFIG_BUCKET, DEADLETTER_PREFIX, DEADLETTER_STREAM,
    DELIVERIES_STREAM, EVENTS_PREFIX, EVENTS_STREAM, HEALTH_BUCKET, LANE_PREFIX, SCHEDULE_PREFIX,
    SHARDS_BUCKET,
};

/// Default retention of events, attempt records and dead letters: 30 days.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

/// How long a shard lease or membership lives without renewal.
pub const LEASE_TTL: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("creating or updating stream {0}: {1}")]
    Stream(
        &'static str,
        #[source] jetstream::context::CreateStreamError,
    ),
    #[error("opening stream {0}: {1}")]
    GetStream(&'static str, #[source] jetstream::context::GetStreamError),
    #[error("creating key-value bucket {0}: {1}")]
    Bucket(
        &'static str,
        #[source] jetstream::context::CreateKeyValueError,
    ),
}

/// Handles on everything the dispatcher uses.
#[derive(Clone)]
pub struct Layout {
    pub js: jetstream::Context,
    pub events: stream::Stream,
    pub deliveries: stream::Stream,
    pub config: kv::Store,
    pub health: kv::Store,
    pub shards: kv::Store,
}

/// Creates or updates the streams and buckets. `retention` is the event store's window
/// (and that of the attempt log and the dead letters).
pub async fn ensure(js: &jetstream::Context, retention: Duration) -> Result<Layout, SetupError> {
    let file = |name: &'static str, subjects: Vec<String>| stream::Config {
        name: name.to_owned(),
        subjects,
        storage: stream::StorageType::File,
        retention: stream::RetentionPolicy::Limits,
        max_age: retention,
        duplicate_window: Duration::from_secs(120),
        allow_direct: true,
        ..Default::default()
    };
    let streams = [
        (
            EVENTS_STREAM,
            file(EVENTS_STREAM, vec![format!("{EVENTS_PREFIX}.>")]),
        ),
        (
            DELIVERIES_STREAM,
            stream::Config {
                allow_message_schedules: true,
                ..file(
                    DELIVERIES_STREAM,
                    vec![format!("{LANE_PREFIX}.>"), format!("{SCHEDULE_PREFIX}.>")],
                )
            },
        ),
        (
            ATTEMPTS_STREAM,
            file(ATTEMPTS_STREAM, vec![format!("{ATTEMPTS_PREFIX}.>")]),
        ),
        (
            DEADLETTER_STREAM,
            file(DEADLETTER_STREAM, vec![format!("{DEADLETTER_PREFIX}.>")]),
        ),
    ];
    for (name, config) in streams {
        // Two replicas starting together may both find the stream missing and race to
        // create it; the loser's update then succeeds.
        let mut tries = 0;
        loop {
            match js.create_or_update_stream(config.clone()).await {
                Ok(_) => break,
                Err(_) if tries < 3 => tries += 1,
                Err(e) => return Err(SetupError::Stream(name, e)),
            }
        }
    }
    let bucket = |name: &'static str, max_age: Duration| kv::Config {
        bucket: name.to_owned(),
        history: 1,
        storage: stream::StorageType::File,
        max_age,
        ..Default::default()
    };
    let ensure_bucket = |name: &'static str, max_age: Duration| {
        let js = js.clone();
        async move {
            let mut tries = 0;
            loop {
                match js.create_or_update_key_value(bucket(name, max_age)).await {
                    Ok(store) => return Ok(store),
                    Err(_) if tries < 3 => tries += 1,
                    Err(e) => return Err(SetupError::Bucket(name, e)),
                }
            }
        }
    };
    let config = ensure_bucket(CONFIG_BUCKET, Duration::ZERO).await?;
    let health = ensure_bucket(HEALTH_BUCKET, Duration::ZERO).await?;
    let shards = ensure_bucket(SHARDS_BUCKET, LEASE_TTL).await?;
    let get = |name: &'static str| {
        let js = js.clone();
        async move {
            js.get_stream(name)
                .await
                .map_err(|e| SetupError::GetStream(name, e))
        }
    };
    Ok(Layout {
        js: js.clone(),
        events: get(EVENTS_STREAM).await?,
        deliveries: get(DELIVERIES_STREAM).await?,
        config,
        health,
        shards,
    })
}
