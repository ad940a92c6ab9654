//! Pure builders of what the endpoint controller writes: the [`Publication`] in
//! `herald-config` and its part of the status (`Ready`, `shard`, `observedGeneration`).
//!
//! Contract: no IO and no clock other than the `now` passed in, which only becomes a
//! condition's `lastTransitionTime` when that condition flips; the same inputs give equal
//! output, so an unchanged endpoint is never rewritten.
//!
//! Holds: only a deleted resource loses its configuration. A resource that exists but
//! does not validate right now keeps its last good configuration, re-published with
//! `held` set (the dispatchers deliver nothing and keep the backlog) until it validates
//! again; one that never validated has nothing to keep.

use herald_core::dataplane::{EndpointConfig, Hold};
use herald_core::names::{condition, reason};
use herald_core::v1alpha1::{WebhookEndpoint, WebhookEndpointStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::validate::Invalid;
use super::verification::Verification;
use crate::conditions::{self, Desired};

/// What `herald-config` should hold for an endpoint.
#[derive(Clone, Debug, PartialEq)]
pub enum Publication {
    /// Valid: its fresh configuration, not held.
    Fresh(EndpointConfig),
    /// Present but not valid right now: the last good configuration, held.
    Held(EndpointConfig),
    /// Not valid and never was: nothing to deliver with, nothing to keep.
    Nothing,
    /// The entry belongs to an endpoint of the same name that was deleted (another
    /// uid): withdraw it.
    Stale,
}

impl Publication {
    /// The configuration the entry should hold, if any.
    pub fn config(&self) -> Option<&EndpointConfig> {
        match self {
            Self::Fresh(config) | Self::Held(config) => Some(config),
            Self::Nothing | Self::Stale => None,
        }
    }
}

/// The configuration of a valid endpoint on `shard`.
pub fn config(obj: &WebhookEndpoint, shard: u32) -> EndpointConfig {
    EndpointConfig::from_spec(obj, shard)
}

/// What to publish for `obj` given its validation outcome (the shard when valid) and
/// the entry `herald-config` holds now.
pub fn publication(
    obj: &WebhookEndpoint,
    validity: &Result<u32, Invalid>,
    current: Option<EndpointConfig>,
) -> Publication {
    match validity {
        Ok(shard) => Publication::Fresh(config(obj, *shard)),
        Err(invalid) => hold(
            current,
            obj.metadata.uid.as_deref().unwrap_or_default(),
            invalid,
        ),
    }
}

/// Holds the `current` entry of the endpoint with `uid` for `why`.
pub fn hold(current: Option<EndpointConfig>, uid: &str, why: &Invalid) -> Publication {
    match current {
        Some(mut config) if config.uid == uid => {
            config.held = Some(Box::new(Hold {
                reason: why.reason.to_owned(),
                message: why.message.clone(),
            }));
            Publication::Held(config)
        }
        Some(_) => Publication::Stale,
        None => Publication::Nothing,
    }
}

/// The `Ready` message of an endpoint whose deliveries are held.
pub fn held_message(why: &str) -> String {
    format!(
        "{why}. Deliveries are held with the last valid configuration; events keep queueing \
         and are delivered once this is fixed"
    )
}

/// The part of the status this controller owns: `observedGeneration`, `shard`, the
/// `Ready` condition (with kstatus') and, while verification is required, `Verified`.
pub fn status(
    obj: &WebhookEndpoint,
    validity: &Result<u32, Invalid>,
    publication: &Publication,
    verification: &Verification,
    now: &Time,
) -> WebhookEndpointStatus {
    let old = obj.status.clone().unwrap_or_default();
    let generation = obj.metadata.generation;
    let url = &obj.spec.url;
    let ready = match (validity, publication) {
        (Ok(shard), _) => verification.not_ready(url).unwrap_or_else(|| {
            Desired::new(
                condition::READY,
                true,
                reason::ACCEPTED,
                format!("configuration published to the data plane (shard {shard})"),
            )
        }),
        (Err(invalid), Publication::Held(_)) => Desired::new(
            condition::READY,
            false,
            invalid.reason,
            held_message(&invalid.message),
        ),
        (Err(invalid), _) => Desired::new(
            condition::READY,
            false,
            invalid.reason,
            invalid.message.clone(),
        ),
    };
    let mut desired = conditions::ready_with_kstatus(ready);
    desired.extend(verification.condition(url));
    WebhookEndpointStatus {
        observed_generation: generation,
        shard: publication.config().map(|c| c.shard),
        conditions: conditions::merge(&old.conditions, &desired, generation, now),
        ..Default::default()
    }
}

/// The fields of `status` that [`status`] renders, to compare with its output.
pub fn owned(status: &WebhookEndpointStatus) -> WebhookEndpointStatus {
    WebhookEndpointStatus {
        observed_generation: status.observed_generation,
        shard: status.shard,
        conditions: status
            .conditions
            .iter()
            .filter(|c| conditions::is_ready_or_kstatus(&c.type_) || c.type_ == condition::VERIFIED)
            .cloned()
            .collect(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_core::v1alpha1::WebhookEndpointSpec;
    use k8s_openapi::jiff::Timestamp;

    fn endpoint(url: &str) -> WebhookEndpoint {
        let spec: WebhookEndpointSpec = serde_json::from_value(serde_json::json!({
            "url": url, "eventTypes": ["order.*"], "secretRef": {"name": "s"}
        }))
        .unwrap();
        let mut obj = WebhookEndpoint::new("orders", spec);
        obj.metadata.namespace = Some("shop".into());
        obj.metadata.uid = Some("u1".into());
        obj.metadata.generation = Some(3);
        obj
    }

    fn now() -> Time {
        Time(Timestamp::from_second(1_800_000_000).unwrap())
    }

    fn unresolvable() -> Invalid {
        Invalid {
            reason: reason::URL_UNRESOLVABLE,
            message: "spec.url: host x.invalid does not resolve".into(),
            retry: None,
        }
    }

    #[test]
    fn a_valid_endpoint_is_published_fresh_and_ready_on_its_shard() {
        let obj = endpoint("https://hooks.example.com/");
        let mut old = config(&obj, 7);
        old.held = Some(Box::new(Hold {
            reason: "SecretNotReady".into(),
            message: "no".into(),
        }));
        let publication = publication(&obj, &Ok(7), Some(old));
        let Publication::Fresh(config) = &publication else {
            panic!("{publication:?}")
        };
        assert_eq!(config.held, None, "validating again releases the hold");
        let status = status(
            &obj,
            &Ok(7),
            &publication,
            &Verification::NotRequired,
            &now(),
        );
        assert_eq!(status.shard, Some(7));
        assert!(conditions::is_true(&status.conditions, condition::READY));
        assert_eq!(status.conditions[0].observed_generation, Some(3));
        let mut again = obj.clone();
        again.status = Some(status.clone());
        let later = Time(Timestamp::from_second(1_800_000_100).unwrap());
        assert_eq!(
            super::status(
                &again,
                &Ok(7),
                &publication,
                &Verification::NotRequired,
                &later
            ),
            status,
            "rendering is stable"
        );
        assert_eq!(owned(&status), status);
    }

    #[test]
    fn an_endpoint_that_stops_validating_keeps_its_last_good_config_held() {
        let good = endpoint("https://hooks.example.com/");
        let current = config(&good, 7);
        let mut edited = endpoint("https://x.invalid/");
        edited.metadata.generation = Some(4);
        let validity = Err(unresolvable());
        let publication = publication(&edited, &validity, Some(current.clone()));
        let Publication::Held(held) = &publication else {
            panic!("{publication:?}")
        };
        assert_eq!(
            held.url, "https://hooks.example.com/",
            "the last good URL is kept"
        );
        assert_eq!(held.generation, 3);
        let hold = held.held.as_ref().unwrap();
        assert_eq!(hold.reason, reason::URL_UNRESOLVABLE);
        assert!(hold.message.contains("x.invalid"), "{}", hold.message);

        let status = status(
            &edited,
            &validity,
            &publication,
            &Verification::NotRequired,
            &now(),
        );
        let ready = conditions::find(&status.conditions, condition::READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "UrlUnresolvable")
        );
        assert!(ready.message.contains("x.invalid"), "{}", ready.message);
        assert!(
            ready.message.contains("events keep queueing"),
            "{}",
            ready.message
        );
        assert_eq!(status.shard, Some(7), "the lanes stay where they are");
    }

    #[test]
    fn an_endpoint_that_never_validated_has_nothing_to_hold() {
        let obj = endpoint("https://10.0.0.1/");
        let invalid = Invalid {
            reason: reason::URL_FORBIDDEN,
            message: "spec.url: no".into(),
            retry: None,
        };
        let validity = Err(invalid);
        let publication = publication(&obj, &validity, None);
        assert_eq!(publication, Publication::Nothing);
        let status = status(
            &obj,
            &validity,
            &publication,
            &Verification::NotRequired,
            &now(),
        );
        assert_eq!(status.shard, None);
        assert_eq!(status.conditions[0].reason, reason::URL_FORBIDDEN);
        assert_eq!(status.conditions[0].message, "spec.url: no");
        // An entry left by a deleted endpoint of the same name is not held for this one.
        let mut stale = config(&obj, 1);
        stale.uid = "u0".into();
        assert_eq!(
            super::publication(&obj, &validity, Some(stale)),
            Publication::Stale
        );
    }
}
