//! The JetStream layout: one description of every stream and bucket Herald uses (name,
//! subjects, limits), and the one way both binaries create or bring them up to date.
//!
//! Contract: [`ensure_stream`] and [`ensure_bucket`] are idempotent and safe to race
//! (several dispatcher replicas and the operator start together); they set only what
//! Herald owns (subjects, retention, schedules, duplicate window) and never lower the
//! replica count an administrator gave an existing stream: a stream with more replicas
//! than asked for keeps them (and says so in a log line); one with fewer is raised.

use std::time::Duration;

use async_nats::jetstream::context::GetStreamErrorKind;
use async_nats::jetstream::{self, ErrorCode, kv, stream};

use super::{
    ATTEMPTS_PREFIX, ATTEMPTS_STREAM, CONFIG_BUCKET, DEADLETTER_PREFIX, DEADLETTER_STREAM,
    DELIVERIES_STREAM, EVENTS_PREFIX, EVENTS_STREAM, HEALTH_BUCKET, IDEMPOTENCY_BUCKET,
    LANE_PREFIX, SCHEDULE_PREFIX, SHARDS_BUCKET, STORED_PREFIX,
};

/// Default retention of events, attempt records and dead letters: 30 days.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);
/// How long a shard lease or membership lives without renewal.
pub const LEASE_TTL: Duration = Duration::from_secs(10);
/// JetStream's duplicate window on the streams Herald publishes to with `Nats-Msg-Id`.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// One stream: what Herald needs of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamSpec {
    pub name: &'static str,
    pub subjects: Vec<String>,
    pub max_age: Duration,
    /// Per-message schedules (`Nats-Schedule`), nats-server 2.12 or newer.
    pub schedules: bool,
    /// A subject transform applied as messages are stored: `(source, destination)`.
    pub transform: Option<(String, String)>,
}

/// One key-value bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketSpec {
    pub name: &'static str,
    /// Zero: entries never expire.
    pub max_age: Duration,
}

/// The ingest stream (event store, replay source). Every event with a namespace and a
/// type is stored under `herald.stored.<partition>.<ns>.<type>`, its namespace hashed
/// into one of `partitions` (the shard count) by the server itself, so fan-out can run
/// one consumer per partition and a tenant's events stay in one partition, in order.
pub fn events_stream(retention: Duration, partitions: u32) -> StreamSpec {
    StreamSpec {
        name: EVENTS_STREAM,
        subjects: vec![format!("{EVENTS_PREFIX}.>")],
        max_age: retention,
        schedules: false,
        transform: Some((
            format!("{EVENTS_PREFIX}.*.>"),
            format!(
                "{STORED_PREFIX}.{{{{partition({},1)}}}}.{{{{wildcard(1)}}}}.>",
                partitions.max(1)
            ),
        )),
    }
}

/// Per-endpoint lanes and pending retries.
pub fn deliveries_stream(retention: Duration) -> StreamSpec {
    StreamSpec {
        name: DELIVERIES_STREAM,
        subjects: vec![format!("{LANE_PREFIX}.>"), format!("{SCHEDULE_PREFIX}.>")],
        max_age: retention,
        schedules: true,
        transform: None,
    }
}

/// The attempt log.
pub fn attempts_stream(retention: Duration) -> StreamSpec {
    StreamSpec {
        name: ATTEMPTS_STREAM,
        subjects: vec![format!("{ATTEMPTS_PREFIX}.>")],
        max_age: retention,
        schedules: false,
        transform: None,
    }
}

/// Events that cannot be delivered at all.
pub fn deadletter_stream(retention: Duration) -> StreamSpec {
    StreamSpec {
        name: DEADLETTER_STREAM,
        subjects: vec![format!("{DEADLETTER_PREFIX}.>")],
        max_age: retention,
        schedules: false,
        transform: None,
    }
}

/// Every stream, for a retention window and the installation's shard count.
pub fn streams(retention: Duration, shards: u32) -> [StreamSpec; 4] {
    [
        events_stream(retention, shards),
        deliveries_stream(retention),
        attempts_stream(retention),
        deadletter_stream(retention),
    ]
}

/// Endpoint configurations and key sets, written by the operator.
pub const CONFIG: BucketSpec = BucketSpec {
    name: CONFIG_BUCKET,
    max_age: Duration::ZERO,
};
/// Endpoint health and delivery state that must outlive a dispatcher, written by the
/// dispatchers.
pub const HEALTH: BucketSpec = BucketSpec {
    name: HEALTH_BUCKET,
    max_age: Duration::ZERO,
};
/// Shard leases and dispatcher membership.
pub const SHARDS: BucketSpec = BucketSpec {
    name: SHARDS_BUCKET,
    max_age: LEASE_TTL,
};

/// HTTP ingest's idempotency keys, created by herald-api: each is kept `window`.
pub fn idempotency(window: Duration) -> BucketSpec {
    BucketSpec {
        name: IDEMPOTENCY_BUCKET,
        max_age: window,
    }
}

/// The oldest nats-server Herald runs on: retries are per-message schedules
/// (`allow_msg_schedules`), new in 2.12.
pub const MIN_SERVER_VERSION: (u64, u64) = (2, 12);

/// Room for the headers a lane message adds to an event (id, publish time, ordering key,
/// attempt, schedule target) on top of the event itself.
pub const LANE_HEADER_ROOM: usize = 1024;

/// The largest message Herald writes to (or accepts into) stream `name` when events may
/// be `max_event_bytes` large (headers included): a stream whose `max_msg_size` is below
/// it refuses some of them. The event store takes events as producers send them, a lane
/// and a dead letter carry a whole event with Herald's headers, the attempt log its
/// batches. `None` for a stream that is not Herald's.
pub fn largest_message(name: &str, max_event_bytes: usize) -> Option<usize> {
    match name {
        EVENTS_STREAM => Some(max_event_bytes),
        DELIVERIES_STREAM | DEADLETTER_STREAM => Some(max_event_bytes + LANE_HEADER_ROOM),
        ATTEMPTS_STREAM => Some(super::attempt_log::MAX_BATCH_BYTES),
        _ => None,
    }
}

/// Whether a server that announced `version` and `max_payload` can carry Herald, whose
/// largest message is `largest_message` bytes. Pure, so each refusal is tested; the
/// messages say what is wrong and what to do, for a pod's log and termination message.
pub fn check_server_info(
    version: &str,
    max_payload: usize,
    largest_message: usize,
) -> Result<(), LayoutError> {
    let mut numbers = version
        .trim_start_matches('v')
        .split(['.', '-', '+'])
        .map(|part| part.parse::<u64>().ok());
    let (major, minor) = (numbers.next().flatten(), numbers.next().flatten());
    match (major, minor) {
        (Some(major), Some(minor)) if (major, minor) >= MIN_SERVER_VERSION => {}
        _ => {
            return Err(LayoutError::ServerTooOld {
                version: version.to_owned(),
            });
        }
    }
    if max_payload < largest_message {
        return Err(LayoutError::PayloadTooSmall {
            max_payload,
            needed: largest_message,
        });
    }
    Ok(())
}

/// Refuses, with a message that says what to change, a NATS server Herald cannot run on:
/// JetStream off (for the server or this account), older than [`MIN_SERVER_VERSION`], or
/// a `max_payload` below `largest_message`. Waits for the connection (the first
/// JetStream request does).
pub async fn check_server(
    js: &jetstream::Context,
    largest_message: usize,
) -> Result<(), LayoutError> {
    check_jetstream(js).await?;
    let info = js.client().server_info();
    check_server_info(&info.version, info.max_payload, largest_message)
}

/// Whether JetStream answers for this account: [`LayoutError::NoJetStream`] when the
/// server or the account has it off, [`LayoutError::Server`] when the question itself
/// failed. Waits for the connection (the first JetStream request does).
pub async fn check_jetstream(js: &jetstream::Context) -> Result<(), LayoutError> {
    use async_nats::jetstream::context::AccountErrorKind;
    match js.query_account().await {
        Ok(_) => Ok(()),
        Err(error) => {
            let disabled = match error.kind() {
                AccountErrorKind::JetStreamUnavailable => true,
                AccountErrorKind::JetStream(e) => matches!(
                    e.error_code(),
                    ErrorCode::JETSTREAM_NOT_ENABLED | ErrorCode::JETSTREAM_NOT_ENABLED_FOR_ACCOUNT
                ),
                _ => false,
            };
            Err(if disabled {
                LayoutError::NoJetStream
            } else {
                LayoutError::Server(error.into())
            })
        }
    }
}

impl LayoutError {
    /// The server is not one Herald can run on (not a passing fault): a person must act.
    pub fn is_unfit_server(&self) -> bool {
        matches!(
            self,
            Self::NoJetStream | Self::ServerTooOld { .. } | Self::PayloadTooSmall { .. }
        )
    }

    /// Trying again cannot help: the server is unfit, or the installation's shard count
    /// differs from the recorded one. Anything else (a timeout, a stream without a
    /// leader while a NATS node is down, a refused call) may pass.
    pub fn is_permanent(&self) -> bool {
        self.is_unfit_server() || matches!(self, Self::ShardCountChanged { .. })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error(
        "JetStream is not enabled on this NATS server or for this account: Herald keeps \
         every event, queue and attempt in JetStream. Enable it (a `jetstream` block in the \
         server configuration, and JetStream limits for the account Herald uses); \
         docs/nats.md shows a configuration that fits"
    )]
    NoJetStream,
    #[error(
        "nats-server {version:?} is too old: Herald needs 2.12 or newer (retries are \
         per-message schedules, `allow_msg_schedules`). Upgrade NATS; docs/nats.md shows a \
         configuration that fits"
    )]
    ServerTooOld { version: String },
    #[error(
        "the NATS server's max_payload is {max_payload} bytes but Herald needs {needed} \
         (the largest event, --max-event-bytes, plus the headers of its queue message): \
         raise max_payload in the server configuration or lower --max-event-bytes \
         (HERALD_MAX_EVENT_BYTES, the chart's dispatcher.maxEventBytes)"
    )]
    PayloadTooSmall { max_payload: usize, needed: usize },
    #[error("asking the NATS server about JetStream: {0}")]
    Server(#[source] async_nats::Error),
    #[error("creating or updating stream {name}: {source}")]
    Stream {
        name: &'static str,
        #[source]
        source: async_nats::Error,
    },
    #[error("creating or updating key-value bucket {name}: {source}")]
    Bucket {
        name: &'static str,
        #[source]
        source: async_nats::Error,
    },
    #[error(
        "this installation runs with {recorded} shards (recorded in NATS, herald-config \
         layout.shards) but this process was started with {configured}: changing the shard \
         count is not supported, because every endpoint's queue is keyed by its shard. Set \
         --shards / HERALD_SHARDS (the chart's `shards` value) back to {recorded}"
    )]
    ShardCountChanged { recorded: u32, configured: u32 },
    #[error("reading or recording the shard count: {0}")]
    ShardCount(#[source] async_nats::Error),
}

/// Records the installation's shard count on first start and refuses any other later:
/// the shards of endpoints (and so the subjects of their queues) depend on it.
pub async fn check_shard_count(config: &kv::Store, shards: u32) -> Result<(), LayoutError> {
    let key = super::BucketKey::ShardCount.to_string();
    for _ in 0..3 {
        let recorded = config
            .get(&key)
            .await
            .map_err(|e| LayoutError::ShardCount(e.into()))?;
        match recorded {
            Some(value) => {
                let recorded = std::str::from_utf8(&value)
                    .ok()
                    .and_then(|v| v.trim().parse().ok())
                    .ok_or_else(|| {
                        LayoutError::ShardCount(format!("{key} holds no number").into())
                    })?;
                return if recorded == shards {
                    Ok(())
                } else {
                    Err(LayoutError::ShardCountChanged {
                        recorded,
                        configured: shards,
                    })
                };
            }
            // Another process may record it at the same time: read again.
            None => {
                if config.create(&key, shards.to_string().into()).await.is_ok() {
                    return Ok(());
                }
            }
        }
    }
    Err(LayoutError::ShardCount(
        format!("could not record {key}").into(),
    ))
}

/// The stream's configuration as Herald wants it, on top of `base` (an existing
/// stream's configuration, so settings Herald does not own are kept).
fn stream_config(spec: &StreamSpec, replicas: usize, base: stream::Config) -> stream::Config {
    stream::Config {
        name: spec.name.to_owned(),
        subjects: spec.subjects.clone(),
        storage: stream::StorageType::File,
        retention: stream::RetentionPolicy::Limits,
        max_age: spec.max_age,
        duplicate_window: DUPLICATE_WINDOW,
        allow_direct: true,
        allow_message_schedules: spec.schedules || base.allow_message_schedules,
        subject_transform: spec
            .transform
            .clone()
            .map(|(source, destination)| stream::SubjectTransform {
                source,
                destination,
            })
            .or(base.subject_transform),
        num_replicas: replicas.max(base.num_replicas).max(1),
        ..base
    }
}

/// Whether a stream lookup failed because the stream does not exist (rather than
/// because NATS could not answer).
pub fn stream_missing(error: &jetstream::context::GetStreamError) -> bool {
    matches!(
        error.kind(),
        GetStreamErrorKind::JetStream(j) if j.error_code() == ErrorCode::STREAM_NOT_FOUND
    )
}

/// The event store's retention as the data plane really runs it: `max_age` of
/// [`EVENTS_STREAM`]'s configuration on the server (the dispatchers set it from
/// `--retention`; an administrator may have changed it since). `None` when the stream
/// does not exist yet (no dispatcher has started). A stream lookup needs only
/// `$JS.API.STREAM.INFO.HERALD_EVENTS`: the configuration, never an event.
pub async fn event_retention(js: &jetstream::Context) -> Result<Option<Duration>, LayoutError> {
    let error = |source: async_nats::Error| LayoutError::Stream {
        name: EVENTS_STREAM,
        source,
    };
    match js.get_stream(EVENTS_STREAM).await {
        Ok(stream) => Ok(Some(stream.cached_info().config.max_age)),
        Err(e) if stream_missing(&e) => Ok(None),
        Err(e) => Err(error(e.into())),
    }
}

/// Creates the stream, or brings an existing one up to date without lowering its
/// replicas. Returns a handle.
pub async fn ensure_stream(
    js: &jetstream::Context,
    spec: &StreamSpec,
    replicas: usize,
) -> Result<stream::Stream, LayoutError> {
    let error = |source: async_nats::Error| LayoutError::Stream {
        name: spec.name,
        source,
    };
    // Two replicas starting together may both find the stream missing and race to
    // create it; the loser finds it on the next pass.
    let mut tries = 0;
    loop {
        tries += 1;
        match js.get_stream(spec.name).await {
            Ok(mut existing) => {
                let current = existing
                    .info()
                    .await
                    .map_err(|e| error(e.into()))?
                    .config
                    .clone();
                warn_if_more_replicas(spec.name, current.num_replicas, replicas);
                let wanted = stream_config(spec, replicas, current.clone());
                if same_stream_config(&wanted, &current) {
                    return Ok(existing);
                }
                js.update_stream(wanted)
                    .await
                    .map_err(|e| error(e.into()))?;
                return js.get_stream(spec.name).await.map_err(|e| error(e.into()));
            }
            Err(e) => {
                if !stream_missing(&e) {
                    if tries >= 3 {
                        return Err(error(e.into()));
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                let config = stream_config(spec, replicas, stream::Config::default());
                match js.create_stream(config).await {
                    Ok(stream) => return Ok(stream),
                    Err(e) if tries >= 3 => return Err(error(e.into())),
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        }
    }
}

fn same_stream_config(a: &stream::Config, b: &stream::Config) -> bool {
    a.subjects == b.subjects
        && a.max_age == b.max_age
        && a.duplicate_window == b.duplicate_window
        && a.allow_direct == b.allow_direct
        && a.allow_message_schedules == b.allow_message_schedules
        && a.subject_transform
            .as_ref()
            .map(|t| (&t.source, &t.destination))
            == b.subject_transform
                .as_ref()
                .map(|t| (&t.source, &t.destination))
        && a.num_replicas == b.num_replicas
        && a.storage == b.storage
}

fn warn_if_more_replicas(name: &str, existing: usize, wanted: usize) {
    if existing > wanted.max(1) {
        tracing::warn!(
            stream = name,
            existing,
            wanted,
            "the stream has more replicas than configured; keeping them (Herald never lowers replicas)"
        );
    }
}

/// Opens the bucket, creating it when missing; raises its replicas when fewer than
/// `replicas`, never lowers them.
pub async fn ensure_bucket(
    js: &jetstream::Context,
    spec: BucketSpec,
    replicas: usize,
) -> Result<kv::Store, LayoutError> {
    let error = |source: async_nats::Error| LayoutError::Bucket {
        name: spec.name,
        source,
    };
    let mut tries = 0;
    loop {
        tries += 1;
        if let Ok(store) = js.get_key_value(spec.name).await {
            let stream_name = format!("KV_{}", spec.name);
            let mut stream = js
                .get_stream(&stream_name)
                .await
                .map_err(|e| error(e.into()))?;
            let config = stream
                .info()
                .await
                .map_err(|e| error(e.into()))?
                .config
                .clone();
            warn_if_more_replicas(spec.name, config.num_replicas, replicas);
            if config.num_replicas < replicas || config.max_age != spec.max_age {
                let raised = stream::Config {
                    num_replicas: config.num_replicas.max(replicas),
                    max_age: spec.max_age,
                    ..config
                };
                js.update_stream(raised)
                    .await
                    .map_err(|e| error(e.into()))?;
            }
            return Ok(store);
        }
        let created = js
            .create_key_value(kv::Config {
                bucket: spec.name.to_owned(),
                history: 1,
                storage: stream::StorageType::File,
                max_age: spec.max_age,
                num_replicas: replicas.max(1),
                ..Default::default()
            })
            .await;
        match created {
            Ok(store) => return Ok(store),
            Err(e) if tries >= 3 => return Err(error(e.into())),
            // Lost a race with another replica or the operator: open it next time round.
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_without_what_herald_needs_is_refused_with_what_to_change() {
        assert!(check_server_info("2.12.0", 1 << 20, 300_000).is_ok());
        assert!(check_server_info("2.15.2", 1 << 20, 300_000).is_ok());
        assert!(check_server_info("3.0.0-beta.1", 1 << 20, 300_000).is_ok());
        for old in ["2.11.17", "2.10.22", "1.4.0", "", "garbage"] {
            let error = check_server_info(old, 1 << 20, 1).unwrap_err().to_string();
            assert!(error.contains("2.12 or newer"), "{old}: {error}");
        }
        let error = check_server_info("2.12.1", 65_536, 263_168)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("max_payload is 65536 bytes but Herald needs 263168"),
            "{error}"
        );
    }

    #[test]
    fn every_stream_has_a_largest_message() {
        let max = 1000;
        for spec in streams(DEFAULT_RETENTION, 4) {
            assert!(largest_message(spec.name, max).is_some(), "{}", spec.name);
        }
        assert_eq!(largest_message(EVENTS_STREAM, max), Some(1000));
        assert_eq!(largest_message(DELIVERIES_STREAM, max), Some(2024));
        assert_eq!(largest_message(DEADLETTER_STREAM, max), Some(2024));
        assert_eq!(largest_message(ATTEMPTS_STREAM, max), Some(256 * 1024));
        assert_eq!(largest_message("KV_herald-config", max), None);
    }

    #[test]
    fn every_stream_is_file_backed_with_the_retention() {
        let retention = Duration::from_secs(3600);
        for spec in streams(retention, 16) {
            let config = stream_config(&spec, 1, stream::Config::default());
            assert_eq!(config.max_age, retention, "{}", spec.name);
            assert_eq!(config.storage, stream::StorageType::File);
            assert_eq!(config.num_replicas, 1);
        }
        assert!(deliveries_stream(retention).schedules);
    }

    #[test]
    fn events_are_stored_by_partition() {
        let spec = events_stream(DEFAULT_RETENTION, 16);
        let transform = stream_config(&spec, 1, stream::Config::default())
            .subject_transform
            .expect("the events stream partitions");
        assert_eq!(transform.source, "herald.events.*.>");
        assert_eq!(
            transform.destination,
            "herald.stored.{{partition(16,1)}}.{{wildcard(1)}}.>"
        );
        let lanes = deliveries_stream(DEFAULT_RETENTION);
        assert!(
            stream_config(&lanes, 1, stream::Config::default())
                .subject_transform
                .is_none()
        );
    }

    #[test]
    fn replicas_are_raised_never_lowered() {
        let spec = events_stream(DEFAULT_RETENTION, 16);
        let admin = stream::Config {
            num_replicas: 5,
            max_bytes: 1 << 30,
            ..Default::default()
        };
        let config = stream_config(&spec, 3, admin);
        assert_eq!(config.num_replicas, 5, "an administrator's replicas stay");
        assert_eq!(
            config.max_bytes,
            1 << 30,
            "settings Herald does not own stay"
        );
        let single = stream::Config {
            num_replicas: 1,
            ..Default::default()
        };
        assert_eq!(stream_config(&spec, 3, single).num_replicas, 3);
    }
}
