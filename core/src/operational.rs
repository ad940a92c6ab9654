//! Herald's own operational events: what happens to a tenant's endpoints, published into
//! the tenant's namespace as ordinary events, so the tenant subscribes with an ordinary
//! `WebhookEndpoint` (to Slack, a pager, its own service), signed and retried like any
//! event.
//!
//! | type | when | `data` |
//! |---|---|---|
//! | `herald.endpoint.disabled` | the endpoint's `Disabled` condition turns True | `endpoint`, `reason`, `message` |
//! | `herald.endpoint.degraded` | its `Healthy` condition turns False while it is enabled | `endpoint`, `reason`, `message` |
//! | `herald.endpoint.recovered` | it is enabled again, or healthy again after being degraded | `endpoint`, `from` (`disabled` or `degraded`) |
//! | `herald.delivery.dead` | a delivery to it is given up | `endpoint`, `eventId`, `eventType`, `reason`, `attempts` |
//!
//! Contract: the builders are pure. Endpoint events come from status transitions, so
//! there is at most one per transition (and a replayed transition carries the same
//! `Nats-Msg-Id`, which JetStream's duplicate window drops); a dead delivery of an
//! operational event produces no `herald.delivery.dead` — an endpoint that fails to
//! receive operational events does not generate more of them about itself. The type
//! prefix `herald.` is Herald's: the HTTP ingest refuses it from producers.

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Value, json};

use crate::dataplane::event_subject;
use crate::names::condition;
use crate::v1alpha1::WebhookEndpointStatus;

/// The prefix of every operational event type.
pub const TYPE_PREFIX: &str = "herald.";
pub const ENDPOINT_DISABLED: &str = "herald.endpoint.disabled";
pub const ENDPOINT_DEGRADED: &str = "herald.endpoint.degraded";
pub const ENDPOINT_RECOVERED: &str = "herald.endpoint.recovered";
pub const DELIVERY_DEAD: &str = "herald.delivery.dead";

/// `data` of `herald.endpoint.disabled` and `herald.endpoint.degraded`.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointProblem {
    /// The `WebhookEndpoint`'s name (in the event's namespace).
    pub endpoint: String,
    /// The condition's reason: `Gone` or `SustainedFailure` (disabled), `Degraded` or
    /// `CircuitOpen` (degraded).
    pub reason: String,
    /// The condition's message, for a person.
    pub message: String,
}

/// What an endpoint recovered from.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum RecoveredFrom {
    Disabled,
    Degraded,
}

/// `data` of `herald.endpoint.recovered`.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointRecovered {
    /// The `WebhookEndpoint`'s name.
    pub endpoint: String,
    pub from: RecoveredFrom,
}

/// `data` of `herald.delivery.dead`.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryDead {
    /// The `WebhookEndpoint`'s name.
    pub endpoint: String,
    /// The id of the event whose delivery was given up (its `webhook-id`): redeliver or
    /// replay it by this id.
    pub event_id: String,
    /// Its type, when its body has one.
    pub event_type: Option<String>,
    /// `FinalStatus` (the receiver answered one of `finalStatusCodes`) or
    /// `RetriesExhausted` (the retry schedule or deadline is spent).
    pub reason: String,
    /// Attempts made.
    pub attempts: u32,
}

/// The JSON Schema of each operational event type: the body a receiver gets
/// (`{"type", "timestamp", "data"}`), by type. `docs/operational-events/` holds them.
pub fn schemas() -> Vec<(&'static str, Value)> {
    fn body<T: JsonSchema>(event_type: &str, about: &str) -> Value {
        let mut data = serde_json::to_value(schemars::schema_for!(T)).unwrap_or_default();
        if let Some(object) = data.as_object_mut() {
            object.remove("$schema");
        }
        one_line_descriptions(&mut data);
        json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": format!("https://herald.dev/schemas/{event_type}.json"),
            "title": event_type,
            "description": about,
            "type": "object",
            "required": ["type", "timestamp", "data"],
            "properties": {
                "type": {"const": event_type},
                "timestamp": {"type": "string", "format": "date-time"},
                "data": data,
            },
        })
    }
    vec![
        (
            ENDPOINT_DISABLED,
            body::<EndpointProblem>(
                ENDPOINT_DISABLED,
                "The endpoint was disabled: deliveries to it stop and events keep queueing.",
            ),
        ),
        (
            ENDPOINT_DEGRADED,
            body::<EndpointProblem>(
                ENDPOINT_DEGRADED,
                "Deliveries to the endpoint fail or are slow, or its circuit opened.",
            ),
        ),
        (
            ENDPOINT_RECOVERED,
            body::<EndpointRecovered>(
                ENDPOINT_RECOVERED,
                "The endpoint is enabled again, or healthy again after being degraded.",
            ),
        ),
        (
            DELIVERY_DEAD,
            body::<DeliveryDead>(
                DELIVERY_DEAD,
                "A delivery to the endpoint was given up; it stays in the delivery log and can be redelivered or replayed.",
            ),
        ),
    ]
}

/// Doc comments' line breaks are not sentences' ends.
fn one_line_descriptions(value: &mut Value) {
    match value {
        Value::Object(object) => {
            for (key, value) in object.iter_mut() {
                match value {
                    Value::String(text) if key == "description" => {
                        *text = text.split_whitespace().collect::<Vec<_>>().join(" ");
                    }
                    other => one_line_descriptions(other),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(one_line_descriptions),
        _ => {}
    }
}

fn data(value: impl Serialize) -> Value {
    serde_json::to_value(value).unwrap_or_default()
}

/// Whether `event_type` is one of Herald's own: its first segment is `herald`.
pub fn is_operational(event_type: &str) -> bool {
    event_type.split('.').next() == Some("herald")
}

/// One operational event, ready to publish.
#[derive(Debug, Clone, PartialEq)]
pub struct OperationalEvent {
    pub namespace: String,
    pub event_type: &'static str,
    pub data: Value,
    /// `Nats-Msg-Id`: the same for the same occurrence, so a second publish of it (a new
    /// operator leader, a retry) is dropped as a duplicate.
    pub msg_id: String,
}

impl OperationalEvent {
    /// `herald.events.<namespace>.<type>`.
    pub fn subject(&self) -> String {
        event_subject(&self.namespace, self.event_type)
    }

    /// The body a producer would publish: `{"type", "data"}`.
    pub fn body(&self) -> Vec<u8> {
        serde_json::to_vec(&json!({"type": self.event_type, "data": self.data})).unwrap_or_default()
    }

    /// Publishes the event to the event store and waits for JetStream's acknowledgement
    /// (at most `timeout`), with its `Nats-Msg-Id`.
    pub async fn publish(
        &self,
        js: &async_nats::jetstream::Context,
        timeout: std::time::Duration,
    ) -> Result<(), async_nats::Error> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, self.msg_id.as_str());
        let publish = async {
            js.publish_with_headers(self.subject(), headers, self.body().into())
                .await?
                .await?;
            Ok::<(), async_nats::Error>(())
        };
        tokio::time::timeout(timeout, publish)
            .await
            .map_err(|_| "no acknowledgement in time")?
    }
}

fn condition_of<'a>(
    status: &'a WebhookEndpointStatus,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    status.conditions.iter().find(|c| c.type_ == type_)
}

fn is(status: &WebhookEndpointStatus, type_: &str, value: &str) -> bool {
    condition_of(status, type_).is_some_and(|c| c.status == value)
}

/// The operational events of an endpoint's status going from `old` to `new`.
pub fn endpoint_transitions(
    namespace: &str,
    endpoint: &str,
    old: &WebhookEndpointStatus,
    new: &WebhookEndpointStatus,
) -> Vec<OperationalEvent> {
    let event = |event_type: &'static str, since: Option<&str>, data: Value| OperationalEvent {
        namespace: namespace.to_owned(),
        event_type,
        data,
        msg_id: format!(
            "herald-op.{namespace}.{endpoint}.{event_type}.{}",
            since.unwrap_or("-")
        ),
    };
    let since = |type_: &str| {
        condition_of(new, type_).map(|c| c.last_transition_time.0.as_second().to_string())
    };
    let described = |type_: &str, event_type: &'static str| {
        let c = condition_of(new, type_)?;
        let problem = EndpointProblem {
            endpoint: endpoint.to_owned(),
            reason: c.reason.clone(),
            message: c.message.clone(),
        };
        Some(event(event_type, since(type_).as_deref(), data(problem)))
    };
    let recovered = |from| {
        data(EndpointRecovered {
            endpoint: endpoint.to_owned(),
            from,
        })
    };
    let mut events = Vec::new();
    let (was_disabled, disabled) = (
        is(old, condition::DISABLED, "True"),
        is(new, condition::DISABLED, "True"),
    );
    if !was_disabled && disabled {
        events.extend(described(condition::DISABLED, ENDPOINT_DISABLED));
    } else if was_disabled && !disabled {
        events.push(event(
            ENDPOINT_RECOVERED,
            since(condition::DISABLED).as_deref(),
            recovered(RecoveredFrom::Disabled),
        ));
    } else if !disabled {
        let (was_unhealthy, unhealthy) = (
            is(old, condition::HEALTHY, "False"),
            is(new, condition::HEALTHY, "False"),
        );
        if !was_unhealthy && unhealthy {
            events.extend(described(condition::HEALTHY, ENDPOINT_DEGRADED));
        } else if was_unhealthy && is(new, condition::HEALTHY, "True") {
            events.push(event(
                ENDPOINT_RECOVERED,
                since(condition::HEALTHY).as_deref(),
                recovered(RecoveredFrom::Degraded),
            ));
        }
    }
    events
}

/// `herald.delivery.dead` for a delivery to `endpoint` given up; `None` when the dead
/// event is itself operational (no event about failing to deliver one).
pub fn delivery_dead(
    namespace: &str,
    endpoint: &str,
    event_id: &str,
    event_type: Option<&str>,
    reason: &str,
    attempts: u32,
) -> Option<OperationalEvent> {
    if event_type.is_some_and(is_operational) {
        return None;
    }
    Some(OperationalEvent {
        namespace: namespace.to_owned(),
        event_type: DELIVERY_DEAD,
        data: data(DeliveryDead {
            endpoint: endpoint.to_owned(),
            event_id: event_id.to_owned(),
            event_type: event_type.map(str::to_owned),
            reason: reason.to_owned(),
            attempts,
        }),
        msg_id: format!("herald-op.{namespace}.{endpoint}.dead.{event_id}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(conditions: &[(&str, &str, &str, i64)]) -> WebhookEndpointStatus {
        serde_json::from_value(json!({
            "conditions": conditions.iter().map(|(t, s, r, at)| json!({
                "type": t, "status": s, "reason": r, "message": format!("{r} happened"),
                "lastTransitionTime": jiff::Timestamp::from_second(*at).unwrap().to_string(),
            })).collect::<Vec<_>>()
        }))
        .unwrap()
    }

    fn types(events: &[OperationalEvent]) -> Vec<&str> {
        events.iter().map(|e| e.event_type).collect()
    }

    #[test]
    fn transitions_give_one_event_each() {
        let healthy = status(&[("Healthy", "True", "Delivering", 10)]);
        let degraded = status(&[("Healthy", "False", "CircuitOpen", 20)]);
        let disabled = status(&[
            ("Healthy", "False", "Gone", 30),
            ("Disabled", "True", "Gone", 30),
        ]);
        let enabled = status(&[
            ("Healthy", "True", "Delivering", 40),
            ("Disabled", "False", "Enabled", 40),
        ]);
        let t = |a, b| endpoint_transitions("shop", "orders", a, b);
        assert_eq!(types(&t(&healthy, &degraded)), [ENDPOINT_DEGRADED]);
        assert_eq!(types(&t(&degraded, &degraded)), Vec::<&str>::new());
        assert_eq!(types(&t(&degraded, &healthy)), [ENDPOINT_RECOVERED]);
        assert_eq!(types(&t(&degraded, &disabled)), [ENDPOINT_DISABLED]);
        assert_eq!(types(&t(&disabled, &disabled)), Vec::<&str>::new());
        assert_eq!(types(&t(&disabled, &enabled)), [ENDPOINT_RECOVERED]);
        let down = &t(&healthy, &disabled)[0];
        assert_eq!(
            down.subject(),
            "herald.events.shop.herald.endpoint.disabled"
        );
        assert_eq!(down.data["reason"], "Gone");
        assert_eq!(
            down.msg_id,
            "herald-op.shop.orders.herald.endpoint.disabled.30"
        );
        let body: Value = serde_json::from_slice(&down.body()).unwrap();
        assert_eq!(body["type"], ENDPOINT_DISABLED);
        assert_eq!(body["data"]["endpoint"], "orders");
        // The same transition seen twice carries the same id.
        assert_eq!(t(&healthy, &disabled)[0].msg_id, down.msg_id);
    }

    #[test]
    fn a_dead_operational_event_makes_no_event() {
        assert!(
            delivery_dead("shop", "ops", "evt_1", Some(ENDPOINT_DISABLED), "Final", 1).is_none()
        );
        let dead =
            delivery_dead("shop", "orders", "evt_2", Some("order.paid"), "Final", 3).unwrap();
        assert_eq!(dead.subject(), "herald.events.shop.herald.delivery.dead");
        assert_eq!(dead.data["eventType"], "order.paid");
        assert_eq!(dead.data["attempts"], 3);
    }

    /// `docs/operational-events/<type>.json` is what [`schemas`] gives (regenerate with
    /// `HERALD_WRITE_SCHEMAS=1 cargo test -p herald-core operational`), and every event
    /// the builders make has the fields its schema requires.
    #[test]
    fn the_committed_schemas_are_the_generated_ones() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operational-events");
        for (event_type, schema) in schemas() {
            let path = dir.join(format!("{event_type}.json"));
            let text = serde_json::to_string_pretty(&schema).unwrap() + "\n";
            if std::env::var_os("HERALD_WRITE_SCHEMAS").is_some() {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&path, &text).unwrap();
            }
            let committed = std::fs::read_to_string(&path).unwrap_or_default();
            assert_eq!(
                committed,
                text,
                "{} differs; HERALD_WRITE_SCHEMAS=1 rewrites it",
                path.display()
            );
        }
        let healthy = status(&[("Healthy", "True", "Delivering", 10)]);
        let disabled = status(&[
            ("Healthy", "False", "Gone", 30),
            ("Disabled", "True", "Gone", 30),
        ]);
        let degraded = status(&[("Healthy", "False", "Degraded", 20)]);
        let mut events = endpoint_transitions("shop", "orders", &healthy, &disabled);
        events.extend(endpoint_transitions("shop", "orders", &healthy, &degraded));
        events.extend(endpoint_transitions("shop", "orders", &disabled, &healthy));
        events.extend(delivery_dead(
            "shop",
            "orders",
            "evt_1",
            Some("order.paid"),
            "FinalStatus",
            1,
        ));
        let schemas = schemas();
        for event in events {
            let (_, schema) = schemas
                .iter()
                .find(|(t, _)| *t == event.event_type)
                .unwrap();
            let data = &schema["properties"]["data"];
            for field in data["required"].as_array().unwrap() {
                let field = field.as_str().unwrap();
                assert!(
                    event.data.get(field).is_some(),
                    "{}: no {field}",
                    event.event_type
                );
            }
            for field in event.data.as_object().unwrap().keys() {
                assert!(
                    data["properties"].get(field).is_some(),
                    "{}: {field} not in the schema",
                    event.event_type
                );
            }
        }
    }
}
