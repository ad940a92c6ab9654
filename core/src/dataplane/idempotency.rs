//! HTTP ingest's idempotency keys on the wire: one entry of the `herald-idempotency`
//! bucket per namespace and key, written and read only by herald-api.
//!
//! JetStream's own duplicate check is per stream and keyed by `Nats-Msg-Id` alone, which
//! any producer can set on its own subject: an id derived from a tenant's key would let
//! another tenant publish first under it and swallow the tenant's event. So the key
//! lives here, under the namespace ([`entry_key`]), and the event is published with a
//! random id chosen when the key was first claimed ([`Claim::message_id`]), which no
//! producer can know. The bucket's age limit is the idempotency window.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The bucket's key of `key` in `namespace`: `<ns>.<128 bits of the key's SHA-256, hex>`
/// (the key itself is not stored; any text up to 255 characters fits).
pub fn entry_key(namespace: &str, key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("{namespace}.{hex}")
}

/// The SHA-256 of a request body, hex: a key reused with another body is refused.
pub fn body_hash(body: &[u8]) -> String {
    Sha256::digest(body)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A key's entry: claimed (the event being published) or answered (its event id).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Claim {
    /// The `Nats-Msg-Id` the event is published with: `http.<ns>.<random>`, the same for
    /// every retry, so JetStream drops a repeat of a publish whose answer was lost.
    pub message_id: String,
    /// [`body_hash`] of the first request's body.
    pub body: String,
    /// When the key was claimed, Unix ms.
    pub claimed_ms: u64,
    /// The stored event's id, once its publish was acknowledged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
}

impl Claim {
    /// A new claim of a key in `namespace` for `body`, with a fresh random message id.
    pub fn new(namespace: &str, body: &[u8], now_ms: u64, random: u128) -> Self {
        Self {
            message_id: format!(
                "http.{namespace}.{}",
                ulid::Ulid::from_parts(now_ms, random)
            ),
            body: body_hash(body),
            claimed_ms: now_ms,
            event_id: None,
        }
    }

    pub fn encode(&self) -> bytes::Bytes {
        serde_json::to_vec(self).expect("claims serialize").into()
    }

    pub fn decode(value: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_round_trips_and_its_key_hides_the_key() {
        let claim = Claim::new("shop", b"{}", 1_700_000_000_000, 42);
        assert!(claim.message_id.starts_with("http.shop.01"));
        assert_eq!(Claim::decode(&claim.encode()).unwrap(), claim);
        let answered = Claim {
            event_id: Some("msg_1".into()),
            ..claim
        };
        assert_eq!(Claim::decode(&answered.encode()).unwrap(), answered);
        let key = entry_key("shop", "order-42");
        assert!(key.starts_with("shop.") && key.len() == "shop.".len() + 32);
        assert!(!key.contains("order-42"));
        assert_ne!(entry_key("shop", "a"), entry_key("shop2", "a"));
        assert_ne!(body_hash(b"a"), body_hash(b"b"));
    }
}
