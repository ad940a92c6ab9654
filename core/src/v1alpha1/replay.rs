use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::schema;

/// A request to deliver past events to an endpoint again.
///
/// Replayed deliveries keep their original `webhook-id`, so receivers deduplicate them,
/// and they go through the endpoint's own scheduler and limits, so a bulk replay cannot
/// flatten a receiver or delay fresh events. The spec cannot change after creation:
/// create a new replay instead.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "herald.dev",
    doc = "A request to deliver past events to an endpoint again; see `kubectl explain webhookreplay.spec`.",
    version = "v1alpha1",
    kind = "WebhookReplay",
    plural = "webhookreplays",
    singular = "webhookreplay",
    shortname = "whr",
    category = "herald",
    namespaced,
    status = "WebhookReplayStatus",
    printcolumn = r#"{"name":"Endpoint","type":"string","jsonPath":".spec.endpoint"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Matched","type":"integer","jsonPath":".status.matched"}"#,
    printcolumn = r#"{"name":"Delivered","type":"integer","jsonPath":".status.delivered"}"#,
    printcolumn = r#"{"name":"Failed","type":"integer","jsonPath":".status.failed"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "self == oldSelf",
        "message": "a replay's spec cannot change after creation; create a new WebhookReplay"
    },
    {
        "rule": "!has(self.to) || self.from < self.to",
        "message": "from must be before to",
        "fieldPath": ".from"
    }
]))]
pub struct WebhookReplaySpec {
    /// Name of the `WebhookEndpoint` (same namespace) to deliver to.
    #[schemars(length(min = 1, max = 253))]
    pub endpoint: String,

    /// Replay events published at or after this time (RFC 3339), e.g.
    /// `2026-11-01T00:00:00Z`. Events older than the retention window (30 days by
    /// default) are gone.
    pub from: Time,

    /// Replay events published before this time. Default: the replay's creation time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<Time>,

    /// Only events of these types (same patterns as an endpoint's `eventTypes`). Default:
    /// every type the endpoint subscribes to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::optional_event_type_patterns")]
    pub event_types: Vec<String>,

    /// Only events whose delivery to this endpoint failed or is dead.
    #[serde(default)]
    pub only_failed: bool,

    /// Count what would be replayed, deliver nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// Progress of a replay.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookReplayStatus {
    /// `Ready` (the request is valid) and `Complete`, with reasons and messages.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::conditions")]
    pub conditions: Vec<Condition>,

    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Pending`, `Running`, `Completed` or `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<ReplayPhase>,

    /// Events in the range that match the filters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched: Option<u64>,

    /// Events queued for delivery again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enqueued: Option<u64>,

    /// Replayed events delivered successfully.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivered: Option<u64>,

    /// Replayed events whose delivery is dead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<u64>,

    /// When the replay started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,

    /// When it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
}

/// Phase of a replay.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ReplayPhase {
    /// Waiting to start (or waiting for a missing endpoint).
    Pending,
    /// Re-enqueueing and delivering.
    Running,
    /// Every matched event was re-enqueued and has a final outcome.
    Completed,
    /// The replay could not be carried out; see the conditions.
    Failed,
}
