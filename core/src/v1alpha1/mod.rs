//! The `herald.dev/v1alpha1` API: `WebhookEndpoint`, `SigningSecret` and `WebhookReplay`.
//!
//! Doc comments on every field are written for the user: they become the CRD
//! descriptions that `kubectl explain` prints. Validation the API server can do itself
//! (OpenAPI schema and CEL rules) lives here too, so invalid specs are refused at
//! `kubectl apply` with a message naming the field.

mod endpoint;
mod replay;
mod schema;
mod signing_secret;

pub use endpoint::*;
pub use replay::*;
pub use signing_secret::*;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A reference to another Herald object in the same namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct LocalRef {
    /// Name of the object, in the same namespace as the referring resource.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

impl LocalRef {
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration as StdDuration;

    #[test]
    fn a_minimal_endpoint_gets_the_documented_defaults() {
        let spec: WebhookEndpointSpec = serde_json::from_value(serde_json::json!({
            "url": "https://hooks.example.com/herald",
            "eventTypes": ["order.*"],
            "secretRef": {"name": "orders"}
        }))
        .unwrap();
        let d = &spec.delivery;
        assert_eq!(d.timeout.get(), StdDuration::from_secs(15));
        assert_eq!(d.max_in_flight, 16);
        assert!(d.disable_on_gone);
        assert_eq!(d.disable_after.get(), StdDuration::from_secs(72 * 3600));
        assert!(d.retry.exponential.is_none() && d.retry.schedule.is_none());
        assert_eq!(d.circuit_breaker.failure_threshold, 10);
        assert!(!spec.ordered && !spec.paused && spec.headers.is_empty());
    }

    #[test]
    fn a_full_endpoint_round_trips() {
        let yaml = serde_json::json!({
            "url": "https://hooks.example.com/herald",
            "eventTypes": ["order.created", "invoice.*"],
            "secretRef": {"name": "orders"},
            "ordered": true,
            "orderingKey": "/data/customerId",
            "paused": false,
            "delivery": {
                "timeout": "5s",
                "maxInFlight": 4,
                "rateLimit": {"perSecond": 50},
                "retry": {"schedule": ["5s", "5m", "1h"]},
                "finalStatusCodes": [400, 422],
                "disableOnGone": false,
                "disableAfter": "24h",
                "circuitBreaker": {"failureThreshold": 5, "probeInterval": "1m"}
            },
            "headers": [{"name": "X-Tenant", "value": "shop"}]
        });
        let spec: WebhookEndpointSpec = serde_json::from_value(yaml.clone()).unwrap();
        assert_eq!(serde_json::to_value(&spec).unwrap(), yaml);
    }

    #[test]
    fn bad_durations_are_refused_naming_the_value() {
        let err =
            serde_json::from_value::<DeliveryPolicy>(serde_json::json!({"timeout": "5 seconds"}))
                .unwrap_err()
                .to_string();
        assert!(err.contains("5 seconds"), "{err}");
    }

    #[test]
    fn status_serializes_without_empty_fields() {
        let status = WebhookEndpointStatus {
            state: Some(EndpointState::Active),
            backlog: Some(0),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&status).unwrap(),
            serde_json::json!({"state": "Active", "backlog": 0})
        );
    }
}
