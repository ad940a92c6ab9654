//! Redaction shared by everything that shows what Herald sent or received: the attempt
//! log's response snippet (the dispatcher) and a delivery's request body (herald-api)
//! follow the endpoint's `redactResponseFields` the same way.

use serde_json::Value;

/// What a redacted value reads.
pub const REDACTED: &str = "[redacted]";

/// Replaces the value at each JSON Pointer (RFC 6901) of `fields` in `json` by
/// [`REDACTED`]; a pointer that matches nothing is ignored.
pub fn json_fields(json: &mut Value, fields: &[String]) {
    for field in fields {
        if let Some(value) = json.pointer_mut(field) {
            *value = Value::String(REDACTED.to_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_pointer_is_replaced_and_one_that_matches_nothing_is_ignored() {
        let mut doc = json!({"data": {"card": "4242", "items": [{"sku": "a"}]}, "type": "x"});
        json_fields(
            &mut doc,
            &[
                "/data/card".into(),
                "/data/items/0/sku".into(),
                "/nope".into(),
            ],
        );
        assert_eq!(
            doc,
            json!({"data": {"card": REDACTED, "items": [{"sku": REDACTED}]}, "type": "x"})
        );
    }
}
