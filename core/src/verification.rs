//! Endpoint verification: before anything is delivered to an endpoint that must be
//! verified (`spec.verify`, or a namespace the platform team marked), the dispatcher
//! owning its shard sends a signed challenge and the receiver must echo it — the way
//! Slack and Azure Event Grid verify a URL — so a tenant cannot point Herald at a third
//! party's URL that never agreed to receive.
//!
//! The request is an ordinary signed webhook (`webhook-id`, `-timestamp`, `-signature`
//! from the endpoint's key) of type [`EVENT_TYPE`]:
//!
//! ```json
//! {"type": "herald.endpoint.verification", "timestamp": "2026-12-07T10:00:00Z",
//!  "data": {"challenge": "hvc_…", "endpoint": {"namespace": "shop", "name": "orders"}}}
//! ```
//!
//! The receiver proves it agreed by answering 2xx with the challenge: the body is the
//! challenge itself, or a JSON object whose `challenge` is it ([`echoed`]). The
//! challenge is drawn by the dispatcher at sending time, never stored or shown before,
//! so a URL that reflects what its address asks for cannot answer it.
//!
//! Contract: the dispatcher is the only writer of the [`VerificationReport`] of an
//! endpoint (`verify.<ns>.<name>` in the health bucket); the operator reads it and
//! delivers nothing (holds the configuration) while the report does not vouch for the
//! endpoint's current URL.

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::dataplane::EndpointKey;

/// The event type of a verification challenge.
pub const EVENT_TYPE: &str = "herald.endpoint.verification";
/// The prefix of every challenge.
pub const CHALLENGE_PREFIX: &str = "hvc_";

/// A fresh challenge: [`CHALLENGE_PREFIX`] and 24 random bytes in base64url.
pub fn challenge() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes)?;
    let text = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    Ok(format!("{CHALLENGE_PREFIX}{text}"))
}

/// The `webhook-id` of a challenge request sent at `now_ms`: `verify_<ULID>`, never an
/// event's id.
pub fn request_id(now_ms: u64) -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)?;
    let ulid = ulid::Ulid::from_parts(now_ms, u128::from_le_bytes(bytes));
    Ok(format!("verify_{ulid}"))
}

/// The body of a challenge request for `endpoint`, sent at `now`.
pub fn request_body(endpoint: &EndpointKey, challenge: &str, now: jiff::Timestamp) -> Vec<u8> {
    let body = json!({
        "type": EVENT_TYPE,
        "timestamp": now.to_string(),
        "data": {
            "challenge": challenge,
            "endpoint": {"namespace": endpoint.namespace(), "name": endpoint.name()},
        },
    });
    serde_json::to_vec(&body).expect("a JSON value serializes")
}

/// Whether a response body echoes `challenge`: the body is the challenge (surrounding
/// whitespace and JSON string quotes aside), or a JSON object whose `challenge` is it.
pub fn echoed(body: &str, challenge: &str) -> bool {
    let text = body.trim();
    if text == challenge {
        return true;
    }
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::String(s)) => s == challenge,
        Ok(serde_json::Value::Object(o)) => {
            o.get("challenge").and_then(|c| c.as_str()) == Some(challenge)
        }
        _ => false,
    }
}

/// What the last challenge to an endpoint showed. Stored as JSON under
/// `verify.<ns>.<name>` in the health bucket by the dispatcher owning the endpoint's
/// shard, after every challenge.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VerificationReport {
    /// The endpoint this is about (a re-created endpoint is verified again).
    pub uid: String,
    /// The URL the challenge went to: a verification vouches for this URL only.
    pub url: String,
    /// The receiver answered 2xx with the challenge.
    pub verified: bool,
    /// What went wrong, for the endpoint's `Verified` condition (empty when verified).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Unix milliseconds of the challenge.
    pub time_ms: u64,
}

impl VerificationReport {
    /// Whether this report vouches for the endpoint `uid` at `url`.
    pub fn vouches_for(&self, uid: &str, url: &str) -> bool {
        self.verified && self.uid == uid && self.url == url
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_are_fresh_and_prefixed() {
        let (a, b) = (challenge().unwrap(), challenge().unwrap());
        assert!(a.starts_with(CHALLENGE_PREFIX) && a.len() == CHALLENGE_PREFIX.len() + 32);
        assert_ne!(a, b);
        let id = request_id(1_000).unwrap();
        assert!(id.starts_with("verify_") && id != request_id(1_000).unwrap());
    }

    #[test]
    fn the_request_carries_the_challenge_and_the_endpoint() {
        let key = EndpointKey::new("shop", "orders");
        let now: jiff::Timestamp = "2026-12-07T10:00:00Z".parse().unwrap();
        let body: serde_json::Value =
            serde_json::from_slice(&request_body(&key, "hvc_x", now)).unwrap();
        assert_eq!(
            body,
            json!({"type": EVENT_TYPE, "timestamp": "2026-12-07T10:00:00Z",
                "data": {"challenge": "hvc_x", "endpoint": {"namespace": "shop", "name": "orders"}}})
        );
    }

    #[test]
    fn an_echo_is_the_challenge_plain_quoted_or_in_an_object() {
        let c = "hvc_abc";
        for body in [
            "hvc_abc",
            " hvc_abc\n",
            "\"hvc_abc\"",
            r#"{"challenge": "hvc_abc"}"#,
            r#"{"challenge":"hvc_abc","ok":true}"#,
        ] {
            assert!(echoed(body, c), "{body:?}");
        }
        for body in [
            "",
            "ok",
            "hvc_abcd",
            r#"{"challenge": "hvc_other"}"#,
            r#"{"validationResponse": "hvc_abc"}"#,
            r#"["hvc_abc"]"#,
            // The whole request echoed back is not an answer: a receiver that reflects
            // anything it gets did not agree to anything.
            r#"{"type":"herald.endpoint.verification","data":{"challenge":"hvc_abc"}}"#,
        ] {
            assert!(!echoed(body, c), "{body:?}");
        }
    }

    #[test]
    fn a_report_vouches_only_for_its_endpoint_and_url() {
        let report = VerificationReport {
            uid: "u1".into(),
            url: "https://a.example/hook".into(),
            verified: true,
            message: String::new(),
            time_ms: 1,
        };
        assert!(report.vouches_for("u1", "https://a.example/hook"));
        assert!(!report.vouches_for("u2", "https://a.example/hook"));
        assert!(!report.vouches_for("u1", "https://b.example/hook"));
        let failed = VerificationReport {
            verified: false,
            ..report
        };
        assert!(!failed.vouches_for("u1", "https://a.example/hook"));
    }
}
