//! Shared code of the example programs: how a receiver verifies a Herald delivery.
//!
//! Herald signs the Standard Webhooks way, so any Standard Webhooks library works; this
//! one uses `herald_core::signing::verify`.

use axum::http::HeaderMap;
use herald_core::signing::{DEFAULT_TOLERANCE_SECS, VerifyingKey, verify};

/// Checks the `webhook-id`, `webhook-timestamp` and `webhook-signature` headers of a
/// delivery against the body and the endpoint's keys (`whsec_...` secrets, or `whpk_...`
/// public keys for Ed25519; give two while a rotation overlaps). `now` is Unix seconds. Returns the `webhook-id` on success.
pub fn verify_request(
    keys: &[VerifyingKey],
    headers: &HeaderMap,
    body: &[u8],
    now: i64,
) -> Result<String, String> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| format!("missing {name} header"))
    };
    let id = header("webhook-id")?;
    let timestamp = header("webhook-timestamp")?;
    let signature = header("webhook-signature")?;
    verify(
        keys,
        id,
        timestamp,
        signature,
        body,
        now,
        DEFAULT_TOLERANCE_SECS,
    )
    .map_err(|e| e.to_string())?;
    Ok(id.to_owned())
}

/// The answer to Herald's verification challenge when `event` is one (an endpoint with
/// `spec.verify`, or in a namespace that requires verification, receives nothing until
/// its receiver echoes it): the challenge, to send back as the body with a 2xx. Only
/// after the request's signature checked out: the echo says "this receiver agreed".
pub fn challenge_answer(event: &serde_json::Value) -> Option<String> {
    (event["type"] == herald_core::verification::EVENT_TYPE)
        .then(|| event["data"]["challenge"].as_str().map(str::to_owned))
        .flatten()
}

/// Parses `whsec_...` secrets and `whpk_...` public keys.
pub fn parse_secrets(secrets: &[String]) -> anyhow::Result<Vec<VerifyingKey>> {
    secrets
        .iter()
        .map(|s| VerifyingKey::parse(s).map_err(|e| anyhow::anyhow!("bad secret: {e}")))
        .collect()
}

/// The current Unix time in seconds.
pub fn unix_now() -> i64 {
    jiff::Timestamp::now().as_second()
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_core::signing::sign;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn signed(body: &[u8], now: i64) -> HeaderMap {
        let keys = [herald_core::signing::SigningKey::from_whsec(SECRET).unwrap()];
        let mut headers = HeaderMap::new();
        headers.insert("webhook-id", "msg_1".parse().unwrap());
        headers.insert("webhook-timestamp", now.to_string().parse().unwrap());
        let signature = sign(&keys, "msg_1", now, body);
        headers.insert("webhook-signature", signature.parse().unwrap());
        headers
    }

    #[test]
    fn accepts_a_signed_request_and_rejects_a_tampered_one() {
        let keys = parse_secrets(&[SECRET.to_owned()]).unwrap();
        let now = unix_now();
        let body = br#"{"type":"order.created","timestamp":"2026-11-30T00:00:00Z","data":{}}"#;
        let headers = signed(body, now);
        assert_eq!(verify_request(&keys, &headers, body, now).unwrap(), "msg_1");
        let tampered =
            br#"{"type":"order.created","timestamp":"2026-11-30T00:00:00Z","data":{"x":1}}"#;
        assert!(verify_request(&keys, &headers, tampered, now).is_err());
        // Stale (replayed) requests are refused too.
        assert!(verify_request(&keys, &headers, body, now + 3600).is_err());
        // A different secret does not verify.
        let other = parse_secrets(&["whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA".to_owned()]).unwrap();
        assert!(verify_request(&other, &headers, body, now).is_err());
    }

    #[test]
    fn echoes_herald_s_verification_challenge_and_nothing_else() {
        use herald_core::dataplane::EndpointKey;
        use herald_core::verification;
        let challenge = verification::challenge().unwrap();
        let body = verification::request_body(
            &EndpointKey::new("shop", "orders"),
            &challenge,
            jiff::Timestamp::now(),
        );
        let event: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let answer = challenge_answer(&event).expect("a challenge");
        assert!(verification::echoed(&answer, &challenge));
        let order = serde_json::json!({"type": "order.created", "data": {"challenge": "x"}});
        assert_eq!(challenge_answer(&order), None);
    }

    #[test]
    fn verifies_the_standard_webhooks_test_vector() {
        let keys = parse_secrets(&[SECRET.to_owned()]).unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(
            "webhook-id",
            "msg_p5jXN8AQM9LWM0D4loKWxJek".parse().unwrap(),
        );
        headers.insert("webhook-timestamp", "1614265330".parse().unwrap());
        headers.insert(
            "webhook-signature",
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
                .parse()
                .unwrap(),
        );
        let body = br#"{"test": 2432232314}"#;
        assert!(verify_request(&keys, &headers, body, 1_614_265_330).is_ok());
        assert!(
            verify_request(&keys, &headers, br#"{"test": 2432232315}"#, 1_614_265_330).is_err()
        );
    }
}
