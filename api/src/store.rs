//! What the API reads from and writes to NATS: endpoint configurations from
//! `herald-config`, the attempt log (`HERALD_ATTEMPTS`), the endpoint's lanes and the
//! event store. Reads use ordered consumers (no state left behind, nothing to ack) and
//! direct gets; the API's NATS identity may do nothing else with these streams.

use std::sync::Arc;

use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use async_nats::jetstream::stream::{DirectGetErrorKind, Stream};
use async_nats::jetstream::{self, kv};
use futures::StreamExt;
use herald_core::api::{Limit, Truncated};
use herald_core::dataplane::{
    ATTEMPTS_STREAM, AttemptRecord, BucketKey, CONFIG_BUCKET, DELIVERIES_STREAM, EVENTS_STREAM,
    EndpointConfig, EndpointKey, Lane, LaneMessage, TenantPolicy, attempt_log, event_sequence,
    layout, parse_event_subject,
};

use crate::deliveries::Queued;
use crate::error::ApiError;

/// Most lane messages one list reads: an endpoint with a larger backlog lists the
/// oldest this many of its queued events that have no attempt yet as `pending`.
pub const LANE_SCAN_MAX: usize = 20_000;

/// The span of the first window a [`BackScan`] reads; each next one is four times longer.
const FIRST_WINDOW_MS: u64 = 60_000;

/// What one request may read of the attempt log: records and time, and its slot among
/// the reads running at once ([`crate::scans`]).
pub struct Budget {
    pub records: usize,
    pub until: tokio::time::Instant,
    /// Held while the read runs.
    pub slot: crate::scans::ScanPermit,
}

/// A read of one endpoint's attempt log from now back to a floor, window by window:
/// each window is read oldest first, the windows newest first, so a reader that has
/// what it needs after the newest records stops there. Records of an event are all
/// logged after its publish time, so once the scan is back to `t` every event published
/// since `t` has all its records read ([`BackScan::read_back_to`]).
///
/// Bounded: it stops for good when it has handed out [`Budget::records`] records or its
/// time is up ([`BackScan::truncated`]); memory is one message at a time (at most
/// `attempt_log::MAX_BATCH_BYTES`) plus what the caller keeps.
pub struct BackScan<'a> {
    stream: &'a Stream,
    subject: String,
    floor_ms: u64,
    /// The end (exclusive) of the next window: everything logged since was read.
    high_ms: u64,
    width_ms: u64,
    budget: Budget,
    stopped: Option<Limit>,
}

impl BackScan<'_> {
    /// Reads the next older window, handing each record with its sequence to `each`;
    /// false when there is nothing left to read (the floor was reached or a bound).
    pub async fn next_window(
        &mut self,
        mut each: impl FnMut(u64, AttemptRecord),
    ) -> Result<bool, ApiError> {
        if self.stopped.is_some() || self.high_ms <= self.floor_ms {
            return Ok(false);
        }
        let low_ms = self
            .high_ms
            .saturating_sub(self.width_ms)
            .max(self.floor_ms);
        let read = self.read_window(low_ms, &mut each).await;
        let completed = read.map_err(|e| ApiError::unavailable("reading the delivery log", e))?;
        if completed {
            self.high_ms = low_ms;
            self.width_ms = self.width_ms.saturating_mul(4);
        }
        Ok(completed)
    }

    /// One window, `[low_ms, high_ms)`; false when a bound stopped it part way.
    async fn read_window(
        &mut self,
        low_ms: u64,
        each: &mut impl FnMut(u64, AttemptRecord),
    ) -> Result<bool, async_nats::Error> {
        let mut consumer = self
            .stream
            .create_consumer(pull::OrderedConfig {
                filter_subject: self.subject.clone(),
                deliver_policy: by_start_time(low_ms),
                max_batch: herald_core::dataplane::READ_BATCH,
                ..Default::default()
            })
            .await?;
        let mut remaining = consumer.info().await?.num_pending;
        tracing::debug!(
            low_ms,
            high_ms = self.high_ms,
            remaining,
            "reading a window of the delivery log"
        );
        let mut messages = consumer.messages().await?;
        while remaining > 0 {
            let next = tokio::time::timeout_at(self.budget.until, messages.next()).await;
            let Ok(next) = next else {
                self.stopped = Some(Limit::Time);
                return Ok(false);
            };
            let Some(message) = next else { break };
            let message = message?;
            let info = message.info()?;
            remaining = info.pending;
            if published_ms(info.published) >= self.high_ms {
                break;
            }
            let seq = info.stream_sequence;
            for record in attempt_log::decode(&message.payload) {
                if self.budget.records == 0 {
                    self.stopped = Some(Limit::Records);
                    return Ok(false);
                }
                self.budget.records -= 1;
                each(seq, record);
            }
        }
        Ok(true)
    }

    /// Every record logged at or after this time has been read.
    pub fn read_back_to(&self) -> u64 {
        self.high_ms
    }

    /// Whether the whole range down to the floor was read.
    fn complete(&self) -> bool {
        self.stopped.is_none() && self.high_ms <= self.floor_ms
    }

    /// The oldest publish time whose events have all their records read: 0 when the
    /// whole range was, else [`BackScan::read_back_to`].
    pub fn complete_from(&self) -> u64 {
        if self.complete() { 0 } else { self.high_ms }
    }

    /// The answer's `truncated`, when a bound stopped the scan.
    pub fn truncated(&self) -> Option<Truncated> {
        self.stopped.map(|limit| Truncated {
            limit: limit.into(),
            read_back_to: Some(herald_core::api::time::from_ms(self.high_ms)),
        })
    }
}

/// Handles on the streams and the bucket.
#[derive(Clone)]
pub struct Store {
    pub js: jetstream::Context,
    config: kv::Store,
    attempts: Stream,
    lanes: Stream,
    pub events: Stream,
    /// HTTP ingest's idempotency keys (created by this API).
    pub idempotency: kv::Store,
}

/// A stored event, read back by its id.
pub struct StoredEvent {
    pub subject: String,
    pub payload: bytes::Bytes,
    pub headers: async_nats::HeaderMap,
    pub published_ms: u64,
}

impl StoredEvent {
    /// The event's type, from its subject.
    pub fn event_type(&self) -> Option<String> {
        parse_event_subject(&self.subject).map(|(_, ty)| ty.to_owned())
    }
}

fn published_ms(time: async_nats::datetime::DateTime) -> u64 {
    (time.unix_timestamp_nanos() / 1_000_000).max(0) as u64
}

/// Start reading at `ms` by publish time (every stream here is append-only by time).
pub fn by_start_time(ms: u64) -> DeliverPolicy {
    let from = jiff::Timestamp::from_millisecond(ms as i64).unwrap_or_default();
    // async-nats takes a `time` value; its serde form is RFC 3339, which jiff prints.
    serde_json::from_value(serde_json::json!({
        "deliver_policy": "by_start_time",
        "opt_start_time": from.to_string(),
    }))
    .unwrap_or(DeliverPolicy::All)
}

impl Store {
    /// Opens the streams and the configuration bucket (created by the dispatchers and
    /// the operator; the API never creates them), then creates or opens its own bucket
    /// of idempotency keys, each kept `window`, with as many replicas as the event store.
    pub async fn open(
        js: jetstream::Context,
        window: std::time::Duration,
    ) -> Result<Self, async_nats::Error> {
        let mut events = js.get_stream(EVENTS_STREAM).await?;
        let replicas = events.info().await?.config.num_replicas;
        let idempotency = layout::ensure_bucket(&js, layout::idempotency(window), replicas)
            .await
            .map_err(Box::new)?;
        Ok(Self {
            config: js.get_key_value(CONFIG_BUCKET).await?,
            attempts: js.get_stream(ATTEMPTS_STREAM).await?,
            lanes: js.get_stream(DELIVERIES_STREAM).await?,
            events,
            idempotency,
            js,
        })
    }

    /// The tenant policy of `namespace` (`None`: the defaults), by direct get of
    /// `tenant.<ns>`. One that does not decode is the defaults, with a log line.
    pub async fn tenant_policy(
        &self,
        namespace: &str,
    ) -> Result<Option<TenantPolicy>, async_nats::Error> {
        let key = BucketKey::Tenant(namespace.to_owned()).to_string();
        let Some(value) = self.config.get(&key).await? else {
            return Ok(None);
        };
        match serde_json::from_slice(&value) {
            Ok(policy) => Ok(Some(policy)),
            Err(error) => {
                tracing::warn!(%error, key, "the tenant policy does not decode; the defaults apply");
                Ok(None)
            }
        }
    }

    /// The endpoint's configuration, or a 404 naming it.
    pub async fn endpoint(&self, namespace: &str, name: &str) -> Result<EndpointConfig, ApiError> {
        let key = EndpointKey::new(namespace, name);
        let entry = self
            .config
            .get(key.config_key())
            .await
            .map_err(|e| ApiError::unavailable("reading the endpoint configuration", e))?;
        let config = entry.and_then(|v| serde_json::from_slice::<EndpointConfig>(&v).ok());
        config
            .filter(|c| c.namespace == namespace && c.name == name)
            .ok_or_else(|| {
                ApiError::not_found(
                    "EndpointNotFound",
                    format!(
                        "namespace {namespace} has no WebhookEndpoint {name} that Herald delivers to (it does not exist or is not valid yet)"
                    ),
                )
            })
    }

    /// The sequence of the newest message of `subjects` in `stream` (0: none).
    async fn last_seq(stream: &Stream, subjects: &[String]) -> Result<u64, ApiError> {
        let mut last = 0;
        for subject in subjects {
            match stream.direct_get_last_for_subject(subject.as_str()).await {
                Ok(message) => last = last.max(message.sequence),
                Err(e) if e.kind() == DirectGetErrorKind::NotFound => {}
                Err(e) => return Err(ApiError::unavailable("reading the delivery log", e)),
            }
        }
        Ok(last)
    }

    /// The attempt log's and the lanes' newest sequences for an endpoint.
    pub async fn high_water(&self, config: &EndpointConfig) -> Result<(u64, u64), ApiError> {
        let key = config.key();
        let attempts = Self::last_seq(&self.attempts, &[key.attempts_subject()]).await?;
        let lanes = Self::last_seq(&self.lanes, &lane_subjects(config)).await?;
        Ok((attempts, lanes))
    }

    /// A bounded read of the endpoint's attempt log back from now to `floor_ms` (see
    /// [`BackScan`]).
    pub async fn scan_back(
        &self,
        key: &EndpointKey,
        floor_ms: u64,
        budget: Budget,
    ) -> Result<BackScan<'_>, ApiError> {
        let info = self
            .attempts
            .get_info()
            .await
            .map_err(|e| ApiError::unavailable("reading the delivery log", e))?;
        let first = info.state.first_timestamp.unix_timestamp_nanos() / 1_000_000;
        let last = info.state.last_timestamp.unix_timestamp_nanos() / 1_000_000;
        Ok(BackScan {
            stream: &self.attempts,
            subject: key.attempts_subject(),
            // Nothing is older than the log's first message.
            floor_ms: floor_ms.max(first.max(0) as u64),
            // Past the newest message: a window ending here holds every record.
            high_ms: (last.max(0) as u64).max(herald_core::clock::now_ms()) + 1,
            width_ms: FIRST_WINDOW_MS,
            budget,
            stopped: None,
        })
    }

    /// The events queued on the endpoint's lanes (the oldest [`LANE_SCAN_MAX`]), or only
    /// those of event `only`.
    pub async fn queued(
        &self,
        config: &EndpointConfig,
        only: Option<&str>,
    ) -> Result<Vec<Queued>, ApiError> {
        let mut out = Vec::new();
        read(
            &self.lanes,
            lane_subjects(config),
            DeliverPolicy::All,
            LANE_SCAN_MAX,
            |seq, message| {
                let Ok(lane) = LaneMessage::decode(message.headers.as_ref()) else {
                    return;
                };
                if only.is_some_and(|id| id != lane.event_id) {
                    return;
                }
                let queued_ms = message.info().map(|i| published_ms(i.published)).ok();
                out.push(Queued {
                    seq,
                    event_id: Arc::from(lane.event_id),
                    event_type: herald_core::envelope::body_type(&message.payload)
                        .map(str::to_owned),
                    published_ms: queued_ms.unwrap_or(lane.published_ms),
                });
            },
        )
        .await
        .map_err(|e| ApiError::unavailable("reading the endpoint's queue", e))?;
        Ok(out)
    }

    /// The stored event `event_id` names, if it is in `namespace`'s part of the store.
    pub async fn event(
        &self,
        namespace: &str,
        event_id: &str,
    ) -> Result<Option<StoredEvent>, ApiError> {
        let (Some(seq), Some(ms)) = (
            event_sequence(event_id),
            herald_core::dataplane::event_published_ms(event_id),
        ) else {
            return Ok(None);
        };
        let message = match self.events.direct_get(seq).await {
            Ok(message) => message,
            Err(e) if e.kind() == DirectGetErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(ApiError::unavailable("reading the event store", e)),
        };
        let stored_ms = published_ms(message.time);
        let ours =
            parse_event_subject(message.subject.as_str()).is_some_and(|(ns, _)| ns == namespace);
        Ok((ours && stored_ms == ms).then(|| StoredEvent {
            subject: message.subject.to_string(),
            payload: message.payload,
            headers: message.headers,
            published_ms: stored_ms,
        }))
    }
}

/// The endpoint's two lane subjects.
pub fn lane_subjects(config: &EndpointConfig) -> Vec<String> {
    let key = config.key();
    [Lane::New, Lane::Retry]
        .map(|lane| key.lane_subject(config.shard, lane))
        .to_vec()
}

/// How long a read waits for the next message it counted as pending. Messages can be
/// removed after they were counted (a lane is purged as its deliveries finish); the
/// read would then wait for them forever, holding the caller's scan.
const READ_IDLE: std::time::Duration = std::time::Duration::from_secs(5);

/// Reads `subjects` of `stream` from `start` to the end as it was when the read began,
/// at most `max` messages, handing each with its sequence to `each`. Ends early when
/// nothing arrives for [`READ_IDLE`]: the rest was removed meanwhile.
async fn read(
    stream: &Stream,
    subjects: Vec<String>,
    start: DeliverPolicy,
    max: usize,
    mut each: impl FnMut(u64, &jetstream::Message),
) -> Result<(), async_nats::Error> {
    let (filter_subject, filter_subjects) = match <[String; 1]>::try_from(subjects) {
        Ok([one]) => (one, Vec::new()),
        Err(many) => (String::new(), many),
    };
    let mut consumer = stream
        .create_consumer(pull::OrderedConfig {
            filter_subject,
            filter_subjects,
            deliver_policy: start,
            max_batch: herald_core::dataplane::READ_BATCH,
            ..Default::default()
        })
        .await?;
    let mut remaining = consumer.info().await?.num_pending;
    let mut messages = consumer.messages().await?;
    let mut read = 0;
    while remaining > 0 && read < max {
        let Ok(Some(message)) = tokio::time::timeout(READ_IDLE, messages.next()).await else {
            break;
        };
        let message = message?;
        let info = message.info()?;
        remaining = info.pending;
        let seq = info.stream_sequence;
        each(seq, &message);
        read += 1;
    }
    Ok(())
}
