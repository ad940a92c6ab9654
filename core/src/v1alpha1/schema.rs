//! Hand-written schema fragments for fields whose validation the derive cannot express.

use schemars::{Schema, SchemaGenerator, json_schema};

use crate::pattern;

/// `spec.eventTypes`: 1 to 64 patterns, each matching [`pattern::PATTERN_REGEX`].
pub fn event_type_patterns(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "minItems": 1,
        "maxItems": 64,
        "items": {
            "type": "string",
            "minLength": 1,
            "maxLength": pattern::MAX_LEN,
            "pattern": pattern::PATTERN_REGEX,
        },
        "x-kubernetes-list-type": "set",
    })
}

/// An optional event-type filter (replays): 0 to 64 patterns.
pub fn optional_event_type_patterns(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": 64,
        "items": {
            "type": "string",
            "minLength": 1,
            "maxLength": pattern::MAX_LEN,
            "pattern": pattern::PATTERN_REGEX,
        },
        "x-kubernetes-list-type": "set",
    })
}

/// `spec.delivery.redactResponseFields`: up to 16 JSON Pointers (RFC 6901), each with at
/// least one reference token (the empty pointer, the whole document, is refused).
pub fn json_pointers(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": 16,
        "items": {
            "type": "string",
            "maxLength": 256,
            "x-kubernetes-validations": [{
                "rule": "self.matches('^(/([^/~]|~[01])*)+$')",
                "message": "must be a JSON Pointer (RFC 6901) such as /user/email: '/' before each field, '~1' for a '/' and '~0' for a '~' inside a field name"
            }],
        },
        "x-kubernetes-list-type": "set",
    })
}

/// Status conditions, merged by `type` under server-side apply.
pub fn conditions(generator: &mut SchemaGenerator) -> Schema {
    let item =
        generator.subschema_for::<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>();
    json_schema!({
        "type": "array",
        "items": item,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
    })
}
