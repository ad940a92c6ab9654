//! The OpenAPI document: `api/openapi.yaml`, committed and compiled in, served as JSON at
//! `/openapi.json`. A unit test holds it to the route table, and [`check`] (a small
//! validator for the subset of JSON Schema the document uses: `$ref`, `type`,
//! `nullable`, `required`, `properties`, `items`, `enum`) lets the e2e test validate
//! real responses against it.

use serde_json::Value;

/// The document as committed.
pub const YAML: &str = include_str!("../openapi.yaml");

/// The document as JSON.
pub fn document() -> Value {
    serde_norway::from_str(YAML).expect("api/openapi.yaml is valid YAML (unit-tested)")
}

fn resolve<'a>(doc: &'a Value, mut value: &'a Value) -> &'a Value {
    while let Some(reference) = value.get("$ref").and_then(Value::as_str) {
        let pointer = reference.trim_start_matches('#');
        match doc.pointer(pointer) {
            Some(target) => value = target,
            None => break,
        }
    }
    value
}

/// The JSON schema of the response `status` of `method` (lower case) on `path`.
pub fn response_schema<'a>(
    doc: &'a Value,
    method: &str,
    path: &str,
    status: u16,
) -> Option<&'a Value> {
    let operation = doc.get("paths")?.get(path)?.get(method)?;
    let response = resolve(doc, operation.get("responses")?.get(status.to_string())?);
    response
        .get("content")?
        .get("application/json")?
        .get("schema")
}

/// Every way `value` differs from `schema` (empty: it validates).
pub fn check(doc: &Value, schema: &Value, value: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    walk(doc, schema, value, "$", &mut problems);
    problems
}

fn walk(doc: &Value, schema: &Value, value: &Value, at: &str, out: &mut Vec<String>) {
    let schema = resolve(doc, schema);
    if value.is_null() {
        if schema.get("nullable") != Some(&Value::Bool(true)) && schema.get("type").is_some() {
            out.push(format!("{at}: null, but not nullable"));
        }
        return;
    }
    if let Some(ty) = schema.get("type").and_then(Value::as_str) {
        let fits = match ty {
            "object" => value.is_object(),
            "array" => value.is_array(),
            "string" => value.is_string(),
            "integer" => value.is_u64() || value.is_i64(),
            "number" => value.is_number(),
            "boolean" => value.is_boolean(),
            _ => true,
        };
        if !fits {
            out.push(format!("{at}: {value} is not of type {ty}"));
            return;
        }
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        out.push(format!("{at}: {value} is not one of {allowed:?}"));
    }
    if let Some(required) = schema.get("required").and_then(Value::as_array) {
        for name in required.iter().filter_map(Value::as_str) {
            if value.get(name).is_none() {
                out.push(format!("{at}: required {name:?} is missing"));
            }
        }
    }
    if let (Some(properties), Some(object)) = (
        schema.get("properties").and_then(Value::as_object),
        value.as_object(),
    ) {
        for (name, sub) in properties {
            if let Some(v) = object.get(name) {
                walk(doc, sub, v, &format!("{at}.{name}"), out);
            }
        }
    }
    if let (Some(items), Some(array)) = (schema.get("items"), value.as_array()) {
        for (i, v) in array.iter().enumerate() {
            walk(doc, items, v, &format!("{at}[{i}]"), out);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::routes::ROUTES;

    #[test]
    fn the_document_describes_exactly_the_routes_of_the_router() {
        let doc = document();
        assert_eq!(doc["openapi"].as_str().map(|v| &v[..2]), Some("3."));
        let mut documented = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for method in item.as_object().unwrap().keys() {
                documented.insert((method.to_uppercase(), path.clone()));
            }
        }
        let routed: BTreeSet<(String, String)> = ROUTES
            .iter()
            .map(|(m, p, _)| (m.as_str().to_owned(), (*p).to_owned()))
            .collect();
        assert_eq!(documented, routed);
        // Each operation is named after its route, and every reference resolves.
        for (method, path, name) in ROUTES {
            let op = &doc["paths"][*path][method.as_str().to_lowercase()];
            assert_eq!(op["operationId"].as_str(), Some(*name), "{path}");
        }
        let text = serde_json::to_string(&doc).unwrap();
        for reference in text.split("\"$ref\":\"#").skip(1) {
            let pointer = reference.split('"').next().unwrap();
            assert!(doc.pointer(pointer).is_some(), "dangling $ref {pointer}");
        }
    }

    #[test]
    fn the_validator_finds_missing_and_mistyped_fields() {
        let doc = document();
        let schema = response_schema(
            &doc,
            "get",
            "/v1/namespaces/{ns}/endpoints/{name}/deliveries",
            200,
        )
        .unwrap();
        let good = serde_json::json!({"items": [{"eventId": "msg_1", "type": "a", "state": "dead",
            "attempts": 3, "lastStatus": null, "lastLatencyMs": 5, "lastAttemptTime": "t",
            "nextAttemptTime": null}], "nextCursor": null});
        assert_eq!(check(&doc, schema, &good), Vec::<String>::new());
        let bad = serde_json::json!({"items": [{"eventId": 1, "state": "gone"}]});
        let problems = check(&doc, schema, &bad);
        assert!(
            problems.iter().any(|p| p.contains("nextCursor")),
            "{problems:?}"
        );
        assert!(
            problems.iter().any(|p| p.contains("eventId")),
            "{problems:?}"
        );
        assert!(problems.iter().any(|p| p.contains("gone")), "{problems:?}");
        let error = response_schema(&doc, "post", "/v1/namespaces/{ns}/events", 413).unwrap();
        let body = serde_json::json!({"error": {"code": "TooLarge", "message": "m"}});
        assert!(check(&doc, error, &body).is_empty());
    }

    /// The values of the enum at `pointer` in the document.
    fn enum_at(doc: &Value, pointer: &str) -> Vec<String> {
        doc.pointer(pointer)
            .and_then(Value::as_array)
            .unwrap_or_else(|| panic!("no enum at {pointer}"))
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn the_shared_answer_types_are_what_the_document_says() {
        use herald_core::api::{
            Attempt, Delivery, DeliveryDetail, EventAccepted, Limit, Page, Queued, Redrive, State,
            Truncated, time,
        };
        use herald_core::dataplane::{AttemptOutcome, DeliveryState};
        let doc = document();
        assert_eq!(
            enum_at(&doc, "/components/schemas/State/enum"),
            State::ALL.map(|s| s.as_str().to_owned())
        );
        assert_eq!(
            enum_at(&doc, "/components/schemas/Attempt/properties/outcome/enum"),
            AttemptOutcome::ALL.map(|o| o.as_str().to_owned())
        );
        assert_eq!(
            enum_at(&doc, "/components/schemas/Truncated/properties/limit/enum"),
            Limit::ALL.map(|l| l.as_str().to_owned())
        );
        let states = [
            DeliveryState::Succeeded,
            DeliveryState::Retrying,
            DeliveryState::Dead,
        ];
        assert_eq!(
            enum_at(&doc, "/components/schemas/Attempt/properties/state/enum"),
            states.map(|s| s.as_str().to_owned())
        );
        // Every answer, with each optional field both set and unset, validates.
        let when = time::from_ms(1_764_583_200_123);
        let at = Some(when);
        let deliveries = "/v1/namespaces/{ns}/endpoints/{name}/deliveries";
        let delivery = |set: bool| Delivery {
            event_id: "msg_1".into(),
            event_type: set.then(|| "order.created".to_owned()),
            state: State::Retrying.into(),
            attempts: 2,
            last_status: set.then_some(500),
            last_latency_ms: set.then_some(12),
            last_attempt_time: at.filter(|_| set),
            next_attempt_time: at.filter(|_| set),
        };
        let attempt = |set: bool| Attempt {
            attempt: 1,
            time: when,
            outcome: AttemptOutcome::Timeout.into(),
            status: set.then_some(500),
            latency_ms: 3,
            response: String::new(),
            state: Some(DeliveryState::Dead.into()),
            next_attempt_time: at.filter(|_| set),
            request_headers: if set {
                vec![herald_core::api::HeaderField {
                    name: "webhook-signature".into(),
                    value: "v1,[redacted]".into(),
                }]
            } else {
                Vec::new()
            },
            response_headers: if set {
                vec![herald_core::api::HeaderField {
                    name: "content-type".into(),
                    value: "text/plain".into(),
                }]
            } else {
                Vec::new()
            },
        };
        let answers: Vec<(&str, String, u16, Value)> = [true, false]
            .into_iter()
            .flat_map(|set| {
                let truncated = set.then(|| Truncated {
                    limit: Limit::Records.into(),
                    read_back_to: at,
                });
                let page = Page {
                    items: vec![delivery(set)],
                    next_cursor: set.then(|| "v1.1.1.msg_1".to_owned()),
                    truncated: truncated.clone(),
                };
                let detail = DeliveryDetail {
                    event_id: "msg_1".into(),
                    event_type: set.then(|| "order.created".to_owned()),
                    state: State::Dead.into(),
                    next_attempt_time: at.filter(|_| set),
                    attempts: vec![attempt(set)],
                    request_body: set.then(|| herald_core::api::RequestBody::of(b"{}")),
                    truncated: truncated.clone(),
                };
                [
                    (
                        "get",
                        deliveries.to_owned(),
                        200,
                        serde_json::to_value(page),
                    ),
                    (
                        "get",
                        format!("{deliveries}/{{eventId}}"),
                        200,
                        serde_json::to_value(detail),
                    ),
                    (
                        "post",
                        "/v1/namespaces/{ns}/endpoints/{name}/redrive-dead".to_owned(),
                        202,
                        serde_json::to_value(Redrive {
                            request_id: "req_1".into(),
                            count: 1,
                            event_ids: vec!["msg_1".into()],
                            skipped: vec![],
                            truncated: truncated.map(|_| Truncated {
                                limit: Limit::Count.into(),
                                read_back_to: None,
                            }),
                        }),
                    ),
                ]
            })
            .chain([
                (
                    "post",
                    "/v1/namespaces/{ns}/events".to_owned(),
                    202,
                    serde_json::to_value(EventAccepted {
                        event_id: "msg_1".into(),
                        duplicate: false,
                    }),
                ),
                (
                    "post",
                    "/v1/namespaces/{ns}/endpoints/{name}/redeliver/{eventId}".to_owned(),
                    202,
                    serde_json::to_value(Queued {
                        event_id: "msg_1".into(),
                        request_id: "req_1".into(),
                    }),
                ),
                (
                    "post",
                    "/v1/namespaces/{ns}/endpoints/{name}/test".to_owned(),
                    202,
                    serde_json::to_value(Queued {
                        event_id: "msg_1".into(),
                        request_id: "req_1".into(),
                    }),
                ),
            ])
            .map(|(method, path, status, value)| (method, path, status, value.unwrap()))
            .collect();
        for (method, path, status, value) in &answers {
            let schema = response_schema(&doc, method, path, *status)
                .unwrap_or_else(|| panic!("{method} {path} {status} is documented"));
            assert_eq!(
                check(&doc, schema, value),
                Vec::<String>::new(),
                "{method} {path}: {value}"
            );
        }
    }
}
