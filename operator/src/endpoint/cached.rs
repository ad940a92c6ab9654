//! What the operator keeps of each `WebhookEndpoint` between reconciles: [`Cached`], decoded
//! from the watch in place of the whole object.
//!
//! The controllers' store holds one object per endpoint for as long as it exists, so its
//! size is the operator's memory per endpoint (the 2 KiB target of docs/scale.md). The
//! whole decoded object was about 2.3 KB: 1,120 bytes of structs (the spec alone 504,
//! mostly defaults) and some twenty small allocations, half of them the status, which
//! reconciles only compare with what they render. Here:
//! - metadata as [`slim`] leaves it (identity, generation, finalizers, deletion,
//!   Herald's annotations; no `resourceVersion`);
//! - the spec as JSON (about 300 bytes, one allocation), decoded when a reconcile needs
//!   it;
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

use herald_core::v1alpha1::{WebhookEndpoint, WebhookEndpointSpec, WebhookEndpointStatus};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use kube::Resource;
use serde::{Deserialize, Serialize};

use super::{build, observed};

/// A `WebhookEndpoint` as the operator keeps it (see the module's doc).
#[derive(Clone, Debug, Deserialize)]
#[serde(try_from = "Whole")]
pub struct Cached {
    pub metadata: ObjectMeta,
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

/// Of one condition, what merging and announcing read.
#[derive(Clone, Debug, PartialEq)]
struct Brief {
    type_: Cow<'static, str>,
    status: Cow<'static, str>,
    reason: Cow<'static, str>,
    since: Time,
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
    ]
};

fn compact(value: &str) -> Cow<'static, str> {
    KNOWN.iter().find(|known| **known == value).map_or_else(
        || Cow::Owned(value.to_owned()),
        |known| Cow::Borrowed(*known),
    )
}

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
            spec: serde_json::to_string(&spec)?.into(),
            status: status.as_ref().map_or_else(Recorded::absent, Recorded::of),
        })
    }
}

/// What the endpoint controllers' watch does to each object before it is stored:
/// [`crate::reconcile::slim`], and no `resourceVersion` for a decoded one. No write of an
/// endpoint is guarded by it (the finalizer patch tests the list itself) and the watcher
/// has taken it from the event by then (it resumes from it: an object must decode with
/// it); 32 bytes twice, here and in the store's key.
pub fn slim(guard: &mut super::Guarded) {
    crate::reconcile::slim(guard);
    if let Ok(cached) = &mut guard.0 {
        cached.metadata.resource_version = None;
    }
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
            conditions: status
                .conditions
                .iter()
                .map(|c| Brief {
                    type_: compact(&c.type_),
                    status: compact(&c.status),
                    reason: compact(&c.reason),
                    since: c.last_transition_time.clone(),
                })
                .collect(),
            controller: fingerprint(&build::owned(status)),
            health: fingerprint(&observed::owned(status)),
        }
    }

    /// The status as far as it is kept: the conditions without message or
    /// `observedGeneration`; `None` when the object has none.
    pub fn status(&self) -> Option<WebhookEndpointStatus> {
        self.present.then(|| WebhookEndpointStatus {
            conditions: self
                .conditions
                .iter()
                .map(|b| Condition {
                    type_: b.type_.to_string(),
                    status: b.status.to_string(),
                    reason: b.reason.to_string(),
                    message: String::new(),
                    observed_generation: None,
                    last_transition_time: b.since.clone(),
                })
                .collect(),
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

    /// The spec.
    pub fn spec(&self) -> Result<WebhookEndpointSpec, serde_json::Error> {
        serde_json::from_str(&self.spec)
    }

    /// The object the pure steps work on (see the module's contract).
    pub fn endpoint(&self) -> Result<WebhookEndpoint, serde_json::Error> {
        Ok(WebhookEndpoint {
            metadata: self.metadata.clone(),
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
        assert_eq!(back.metadata, whole.metadata);
        let mut guard = kube::core::DeserializeGuard(Ok(cached.clone()));
        slim(&mut guard);
        let slimmed = guard.0.unwrap().metadata;
        assert_eq!(slimmed.resource_version, None);
        assert_eq!(slimmed.uid, whole.metadata.uid);
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
            briefs.iter().all(|b| matches!(
                (&b.type_, &b.status, &b.reason),
                (Cow::Borrowed(_), Cow::Borrowed(_), Cow::Borrowed(_))
            )),
            "Herald's own words are not copied: {briefs:?}"
        );
        assert_eq!(compact("SomethingElse"), "SomethingElse");
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
        let rendered = build::status(&obj, &Ok(3), &publication, &later);
        assert_eq!(fingerprint(&rendered), cached.status.controller);
        let moved = build::status(&obj, &Ok(4), &publication, &later);
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
        let now = Time("2026-12-01T00:00:00.123456Z".parse().unwrap());
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
    }

    #[test]
    fn a_cached_endpoint_stays_small() {
        // The store holds one per endpoint (docs/scale.md): 1,120 bytes of structs for the
        // whole object, 416 for this, before any allocation.
        assert!(std::mem::size_of::<super::super::Guarded>() <= 416);
        let cached: Cached = serde_json::from_value(stored()).unwrap();
        assert!(cached.spec.len() < 512, "{}", cached.spec);
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
