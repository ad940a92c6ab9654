//! Pure builders: the `EndpointConfig` the dispatcher reads, and the status Herald
//! writes.
//!
//! Contract: no IO and no clock other than the `now` passed in, which only becomes a
//! condition's `lastTransitionTime` when that condition flips; rendering the same inputs
//! twice gives equal output, so an unchanged endpoint is never rewritten.

use herald_core::dataplane::{EndpointConfig, EndpointHealth};
use herald_core::names::{self, condition, reason};
use herald_core::v1alpha1::{
    CircuitState, EndpointState, LastDelivery, WebhookEndpoint, WebhookEndpointStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::validate::Invalid;
use crate::conditions::{self, Desired};

/// The compiled configuration of a valid endpoint.
pub fn config(obj: &WebhookEndpoint, shard: u32) -> EndpointConfig {
    let spec = &obj.spec;
    EndpointConfig {
        namespace: obj.namespace().unwrap_or_default(),
        name: obj.name_any(),
        uid: obj.uid().unwrap_or_default(),
        generation: obj.metadata.generation.unwrap_or_default(),
        url: spec.url.clone(),
        event_types: spec.event_types.clone(),
        secret: spec.secret_ref.name.clone(),
        ordered: spec.ordered,
        ordering_key: spec.ordering_key.clone(),
        paused: spec.paused,
        delivery: std::sync::Arc::new(spec.delivery.clone()),
        headers: spec.headers.clone(),
        shard,
        enable_token: obj.annotations().get(names::ENABLE_ANNOTATION).cloned(),
    }
}

fn time_ms(ms: u64) -> Option<Time> {
    i64::try_from(ms)
        .ok()
        .and_then(|ms| Timestamp::from_millisecond(ms).ok())
        .map(Time)
}

/// `998` → `99.8%`.
pub fn success_rate(permille: u32) -> String {
    let permille = permille.min(1000);
    format!("{}.{}%", permille / 10, permille % 10)
}

/// `120` → `120ms`, `2500` → `2.5s`.
pub fn latency(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms}ms")
    } else {
        format!("{}.{}s", ms / 1000, (ms % 1000) / 100)
    }
}

/// The command that re-enables a disabled endpoint.
pub fn enable_hint(obj: &WebhookEndpoint) -> String {
    format!(
        "kubectl annotate webhookendpoint {} -n {} {}=$(date +%s) --overwrite",
        obj.name_any(),
        obj.namespace().unwrap_or_default(),
        names::ENABLE_ANNOTATION
    )
}

/// The status of an endpoint: `validity` is the validation outcome (the shard when
/// valid), `health` what the data plane last reported about this very endpoint (uid
/// already checked).
pub fn status(
    obj: &WebhookEndpoint,
    validity: &Result<u32, Invalid>,
    health: Option<&EndpointHealth>,
    now: &Time,
) -> WebhookEndpointStatus {
    let old = obj.status.clone().unwrap_or_default();
    let generation = obj.metadata.generation;
    let mut status = WebhookEndpointStatus {
        observed_generation: generation,
        ..Default::default()
    };
    let mut desired = Vec::new();
    match validity {
        Err(invalid) => {
            desired.push(Desired::new(
                condition::READY,
                false,
                invalid.reason,
                invalid.message.clone(),
            ));
        }
        Ok(shard) => {
            status.shard = Some(*shard);
            desired.push(Desired::new(
                condition::READY,
                true,
                reason::ACCEPTED,
                format!("configuration published to the data plane (shard {shard})"),
            ));
            status.state = Some(EndpointState::Pending);
            if let Some(h) = health {
                apply_health(obj, h, &mut status, &mut desired);
            }
            if obj.spec.paused {
                status.state = Some(EndpointState::Paused);
            }
        }
    }
    status.conditions = conditions::merge(&old.conditions, &desired, generation, now);
    status
}

fn apply_health(
    obj: &WebhookEndpoint,
    h: &EndpointHealth,
    status: &mut WebhookEndpointStatus,
    desired: &mut Vec<Desired>,
) {
    status.circuit = h.circuit;
    status.concurrency_limit = h.concurrency_limit;
    status.backlog = h.backlog;
    status.oldest_pending = h.oldest_pending_ms.and_then(time_ms);
    status.first_failure = h.first_failure_ms.and_then(time_ms);
    status.success_rate = h.success_permille.map(success_rate);
    status.p95_latency = h.p95_latency_ms.map(latency);
    status.last_delivery = h.last_delivery.as_ref().and_then(|d| {
        Some(LastDelivery {
            event_id: d.event_id.clone(),
            http_status: d.http_status,
            outcome: d.outcome.clone(),
            latency_ms: d.latency_ms,
            time: time_ms(d.time_ms)?,
        })
    });
    let disabled = h.disabled_reason.as_deref().map(|r| {
        if r == reason::GONE {
            reason::GONE
        } else {
            reason::SUSTAINED_FAILURE
        }
    });
    status.state = Some(match (disabled, h.state) {
        (Some(_), _) => EndpointState::Disabled,
        (None, Some(state)) => state,
        (None, None) => EndpointState::Active,
    });
    let healthy = match (disabled, h.circuit, status.state) {
        (Some(why), _, _) => Desired::new(
            condition::HEALTHY,
            false,
            why,
            "deliveries are stopped; see the Disabled condition",
        ),
        (None, Some(CircuitState::Open), _) => Desired::new(
            condition::HEALTHY,
            false,
            reason::CIRCUIT_OPEN,
            "the circuit breaker is open after consecutive failures; only probe requests are sent",
        ),
        (None, _, Some(EndpointState::Degraded)) => Desired::new(
            condition::HEALTHY,
            false,
            reason::DEGRADED,
            format!(
                "deliveries fail or are slow (success {}, p95 {})",
                status.success_rate.as_deref().unwrap_or("n/a"),
                status.p95_latency.as_deref().unwrap_or("n/a")
            ),
        ),
        _ => Desired::new(
            condition::HEALTHY,
            true,
            reason::DELIVERING,
            "deliveries succeed",
        ),
    };
    desired.push(healthy);
    desired.push(match disabled {
        Some(why) => {
            let detail = h
                .disabled_message
                .clone()
                .unwrap_or_else(|| "deliveries to this endpoint are stopped".into());
            Desired::new(
                condition::DISABLED,
                true,
                why,
                format!(
                    "{detail}. Events keep queueing. Re-enable once the receiver is fixed: {}",
                    enable_hint(obj)
                ),
            )
        }
        None => Desired::new(
            condition::DISABLED,
            false,
            reason::ENABLED,
            "deliveries are enabled",
        ),
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::validate::Invalid;
    use herald_core::v1alpha1::WebhookEndpointSpec;

    fn endpoint() -> WebhookEndpoint {
        let spec: WebhookEndpointSpec = serde_json::from_value(serde_json::json!({
            "url": "https://hooks.example.com/", "eventTypes": ["order.*"], "secretRef": {"name": "s"}
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

    #[test]
    fn formats_match_the_printer_columns() {
        assert_eq!(success_rate(998), "99.8%");
        assert_eq!(success_rate(1000), "100.0%");
        assert_eq!(latency(120), "120ms");
        assert_eq!(latency(2500), "2.5s");
    }

    #[test]
    fn a_valid_endpoint_without_health_is_pending_on_its_shard() {
        let obj = endpoint();
        let status = status(&obj, &Ok(7), None, &now());
        assert_eq!(status.state, Some(EndpointState::Pending));
        assert_eq!(status.shard, Some(7));
        assert!(conditions::is_true(&status.conditions, condition::READY));
        assert_eq!(status.conditions[0].observed_generation, Some(3));
        let mut again = obj.clone();
        again.status = Some(status.clone());
        let later = Time(Timestamp::from_second(1_800_000_100).unwrap());
        assert_eq!(
            super::status(&again, &Ok(7), None, &later),
            status,
            "rendering is stable"
        );
    }

    #[test]
    fn an_invalid_endpoint_says_why() {
        let invalid = Invalid {
            reason: reason::URL_FORBIDDEN,
            message: "spec.url: no".into(),
            retry: None,
        };
        let status = status(&endpoint(), &Err(invalid), None, &now());
        assert_eq!(status.state, None);
        assert_eq!(status.conditions[0].reason, reason::URL_FORBIDDEN);
        assert_eq!(status.conditions[0].status, "False");
    }

    #[test]
    fn disabled_health_tells_how_to_re_enable() {
        let health = EndpointHealth {
            uid: "u1".into(),
            disabled_reason: Some("Gone".into()),
            disabled_message: Some("the receiver answered 410 Gone".into()),
            success_permille: Some(0),
            ..Default::default()
        };
        let status = status(&endpoint(), &Ok(1), Some(&health), &now());
        assert_eq!(status.state, Some(EndpointState::Disabled));
        let disabled = conditions::find(&status.conditions, condition::DISABLED).unwrap();
        assert_eq!(
            (disabled.status.as_str(), disabled.reason.as_str()),
            ("True", "Gone")
        );
        assert!(
            disabled.message.contains("kubectl annotate webhookendpoint orders -n shop herald.dev/enable=$(date +%s) --overwrite"),
            "{}",
            disabled.message
        );
    }
}
