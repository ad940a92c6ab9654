//! The JSON of Herald's API as the plugin reads it: the contract's camelCase fields,
//! times in RFC 3339, `null` for what is not known (yet). Fields this version does not
//! know are ignored here and kept in the raw JSON `-o json` prints.

use jiff::Timestamp;
use serde::{Deserialize, Deserializer};

/// A string the API may send as `null`: empty then.
fn null_as_empty<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}

/// One delivery (an event to this endpoint) as the log lists it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Delivery {
    pub event_id: String,
    /// Empty when the API does not know it (`null`: an event past retention whose
    /// attempt records predate the type field).
    #[serde(rename = "type", default, deserialize_with = "null_as_empty")]
    pub event_type: String,
    /// `pending`, `inFlight`, `succeeded`, `retrying` or `dead`.
    pub state: String,
    #[serde(default)]
    pub attempts: u32,
    #[serde(default)]
    pub last_status: Option<u16>,
    #[serde(default)]
    pub last_latency_ms: Option<f64>,
    #[serde(default)]
    pub last_attempt_time: Option<Timestamp>,
    #[serde(default)]
    pub next_attempt_time: Option<Timestamp>,
}

/// A page of the delivery log, newest first.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Page {
    pub items: Vec<Delivery>,
    #[serde(default)]
    pub next_cursor: Option<String>,
}

/// One delivery with every attempt.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryDetail {
    pub event_id: String,
    /// Empty when the API does not know it (`null`: an event past retention whose
    /// attempt records predate the type field).
    #[serde(rename = "type", default, deserialize_with = "null_as_empty")]
    pub event_type: String,
    pub state: String,
    #[serde(default)]
    pub attempts: Vec<Attempt>,
}

/// One attempt of a delivery.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attempt {
    pub attempt: u32,
    #[serde(default)]
    pub time: Option<Timestamp>,
    #[serde(default)]
    pub outcome: String,
    #[serde(default)]
    pub status: Option<u16>,
    #[serde(default)]
    pub latency_ms: Option<f64>,
    #[serde(default)]
    pub response: Option<String>,
}

/// What a POST that queues work answered (202).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Accepted {
    #[serde(default)]
    pub event_id: Option<String>,
    #[serde(default)]
    pub request_id: Option<String>,
    #[serde(default)]
    pub count: Option<u64>,
    #[serde(default)]
    pub event_ids: Vec<String>,
}

/// Filters of the delivery log.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Query {
    pub status: Option<String>,
    pub event_type: Option<String>,
    pub since: Option<Timestamp>,
    pub until: Option<Timestamp>,
    pub limit: Option<u32>,
    pub cursor: Option<String>,
}

impl Query {
    /// The query string pairs, in the contract's names.
    pub fn pairs(&self) -> Vec<(&'static str, String)> {
        let Self {
            status,
            event_type,
            since,
            until,
            limit,
            cursor,
        } = self;
        [
            ("status", status.clone()),
            ("type", event_type.clone()),
            ("since", since.map(|t| t.to_string())),
            ("until", until.map(|t| t.to_string())),
            ("limit", limit.map(|l| l.to_string())),
            ("cursor", cursor.clone()),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v?)))
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_type_reads_as_empty() {
        let d: Delivery = serde_json::from_value(serde_json::json!({
            "eventId": "evt_1", "type": null, "state": "dead", "attempts": 3,
        }))
        .unwrap();
        assert_eq!((d.event_type.as_str(), d.state.as_str()), ("", "dead"));
    }

    #[test]
    fn query_pairs_use_the_contract_names_and_skip_unset_ones() {
        let q = Query {
            status: Some("dead".into()),
            event_type: Some("order.created".into()),
            since: Some("2026-12-01T10:00:00Z".parse().unwrap()),
            limit: Some(20),
            ..Default::default()
        };
        assert_eq!(
            q.pairs(),
            vec![
                ("status", "dead".to_owned()),
                ("type", "order.created".to_owned()),
                ("since", "2026-12-01T10:00:00Z".to_owned()),
                ("limit", "20".to_owned()),
            ]
        );
        assert!(Query::default().pairs().is_empty());
    }

    #[test]
    fn deliveries_decode_with_nulls_and_unknown_fields() {
        let page: Page = serde_json::from_value(serde_json::json!({
            "items": [
                {"eventId": "e1", "type": "order.created", "state": "succeeded", "attempts": 1,
                 "lastStatus": 200, "lastLatencyMs": 12, "lastAttemptTime": "2026-12-01T10:00:00Z",
                 "nextAttemptTime": null, "future": true},
                {"eventId": "e2", "type": "order.paid", "state": "pending", "attempts": 0,
                 "lastStatus": null, "lastLatencyMs": null, "lastAttemptTime": null,
                 "nextAttemptTime": null}
            ],
            "nextCursor": null
        }))
        .unwrap();
        assert_eq!(page.items.len(), 2);
        assert_eq!(page.items[0].last_status, Some(200));
        assert_eq!(page.items[1].last_attempt_time, None);
        assert!(page.next_cursor.is_none());
    }
}
