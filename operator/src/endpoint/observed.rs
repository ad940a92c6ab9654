//! Pure: the part of an endpoint's status that shows what the data plane observed — the
//! health fields, the `Healthy` and `Disabled` conditions and `state` — rendered by the
//! health writer (`crate::health::writer`) under its own field manager.
//!
//! Contract: [`state`] is the one place that decides an endpoint's `state`; no IO and no
//! clock other than the `now` passed in (only a flipping condition takes it), so the same
//! inputs render the same status and an unchanged endpoint is never rewritten.

use herald_core::dataplane::EndpointHealth;
use herald_core::names::{self, condition, reason};
use herald_core::v1alpha1::{
    CircuitState, EndpointState, LastDelivery, WebhookEndpoint, WebhookEndpointStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::conditions::{self, Desired};

/// The summary state of an endpoint: absent while it is not `Ready` (invalid, or held),
/// `Paused` when the spec says so, `Pending` until a dispatcher reports, then what the
/// dispatcher reports (`Disabled` when it disabled the endpoint).
pub fn state(ready: bool, paused: bool, health: Option<&EndpointHealth>) -> Option<EndpointState> {
    if !ready {
        return None;
    }
    if paused {
        return Some(EndpointState::Paused);
    }
    Some(match health {
        None => EndpointState::Pending,
        Some(h) if h.disabled_reason.is_some() => EndpointState::Disabled,
        Some(h) => h.state.unwrap_or(EndpointState::Active),
    })
}

/// Unix milliseconds as a status time, in whole seconds: the API server stores
/// `metav1.Time` to the second, so a rendering with milliseconds would never equal the
/// stored status and every health publication would be written again.
fn time_ms(ms: u64) -> Option<Time> {
    i64::try_from(ms / 1000)
        .ok()
        .and_then(|s| Timestamp::from_second(s).ok())
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

/// The health writer's part of the status of `obj`, given the health the data plane
/// last reported about this very endpoint (uid already checked). Readiness is read from
/// the stored `Ready` condition, which the endpoint controller owns.
pub fn status(
    obj: &WebhookEndpoint,
    health: Option<&EndpointHealth>,
    now: &Time,
) -> WebhookEndpointStatus {
    let old = obj.status.clone().unwrap_or_default();
    let ready = conditions::is_true(&old.conditions, condition::READY);
    let mut status = WebhookEndpointStatus {
        state: state(ready, obj.spec.paused, health),
        ..Default::default()
    };
    if let Some(h) = health {
        let desired = health_fields(obj, h, &mut status);
        status.conditions =
            conditions::merge(&old.conditions, &desired, obj.metadata.generation, now);
    }
    status
}

/// The fields of `status` that [`status`] renders, to compare with its output.
pub fn owned(status: &WebhookEndpointStatus) -> WebhookEndpointStatus {
    WebhookEndpointStatus {
        conditions: status
            .conditions
            .iter()
            .filter(|c| c.type_ == condition::HEALTHY || c.type_ == condition::DISABLED)
            .cloned()
            .collect(),
        observed_generation: None,
        shard: None,
        ..status.clone()
    }
}

/// Copies health into `status`; returns the `Healthy` and `Disabled` conditions.
fn health_fields(
    obj: &WebhookEndpoint,
    h: &EndpointHealth,
    status: &mut WebhookEndpointStatus,
) -> [Desired; 2] {
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
            outcome: d.outcome.to_string(),
            latency_ms: d.latency_ms,
            time: time_ms(d.time_ms)?,
        })
    });
    [healthy(h, status), disabled(obj, h)]
}

/// `Healthy`: False when disabled, the circuit is open or the endpoint is degraded.
fn healthy(h: &EndpointHealth, status: &WebhookEndpointStatus) -> Desired {
    match (h.disabled_reason, h.circuit, h.state) {
        (Some(why), _, _) => Desired::new(
            condition::HEALTHY,
            false,
            why.as_str(),
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
    }
}

/// `Disabled`: True with the dispatcher's reason and how to re-enable.
fn disabled(obj: &WebhookEndpoint, h: &EndpointHealth) -> Desired {
    let Some(why) = h.disabled_reason else {
        return Desired::new(
            condition::DISABLED,
            false,
            reason::ENABLED,
            "deliveries are enabled",
        );
    };
    let detail = h
        .disabled_message
        .clone()
        .unwrap_or_else(|| "deliveries to this endpoint are stopped".into());
    Desired::new(
        condition::DISABLED,
        true,
        why.as_str(),
        format!(
            "{detail}. Events keep queueing. Re-enable once the receiver is fixed: {}",
            enable_hint(obj)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_core::dataplane::DisabledReason;
    use herald_core::v1alpha1::WebhookEndpointSpec;

    fn endpoint(ready: bool) -> WebhookEndpoint {
        let spec: WebhookEndpointSpec = serde_json::from_value(serde_json::json!({
            "url": "https://hooks.example.com/", "eventTypes": ["order.*"], "secretRef": {"name": "s"}
        }))
        .unwrap();
        let mut obj = WebhookEndpoint::new("orders", spec);
        obj.metadata.namespace = Some("shop".into());
        obj.metadata.uid = Some("u1".into());
        obj.metadata.generation = Some(3);
        let ready = Desired::new(condition::READY, ready, reason::ACCEPTED, "");
        obj.status = Some(WebhookEndpointStatus {
            conditions: conditions::merge(&[], &[ready], Some(3), &now()),
            ..Default::default()
        });
        obj
    }

    fn now() -> Time {
        Time(Timestamp::from_second(1_800_000_000).unwrap())
    }

    fn health(state: Option<EndpointState>, disabled: Option<DisabledReason>) -> EndpointHealth {
        EndpointHealth {
            uid: "u1".into(),
            state,
            disabled_reason: disabled,
            ..Default::default()
        }
    }

    #[test]
    fn formats_match_the_printer_columns() {
        assert_eq!(success_rate(998), "99.8%");
        assert_eq!(success_rate(1000), "100.0%");
        assert_eq!(latency(120), "120ms");
        assert_eq!(latency(2500), "2.5s");
    }

    #[test]
    fn state_is_decided_in_one_table() {
        use EndpointState::*;
        let degraded = health(Some(Degraded), None);
        let gone = health(Some(Active), Some(DisabledReason::Gone));
        let silent = health(None, None);
        let table: [(bool, bool, Option<&EndpointHealth>, Option<EndpointState>); 8] = [
            (false, false, Some(&degraded), None),
            (false, true, None, None),
            (true, false, None, Some(Pending)),
            (true, true, Some(&degraded), Some(Paused)),
            (true, true, Some(&gone), Some(Paused)),
            (true, false, Some(&gone), Some(Disabled)),
            (true, false, Some(&degraded), Some(Degraded)),
            (true, false, Some(&silent), Some(Active)),
        ];
        for (ready, paused, h, want) in table {
            assert_eq!(state(ready, paused, h), want, "{ready} {paused} {h:?}");
        }
    }

    #[test]
    fn a_ready_endpoint_without_health_is_pending_and_stable() {
        let obj = endpoint(true);
        let status = status(&obj, None, &now());
        assert_eq!(status.state, Some(EndpointState::Pending));
        assert!(status.conditions.is_empty());
        let mut again = obj.clone();
        let mut stored = obj.status.clone().unwrap();
        stored.state = status.state;
        again.status = Some(stored.clone());
        assert_eq!(owned(&stored), status);
        assert_eq!(
            super::status(&again, None, &now()),
            status,
            "rendering is stable"
        );
        assert_eq!(super::status(&endpoint(false), None, &now()).state, None);
    }

    #[test]
    fn times_are_whole_seconds_as_the_api_server_stores_them() {
        let mut h = health(Some(EndpointState::Active), None);
        h.oldest_pending_ms = Some(1_800_000_000_999);
        h.first_failure_ms = Some(1_800_000_001_001);
        let rendered = status(&endpoint(true), Some(&h), &now());
        let stored: WebhookEndpointStatus =
            serde_json::from_value(serde_json::to_value(&rendered).unwrap()).unwrap();
        assert_eq!(stored, rendered, "a round trip changes nothing");
        assert_eq!(
            rendered.oldest_pending.map(|t| t.0),
            Some(Timestamp::from_second(1_800_000_000).unwrap())
        );
        assert_eq!(
            rendered.first_failure.map(|t| t.0),
            Some(Timestamp::from_second(1_800_000_001).unwrap())
        );
    }

    #[test]
    fn disabled_health_tells_how_to_re_enable() {
        let mut health = health(None, Some(DisabledReason::Gone));
        health.disabled_message = Some("the receiver answered 410 Gone".into());
        health.success_permille = Some(0);
        let status = status(&endpoint(true), Some(&health), &now());
        assert_eq!(status.state, Some(EndpointState::Disabled));
        assert_eq!(status.success_rate.as_deref(), Some("0.0%"));
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
        assert!(conditions::find(&status.conditions, condition::READY).is_none());
    }
}
