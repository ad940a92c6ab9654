use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{LocalRef, schema};
use crate::duration::Duration;

/// An HTTP endpoint that receives a tenant's events, signed the Standard Webhooks way.
///
/// Herald POSTs every event whose type matches `eventTypes` to `url`, signs it with the
/// keys of the referenced `SigningSecret`, retries failures with backoff, and reports what
/// happened in `status`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "herald.dev",
    doc = "An HTTP endpoint that receives a tenant's events; see `kubectl explain webhookendpoint.spec`.",
    version = "v1alpha1",
    kind = "WebhookEndpoint",
    plural = "webhookendpoints",
    singular = "webhookendpoint",
    shortname = "whe",
    category = "herald",
    namespaced,
    status = "WebhookEndpointStatus",
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.state"}"#,
    printcolumn = r#"{"name":"Success","type":"string","jsonPath":".status.successRate"}"#,
    printcolumn = r#"{"name":"P95","type":"string","jsonPath":".status.p95Latency","priority":1}"#,
    printcolumn = r#"{"name":"Backlog","type":"integer","jsonPath":".status.backlog"}"#,
    printcolumn = r#"{"name":"Oldest","type":"date","jsonPath":".status.oldestPending"}"#,
    printcolumn = r#"{"name":"Shard","type":"integer","jsonPath":".status.shard","priority":1}"#,
    printcolumn = r#"{"name":"URL","type":"string","jsonPath":".spec.url","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!has(self.orderingKey) || self.ordered",
        "message": "orderingKey needs ordered: true",
        "fieldPath": ".orderingKey"
    },
    {
        "rule": "!has(self.tls) || self.url.startsWith('https://')",
        "message": "tls needs an https:// url",
        "fieldPath": ".tls"
    }
]))]
pub struct WebhookEndpointSpec {
    /// The URL Herald POSTs events to: `https://` (or `http://` where the platform's
    /// operator allows it). Redirects are never followed. Addresses on loopback, private,
    /// link-local and cloud-metadata networks are refused unless the platform allowlists
    /// them; the check is made on the resolved address, at every connection.
    #[schemars(extend(
        "maxLength" = 2048,
        "x-kubernetes-validations" = [
            {
                "rule": "self.startsWith('https://') || self.startsWith('http://')",
                "message": "url must start with https:// (or http://)"
            },
            {
                "rule": "isURL(self) && url(self).getHostname() != ''",
                "message": "url must be an absolute URL with a host, e.g. https://hooks.example.com/herald"
            }
        ]
    ))]
    pub url: String,

    /// Event types this endpoint receives. Each entry is an exact type such as
    /// `order.created`, or a pattern: `*` as a segment matches exactly one segment
    /// (`order.*.shipped`), `*` as the last segment matches one or more (`order.*`), and a
    /// lone `*` matches every type except Herald's operational events (`herald.…`), which
    /// only patterns starting with `herald.` receive (e.g. `herald.*`).
    #[schemars(schema_with = "schema::event_type_patterns")]
    pub event_types: Vec<String>,

    /// The `SigningSecret` (same namespace) whose keys sign this endpoint's requests.
    pub secret_ref: LocalRef,

    /// Deliver one event at a time, in publish order. A failing event then holds back
    /// the ones after it (for this endpoint only) until it succeeds or is dead.
    #[serde(default)]
    pub ordered: bool,

    /// With `ordered`, keep order per key instead of across all events: a JSON Pointer
    /// (RFC 6901) into the event, e.g. `/data/customerId`. Events with different keys are
    /// delivered in parallel; events without the field share one empty key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxLength" = 256, "pattern" = "^(/[^/]+)+$"))]
    pub ordering_key: Option<String>,

    /// Hold deliveries. Events keep queueing (in JetStream, not in memory) and are
    /// delivered once `paused` is false again.
    #[serde(default)]
    pub paused: bool,

    /// Verify the receiver before the first delivery: Herald sends a signed
    /// `herald.endpoint.verification` request whose `data.challenge` the receiver must
    /// echo (as the body, or as `{"challenge": "..."}`) with a 2xx. Until it does,
    /// nothing is delivered (events keep queueing) and the `Verified` condition says why;
    /// a new `url` is verified again. A namespace annotated
    /// `herald.dev/require-endpoint-verification: "true"` verifies every endpoint.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub verify: bool,

    /// How Herald delivers to this endpoint: timeouts, concurrency, rate, retries.
    #[serde(default)]
    pub delivery: DeliveryPolicy,

    /// TLS toward the receiver: a client certificate to present (mutual TLS) and a CA
    /// to verify the receiver with instead of the platform's roots, both from Secrets in
    /// the endpoint's namespace. Needs an `https://` url.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<EndpointTls>,

    /// Headers added to every request: a routing header a gateway expects, or the
    /// credential a receiver demands beyond the signature (a bearer token, basic auth, an
    /// API key). They cannot override `content-type`, `host` or any `webhook-*` header.
    /// A `value` is stored in the resource in clear text (and so in git): take
    /// credentials from a Secret with `valueFrom.secretKeyRef` instead, which Herald
    /// redacts wherever it would show the value.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 32),
        extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"])
    )]
    pub headers: Vec<Header>,
}

/// One extra request header: a value, or a reference to one in a Secret.
#[derive(Serialize, Deserialize, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!(self.name.lowerAscii() in ['content-type', 'content-length', 'host', 'user-agent', 'transfer-encoding', 'connection']) && !self.name.lowerAscii().startsWith('webhook-')",
        "message": "headers may not override content-type, content-length, host, user-agent, transfer-encoding, connection or any webhook-* header; Herald sets those",
        "fieldPath": ".name"
    },
    {
        "rule": "!has(self.value) || !self.value.matches('[\\x00-\\x08\\x0a-\\x1f\\x7f]')",
        "message": "header values may not contain control characters (CR, LF, NUL...): they would split or corrupt the request; tab is the only one allowed",
        "fieldPath": ".value"
    },
    {
        "rule": "has(self.value) != has(self.valueFrom)",
        "message": "give a header either value or valueFrom, not both and not neither"
    }
]))]
pub struct Header {
    /// Header name, an HTTP token such as `X-Tenant`.
    #[schemars(extend("minLength" = 1, "maxLength" = 128, "pattern" = "^[A-Za-z0-9!#$%&'*+.^_`|~-]+$"))]
    pub name: String,
    /// Header value: printable text (a tab is allowed, no other control character).
    /// Inside Herald's data plane this holds the value `valueFrom` resolved to.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(extend("maxLength" = 4096))]
    pub value: String,
    /// Take the value from a key of a Secret in the endpoint's namespace. The value is
    /// redacted from the delivery log, status, Events and logs, and a change of the
    /// Secret reaches deliveries within the operator's `--header-secret-refresh`
    /// (default 30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<HeaderValueFrom>,
}

impl Header {
    /// A header with a literal value.
    pub fn literal(name: impl Into<String>, value: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            value: value.into(),
            value_from: None,
        }
    }

    /// Whether the value is a credential from a Secret: always redacted.
    pub fn is_secret(&self) -> bool {
        self.value_from.is_some()
    }
}

impl std::fmt::Debug for Header {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Header");
        d.field("name", &self.name);
        match &self.value_from {
            Some(from) => d.field("value", &"<redacted>").field("value_from", from),
            None => d.field("value", &self.value),
        };
        d.finish()
    }
}

/// TLS settings of an endpoint.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointTls {
    /// The client certificate Herald presents to the receiver: a Secret of type
    /// `kubernetes.io/tls` (keys `tls.crt`, the certificate chain, and `tls.key`, its
    /// private key, PEM). A renewed Secret (cert-manager) is picked up within the
    /// operator's `--header-secret-refresh`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate: Option<SecretName>,
    /// Verify the receiver's certificate with the CA certificates (PEM) in this Secret
    /// key instead of the platform's trusted roots, e.g. for a receiver with a private
    /// CA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<SecretKeyRef>,
}

/// A Secret in the same namespace, by name.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretName {
    /// The Secret's name.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
}

/// Where a header's value comes from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HeaderValueFrom {
    /// A key of a Secret in the endpoint's namespace.
    pub secret_key_ref: SecretKeyRef,
}

/// A key of a Secret in the same namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// The Secret's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The key in the Secret's `data`.
    #[schemars(extend("minLength" = 1, "maxLength" = 253, "pattern" = "^[-._a-zA-Z0-9]+$"))]
    pub key: String,
}

/// How Herald delivers to one endpoint.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryPolicy {
    /// Time limit of one attempt, from connecting to the end of the response headers.
    /// A slower answer counts as a failure. Default `15s`.
    #[serde(default = "default_timeout")]
    pub timeout: Duration,

    /// Most requests in flight to this endpoint at once. Herald starts lower and adapts
    /// within this cap: it adds one per window of successes and halves on timeouts, 5xx
    /// and 429. Between 1 and 1024; default 16.
    #[serde(default = "default_max_in_flight")]
    #[schemars(range(min = 1, max = 1024))]
    pub max_in_flight: u32,

    /// Optional ceiling on the request rate, on top of the concurrency limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimit>,

    /// When failed attempts are retried. Default: exponential backoff with full jitter,
    /// first retry within 5 s, spreading to 1 h apart, giving up after 3 days.
    #[serde(default)]
    pub retry: RetryPolicy,

    /// HTTP status codes (400–499) that end a delivery at once as dead instead of being
    /// retried, e.g. `[400, 422]`. Default: none, every failure is retried. 429 is always
    /// retried and 410 is governed by `disableOnGone`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 100),
        inner(range(min = 400, max = 499)),
        extend("x-kubernetes-list-type" = "set")
    )]
    pub final_status_codes: Vec<u16>,

    /// Disable the endpoint at once when it answers 410 Gone, as the Standard Webhooks
    /// specification advises. Default true.
    #[serde(default = "default_true")]
    pub disable_on_gone: bool,

    /// Disable the endpoint after it has failed continuously (no success at all) for this
    /// long. Events keep queueing while it is disabled; the `Disabled` condition's message
    /// says how to re-enable it. Default `72h`.
    #[serde(default = "default_disable_after")]
    pub disable_after: Duration,

    /// The circuit breaker that stops hammering an endpoint that keeps failing.
    #[serde(default)]
    pub circuit_breaker: CircuitBreaker,

    /// Fields of the receiver's response body kept out of the attempt log, as JSON
    /// Pointers (RFC 6901), e.g. `["/token", "/user/email", "/items/0/secret"]`: their
    /// values become `"[redacted]"` before the first 1 KiB of the response is kept, and
    /// the JSON is kept re-written compactly with object keys in alphabetical order. A
    /// pointer that matches nothing is ignored. With at least one pointer set, a response
    /// that is not one complete JSON document (not JSON, or longer than the 64 KiB Herald
    /// reads) is not kept at all: the attempt log says so instead. The same pointers are
    /// redacted in the request body a delivery's detail shows (the event as delivered).
    /// The values of credential-like request headers and the signature are always
    /// redacted. At most 16.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::json_pointers")]
    pub redact_response_fields: Vec<String>,

    /// The egress proxy this endpoint's requests go through, instead of the platform's
    /// default: `{name: <proxy>}` picks one of the proxies the platform allows (ask the
    /// platform team which; an unknown name makes the endpoint `Ready=False` with reason
    /// `ProxyNotAllowed`), `{direct: true}` connects without a proxy where the platform
    /// allows direct egress. Unset: the platform's default (a proxy, or direct). The URL's
    /// address is checked against the platform's address policy either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<EgressProxy>,
}

/// Which egress proxy an endpoint's requests go through.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "has(self.name) != (has(self.direct) && self.direct)",
        "message": "proxy must set exactly one of name (a proxy the platform allows) or direct: true"
    }
]))]
pub struct EgressProxy {
    /// The name of a proxy the platform allows, e.g. `eu-static-ip`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend(
        "minLength" = 1,
        "maxLength" = 63,
        "pattern" = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
    ))]
    pub name: Option<String>,
    /// Connect directly, not through the platform's default proxy (refused at delivery
    /// unless the platform allows direct egress).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub direct: bool,
}

impl Default for DeliveryPolicy {
    fn default() -> Self {
        Self {
            timeout: default_timeout(),
            max_in_flight: default_max_in_flight(),
            rate_limit: None,
            retry: RetryPolicy::default(),
            final_status_codes: Vec::new(),
            disable_on_gone: true,
            disable_after: default_disable_after(),
            circuit_breaker: CircuitBreaker::default(),
            redact_response_fields: Vec::new(),
            proxy: None,
        }
    }
}

fn default_timeout() -> Duration {
    Duration::from_secs(15)
}
fn default_max_in_flight() -> u32 {
    16
}
fn default_true() -> bool {
    true
}
fn default_disable_after() -> Duration {
    Duration::from_hours(72)
}

/// A token-bucket rate limit.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RateLimit {
    /// Sustained requests per second, 1 to 100000.
    #[schemars(range(min = 1, max = 100_000))]
    pub per_second: u32,
    /// Requests allowed in a burst above the sustained rate. Default: equal to `perSecond`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100_000))]
    pub burst: Option<u32>,
}

/// When to retry. Set at most one of `exponential` and `schedule`; with neither, the
/// exponential defaults apply.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!(has(self.exponential) && has(self.schedule))",
        "message": "set at most one of exponential and schedule"
    }
]))]
pub struct RetryPolicy {
    /// Exponential backoff with full jitter: retry n waits a random time between 0 and
    /// `min(cap, base * 2^(n-1))`, until `deadline` after the first attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exponential: Option<ExponentialBackoff>,

    /// An explicit list of waits: retry n waits the n-th entry, e.g.
    /// `["5s", "5m", "30m", "2h", "5h", "10h"]`. After the last one the delivery is dead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 50))]
    pub schedule: Option<Vec<Duration>>,
}

/// Exponential backoff parameters.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "duration(self.base) <= duration(self.cap)",
        "message": "base must not exceed cap"
    }
]))]
pub struct ExponentialBackoff {
    /// Upper bound of the first retry's wait. Default `5s`.
    #[serde(default = "default_base")]
    pub base: Duration,
    /// Largest wait between two attempts. Default `1h`.
    #[serde(default = "default_cap")]
    pub cap: Duration,
    /// Give up (the delivery is dead, and stays visible and replayable) this long after
    /// the first attempt. Default `72h`.
    #[serde(default = "default_deadline")]
    pub deadline: Duration,
}

impl Default for ExponentialBackoff {
    fn default() -> Self {
        Self {
            base: default_base(),
            cap: default_cap(),
            deadline: default_deadline(),
        }
    }
}

fn default_base() -> Duration {
    Duration::from_secs(5)
}
fn default_cap() -> Duration {
    Duration::from_hours(1)
}
fn default_deadline() -> Duration {
    Duration::from_hours(72)
}

/// Circuit breaker settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CircuitBreaker {
    /// Consecutive failed attempts that open the circuit. While open, only one probe
    /// request is sent per `probeInterval`; its success closes the circuit. Default 10.
    #[serde(default = "default_failure_threshold")]
    #[schemars(range(min = 1, max = 10_000))]
    pub failure_threshold: u32,
    /// Time between probes while the circuit is open. Default `30s`.
    #[serde(default = "default_probe_interval")]
    pub probe_interval: Duration,
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        Self {
            failure_threshold: default_failure_threshold(),
            probe_interval: default_probe_interval(),
        }
    }
}

fn default_failure_threshold() -> u32 {
    10
}
fn default_probe_interval() -> Duration {
    Duration::from_secs(30)
}

/// What Herald observed about the endpoint. Written by Herald at a bounded rate (at most
/// once per endpoint per reporting interval, 10 s by default), never on every event.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookEndpointStatus {
    /// `Ready`, `Healthy` and `Disabled`, each with a reason and a message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::conditions")]
    pub conditions: Vec<Condition>,

    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Summary: `Pending`, `Active`, `Degraded`, `Paused` or `Disabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<EndpointState>,

    /// The dispatcher shard that delivers for this endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<u32>,

    /// The circuit breaker: `Closed`, `Open` or `HalfOpen`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit: Option<CircuitState>,

    /// Requests Herald currently allows in flight (adaptive, at most `maxInFlight`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_limit: Option<u32>,

    /// Deliveries waiting for this endpoint (new events and retries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backlog: Option<u64>,

    /// When the oldest waiting delivery was published.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_pending: Option<Time>,

    /// The most recent attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_delivery: Option<LastDelivery>,

    /// Share of successful attempts over the recent window, e.g. `99.8%`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success_rate: Option<String>,

    /// 95th percentile attempt latency over the recent window, e.g. `120ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p95_latency: Option<String>,

    /// Start of the current run of failures; absent while deliveries succeed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_failure: Option<Time>,
}

/// Summary state of an endpoint.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum EndpointState {
    /// Accepted, waiting for the data plane to pick it up.
    Pending,
    /// Delivering normally.
    Active,
    /// Delivering, but failing or slow.
    Degraded,
    /// `spec.paused` is set; events queue.
    Paused,
    /// Deliveries stopped after sustained failure or 410 Gone; events queue.
    Disabled,
}

/// Circuit breaker state.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum CircuitState {
    Closed,
    Open,
    HalfOpen,
}

/// The most recent delivery attempt.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastDelivery {
    /// The event's `webhook-id`.
    pub event_id: String,
    /// HTTP status of the response; absent when no response came (timeout, refused...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
    /// Outcome class: `Success`, `HttpError`, `Timeout`, `ConnectError`, `Redirect`...
    pub outcome: String,
    /// Attempt latency in milliseconds.
    pub latency_ms: u64,
    /// When the attempt was made.
    pub time: Time,
}
