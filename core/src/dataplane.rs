//! The contract between the operator and the dispatchers, and the NATS names both use.
//! `docs/architecture.md` explains the design; this module is its single source of names.
//!
//! The operator publishes each endpoint's compiled [`EndpointConfig`] and each signing
//! secret's [`KeySet`] into the KV bucket [`CONFIG_BUCKET`]; dispatchers read only that,
//! so they keep delivering while the Kubernetes API is unreachable. Dispatchers publish
//! [`EndpointHealth`] into [`HEALTH_BUCKET`] at a bounded rate; the operator turns it into
//! `WebhookEndpoint` status.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::v1alpha1::{CircuitState, DeliveryPolicy, EndpointState, Header};

/// Ingest stream: the event store and the replay source.
pub const EVENTS_STREAM: &str = "HERALD_EVENTS";
/// Per-endpoint lanes and pending retries.
pub const DELIVERIES_STREAM: &str = "HERALD_DELIVERIES";
/// The attempt log.
pub const ATTEMPTS_STREAM: &str = "HERALD_ATTEMPTS";
/// Events that cannot be delivered at all.
pub const DEADLETTER_STREAM: &str = "HERALD_DEADLETTER";
/// Endpoint configurations and key sets, written by the operator.
pub const CONFIG_BUCKET: &str = "herald-config";
/// Endpoint health, written by the dispatchers.
pub const HEALTH_BUCKET: &str = "herald-health";
/// Shard leases and dispatcher membership.
pub const SHARDS_BUCKET: &str = "herald-shards";

/// Prefix of ingest subjects: `herald.events.<namespace>.<event type>`.
pub const EVENTS_PREFIX: &str = "herald.events";
/// Prefix of lane subjects: `herald.q.<shard>.<ns>.<name>.{new,retry}`.
pub const LANE_PREFIX: &str = "herald.q";
/// Prefix of retry schedules: `herald.sched.<shard>.<ns>.<name>.<event id>`.
pub const SCHEDULE_PREFIX: &str = "herald.sched";
/// Prefix of attempt-log subjects: `herald.attempts.<ns>.<name>`.
pub const ATTEMPTS_PREFIX: &str = "herald.attempts";
/// Prefix of dead-letter subjects: `herald.deadletter.<reason>`.
pub const DEADLETTER_PREFIX: &str = "herald.deadletter";

/// Header carrying the attempt number of a retry-lane message.
pub const ATTEMPT_HEADER: &str = "Herald-Attempt";
/// Header carrying the event id (`webhook-id`) on lane messages.
pub const EVENT_ID_HEADER: &str = "Herald-Event-Id";
/// Header carrying the Unix milliseconds of the first attempt on retry-lane messages.
pub const FIRST_ATTEMPT_HEADER: &str = "Herald-First-Attempt";
/// Header carrying the Unix milliseconds the event was published at.
pub const PUBLISHED_HEADER: &str = "Herald-Published";
/// Header carrying the replay name on lane messages enqueued by a replay.
pub const REPLAY_HEADER: &str = "Herald-Replay";
/// Header carrying the hash (hex) of an event's ordering key on lane messages of
/// endpoints with `orderingKey`.
pub const ORDERING_KEY_HEADER: &str = "Herald-Ordering-Key";
/// Header carrying the reason on dead-letter messages.
pub const REASON_HEADER: &str = "Herald-Reason";

/// An endpoint's identity in subjects and keys: `<namespace>.<name>`, with the dots of
/// the name (Kubernetes names are DNS subdomains) turned into `_`, which Kubernetes names
/// cannot contain, so the mapping is one-to-one.
///
/// Clones share the text: an endpoint's key is held by several indexes.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointKey(std::sync::Arc<str>);

impl EndpointKey {
    pub fn new(namespace: &str, name: &str) -> Self {
        Self(format!("{namespace}.{}", name.replace('.', "_")).into())
    }

    /// Parses `<ns>.<escaped name>` back.
    pub fn parse(key: &str) -> Option<Self> {
        let (ns, name) = key.split_once('.')?;
        (!ns.is_empty() && !name.is_empty() && !name.contains('.')).then(|| Self(key.into()))
    }

    pub fn namespace(&self) -> &str {
        self.0.split_once('.').map(|(ns, _)| ns).unwrap_or_default()
    }

    /// The Kubernetes name of the endpoint.
    pub fn name(&self) -> String {
        self.0
            .split_once('.')
            .map(|(_, n)| n.replace('_', "."))
            .unwrap_or_default()
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `ep.<key>` in [`CONFIG_BUCKET`] and [`HEALTH_BUCKET`].
    pub fn config_key(&self) -> String {
        format!("ep.{}", self.0)
    }

    pub fn lane_subject(&self, shard: u32, lane: Lane) -> String {
        format!("{LANE_PREFIX}.{shard}.{}.{}", self.0, lane.token())
    }

    pub fn schedule_subject(&self, shard: u32, event_id: &str) -> String {
        format!("{SCHEDULE_PREFIX}.{shard}.{}.{event_id}", self.0)
    }

    pub fn attempts_subject(&self) -> String {
        format!("{ATTEMPTS_PREFIX}.{}", self.0)
    }
}

impl fmt::Display for EndpointKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for EndpointKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EndpointKey({})", self.0)
    }
}

/// The two lanes of an endpoint's queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lane {
    /// First attempts of fresh (and replayed) events.
    New,
    /// Retries, published here by JetStream when their schedule is due.
    Retry,
}

impl Lane {
    pub fn token(self) -> &'static str {
        match self {
            Lane::New => "new",
            Lane::Retry => "retry",
        }
    }
}

/// Parses a lane subject into `(shard, endpoint, lane)`.
pub fn parse_lane_subject(subject: &str) -> Option<(u32, EndpointKey, Lane)> {
    let rest = subject.strip_prefix(LANE_PREFIX)?.strip_prefix('.')?;
    let mut parts = rest.split('.');
    let shard = parts.next()?.parse().ok()?;
    let ns = parts.next()?;
    let name = parts.next()?;
    let lane = match parts.next()? {
        "new" => Lane::New,
        "retry" => Lane::Retry,
        _ => return None,
    };
    parts
        .next()
        .is_none()
        .then(|| (shard, EndpointKey(format!("{ns}.{name}").into()), lane))
}

/// `herald.events.<namespace>.<type>`.
pub fn event_subject(namespace: &str, event_type: &str) -> String {
    format!("{EVENTS_PREFIX}.{namespace}.{event_type}")
}

/// Splits an ingest subject into `(namespace, event type)`.
pub fn parse_event_subject(subject: &str) -> Option<(&str, &str)> {
    let rest = subject.strip_prefix(EVENTS_PREFIX)?.strip_prefix('.')?;
    let (ns, ty) = rest.split_once('.')?;
    (!ns.is_empty() && !ty.is_empty()).then_some((ns, ty))
}

/// The shard of an endpoint: FNV-1a of `<namespace>/<name>` modulo `shards`. Stable
/// across versions and processes (unlike `std`'s randomly seeded hasher).
pub fn shard_for(namespace: &str, name: &str, shards: u32) -> u32 {
    let hash = fnv1a(namespace.bytes().chain([b'/']).chain(name.bytes()));
    (hash % u64::from(shards.max(1))) as u32
}

/// 64-bit FNV-1a: a hash that is the same in every process and version, for shard
/// assignment, shard ownership and ordering keys.
pub fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The `webhook-id` of the event stored at `sequence` of [`EVENTS_STREAM`], published at
/// `published_ms`: `msg_<ULID>`. Derived, never stored: every fan-out, retry and replay
/// of the same stored event computes the same id, and ids sort by publish time.
pub fn event_id(published_ms: u64, sequence: u64) -> String {
    format!(
        "msg_{}",
        ulid::Ulid::from_parts(published_ms, u128::from(sequence))
    )
}

/// What the dispatcher needs to know about one endpoint, compiled by the operator from a
/// valid `WebhookEndpoint`. Stored as JSON under `ep.<key>` in [`CONFIG_BUCKET`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointConfig {
    pub namespace: String,
    pub name: String,
    /// The resource's uid: a deleted and re-created endpoint is a new endpoint.
    pub uid: String,
    pub generation: i64,
    pub url: String,
    pub event_types: Vec<String>,
    /// Name of the `SigningSecret`; its keys are under `key.<ns>.<name>`.
    pub secret: String,
    #[serde(default)]
    pub ordered: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering_key: Option<String>,
    #[serde(default)]
    pub paused: bool,
    /// Shared: dispatchers intern identical policies (most endpoints use the defaults),
    /// which keeps an idle endpoint small.
    pub delivery: std::sync::Arc<DeliveryPolicy>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<Header>,
    pub shard: u32,
    /// Changes when a user re-enables a disabled endpoint (`herald.dev/enable`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_token: Option<String>,
}

impl EndpointConfig {
    pub fn key(&self) -> EndpointKey {
        EndpointKey::new(&self.namespace, &self.name)
    }
}

/// `key.<ns>.<name>` in [`CONFIG_BUCKET`]: a signing secret's keys.
pub fn keyset_key(namespace: &str, secret: &str) -> String {
    format!("key.{}", EndpointKey::new(namespace, secret))
}

/// The keys that currently sign for one `SigningSecret`, newest first. During a
/// rotation's overlap both keys are here; afterwards only the new one.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeySet {
    /// `whsec_...` secrets.
    pub keys: Vec<String>,
}

impl fmt::Debug for KeySet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeySet({} keys, <redacted>)", self.keys.len())
    }
}

/// What a dispatcher reports about one endpoint. Stored under `ep.<key>` in
/// [`HEALTH_BUCKET`], at most once per endpoint per reporting interval, only on change.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointHealth {
    /// The uid of the endpoint this is about (stale records of a re-created endpoint
    /// are ignored).
    pub uid: String,
    /// The config generation the dispatcher is using.
    pub generation: i64,
    pub shard: u32,
    pub state: Option<EndpointState>,
    pub circuit: Option<CircuitState>,
    pub concurrency_limit: Option<u32>,
    pub backlog: Option<u64>,
    /// Unix milliseconds of the oldest pending delivery's publish.
    pub oldest_pending_ms: Option<u64>,
    pub last_delivery: Option<LastAttempt>,
    /// Successful attempts / attempts over the window, in per mille.
    pub success_permille: Option<u32>,
    pub p95_latency_ms: Option<u64>,
    /// Unix milliseconds of the start of the current failure run.
    pub first_failure_ms: Option<u64>,
    /// Why the endpoint is disabled, when it is (`Gone`, `SustainedFailure`).
    pub disabled_reason: Option<String>,
    pub disabled_message: Option<String>,
    /// The enable token in force when the endpoint was disabled.
    pub enable_token: Option<String>,
}

/// The most recent attempt, as reported in health.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LastAttempt {
    pub event_id: String,
    pub http_status: Option<u16>,
    pub outcome: String,
    pub latency_ms: u64,
    /// Unix milliseconds.
    pub time_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_keys_escape_dots_one_to_one() {
        let key = EndpointKey::new("shop", "orders.v2");
        assert_eq!(key.as_str(), "shop.orders_v2");
        assert_eq!(key.name(), "orders.v2");
        assert_eq!(key.namespace(), "shop");
        assert_eq!(
            key.lane_subject(3, Lane::New),
            "herald.q.3.shop.orders_v2.new"
        );
        assert_eq!(
            parse_lane_subject("herald.q.3.shop.orders_v2.retry"),
            Some((3, key.clone(), Lane::Retry))
        );
        assert_eq!(parse_lane_subject("herald.q.3.shop.orders_v2.other"), None);
        assert_eq!(EndpointKey::parse("shop.orders_v2"), Some(key));
        assert_eq!(EndpointKey::parse("shop"), None);
    }

    #[test]
    fn event_subjects_split_namespace_and_type() {
        assert_eq!(
            parse_event_subject("herald.events.shop.order.created"),
            Some(("shop", "order.created"))
        );
        assert_eq!(parse_event_subject("herald.events.shop"), None);
        assert_eq!(
            event_subject("shop", "order.created"),
            "herald.events.shop.order.created"
        );
    }

    #[test]
    fn shards_are_stable_and_spread() {
        assert_eq!(
            shard_for("shop", "orders", 16),
            shard_for("shop", "orders", 16)
        );
        let mut counts = [0u32; 8];
        for i in 0..8000 {
            counts[shard_for("ns", &format!("ep-{i}"), 8) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (800..1200).contains(&c)),
            "{counts:?}"
        );
    }

    #[test]
    fn event_ids_are_deterministic_and_distinct() {
        assert_eq!(
            event_id(1_700_000_000_000, 7),
            event_id(1_700_000_000_000, 7)
        );
        assert_ne!(
            event_id(1_700_000_000_000, 7),
            event_id(1_700_000_000_000, 8)
        );
        let id = event_id(1_700_000_000_000, 7);
        assert!(id.starts_with("msg_") && id.len() == 30, "{id}");
    }

    #[test]
    fn keysets_never_print_keys() {
        let set = KeySet {
            keys: vec!["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into()],
        };
        assert!(!format!("{set:?}").contains("whsec_"));
    }
}
