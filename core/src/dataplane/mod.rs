//! The contract between the operator and the dispatchers, and the NATS names both use.
//! `docs/architecture.md` explains the design; this module is its single source of names.
//!
//! The operator publishes each endpoint's compiled [`EndpointConfig`] and each signing
//! secret's [`KeySet`] into the KV bucket [`CONFIG_BUCKET`]; dispatchers read only that,
//! so they keep delivering while the Kubernetes API is unreachable. Dispatchers publish
//! [`EndpointHealth`] into [`HEALTH_BUCKET`] at a bounded rate; the operator turns it into
//! `WebhookEndpoint` status.

use std::fmt;

pub mod attempt_log;
pub mod credentials;
pub mod dead_letter;
pub mod idempotency;
pub mod lane;
pub mod layout;
pub mod records;

pub use attempt_log::Newest;
pub use credentials::Credentials;
pub use dead_letter::DeadLetter;
pub use lane::{LaneError, LaneMessage, Origin};
pub use records::{
    AttemptOutcome, AttemptRecord, DeadReason, DeliveryState, DisabledReason, EndpointConfig,
    EndpointHealth, Hold, KeySet, LastAttempt, LastingState, MAX_RESPONSE_HEADER_BYTES,
    MAX_RESPONSE_HEADERS, ReplayProgress, ReplayRequest, TenantPolicy, TlsMaterial,
};

/// Ingest stream: the event store and the replay source.
/// Most messages one pull of a consumer that reads a stream through (replay, the HTTP
/// API's log reads) asks for. An attempt-log batch holds up to 256 KiB and an event up to
/// 1 MiB: the ordered consumer's default of 500 a pull lets the server send hundreds of
/// MiB at once to a reader that decodes slower than it receives, and a connection whose
/// backlog passes the server's `max_pending` (64 MiB) is cut as a slow consumer, with
/// every other request on it. 16 keeps one pull to a few MiB.
pub const READ_BATCH: i64 = 16;

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
/// HTTP ingest's idempotency keys, written by herald-api (`idempotency`).
pub const IDEMPOTENCY_BUCKET: &str = "herald-idempotency";

/// Prefix of ingest subjects: `herald.events.<namespace>.<event type>`.
pub const EVENTS_PREFIX: &str = "herald.events";
/// Prefix of stored event subjects: `herald.stored.<partition>.<namespace>.<event type>`.
/// [`EVENTS_STREAM`] rewrites every ingest subject with a namespace and a type to this
/// form as it stores the event (a subject transform), with the partition
/// [`partition_of`] the namespace; fan-out runs one consumer per partition. A subject the
/// transform does not match (no type) is stored as published.
pub const STORED_PREFIX: &str = "herald.stored";
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
/// Header carrying the uid of the `WebhookReplay` on lane messages a replay enqueued,
/// kept by their retries.
pub const REPLAY_HEADER: &str = "Herald-Replay";
/// Header carrying the hash (hex) of an event's ordering key on lane messages of
/// endpoints with `orderingKey`.
pub const ORDERING_KEY_HEADER: &str = "Herald-Ordering-Key";
/// Header carrying the reason on dead-letter messages.
pub const REASON_HEADER: &str = "Herald-Reason";
/// Header carrying the original ingest subject on dead-letter messages.
pub const SUBJECT_HEADER: &str = "Herald-Subject";
/// Header carrying the original size in bytes on a dead letter whose payload is only the
/// event's beginning (an event over the size limit; the whole event stays in the event
/// stream under the sequence its id encodes).
pub const TRUNCATED_HEADER: &str = "Herald-Truncated";
/// Header carrying the uid of the endpoint a retry-lane message was written for (fresh
/// lane messages carry it in `Nats-Msg-Id: <event id>.<uid>`): a message left behind by
/// a deleted endpoint is not delivered to a re-created one of the same name.
pub const ENDPOINT_UID_HEADER: &str = "Herald-Endpoint-Uid";
/// The header NATS KV puts on a deleted or purged key's marker (`DEL`, `PURGE`).
pub const KV_OPERATION_HEADER: &str = "KV-Operation";
/// JetStream's header that makes a message a schedule (`@at <RFC 3339 time>`).
pub const SCHEDULE_HEADER: &str = "Nats-Schedule";
/// JetStream's header naming the subject a schedule publishes to when due.
pub const SCHEDULE_TARGET_HEADER: &str = "Nats-Schedule-Target";

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

    /// Whether `self` and `other` are clones of one key (share one allocation).
    pub fn shares(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }

    /// `ep.<key>` in [`CONFIG_BUCKET`] and [`HEALTH_BUCKET`].
    pub fn config_key(&self) -> String {
        BucketKey::Endpoint(self.clone()).to_string()
    }

    pub fn lane_subject(&self, shard: u32, lane: Lane) -> String {
        format!("{LANE_PREFIX}.{shard}.{}.{}", self.0, lane.token())
    }

    /// The filter of one of the endpoint's lanes on whichever shard it is.
    pub fn lane_filter(&self, lane: Lane) -> String {
        format!("{LANE_PREFIX}.*.{}.{}", self.0, lane.token())
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

/// A key of [`CONFIG_BUCKET`] or [`HEALTH_BUCKET`]: `ep.<ns>.<name>` for an endpoint's
/// configuration or health, `key.<ns>.<secret>` for a signing secret's key set,
/// `state.<shard>.<ns>.<name>` for delivery state that must outlive a dispatcher,
/// `replay.<ns>.<name>` for a `WebhookReplay`'s request, `verify.<ns>.<name>` for an
/// endpoint's verification, `cred.<ns>.<name>` for its values from Secrets.
/// Parsed and printed only here, so the operator and the dispatchers cannot disagree.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum BucketKey {
    /// `ep.<ns>.<name>`.
    Endpoint(EndpointKey),
    /// `key.<ns>.<secret name>` (the secret's key, escaped like an endpoint's).
    KeySet(EndpointKey),
    /// `state.<shard>.<ns>.<name>`: an endpoint's [`LastingState`], keyed by shard so a
    /// new owner of a shard reads only its own.
    Lasting { shard: u32, key: EndpointKey },
    /// `layout.shards` in [`CONFIG_BUCKET`]: the shard count the installation runs with,
    /// recorded by the first binary that starts; a process started with another count
    /// refuses to run.
    ShardCount,
    /// `replay.<ns>.<replay name>` (escaped like an endpoint's): in [`CONFIG_BUCKET`] a
    /// valid `WebhookReplay`'s [`ReplayRequest`], written by the operator and deleted
    /// with the resource.
    Replay(EndpointKey),
    /// `tenant.<ns>` in [`CONFIG_BUCKET`]: how the tenant shares the dispatchers
    /// ([`TenantPolicy`]), written by the operator from the namespace's annotations and
    /// deleted when it has none.
    Tenant(String),
    /// `verify.<ns>.<name>` in [`HEALTH_BUCKET`]: what the last verification challenge
    /// to the endpoint showed ([`crate::verification::VerificationReport`]), written by
    /// the dispatcher owning its shard.
    Verification(EndpointKey),
    /// `cred.<ns>.<name>` in [`CONFIG_BUCKET`]: the endpoint's values from Secrets
    /// ([`Credentials`]), written by the operator, read by the dispatchers alone.
    Credentials(EndpointKey),
}

impl BucketKey {
    const ENDPOINT: &str = "ep.";
    const KEY_SET: &str = "key.";
    const LASTING: &str = "state.";
    const REPLAY: &str = "replay.";
    const SHARD_COUNT: &str = "layout.shards";
    const TENANT: &str = "tenant.";
    const VERIFICATION: &str = "verify.";
    const CREDENTIALS: &str = "cred.";

    /// The key of `WebhookReplay` `name` in `namespace`.
    pub fn replay(namespace: &str, name: &str) -> Self {
        Self::Replay(EndpointKey::new(namespace, name))
    }

    /// The filter that selects every [`BucketKey::Endpoint`].
    pub fn endpoint_filter() -> String {
        format!("{}>", Self::ENDPOINT)
    }

    /// The filter that selects every [`BucketKey::Replay`].
    pub fn replay_filter() -> String {
        format!("{}>", Self::REPLAY)
    }

    /// The filter that selects every [`BucketKey::Verification`].
    pub fn verification_filter() -> String {
        format!("{}>", Self::VERIFICATION)
    }

    /// The filter that selects every [`BucketKey::Lasting`] of `shard`.
    pub fn lasting_filter(shard: u32) -> String {
        format!("{}{shard}.>", Self::LASTING)
    }

    /// The key set of `SigningSecret` `secret` in `namespace`.
    pub fn key_set(namespace: &str, secret: &str) -> Self {
        Self::KeySet(EndpointKey::new(namespace, secret))
    }

    pub fn parse(key: &str) -> Option<Self> {
        if key == Self::SHARD_COUNT {
            return Some(Self::ShardCount);
        }
        if let Some(ns) = key.strip_prefix(Self::TENANT) {
            return (!ns.is_empty() && !ns.contains('.')).then(|| Self::Tenant(ns.to_owned()));
        }
        if let Some(rest) = key.strip_prefix(Self::ENDPOINT) {
            EndpointKey::parse(rest).map(Self::Endpoint)
        } else if let Some(rest) = key.strip_prefix(Self::REPLAY) {
            EndpointKey::parse(rest).map(Self::Replay)
        } else if let Some(rest) = key.strip_prefix(Self::VERIFICATION) {
            EndpointKey::parse(rest).map(Self::Verification)
        } else if let Some(rest) = key.strip_prefix(Self::CREDENTIALS) {
            EndpointKey::parse(rest).map(Self::Credentials)
        } else if let Some(rest) = key.strip_prefix(Self::LASTING) {
            let (shard, rest) = rest.split_once('.')?;
            Some(Self::Lasting {
                shard: shard.parse().ok()?,
                key: EndpointKey::parse(rest)?,
            })
        } else {
            key.strip_prefix(Self::KEY_SET)
                .and_then(EndpointKey::parse)
                .map(Self::KeySet)
        }
    }

    /// The namespace the key belongs to (none for installation-wide keys).
    pub fn namespace(&self) -> &str {
        match self {
            Self::Endpoint(k)
            | Self::KeySet(k)
            | Self::Replay(k)
            | Self::Verification(k)
            | Self::Credentials(k)
            | Self::Lasting { key: k, .. } => k.namespace(),
            Self::Tenant(ns) => ns,
            Self::ShardCount => "",
        }
    }
}

impl fmt::Display for BucketKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Endpoint(k) => write!(f, "{}{k}", Self::ENDPOINT),
            Self::KeySet(k) => write!(f, "{}{k}", Self::KEY_SET),
            Self::Lasting { shard, key } => write!(f, "{}{shard}.{key}", Self::LASTING),
            Self::Replay(k) => write!(f, "{}{k}", Self::REPLAY),
            Self::ShardCount => f.write_str(Self::SHARD_COUNT),
            Self::Tenant(ns) => write!(f, "{}{ns}", Self::TENANT),
            Self::Verification(k) => write!(f, "{}{k}", Self::VERIFICATION),
            Self::Credentials(k) => write!(f, "{}{k}", Self::CREDENTIALS),
        }
    }
}

/// A key of [`SHARDS_BUCKET`]: `shard.<n>` holds the id of the dispatcher that leases
/// shard `n`, `member.<id>` says a dispatcher is alive (both expire with the bucket's
/// TTL unless renewed).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum LeaseKey {
    /// `shard.<n>`.
    Shard(u32),
    /// `member.<dispatcher id>`.
    Member(String),
}

impl LeaseKey {
    const SHARD: &str = "shard.";
    const MEMBER: &str = "member.";

    pub fn parse(key: &str) -> Option<Self> {
        if let Some(shard) = key.strip_prefix(Self::SHARD) {
            shard.parse().ok().map(Self::Shard)
        } else {
            key.strip_prefix(Self::MEMBER)
                .filter(|id| !id.is_empty())
                .map(|id| Self::Member(id.to_owned()))
        }
    }
}

impl fmt::Display for LeaseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Shard(shard) => write!(f, "{}{shard}", Self::SHARD),
            Self::Member(id) => write!(f, "{}{id}", Self::MEMBER),
        }
    }
}

/// `key.<ns>.<name>` in [`CONFIG_BUCKET`]: a signing secret's keys.
pub fn keyset_key(namespace: &str, secret: &str) -> String {
    BucketKey::key_set(namespace, secret).to_string()
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

/// The filter of every lane of `shard`.
pub fn shard_lanes_filter(shard: u32) -> String {
    format!("{LANE_PREFIX}.{shard}.>")
}

/// The filter of every lane of `namespace`'s endpoints on `shard`.
pub fn namespace_lanes_filter(shard: u32, namespace: &str) -> String {
    format!("{LANE_PREFIX}.{shard}.{namespace}.>")
}

/// The filter of every retry schedule of `shard`.
pub fn shard_schedules_filter(shard: u32) -> String {
    format!("{SCHEDULE_PREFIX}.{shard}.>")
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

/// Parses a schedule subject into `(shard, endpoint, event id)`.
pub fn parse_schedule_subject(subject: &str) -> Option<(u32, EndpointKey, &str)> {
    let rest = subject.strip_prefix(SCHEDULE_PREFIX)?.strip_prefix('.')?;
    let mut parts = rest.splitn(4, '.');
    let shard = parts.next()?.parse().ok()?;
    let ns = parts.next()?;
    let name = parts.next()?;
    let event_id = parts.next()?;
    (!event_id.contains('.')).then(|| (shard, EndpointKey(format!("{ns}.{name}").into()), event_id))
}

/// `herald.events.<namespace>.<type>`.
pub fn event_subject(namespace: &str, event_type: &str) -> String {
    format!("{EVENTS_PREFIX}.{namespace}.{event_type}")
}

/// Splits an event's subject into `(namespace, event type)`: the ingest form
/// `herald.events.<ns>.<type>` (what producers publish to, and how events stored before
/// partitioning are stored) or the stored form `herald.stored.<partition>.<ns>.<type>`.
pub fn parse_event_subject(subject: &str) -> Option<(&str, &str)> {
    let rest = match subject.strip_prefix(STORED_PREFIX) {
        Some(stored) => {
            let (partition, rest) = stored.strip_prefix('.')?.split_once('.')?;
            partition.parse::<u32>().ok()?;
            rest
        }
        None => subject.strip_prefix(EVENTS_PREFIX)?.strip_prefix('.')?,
    };
    let (ns, ty) = rest.split_once('.')?;
    (!ns.is_empty() && !ty.is_empty()).then_some((ns, ty))
}

/// The subject an event was published to, from the subject it is stored under: what a
/// person sees in a dead letter. Any other subject is returned as it is.
pub fn ingest_subject(stored: &str) -> std::borrow::Cow<'_, str> {
    match (
        stored.starts_with(STORED_PREFIX),
        parse_event_subject(stored),
    ) {
        (true, Some((ns, ty))) => event_subject(ns, ty).into(),
        _ => stored.into(),
    }
}

/// The ingest partition of a namespace: 32-bit FNV-1a of its name modulo `partitions`,
/// exactly what nats-server's `{{partition(n,1)}}` computes in [`EVENTS_STREAM`]'s
/// subject transform (so Herald can name the partition of a tenant).
pub fn partition_of(namespace: &str, partitions: u32) -> u32 {
    let hash = namespace.bytes().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    });
    hash % partitions.max(1)
}

/// The filter of one ingest partition's stored events.
pub fn partition_filter(partition: u32) -> String {
    format!("{STORED_PREFIX}.{partition}.>")
}

/// The filters that select every stored event of a namespace, in either form.
pub fn namespace_event_filters(namespace: &str) -> Vec<String> {
    vec![
        format!("{EVENTS_PREFIX}.{namespace}.>"),
        format!("{STORED_PREFIX}.*.{namespace}.>"),
    ]
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

/// The publish time (Unix milliseconds) an event id carries.
pub fn event_published_ms(event_id: &str) -> Option<u64> {
    let ulid = event_id.strip_prefix("msg_")?.parse::<ulid::Ulid>().ok()?;
    Some(ulid.timestamp_ms())
}

/// The [`EVENTS_STREAM`] sequence an event id carries (`event_id(ms, seq)`).
pub fn event_sequence(event_id: &str) -> Option<u64> {
    let ulid = event_id.strip_prefix("msg_")?.parse::<ulid::Ulid>().ok()?;
    u64::try_from(ulid.random()).ok()
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
        assert_eq!(key.lane_filter(Lane::New), "herald.q.*.shop.orders_v2.new");
        assert_eq!(shard_lanes_filter(3), "herald.q.3.>");
        assert_eq!(namespace_lanes_filter(3, "shop"), "herald.q.3.shop.>");
        assert_eq!(shard_schedules_filter(3), "herald.sched.3.>");
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
        assert_eq!(
            parse_event_subject("herald.stored.7.shop.order.created"),
            Some(("shop", "order.created"))
        );
        for bad in [
            "herald.stored.x.shop.a",
            "herald.stored.7.shop",
            "herald.stored",
        ] {
            assert_eq!(parse_event_subject(bad), None, "{bad}");
        }
        assert_eq!(
            ingest_subject("herald.stored.7.shop.order.created"),
            "herald.events.shop.order.created"
        );
        assert_eq!(ingest_subject("herald.events.shop"), "herald.events.shop");
    }

    #[test]
    fn partitions_are_the_servers() {
        // What nats-server 2.15 stored for `{{partition(8,1)}}` of these namespaces
        // (e2e/tests/partitions.rs checks the transform itself).
        for (namespace, partition) in [
            ("alpha", 3),
            ("beta", 7),
            ("gamma", 2),
            ("tenant-a", 3),
            ("tenant-b", 6),
        ] {
            assert_eq!(partition_of(namespace, 8), partition, "{namespace}");
        }
        assert_eq!(partition_filter(3), "herald.stored.3.>");
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
        assert_eq!(event_published_ms(&id), Some(1_700_000_000_000));
        let key = EndpointKey::new("shop", "orders");
        let subject = key.schedule_subject(3, &id);
        assert_eq!(
            parse_schedule_subject(&subject),
            Some((3, key, id.as_str()))
        );
        assert_eq!(parse_schedule_subject("herald.sched.3.shop"), None);
    }

    #[test]
    fn lease_keys_round_trip() {
        for (key, text) in [
            (LeaseKey::Shard(7), "shard.7"),
            (LeaseKey::Member("disp-0.abc".into()), "member.disp-0.abc"),
        ] {
            assert_eq!(key.to_string(), text);
            assert_eq!(LeaseKey::parse(text), Some(key));
        }
        for bad in ["shard.", "shard.x", "member.", "ep.shop.a", ""] {
            assert_eq!(LeaseKey::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn bucket_keys_round_trip() {
        let ep = BucketKey::Endpoint(EndpointKey::new("shop", "orders.v2"));
        assert_eq!(ep.to_string(), "ep.shop.orders_v2");
        assert_eq!(BucketKey::parse("ep.shop.orders_v2"), Some(ep.clone()));
        assert_eq!(
            EndpointKey::new("shop", "orders.v2").config_key(),
            "ep.shop.orders_v2"
        );
        let keys = BucketKey::key_set("shop", "signing");
        assert_eq!(keys.to_string(), "key.shop.signing");
        assert_eq!(keyset_key("shop", "signing"), "key.shop.signing");
        assert_eq!(BucketKey::parse("key.shop.signing"), Some(keys.clone()));
        assert_eq!(keys.namespace(), "shop");
        let lasting = BucketKey::Lasting {
            shard: 3,
            key: EndpointKey::new("shop", "orders"),
        };
        assert_eq!(lasting.to_string(), "state.3.shop.orders");
        assert_eq!(BucketKey::parse("state.3.shop.orders"), Some(lasting));
        assert_eq!(BucketKey::lasting_filter(3), "state.3.>");
        assert_eq!(BucketKey::endpoint_filter(), "ep.>");
        assert_eq!(BucketKey::replay_filter(), "replay.>");
        assert_eq!(
            BucketKey::parse("layout.shards"),
            Some(BucketKey::ShardCount)
        );
        assert_eq!(BucketKey::ShardCount.to_string(), "layout.shards");
        let replay = BucketKey::replay("shop", "again.v2");
        assert_eq!(replay.to_string(), "replay.shop.again_v2");
        assert_eq!(
            BucketKey::parse("replay.shop.again_v2"),
            Some(replay.clone())
        );
        assert_eq!(replay.namespace(), "shop");
        let tenant = BucketKey::Tenant("shop".into());
        assert_eq!(tenant.to_string(), "tenant.shop");
        assert_eq!(BucketKey::parse("tenant.shop"), Some(tenant.clone()));
        assert_eq!(tenant.namespace(), "shop");
        let verification = BucketKey::Verification(EndpointKey::new("shop", "orders.v2"));
        assert_eq!(verification.to_string(), "verify.shop.orders_v2");
        assert_eq!(
            BucketKey::parse("verify.shop.orders_v2"),
            Some(verification.clone())
        );
        assert_eq!(verification.namespace(), "shop");
        assert_eq!(BucketKey::verification_filter(), "verify.>");
        let credentials = BucketKey::Credentials(EndpointKey::new("shop", "orders"));
        assert_eq!(credentials.to_string(), "cred.shop.orders");
        assert_eq!(BucketKey::parse("cred.shop.orders"), Some(credentials));
        for bad in [
            "tenant.",
            "tenant.shop.x",
            "ep.",
            "ep.shop",
            "key.",
            "member.x",
            "shard.1",
            "ep.shop.a.b",
            "",
            "state.x.a.b",
            "state.1.a",
            "replay.",
            "replay.shop",
            "replay.shop.a.b",
        ] {
            assert_eq!(BucketKey::parse(bad), None, "{bad}");
        }
    }
}
