//! The records that cross the NATS wire between the operator, the dispatchers and the
//! tools that read the delivery log: typed once here, serialized as before so data
//! already stored stays readable.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::EndpointKey;
use crate::names::ENABLE_ANNOTATION;
use crate::v1alpha1::{CircuitState, DeliveryPolicy, EndpointState, Header, WebhookEndpoint};

/// What the dispatcher needs to know about one endpoint, compiled by the operator from a
/// valid `WebhookEndpoint`. Stored as JSON under `ep.<key>` in
/// [`CONFIG_BUCKET`](super::CONFIG_BUCKET).
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
    pub delivery: Arc<DeliveryPolicy>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<Header>,
    /// The client certificate and CA of `spec.tls`, as the operator read them from
    /// their Secrets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<Arc<TlsMaterial>>,
    pub shard: u32,
    /// Changes when a user re-enables a disabled endpoint (`herald.dev/enable`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_token: Option<String>,
    /// Set while the resource exists but does not validate right now (its secret is not
    /// ready, its host does not resolve...): the dispatchers keep this last good
    /// configuration and the endpoint's backlog, deliver nothing, and resume when the
    /// operator clears it. Only a deleted resource drops work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<Box<Hold>>,
    /// Set while the endpoint must be verified and is not (its `held` says so too): the
    /// dispatcher owning its shard sends challenges ([`crate::verification`]) until one
    /// is echoed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub verify: bool,
    /// The version ([`super::Credentials::fingerprint`]) of the values from Secrets the
    /// endpoint needs, kept under `cred.<ns>.<name>`: in this entry each header with a
    /// `valueFrom` has an empty value and `tls` is absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<String>,
}

/// Why delivery to an endpoint is held: a condition reason and message a tenant can
/// act on (the endpoint's `Ready` condition says the same).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    pub reason: String,
    pub message: String,
}

impl EndpointConfig {
    /// The configuration of a (validated) `WebhookEndpoint` on `shard`: the one way the
    /// operator, the tests and the benchmark build it.
    pub fn from_spec(obj: &WebhookEndpoint, shard: u32) -> Self {
        let meta = &obj.metadata;
        let spec = &obj.spec;
        Self {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            generation: meta.generation.unwrap_or_default(),
            url: spec.url.clone(),
            event_types: spec.event_types.clone(),
            secret: spec.secret_ref.name.clone(),
            ordered: spec.ordered,
            ordering_key: spec.ordering_key.clone(),
            paused: spec.paused,
            delivery: Arc::new(spec.delivery.clone()),
            headers: spec.headers.clone(),
            // Read from Secrets by the operator.
            tls: None,
            shard,
            enable_token: meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(ENABLE_ANNOTATION))
                .cloned(),
            held: None,
            verify: false,
            credentials: None,
        }
    }

    pub fn key(&self) -> EndpointKey {
        EndpointKey::new(&self.namespace, &self.name)
    }
}

/// An endpoint's TLS material (PEM): what it presents and what it trusts. Its `Debug`
/// shows neither the key nor the certificates.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TlsMaterial {
    /// The client certificate chain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cert: Option<String>,
    /// Its private key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_key: Option<String>,
    /// CA certificates to verify the receiver with instead of the platform's roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
}

impl fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "TlsMaterial(client certificate: {}, CA: {}, <redacted>)",
            self.client_cert.is_some(),
            self.ca.is_some()
        )
    }
}

/// The keys that currently sign for one `SigningSecret`, newest first. During a
/// rotation's overlap both keys are here; afterwards only the new one.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeySet {
    /// The keys as the Secret holds them: `whsec_...` (HMAC) or `whsk_...` (Ed25519).
    pub keys: Vec<String>,
}

impl fmt::Debug for KeySet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeySet({} keys, <redacted>)", self.keys.len())
    }
}

/// How a tenant (namespace) shares the dispatchers and the HTTP API, from the namespace's
/// annotations `herald.dev/weight`, `herald.dev/max-in-flight`, `herald.dev/api-rate` and
/// `herald.dev/api-burst` (set by the platform team, who own namespaces). Stored as JSON
/// under `tenant.<ns>` in [`CONFIG_BUCKET`](super::CONFIG_BUCKET); a missing field or key
/// means the defaults (the dispatchers' and herald-api's flags).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantPolicy {
    /// Consecutive attempts per turn of a shard's tenant ring (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// Most attempts of the tenant in flight per shard (default: the dispatcher's
    /// `--tenant-max-in-flight`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
    /// Requests per second the tenant may make to herald-api, HTTP ingest included
    /// (default: its `--rate-per-namespace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_rate: Option<u32>,
    /// Requests the tenant may make at once above its rate (default: herald-api's
    /// `--burst-per-namespace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_burst: Option<u32>,
}

/// A valid `WebhookReplay`, as the dispatcher owning its endpoint's shard carries it out.
/// Stored as JSON under `replay.<ns>.<name>` in [`CONFIG_BUCKET`](super::CONFIG_BUCKET)
/// by the operator, which alone can read the resource; deleted when the resource is.
/// The range is fixed when written: `to` defaults to the end of the second the resource
/// was created in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayRequest {
    pub namespace: String,
    /// The `WebhookReplay`'s name.
    pub name: String,
    /// The resource's uid: a deleted and re-created replay of the same name is a new
    /// replay.
    pub uid: String,
    /// Name of the `WebhookEndpoint` (same namespace).
    pub endpoint: String,
    /// Events published at or after this Unix millisecond.
    pub from_ms: u64,
    /// Events published before this Unix millisecond.
    pub to_ms: u64,
    /// Type patterns the events must also match; empty: every type the endpoint takes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub event_types: Vec<String>,
    #[serde(default)]
    pub only_failed: bool,
    #[serde(default)]
    pub dry_run: bool,
}

/// How far the dispatcher carrying out a replay has come. Stored as JSON under
/// `replay.<ns>.<name>` in [`HEALTH_BUCKET`](super::HEALTH_BUCKET) by the owner of the
/// endpoint's shard; the operator mirrors it into the `WebhookReplay`'s status, and a
/// new owner of the shard resumes from `cursor`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayProgress {
    /// The [`ReplayRequest::uid`] this is the progress of.
    pub uid: String,
    /// Whether the whole range has been looked at.
    #[serde(default)]
    pub done: bool,
    /// Events in the range that match the filters, so far.
    #[serde(default)]
    pub matched: u64,
    /// Events queued for delivery again, so far.
    #[serde(default)]
    pub enqueued: u64,
    /// The event-store sequence of the last event looked at (0: none yet); every event
    /// up to it that matched is enqueued.
    #[serde(default)]
    pub cursor: u64,
    /// Enqueued events whose delivery succeeded (newest attempt record of the replay).
    #[serde(default)]
    pub delivered: u64,
    /// Enqueued events whose delivery is dead.
    #[serde(default)]
    pub failed: u64,
    /// When the replay began enqueueing (Unix ms): its attempt records are logged from
    /// then on, where a new owner recounts `delivered` and `failed`.
    #[serde(default)]
    pub started_ms: u64,
}

impl ReplayProgress {
    /// Whether the replay has nothing left to do: its range is read and, unless it is a
    /// dry run, every enqueued event reached a final state.
    pub fn finished(&self, dry_run: bool) -> bool {
        self.done && (dry_run || self.delivered + self.failed >= self.enqueued)
    }
}

/// What an attempt came to: the attempt log's error classes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AttemptOutcome {
    /// Any 2xx.
    Success,
    /// A non-2xx status other than those below.
    HttpError,
    /// 429 or 503: slow down (honouring `Retry-After`).
    RateLimited,
    /// 410: the receiver says the endpoint is gone for good.
    Gone,
    /// 3xx: redirects are never followed.
    Redirect,
    /// No complete response within the endpoint's timeout.
    Timeout,
    /// Connection refused, reset, DNS failure, TLS failure.
    ConnectError,
    /// The address the host resolved to is refused by the platform's policy.
    AddressForbidden,
    /// Anything else that prevented a response.
    RequestError,
}

impl AttemptOutcome {
    pub const ALL: [Self; 9] = [
        Self::Success,
        Self::HttpError,
        Self::RateLimited,
        Self::Gone,
        Self::Redirect,
        Self::Timeout,
        Self::ConnectError,
        Self::AddressForbidden,
        Self::RequestError,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "Success",
            Self::HttpError => "HttpError",
            Self::RateLimited => "RateLimited",
            Self::Gone => "Gone",
            Self::Redirect => "Redirect",
            Self::Timeout => "Timeout",
            Self::ConnectError => "ConnectError",
            Self::AddressForbidden => "AddressForbidden",
            Self::RequestError => "RequestError",
        }
    }

    /// The outcome of an HTTP status.
    pub fn of_status(status: u16) -> Self {
        match status {
            200..=299 => Self::Success,
            300..=399 => Self::Redirect,
            410 => Self::Gone,
            429 | 503 => Self::RateLimited,
            _ => Self::HttpError,
        }
    }
}

impl fmt::Display for AttemptOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why the dispatcher stopped delivering to an endpoint. The names are condition and
/// Event reasons too ([`crate::names::reason`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DisabledReason {
    /// The receiver answered 410 Gone (`spec.delivery.disableOnGone`).
    Gone,
    /// No successful delivery for `spec.delivery.disableAfter`.
    SustainedFailure,
}

impl DisabledReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Gone => crate::names::reason::GONE,
            Self::SustainedFailure => crate::names::reason::SUSTAINED_FAILURE,
        }
    }
}

/// Where one delivery (one event to one endpoint) stands after an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryState {
    Succeeded,
    /// Failed; another attempt is due at `nextAttemptMs`.
    Retrying,
    /// Given up (see [`DeadReason`]); kept in the log and replayable.
    Dead,
}

impl DeliveryState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Retrying => "retrying",
            Self::Dead => "dead",
        }
    }
}

impl fmt::Display for DeliveryState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a delivery was given up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DeadReason {
    /// The status is one of `spec.delivery.finalStatusCodes`.
    FinalStatus,
    /// The retry schedule or deadline is spent.
    RetriesExhausted,
}

impl DeadReason {
    /// The serialized name (as in the attempt log and `herald.delivery.dead`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FinalStatus => "FinalStatus",
            Self::RetriesExhausted => "RetriesExhausted",
        }
    }
}

/// One attempt-log record, written by the dispatcher as JSON lines (batched per
/// endpoint) to `herald.attempts.<ns>.<name>`. Headers are kept with credentials and the
/// signature redacted, so no secret or auth header value can end up here.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttemptRecord {
    pub event_id: Arc<str>,
    pub attempt: u32,
    pub time_ms: u64,
    pub outcome: AttemptOutcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
    pub latency_ms: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub response: String,
    pub state: DeliveryState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_ms: Option<u64>,
    /// Set when `state` is `dead`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_reason: Option<DeadReason>,
    /// The `WebhookReplay` (uid) that queued this delivery again, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<Arc<str>>,
    /// The event's type, read from the front of the body that was sent
    /// ([`crate::envelope::body_type`]), so the HTTP API lists and filters the log by
    /// type without reading the event store. Absent in records written before it was
    /// logged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_type: Option<String>,
    /// The request's headers as sent, `[name, value]`: Herald's (the signature cut to its
    /// versions, `v1,[redacted]`) and the endpoint's (credentials `[redacted]`). Absent
    /// when nothing was sent (the address was refused) and in records written before
    /// they were logged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub request_headers: Vec<(String, String)>,
    /// The response's headers, `[name, value]`: the first [`MAX_RESPONSE_HEADERS`], at
    /// most [`MAX_RESPONSE_HEADER_BYTES`] together, credentials `[redacted]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub response_headers: Vec<(String, String)>,
}

/// Most response headers an attempt record keeps.
pub const MAX_RESPONSE_HEADERS: usize = 16;
/// Most bytes of response headers (names and values) an attempt record keeps.
pub const MAX_RESPONSE_HEADER_BYTES: usize = 1024;

/// What a dispatcher reports about one endpoint. Stored under `ep.<key>` in
/// [`HEALTH_BUCKET`](super::HEALTH_BUCKET), at most once per endpoint per reporting
/// interval, only on change.
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
    /// Why the endpoint is disabled, when it is.
    pub disabled_reason: Option<DisabledReason>,
    pub disabled_message: Option<String>,
    /// The enable token in force when the endpoint was disabled.
    pub enable_token: Option<String>,
}

/// What must outlive a dispatcher about one endpoint, so a restart or a handover does
/// not re-enable a disabled endpoint, restart its `disableAfter` clock, close its circuit
/// or forget a receiver's `Retry-After`. Stored under `state.<shard>.<ns>.<name>` in
/// [`HEALTH_BUCKET`](super::HEALTH_BUCKET) while it differs from the default (a healthy
/// endpoint has none), written at once when it changes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LastingState {
    /// The endpoint this is about (a re-created endpoint starts afresh).
    pub uid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled_reason: Option<DisabledReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled_message: Option<String>,
    /// The enable token in force when it was disabled; a new one re-enables.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_token: Option<String>,
    /// Unix milliseconds since which no attempt succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing_since_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit: Option<CircuitState>,
    /// Unix milliseconds until which the receiver asked for a pause.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_until_ms: Option<u64>,
    /// The adaptive concurrency limit while the endpoint is failing, so a new owner does
    /// not start a struggling receiver at the initial limit again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_limit: Option<u32>,
}

/// The most recent attempt, as reported in health.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LastAttempt {
    pub event_id: String,
    pub http_status: Option<u16>,
    pub outcome: AttemptOutcome,
    pub latency_ms: u64,
    /// Unix milliseconds.
    pub time_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn dead_reasons_name_their_serialized_form() {
        for reason in [DeadReason::FinalStatus, DeadReason::RetriesExhausted] {
            assert_eq!(serde_json::to_value(reason).unwrap(), reason.as_str());
        }
    }

    #[test]
    fn keysets_never_print_keys() {
        let set = KeySet {
            keys: vec!["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into()],
        };
        assert!(!format!("{set:?}").contains("whsec_"));
    }

    #[test]
    fn wire_forms_are_the_stored_ones() {
        // Records written before these types existed must stay readable.
        let old = json!({
            "eventId": "msg_1", "attempt": 2, "timeMs": 5, "outcome": "HttpError",
            "httpStatus": 500, "latencyMs": 3, "state": "retrying", "nextAttemptMs": 9
        });
        let record: AttemptRecord = serde_json::from_value(old.clone()).unwrap();
        assert_eq!(record.outcome, AttemptOutcome::HttpError);
        assert_eq!(record.state, DeliveryState::Retrying);
        assert_eq!(serde_json::to_value(&record).unwrap(), old);
        for outcome in AttemptOutcome::ALL {
            assert_eq!(
                serde_json::to_value(outcome).unwrap(),
                json!(outcome.as_str())
            );
        }
        for state in [
            DeliveryState::Succeeded,
            DeliveryState::Retrying,
            DeliveryState::Dead,
        ] {
            assert_eq!(serde_json::to_value(state).unwrap(), json!(state.as_str()));
        }
        for reason in [DisabledReason::Gone, DisabledReason::SustainedFailure] {
            assert_eq!(
                serde_json::to_value(reason).unwrap(),
                json!(reason.as_str())
            );
        }
        let health: EndpointHealth =
            serde_json::from_value(json!({"uid": "u", "generation": 1, "shard": 0,
                "disabledReason": "Gone", "state": null, "circuit": null,
                "concurrencyLimit": null, "backlog": null, "oldestPendingMs": null,
                "lastDelivery": null, "successPermille": null, "p95LatencyMs": null,
                "firstFailureMs": null, "disabledMessage": null, "enableToken": null}))
            .unwrap();
        assert_eq!(health.disabled_reason, Some(DisabledReason::Gone));
    }

    #[test]
    fn statuses_classify_as_the_contract_says() {
        for (status, outcome) in [
            (200, AttemptOutcome::Success),
            (204, AttemptOutcome::Success),
            (302, AttemptOutcome::Redirect),
            (410, AttemptOutcome::Gone),
            (429, AttemptOutcome::RateLimited),
            (503, AttemptOutcome::RateLimited),
            (500, AttemptOutcome::HttpError),
            (404, AttemptOutcome::HttpError),
        ] {
            assert_eq!(AttemptOutcome::of_status(status), outcome, "{status}");
        }
    }

    #[test]
    fn configs_come_from_the_resource() {
        let spec = serde_json::from_value(json!({
            "url": "https://hooks.example.com/", "eventTypes": ["order.*"],
            "secretRef": {"name": "s"}, "ordered": true,
            "delivery": {"redactResponseFields": ["/token", "/user/email"]}
        }))
        .unwrap();
        let mut obj = WebhookEndpoint::new("orders", spec);
        obj.metadata.namespace = Some("shop".into());
        obj.metadata.uid = Some("u1".into());
        obj.metadata.generation = Some(3);
        obj.metadata.annotations = Some([(ENABLE_ANNOTATION.to_owned(), "7".to_owned())].into());
        let config = EndpointConfig::from_spec(&obj, 5);
        assert_eq!(config.key(), EndpointKey::new("shop", "orders"));
        assert_eq!(
            (config.uid.as_str(), config.generation, config.shard),
            ("u1", 3, 5)
        );
        assert!(config.ordered);
        assert_eq!(config.secret, "s");
        assert_eq!(config.enable_token.as_deref(), Some("7"));
        // What the dispatcher reads back from the bucket carries the redaction.
        let read: EndpointConfig =
            serde_json::from_slice(&serde_json::to_vec(&config).unwrap()).unwrap();
        assert_eq!(
            read.delivery.redact_response_fields,
            ["/token", "/user/email"]
        );
        assert_eq!(read, config);
    }
}
