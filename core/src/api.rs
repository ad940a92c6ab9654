//! The HTTP API's answers, one set of types for both ends: herald-api serializes them,
//! `kubectl herald` reads them. `api/openapi.yaml` describes the same JSON, and a test
//! of herald-api holds every enum here to the document's lists.
//!
//! Enums arrive as [`Lenient`]: a value this version does not know is kept as its text
//! (and printed as it came), so an older plugin keeps working against a newer API. Times
//! are RFC 3339 in UTC with milliseconds; any RFC 3339 time is read.

use std::fmt;
use std::sync::Arc;

use jiff::Timestamp;
use serde::de::{DeserializeOwned, IntoDeserializer};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::dataplane::{AttemptOutcome, DeliveryState};

/// A value of `T` as the wire carries it, or the text of one this version does not know.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Lenient<T> {
    Known(T),
    Unknown(String),
}

impl<T> Lenient<T> {
    /// The value, when this version knows it.
    pub fn known(&self) -> Option<&T> {
        match self {
            Self::Known(value) => Some(value),
            Self::Unknown(_) => None,
        }
    }
}

impl<T> From<T> for Lenient<T> {
    fn from(value: T) -> Self {
        Self::Known(value)
    }
}

impl<T: fmt::Display> fmt::Display for Lenient<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Known(value) => value.fmt(f),
            Self::Unknown(text) => f.write_str(text),
        }
    }
}

impl<T: Serialize> Serialize for Lenient<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Known(value) => value.serialize(serializer),
            Self::Unknown(text) => serializer.serialize_str(text),
        }
    }
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Lenient<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        let known: Result<T, serde::de::value::Error> =
            T::deserialize(text.as_str().into_deserializer());
        Ok(known.map_or(Self::Unknown(text), Self::Known))
    }
}

/// Where a delivery (one event to one endpoint) stands, as the delivery log shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum State {
    /// Queued, no attempt logged yet.
    Pending,
    /// Attempted before and back in the pipeline (a retry due, a redelivery, a replay).
    InFlight,
    Succeeded,
    /// Failed; another attempt is scheduled.
    Retrying,
    /// Given up; replayable.
    Dead,
}

impl State {
    pub const ALL: [Self; 5] = [
        Self::Pending,
        Self::InFlight,
        Self::Succeeded,
        Self::Retrying,
        Self::Dead,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::InFlight => "inFlight",
            Self::Succeeded => "succeeded",
            Self::Retrying => "retrying",
            Self::Dead => "dead",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One delivery as the log lists it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Delivery {
    pub event_id: Arc<str>,
    /// `null` only for records written before Herald logged the type, of an event past
    /// the retention window.
    #[serde(rename = "type", default)]
    pub event_type: Option<String>,
    pub state: Lenient<State>,
    #[serde(default)]
    pub attempts: u32,
    /// The HTTP status of the newest attempt (`null` without a response).
    #[serde(default)]
    pub last_status: Option<u16>,
    #[serde(default)]
    pub last_latency_ms: Option<u64>,
    #[serde(default, with = "time::option")]
    pub last_attempt_time: Option<Timestamp>,
    #[serde(default, with = "time::option")]
    pub next_attempt_time: Option<Timestamp>,
}

/// A page of the delivery log, newest event first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Page {
    pub items: Vec<Delivery>,
    /// `null` on the last page.
    #[serde(default)]
    pub next_cursor: Option<String>,
    /// Set when the request reached the most it may read of the log before reading all
    /// it was asked to: the page holds only events published since `readBackTo`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<Truncated>,
}

/// One attempt of a delivery.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attempt {
    pub attempt: u32,
    #[serde(with = "time")]
    pub time: Timestamp,
    pub outcome: Lenient<AttemptOutcome>,
    #[serde(default)]
    pub status: Option<u16>,
    #[serde(default)]
    pub latency_ms: u64,
    /// The response's first bytes, size-capped, secrets redacted.
    #[serde(default)]
    pub response: String,
    /// Where the delivery stood after this attempt (absent from older answers).
    #[serde(default)]
    pub state: Option<Lenient<DeliveryState>>,
    #[serde(default, with = "time::option")]
    pub next_attempt_time: Option<Timestamp>,
    /// The request's headers as sent: the signature cut to its versions, credentials
    /// redacted (absent from older answers and when nothing was sent).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub request_headers: Vec<HeaderField>,
    /// The response's headers (the first 16, 1 KiB at most), credentials redacted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub response_headers: Vec<HeaderField>,
}

/// One HTTP header.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeaderField {
    pub name: String,
    pub value: String,
}

impl HeaderField {
    /// From a logged `(name, value)` pair.
    pub fn from_pair((name, value): &(String, String)) -> Self {
        Self {
            name: name.clone(),
            value: value.clone(),
        }
    }
}

/// The body every attempt of a delivery sent: the event as delivered,
/// `{"type","timestamp","data"}`, its first [`REQUEST_BODY_BYTES`] bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestBody {
    pub body: String,
    /// The whole body's size.
    pub bytes: u64,
    /// `body` is the start of a longer body.
    #[serde(default)]
    pub truncated: bool,
}

/// How much of a request body a delivery's detail shows.
pub const REQUEST_BODY_BYTES: usize = 4096;

impl RequestBody {
    /// [`Self::of`] `body` with the value at each JSON Pointer of `fields` (the
    /// endpoint's `redactResponseFields`) redacted, as the attempt log redacts responses;
    /// a body that is not JSON is not shown at all then.
    pub fn redacted(body: &[u8], fields: &[String]) -> Self {
        if fields.is_empty() {
            return Self::of(body);
        }
        match serde_json::from_slice::<serde_json::Value>(body) {
            Ok(mut json) => {
                crate::redact::json_fields(&mut json, fields);
                Self {
                    bytes: body.len() as u64,
                    ..Self::of(json.to_string().as_bytes())
                }
            }
            Err(_) => Self {
                body: "[request body not shown: not JSON and redactResponseFields is set]".into(),
                bytes: body.len() as u64,
                truncated: false,
            },
        }
    }

    /// The first [`REQUEST_BODY_BYTES`] of `body`, cut at a character boundary.
    pub fn of(body: &[u8]) -> Self {
        let text = String::from_utf8_lossy(body);
        let mut end = text.len().min(REQUEST_BODY_BYTES);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        Self {
            body: text[..end].to_owned(),
            bytes: body.len() as u64,
            truncated: end < text.len(),
        }
    }
}

/// One delivery with every attempt, oldest first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryDetail {
    pub event_id: Arc<str>,
    #[serde(rename = "type", default)]
    pub event_type: Option<String>,
    pub state: Lenient<State>,
    #[serde(default, with = "time::option")]
    pub next_attempt_time: Option<Timestamp>,
    #[serde(default)]
    pub attempts: Vec<Attempt>,
    /// What every attempt sent as its body; absent when the event is no longer stored
    /// (past the store's retention).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_body: Option<RequestBody>,
    /// Set when the request reached the most it may read of the log: attempts logged
    /// before `readBackTo` are not shown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<Truncated>,
}

/// An event accepted by HTTP ingest (202), or its duplicate's original.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventAccepted {
    pub event_id: String,
    pub duplicate: bool,
}

/// A redelivery or a test event queued (202).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Queued {
    pub event_id: String,
    pub request_id: String,
}

/// The dead deliveries queued again (202).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Redrive {
    pub request_id: String,
    pub count: u64,
    pub event_ids: Vec<Arc<str>>,
    /// Dead deliveries not queued: test events, events past the retention window, types
    /// the endpoint no longer takes.
    #[serde(default)]
    pub skipped: Vec<Arc<str>>,
    /// Set when the request stopped before finding every dead delivery (the log is
    /// longer than one request reads, or more are dead than one request queues): ask
    /// again once these are delivered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<Truncated>,
}

/// Where a request stopped that reached one of the API's bounds on what one request may
/// read or do, and which.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Truncated {
    pub limit: Lenient<Limit>,
    /// Everything logged since this time was read; nothing older (`null` when the log was
    /// read to its start and another bound stopped the request).
    #[serde(default, with = "time::option")]
    pub read_back_to: Option<Timestamp>,
}

/// One of the API's bounds on a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Limit {
    /// The most attempt records one request reads (`--max-scan-records`).
    Records,
    /// The longest one request reads the log (`--max-scan-seconds`).
    Time,
    /// The most dead deliveries one redrive queues.
    Count,
}

impl Limit {
    pub const ALL: [Self; 3] = [Self::Records, Self::Time, Self::Count];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Records => "records",
            Self::Time => "time",
            Self::Count => "count",
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Times on the wire: RFC 3339 in UTC with milliseconds.
pub mod time {
    use super::*;

    /// `2026-12-01T10:00:00.000Z`.
    pub fn format(time: &Timestamp) -> String {
        time.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
    }

    /// The time `ms` Unix milliseconds name (the epoch for one out of range).
    pub fn from_ms(ms: u64) -> Timestamp {
        i64::try_from(ms)
            .ok()
            .and_then(|ms| Timestamp::from_millisecond(ms).ok())
            .unwrap_or(Timestamp::UNIX_EPOCH)
    }

    pub fn serialize<S: Serializer>(time: &Timestamp, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format(time))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Timestamp, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }

    pub mod option {
        use super::*;

        pub fn serialize<S: Serializer>(
            time: &Option<Timestamp>,
            serializer: S,
        ) -> Result<S::Ok, S::Error> {
            match time {
                Some(time) => super::serialize(time, serializer),
                None => serializer.serialize_none(),
            }
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(
            deserializer: D,
        ) -> Result<Option<Timestamp>, D::Error> {
            Option::<String>::deserialize(deserializer)?
                .map(|text| text.parse().map_err(serde::de::Error::custom))
                .transpose()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at(ms: u64) -> Timestamp {
        time::from_ms(ms)
    }

    #[test]
    fn every_answer_round_trips() {
        let delivery = Delivery {
            event_id: "msg_1".into(),
            event_type: Some("order.created".into()),
            state: State::Retrying.into(),
            attempts: 2,
            last_status: Some(500),
            last_latency_ms: Some(12),
            last_attempt_time: Some(at(1_764_583_200_123)),
            next_attempt_time: None,
        };
        let page = Page {
            items: vec![delivery.clone()],
            next_cursor: Some("c".into()),
            truncated: None,
        };
        let attempt = Attempt {
            attempt: 1,
            time: at(1_764_583_200_000),
            outcome: AttemptOutcome::HttpError.into(),
            status: Some(500),
            latency_ms: 3,
            response: "oops".into(),
            state: Some(DeliveryState::Retrying.into()),
            next_attempt_time: Some(at(1_764_583_205_000)),
            request_headers: vec![HeaderField::from_pair(&(
                "webhook-signature".into(),
                "v1,[redacted]".into(),
            ))],
            response_headers: Vec::new(),
        };
        let detail = DeliveryDetail {
            event_id: "msg_1".into(),
            event_type: None,
            state: State::Dead.into(),
            next_attempt_time: None,
            attempts: vec![attempt],
            request_body: Some(RequestBody::of("é".repeat(REQUEST_BODY_BYTES).as_bytes())),
            truncated: Some(Truncated {
                limit: Limit::Time.into(),
                read_back_to: Some(at(1_764_583_000_000)),
            }),
        };
        let cut = RequestBody::of("é".repeat(REQUEST_BODY_BYTES).as_bytes());
        assert!(cut.truncated && cut.body.len() <= REQUEST_BODY_BYTES);
        assert_eq!(cut.bytes, 2 * REQUEST_BODY_BYTES as u64);
        assert!(!RequestBody::of(b"{}").truncated);
        // The endpoint's redactResponseFields apply to the request body too.
        let event = br#"{"type":"order.paid","data":{"card":"4242 4242","id":"o-1"}}"#;
        let shown = RequestBody::redacted(event, &["/data/card".into()]);
        assert!(
            !shown.body.contains("4242") && shown.body.contains("o-1"),
            "{shown:?}"
        );
        assert_eq!(shown.bytes, event.len() as u64);
        assert_eq!(RequestBody::redacted(event, &[]), RequestBody::of(event));
        let not_json = RequestBody::redacted(b"card=4242", &["/card".into()]);
        assert!(!not_json.body.contains("4242"), "{not_json:?}");
        fn round_trip<T: Serialize + DeserializeOwned + PartialEq + fmt::Debug>(value: T) {
            let json = serde_json::to_value(&value).unwrap();
            assert_eq!(serde_json::from_value::<T>(json).unwrap(), value);
        }
        round_trip(page.clone());
        round_trip(detail.clone());
        round_trip(EventAccepted {
            event_id: "msg_2".into(),
            duplicate: true,
        });
        round_trip(Queued {
            event_id: "msg_3".into(),
            request_id: "req_1".into(),
        });
        round_trip(Redrive {
            request_id: "req_2".into(),
            count: 1,
            event_ids: vec!["msg_4".into()],
            skipped: vec!["msg_5".into()],
            truncated: Some(Truncated {
                limit: Limit::Count.into(),
                read_back_to: None,
            }),
        });
        let json = serde_json::to_value(&page).unwrap();
        assert_eq!(
            json,
            json!({"items": [{"eventId": "msg_1", "type": "order.created", "state": "retrying",
                "attempts": 2, "lastStatus": 500, "lastLatencyMs": 12,
                "lastAttemptTime": "2025-12-01T10:00:00.123Z", "nextAttemptTime": null}],
                "nextCursor": "c"})
        );
        let json = serde_json::to_value(&detail).unwrap();
        assert_eq!(json["attempts"][0]["outcome"], "HttpError");
        assert_eq!(json["attempts"][0]["state"], "retrying");
        assert_eq!(json["attempts"][0]["time"], "2025-12-01T10:00:00.000Z");
    }

    #[test]
    fn values_a_newer_api_sends_are_kept_as_text() {
        let d: Delivery = serde_json::from_value(json!({
            "eventId": "e", "type": null, "state": "parked", "attempts": 1,
            "lastAttemptTime": "2026-12-01T10:00:00Z", "somethingNew": true,
        }))
        .unwrap();
        assert_eq!(d.state, Lenient::Unknown("parked".into()));
        assert_eq!(d.state.to_string(), "parked");
        assert_eq!(d.state.known(), None);
        assert_eq!(d.event_type, None);
        assert_eq!(d.last_attempt_time, Some(at(1_796_119_200_000)));
        let a: Attempt = serde_json::from_value(json!({
            "attempt": 1, "time": "2026-12-01T10:00:00.5+01:00", "outcome": "Teleported",
            "status": null, "latencyMs": 4, "response": "",
        }))
        .unwrap();
        assert_eq!(a.outcome.to_string(), "Teleported");
        assert_eq!(a.state, None);
        assert_eq!(a.time, at(1_796_115_600_500));
        let known: Lenient<State> = serde_json::from_value(json!("inFlight")).unwrap();
        assert_eq!(known.known(), Some(&State::InFlight));
        assert_eq!(serde_json::to_value(known).unwrap(), json!("inFlight"));
    }

    #[test]
    fn names_are_the_wire_names() {
        for state in State::ALL {
            assert_eq!(serde_json::to_value(state).unwrap(), json!(state.as_str()));
        }
        for outcome in AttemptOutcome::ALL {
            assert_eq!(
                serde_json::to_value(outcome).unwrap(),
                json!(outcome.as_str())
            );
        }
    }
}
