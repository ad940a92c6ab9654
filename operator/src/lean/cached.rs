//! What the operator keeps of each `WebhookEndpoint` between reconciles: [`Cached`], decoded
//! from the watch in place of the whole object.
//!
//! The controllers' store holds one object per endpoint for as long as it exists, so its
//! size is the operator's memory per endpoint (the 2 KiB target of docs/scale.md). The
//! whole decoded object was about 2.3 KB: 1,120 bytes of structs (the spec alone 504,
//! mostly defaults) and some twenty small allocations, half of them the status, which
//! reconciles only compare with what they render. Here:
//! - metadata as [`slim`] leaves it (identity, generation, finalizers, deletion,
//!   Herald's annotations; no `resourceVersion`; a UUID uid as a number and Herald's
//!   finalizer alone as an empty list, both given back by [`Cached::endpoint`]);
//! - the spec as JSON without the fields that hold their default (about 110 bytes for an
//!   endpoint that sets only URL, types and secret; one allocation), decoded when a
//!   reconcile needs it;
//! - of the status, [`Recorded`]: each condition's type, status, reason and
//!   `lastTransitionTime` (what merging conditions and announcing flips read) and a
//!   fingerprint of each writer's part, so a writer can tell whether what it rendered
//!   is what is stored without keeping the status.
//!
//! Contract: [`Cached::endpoint`] gives back the object the pure steps work on — same
//! metadata and spec, a status holding only those condition fields — and
//! [`fingerprint`] of a rendered part equals [`Recorded`]'s exactly when the rendered part
//! serializes as the stored one does (then writing it would change nothing).

use std::borrow::Cow;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::LazyLock;

use herald_core::names::ENDPOINT_FINALIZER;
use herald_core::v1alpha1::{WebhookEndpoint, WebhookEndpointSpec, WebhookEndpointStatus};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::endpoint::build;
use crate::endpoint::observed;

/// A `WebhookEndpoint` as watched and kept ([`Cached`]): decoded, or the reason it could
/// not be.
pub type Guarded = crate::reconcile::Guarded<Cached>;

/// A `WebhookEndpoint` as the operator keeps it (see the module's doc).
#[derive(Clone, Debug, Deserialize)]
#[serde(try_from = "Whole")]
pub struct Cached {
    /// Without `uid` when it is a UUID (as the API server makes them): that is kept in
    /// [`Self::uid`], so neither this nor the store's key holds it as text.
    pub metadata: ObjectMeta,
    /// The uid as a number (0: in `metadata`, or none).
    uid: u128,
    /// The spec as JSON.
    spec: Box<str>,
    /// What is kept of the status.
    pub status: Recorded,
}

/// What is kept of an endpoint's status.
#[derive(Clone, Debug, PartialEq)]
pub struct Recorded {
    /// Whether the object has a status at all.
    pub present: bool,
    conditions: Box<[Brief]>,
    /// [`fingerprint`] of the endpoint controller's part ([`build::owned`]).
    pub controller: u64,
    /// [`fingerprint`] of the health writer's part ([`observed::owned`]).
    pub health: u64,
}

/// Of one condition, what merging and announcing read: type, status and reason, and
/// `lastTransitionTime`. Herald's own words (nearly every condition) are kept as indexes
/// into [`KNOWN`] and the time as whole seconds (16 bytes in all); anything else as
/// written.
#[derive(Clone, Debug, PartialEq)]
enum Brief {
    Known { words: [u8; 3], since: i64 },
    Other(Box<(String, String, String, Time)>),
}

impl Brief {
    fn of(c: &Condition) -> Self {
        let index = |value: &str| {
            KNOWN
                .iter()
                .position(|known| *known == value)
                .and_then(|i| u8::try_from(i).ok())
        };
        let since = c.last_transition_time.0;
        match (index(&c.type_), index(&c.status), index(&c.reason)) {
            (Some(t), Some(s), Some(r)) if since.subsec_nanosecond() == 0 => Self::Known {
                words: [t, s, r],
                since: since.as_second(),
            },
            _ => Self::Other(Box::new((
                c.type_.clone(),
                c.status.clone(),
                c.reason.clone(),
                c.last_transition_time.clone(),
            ))),
        }
    }

    /// The condition as kept: no message, no `observedGeneration`.
    fn condition(&self) -> Condition {
        let (type_, status, reason, since) = match self {
            Self::Known { words, since } => {
                let word = |i: u8| KNOWN[usize::from(i)].to_owned();
                let since = Timestamp::from_second(*since).unwrap_or_default();
                (word(words[0]), word(words[1]), word(words[2]), Time(since))
            }
            Self::Other(other) => other.as_ref().clone(),
        };
        Condition {
            type_,
            status,
            reason,
            message: String::new(),
            observed_generation: None,
            last_transition_time: since,
        }
    }
}

/// The condition types, statuses and reasons Herald writes, kept as these constants
/// instead of three allocations per condition; anything else is kept as written.
const KNOWN: &[&str] = {
    use herald_core::names::{condition as c, reason as r};
    &[
        c::READY,
        c::HEALTHY,
        c::DISABLED,
        c::RECONCILING,
        c::STALLED,
        c::VERIFIED,
        "True",
        "False",
        "Unknown",
        r::ACCEPTED,
        r::INVALID_SPEC,
        r::URL_FORBIDDEN,
        r::PROXY_NOT_ALLOWED,
        r::SECRET_NOT_FOUND,
        r::SECRET_NOT_READY,
        r::SECRET_FORBIDDEN,
        r::URL_UNRESOLVABLE,
        r::PAUSED,
        r::DELIVERING,
        r::DEGRADED,
        r::CIRCUIT_OPEN,
        r::SUSTAINED_FAILURE,
        r::GONE,
        r::ENABLED,
        r::NOT_VERIFIED,
        r::CHALLENGE_FAILED,
        r::CHALLENGE_ECHOED,
    ]
};

/// The whole object as the API server sends it.
#[derive(Deserialize)]
struct Whole {
    metadata: ObjectMeta,
    spec: WebhookEndpointSpec,
    #[serde(default)]
    status: Option<WebhookEndpointStatus>,
}

impl TryFrom<Whole> for Cached {
    type Error = serde_json::Error;

    fn try_from(whole: Whole) -> Result<Self, Self::Error> {
        let Whole {
            metadata,
            spec,
            status,
        } = whole;
        Ok(Self {
            metadata,
            uid: 0,
            spec: minimal(&spec)?.into(),
            status: status.as_ref().map_or_else(Recorded::absent, Recorded::of),
        })
    }
}

/// The spec as JSON without the fields that hold their default, which decoding gives
/// back: an endpoint that sets only its URL, types and secret is kept in about 120 bytes
/// instead of 300 (the delivery policy's defaults written out). Whole when leaving a
/// field out would not decode to the same spec.
fn minimal(spec: &WebhookEndpointSpec) -> Result<String, serde_json::Error> {
    static DEFAULTS: LazyLock<Value> = LazyLock::new(|| {
        let bare = serde_json::json!({"url": "", "eventTypes": [], "secretRef": {"name": ""}});
        serde_json::from_value::<WebhookEndpointSpec>(bare)
            .and_then(serde_json::to_value)
            .unwrap_or(Value::Null)
    });
    let whole = serde_json::to_value(spec)?;
    let mut pruned = whole.clone();
    prune(&mut pruned, &DEFAULTS);
    let same = serde_json::from_value::<WebhookEndpointSpec>(pruned.clone())
        .is_ok_and(|back| back == *spec);
    serde_json::to_string(if same { &pruned } else { &whole })
}

/// Removes from `value` the fields equal to those of `defaults`, and objects left empty.
fn prune(value: &mut Value, defaults: &Value) {
    let (Value::Object(fields), Value::Object(defaults)) = (value, defaults) else {
        return;
    };
    fields.retain(|name, field| {
        let Some(default) = defaults.get(name) else {
            return true;
        };
        prune(field, default);
        !(field == default || field.as_object().is_some_and(|o| o.is_empty()))
    });
}

/// What the endpoint controllers' watch does to each object before it is stored:
/// [`crate::reconcile::slim`], and no `resourceVersion` for a decoded one. No write of an
/// endpoint is guarded by it (the finalizer patch tests the list itself) and the watcher
/// has taken it from the event by then (it resumes from it: an object must decode with
/// it); 32 bytes twice, here and in the store's key.
pub fn slim(guard: &mut Guarded) {
    crate::reconcile::slim(guard);
    if let Ok(cached) = &mut guard.0 {
        cached.metadata.resource_version = None;
        if let Some(uid) = cached.metadata.uid.as_deref().and_then(uuid) {
            cached.uid = uid;
            cached.metadata.uid = None;
        }
        // Herald's finalizer alone is kept as an empty list, which allocates nothing (the
        // API server leaves an empty list out, so it cannot mean anything else).
        if cached.metadata.finalizers.as_deref() == Some(&[ENDPOINT_FINALIZER.to_owned()]) {
            cached.metadata.finalizers = Some(Vec::new());
        }
    }
}

/// `uid` as a number, when it is a UUID in the API server's form that [`uuid_text`]
/// gives back exactly.
fn uuid(uid: &str) -> Option<u128> {
    let bytes = uid.as_bytes();
    let dashes = [8, 13, 18, 23];
    let form = bytes.len() == 36
        && bytes.iter().enumerate().all(|(i, b)| {
            if dashes.contains(&i) {
                *b == b'-'
            } else {
                b.is_ascii_digit() || (b'a'..=b'f').contains(b)
            }
        });
    if !form {
        return None;
    }
    u128::from_str_radix(&uid.replace('-', ""), 16)
        .ok()
        .filter(|value| *value != 0)
}

/// The API server's form of a UUID.
fn uuid_text(value: u128) -> String {
    let hex = format!("{value:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// A hash of what `part` serializes to: equal parts have equal fingerprints.
pub fn fingerprint<T: Serialize>(part: &T) -> u64 {
    let mut hasher = DefaultHasher::new();
    serde_json::to_vec(part)
        .unwrap_or_default()
        .hash(&mut hasher);
    hasher.finish()
}

impl Recorded {
    /// No status: the fingerprints are those of an empty one, as a writer compared an
    /// absent status with the default before.
    pub fn absent() -> Self {
        Self {
            present: false,
            ..Self::of(&WebhookEndpointStatus::default())
        }
    }

    /// What is kept of `status`.
    pub fn of(status: &WebhookEndpointStatus) -> Self {
        Self {
            present: true,
            conditions: status.conditions.iter().map(Brief::of).collect(),
            controller: fingerprint(&build::owned(status)),
            health: fingerprint(&observed::owned(status)),
        }
    }

    /// The status as far as it is kept: the conditions without message or
    /// `observedGeneration`; `None` when the object has none.
    pub fn status(&self) -> Option<WebhookEndpointStatus> {
        self.present.then(|| WebhookEndpointStatus {
            conditions: self.conditions.iter().map(Brief::condition).collect(),
            ..Default::default()
        })
    }
}

/// Of the spec, the SigningSecret's name.
#[derive(Deserialize)]
struct SecretOnly {
    #[serde(rename = "secretRef")]
    secret_ref: herald_core::v1alpha1::LocalRef,
}

impl Cached {
    /// Whether the endpoint signs with SigningSecret `name` (decoding only that).
    pub fn uses_secret(&self, name: &str) -> bool {
        serde_json::from_str::<SecretOnly>(&self.spec).is_ok_and(|s| s.secret_ref.name == name)
    }

    /// The object's uid.
    pub fn uid(&self) -> Option<String> {
        match self.uid {
            0 => self.metadata.uid.clone(),
            uid => Some(uuid_text(uid)),
        }
    }

    /// The object's finalizers.
    pub fn finalizers(&self) -> Vec<String> {
        match self.metadata.finalizers.as_deref() {
            Some([]) => vec![ENDPOINT_FINALIZER.to_owned()],
            listed => listed.unwrap_or_default().to_vec(),
        }
    }

    /// The spec.
    pub fn spec(&self) -> Result<WebhookEndpointSpec, serde_json::Error> {
        serde_json::from_str(&self.spec)
    }

    /// A fingerprint of what the health writer renders from besides the health record —
    /// the metadata, the spec and the endpoint controller's part of the status — and of
    /// `health`, the fingerprint of the writer's own part (as stored, or as a write is
    /// about to store it): equal inputs render the same part from the same record.
    pub fn inputs(&self, health: u64) -> u64 {
        let mut hasher = DefaultHasher::new();
        serde_json::to_vec(&self.metadata)
            .unwrap_or_default()
            .hash(&mut hasher);
        self.uid.hash(&mut hasher);
        self.spec.hash(&mut hasher);
        self.status.controller.hash(&mut hasher);
        health.hash(&mut hasher);
        hasher.finish()
    }

    /// The object the pure steps work on (see the module's contract).
    pub fn endpoint(&self) -> Result<WebhookEndpoint, serde_json::Error> {
        Ok(WebhookEndpoint {
            metadata: ObjectMeta {
                uid: self.uid(),
                finalizers: self.metadata.finalizers.as_ref().map(|_| self.finalizers()),
                ..self.metadata.clone()
            },
            spec: self.spec()?,
            status: self.status.status(),
        })
    }
}

impl Resource for Cached {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        WebhookEndpoint::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        WebhookEndpoint::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        WebhookEndpoint::version(dt)
    }

    fn api_version(dt: &()) -> Cow<'_, str> {
        WebhookEndpoint::api_version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        WebhookEndpoint::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stored() -> serde_json::Value {
        json!({
            "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookEndpoint",
            "metadata": {"name": "orders", "namespace": "shop", "uid": "u1", "generation": 2,
                "resourceVersion": "42",
                "finalizers": ["herald.dev/delivery-cleanup"]},
            "spec": {"url": "https://hooks.example.com/", "eventTypes": ["order.*"],
                "secretRef": {"name": "s"}, "paused": true, "ordered": true,
                "orderingKey": "customer",
                "headers": [{"name": "x-tenant", "value": "shop"}],
                "delivery": {"timeout": "5s", "maxInFlight": 3,
                    "retry": {"schedule": ["1s", "1m"]}, "finalStatusCodes": [400, 404],
                    "rateLimit": {"perSecond": 10}}},
            "status": {"observedGeneration": 2, "shard": 3, "state": "Active",
                "successRate": "99.5%", "p95Latency": "120ms", "backlog": 4,
                "conditions": [
                    {"type": "Ready", "status": "True", "reason": "Accepted",
                     "message": "configuration published to the data plane (shard 3)",
                     "lastTransitionTime": "2026-11-30T10:00:00Z", "observedGeneration": 2},
                    {"type": "Healthy", "status": "False", "reason": "Degraded",
                     "message": "slow", "lastTransitionTime": "2026-11-30T11:00:00Z",
                     "observedGeneration": 2}]}
        })
    }

    #[test]
    fn the_endpoint_comes_back_with_its_spec_and_the_conditions_merging_reads() {
        let whole: WebhookEndpoint = serde_json::from_value(stored()).unwrap();
        let cached: Cached = serde_json::from_value(stored()).unwrap();
        let back = cached.endpoint().unwrap();
        let identity = |m: &ObjectMeta| (m.uid.clone(), m.name.clone(), m.finalizers.clone());
        assert_eq!(identity(&back.metadata), identity(&whole.metadata));
        let mut guard = kube::core::DeserializeGuard(Ok(cached.clone()));
        slim(&mut guard);
        let slimmed = guard.0.unwrap();
        assert_eq!(slimmed.metadata.resource_version, None);
        assert_eq!(
            slimmed.uid(),
            whole.metadata.uid,
            "not a UUID: kept as it is"
        );
        assert_eq!(back.spec, whole.spec, "the spec survives its JSON form");
        let (kept, full) = (back.status.unwrap(), whole.status.clone().unwrap());
        assert_eq!(kept.conditions.len(), 2);
        for (k, f) in kept.conditions.iter().zip(&full.conditions) {
            assert_eq!(
                (&k.type_, &k.status, &k.reason, &k.last_transition_time),
                (&f.type_, &f.status, &f.reason, &f.last_transition_time)
            );
            assert!(k.message.is_empty());
        }
        assert_eq!(kept.success_rate, None, "gauges are not kept");
        let briefs = &cached.status.conditions;
        assert!(
            briefs.iter().all(|b| matches!(b, Brief::Known { .. })),
            "Herald's own words are not copied: {briefs:?}"
        );
        let foreign = Condition {
            type_: "Synced".into(),
            status: "True".into(),
            reason: "SomethingElse".into(),
            message: "by another controller".into(),
            observed_generation: Some(1),
            last_transition_time: Time("2026-11-30T10:00:00.5Z".parse().unwrap()),
        };
        let kept = Brief::of(&foreign).condition();
        assert_eq!(
            (
                &kept.type_,
                &kept.status,
                &kept.reason,
                &kept.last_transition_time
            ),
            (
                &foreign.type_,
                &foreign.status,
                &foreign.reason,
                &foreign.last_transition_time
            ),
            "anything else is kept as written"
        );
        let bare = json!({"apiVersion": "herald.dev/v1alpha1", "kind": "WebhookEndpoint",
            "metadata": {"name": "a", "namespace": "shop"},
            "spec": {"url": "https://a.example.com/", "eventTypes": ["a"],
                "secretRef": {"name": "s"}}});
        let cached: Cached = serde_json::from_value(bare).unwrap();
        assert_eq!(cached.endpoint().unwrap().status, None);
        assert!(!cached.status.present);
        let empty = WebhookEndpointStatus::default();
        assert_eq!(cached.status.health, fingerprint(&observed::owned(&empty)));
        assert!(cached.uses_secret("s") && !cached.uses_secret("t"));
    }

    #[test]
    fn fingerprints_match_exactly_when_the_owned_parts_are_equal() {
        let whole: WebhookEndpoint = serde_json::from_value(stored()).unwrap();
        let status = whole.status.clone().unwrap();
        let cached: Cached = serde_json::from_value(stored()).unwrap();
        assert_eq!(
            cached.status.controller,
            fingerprint(&build::owned(&status))
        );
        assert_eq!(cached.status.health, fingerprint(&observed::owned(&status)));
        let mut moved = status.clone();
        moved.backlog = Some(5);
        assert_eq!(
            cached.status.controller,
            fingerprint(&build::owned(&moved)),
            "a gauge is not the controller's"
        );
        assert_ne!(cached.status.health, fingerprint(&observed::owned(&moved)));
        let mut message = status.clone();
        message.conditions[0].message = "configuration published (shard 4)".into();
        assert_ne!(
            cached.status.controller,
            fingerprint(&build::owned(&message))
        );
        assert_eq!(
            cached.status.health,
            fingerprint(&observed::owned(&message))
        );
    }

    #[test]
    fn rendering_what_is_stored_matches_its_fingerprint_so_a_resync_writes_nothing() {
        let cached: Cached = serde_json::from_value(stored()).unwrap();
        let obj = cached.endpoint().unwrap();
        let later = Time("2026-12-01T00:00:00Z".parse().unwrap());
        let publication = build::Publication::Fresh(build::config(&obj, 3));
        let rendered = build::status(
            &obj,
            &Ok(3),
            &publication,
            &crate::endpoint::verification::Verification::NotRequired,
            &later,
        );
        assert_eq!(fingerprint(&rendered), cached.status.controller);
        let moved = build::status(
            &obj,
            &Ok(4),
            &publication,
            &crate::endpoint::verification::Verification::NotRequired,
            &later,
        );
        assert_ne!(fingerprint(&moved), cached.status.controller);
    }

    #[test]
    fn rendering_the_stored_health_matches_its_fingerprint_so_nothing_is_written_twice() {
        use herald_core::dataplane::{AttemptOutcome, EndpointHealth, LastAttempt};
        use herald_core::v1alpha1::{CircuitState, EndpointState};
        let health = EndpointHealth {
            uid: "u1".into(),
            generation: 2,
            state: Some(EndpointState::Active),
            circuit: Some(CircuitState::Closed),
            concurrency_limit: Some(3),
            backlog: Some(0),
            success_permille: Some(995),
            p95_latency_ms: Some(120),
            last_delivery: Some(LastAttempt {
                event_id: "01JDQ4Z9X8Y7W6V5T4S3R2Q1P0".into(),
                http_status: Some(200),
                outcome: AttemptOutcome::Success,
                latency_ms: 12,
                time_ms: 1_800_000_000_123,
            }),
            ..Default::default()
        };
        let first: Cached = serde_json::from_value(stored()).unwrap();
        // The writer renders in whole seconds, as the API server stores times.
        let now = Time("2026-12-01T00:00:00Z".parse().unwrap());
        let rendered = observed::status(&first.endpoint().unwrap(), Some(&health), &now);
        // What the API server then holds: the controller's part and the health writer's,
        // times to the second.
        let mut object = stored();
        let mut status = serde_json::to_value(&rendered).unwrap();
        let mut conditions = vec![object["status"]["conditions"][0].clone()];
        for c in status["conditions"].as_array_mut().unwrap().drain(..) {
            conditions.push(c);
        }
        for c in &mut conditions {
            let t = c["lastTransitionTime"].as_str().unwrap().to_owned();
            c["lastTransitionTime"] = json!(format!("{}Z", &t[..19]));
        }
        status["conditions"] = json!(conditions);
        status["observedGeneration"] = object["status"]["observedGeneration"].clone();
        status["shard"] = object["status"]["shard"].clone();
        object["status"] = status;
        let stored_again: Cached = serde_json::from_value(object).unwrap();
        let later = Time("2026-12-01T00:05:00Z".parse().unwrap());
        let again = observed::status(&stored_again.endpoint().unwrap(), Some(&health), &later);
        assert_eq!(
            fingerprint(&again),
            stored_again.status.health,
            "{again:#?}"
        );
        // What the writer expects to come back is what comes back, so its own write
        // does not make it render again.
        assert_eq!(
            first.inputs(fingerprint(&rendered)),
            stored_again.inputs(stored_again.status.health)
        );
        assert_ne!(
            first.inputs(first.status.health),
            stored_again.inputs(stored_again.status.health),
            "a health part that changed is a changed input"
        );
        let mut respecced = stored_again.clone();
        respecced.spec = respecced
            .spec
            .replace("\"paused\":true", "\"paused\":false")
            .into();
        assert_ne!(
            respecced.inputs(respecced.status.health),
            stored_again.inputs(stored_again.status.health),
            "so is the spec"
        );
    }

    #[test]
    fn a_uuid_is_kept_as_a_number_and_comes_back_as_it_was() {
        let mut object = stored();
        let uid = "3f2a1b4c-5d6e-4f70-8a9b-00000000002a";
        object["metadata"]["uid"] = json!(uid);
        let whole: WebhookEndpoint = serde_json::from_value(object.clone()).unwrap();
        let mut guard: Guarded = serde_json::from_value(object).unwrap();
        slim(&mut guard);
        let cached = guard.0.unwrap();
        assert_eq!(cached.metadata.uid, None, "not held as text");
        assert_eq!(
            cached.metadata.finalizers,
            Some(Vec::new()),
            "nor the finalizer"
        );
        assert_eq!(cached.finalizers(), vec![ENDPOINT_FINALIZER.to_owned()]);
        assert_eq!(cached.uid().as_deref(), Some(uid));
        let back = cached.endpoint().unwrap();
        let identity = |m: &ObjectMeta| (m.uid.clone(), m.name.clone(), m.finalizers.clone());
        assert_eq!(identity(&back.metadata), identity(&whole.metadata));
        for other in [
            "3F2A1B4C-5D6E-4F70-8A9B-00000000002A",
            "u1",
            "",
            "00000000-0000-0000-0000-000000000000",
            "3f2a1b4c5d6e4f708a9b00000000002a0000",
        ] {
            assert_eq!(uuid(other), None, "{other}");
        }
    }

    #[test]
    fn a_cached_endpoint_stays_small() {
        // The store holds one per endpoint (docs/scale.md): 1,120 bytes of structs for the
        // whole object, 432 for this (the uid as a number instead of 36 bytes of text
        // twice), before any allocation.
        assert!(std::mem::size_of::<Guarded>() <= 432);
        assert!(std::mem::size_of::<Brief>() <= 16);
        let cached: Cached = serde_json::from_value(stored()).unwrap();
        assert!(cached.spec.len() < 512, "{}", cached.spec);
        let mut bare = stored();
        bare["spec"] = json!({"url": "https://hooks.example.com/shop/orders",
            "eventTypes": ["order.created"], "secretRef": {"name": "signing"}});
        let cached: Cached = serde_json::from_value(bare).unwrap();
        assert!(
            cached.spec.len() < 128,
            "defaults are not kept: {}",
            cached.spec
        );
    }

    #[test]
    fn a_spec_comes_back_whole_from_what_is_kept() {
        let specs = [
            json!({"url": "https://a.example.com/", "eventTypes": ["a"], "secretRef": {"name": "s"}}),
            stored()["spec"].clone(),
            // Explicit defaults, and a default-looking value inside a non-default object.
            json!({"url": "https://a.example.com/", "eventTypes": ["a", "b.*"],
                "secretRef": {"name": "s"}, "paused": false,
                "delivery": {"timeout": "10s", "maxInFlight": 1, "disableOnGone": false,
                    "retry": {"schedule": ["5s"]}, "circuitBreaker": {}}}),
            json!({"url": "", "eventTypes": [], "secretRef": {"name": ""}}),
        ];
        for spec in specs {
            let whole: WebhookEndpointSpec = serde_json::from_value(spec.clone()).unwrap();
            let kept = minimal(&whole).unwrap();
            let back: WebhookEndpointSpec = serde_json::from_str(&kept).unwrap();
            assert_eq!(back, whole, "{spec} kept as {kept}");
            assert!(kept.len() <= serde_json::to_string(&whole).unwrap().len());
        }
    }

    #[test]
    fn a_spec_that_does_not_decode_makes_the_object_undecodable() {
        let mut bad = stored();
        bad["spec"]["delivery"]["timeout"] = json!("soon");
        let guard: kube::core::DeserializeGuard<Cached> = serde_json::from_value(bad).unwrap();
        let invalid = guard.0.unwrap_err();
        assert_eq!(invalid.metadata.name.as_deref(), Some("orders"));
    }
}
