//! The JSON of Herald's API as the plugin reads it: the answers are
//! [`herald_core::api`]'s types, the ones herald-api writes (values this version does not
//! know are kept as their text; fields it does not know are ignored here and kept in the
//! raw JSON `-o json` prints). The query is the plugin's own.

use jiff::Timestamp;

pub use herald_core::api::{
    Attempt, Delivery, DeliveryDetail, HeaderField, Lenient, Page, Queued, Redrive, State,
};

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
    fn an_unknown_type_reads_as_none() {
        let d: Delivery = serde_json::from_value(serde_json::json!({
            "eventId": "evt_1", "type": null, "state": "dead", "attempts": 3,
        }))
        .unwrap();
        assert_eq!(d.event_type, None);
        assert_eq!(d.state, Lenient::Known(State::Dead));
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
