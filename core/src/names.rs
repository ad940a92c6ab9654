//! Names both binaries must agree on: API group, field manager, finalizers, labels,
//! annotations, condition types and reasons.

/// The API group of every Herald resource.
pub const GROUP: &str = "herald.dev";
/// The one field manager Herald uses for server-side apply.
pub const FIELD_MANAGER: &str = "herald.dev/operator";
/// Finalizer on a `WebhookEndpoint`: Herald holds its queue and delivery log in JetStream.
pub const ENDPOINT_FINALIZER: &str = "herald.dev/delivery-cleanup";
/// Finalizer on a `SigningSecret`: Herald holds its key set in NATS (`herald-config`).
pub const SIGNING_SECRET_FINALIZER: &str = "herald.dev/keyset-cleanup";
/// Held by a `WebhookReplay` while its request is in `herald-config`.
pub const REPLAY_FINALIZER: &str = "herald.dev/replay-cleanup";
/// Annotation that asks the operator to rotate a `SigningSecret` now; any new value works.
pub const ROTATE_ANNOTATION: &str = "herald.dev/rotate";
/// Annotation that re-enables a disabled `WebhookEndpoint`; any new value works (it is
/// copied into the endpoint's `enableToken` in the data plane).
pub const ENABLE_ANNOTATION: &str = "herald.dev/enable";
/// Name of the coordination.k8s.io Lease the operator replicas elect a leader with.
pub const LEADER_LEASE: &str = "herald-operator";
/// Label put on the Kubernetes Secrets Herald generates.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY: &str = "herald";

/// Condition types.
pub mod condition {
    /// The resource is valid and its configuration reached the data plane.
    pub const READY: &str = "Ready";
    /// Deliveries succeed at a healthy rate and latency.
    pub const HEALTHY: &str = "Healthy";
    /// Deliveries to the endpoint have stopped after sustained failure or 410 Gone.
    pub const DISABLED: &str = "Disabled";
    /// A replay has finished (successfully or not).
    pub const COMPLETE: &str = "Complete";
    /// The receiver echoed Herald's verification challenge for the endpoint's URL.
    /// Written only while the endpoint must be verified.
    pub const VERIFIED: &str = "Verified";
    /// kstatus: Herald waits for something that can come on its own (a SigningSecret,
    /// DNS, a referenced endpoint). Written only while True.
    pub const RECONCILING: &str = "Reconciling";
    /// kstatus: a person must change something (an invalid spec, a forbidden URL, bad
    /// key data). Written only while True.
    pub const STALLED: &str = "Stalled";
}

/// Condition reasons (CamelCase, low cardinality: also used as Event reasons and metric
/// labels).
pub mod reason {
    pub const ACCEPTED: &str = "Accepted";
    /// The endpoint must be verified and its receiver has not echoed a challenge for its
    /// URL yet (`Ready` and `Verified`).
    pub const NOT_VERIFIED: &str = "NotVerified";
    /// The last verification challenge failed (`Verified`).
    pub const CHALLENGE_FAILED: &str = "ChallengeFailed";
    /// The receiver echoed the verification challenge (`Verified`).
    pub const CHALLENGE_ECHOED: &str = "ChallengeEchoed";
    pub const INVALID_SPEC: &str = "InvalidSpec";
    pub const URL_FORBIDDEN: &str = "UrlForbidden";
    /// `spec.delivery.proxy` names a proxy the platform did not configure, or asks for
    /// direct egress where the platform does not allow it.
    pub const PROXY_NOT_ALLOWED: &str = "ProxyNotAllowed";
    pub const SECRET_NOT_FOUND: &str = "SecretNotFound";
    pub const SECRET_NOT_READY: &str = "SecretNotReady";
    /// The operator has no RBAC rights on Secrets in the SigningSecret's namespace.
    pub const SECRET_FORBIDDEN: &str = "SecretForbidden";
    /// A header's `valueFrom.secretKeyRef` names a Secret or key that does not exist.
    pub const HEADER_SECRET_NOT_FOUND: &str = "HeaderSecretNotFound";
    /// A header's value from a Secret cannot be sent (control characters, too long...).
    pub const HEADER_SECRET_INVALID: &str = "HeaderSecretInvalid";
    /// `spec.tls` names a Secret or key that does not exist.
    pub const TLS_SECRET_NOT_FOUND: &str = "TlsSecretNotFound";
    /// `spec.tls`'s Secret does not hold what it should (PEM certificates, a private key).
    pub const TLS_SECRET_INVALID: &str = "TlsSecretInvalid";
    pub const ENDPOINT_NOT_FOUND: &str = "EndpointNotFound";
    pub const PAUSED: &str = "Paused";
    pub const DELIVERING: &str = "Delivering";
    pub const DEGRADED: &str = "Degraded";
    pub const CIRCUIT_OPEN: &str = "CircuitOpen";
    pub const SUSTAINED_FAILURE: &str = "SustainedFailure";
    pub const GONE: &str = "Gone";
    pub const KEY_GENERATED: &str = "KeyGenerated";
    pub const SECRET_ROTATED: &str = "SecretRotated";
    /// The endpoint's host name does not resolve (yet); retried every minute.
    pub const URL_UNRESOLVABLE: &str = "UrlUnresolvable";
    /// The endpoint is not disabled.
    pub const ENABLED: &str = "Enabled";
    /// A disabled endpoint delivers again.
    pub const RECOVERED: &str = "Recovered";
    /// Deliveries stopped (Event reason).
    pub const DISABLED: &str = "Disabled";
    /// The replay's time range reaches past the retention window.
    pub const OUTSIDE_RETENTION: &str = "OutsideRetention";
    /// The event store does not exist yet (no dispatcher has started), so its retention
    /// window is unknown.
    pub const EVENT_STORE_MISSING: &str = "EventStoreMissing";
    /// The replay request is valid.
    pub const VALID: &str = "Valid";
    /// A replay waits for the dispatcher that owns its endpoint's shard to take it up.
    pub const WAITING: &str = "Waiting";
    /// A replay is being carried out.
    pub const RUNNING: &str = "Running";
    /// A replay has been carried out.
    pub const COMPLETED: &str = "Completed";
}
