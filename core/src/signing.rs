//! Standard Webhooks signatures (<https://www.standardwebhooks.com/>, spec v1.0.0).
//!
//! A delivery carries `webhook-id`, `webhook-timestamp` (Unix seconds) and
//! `webhook-signature`: one `v1,<base64 HMAC-SHA256(key, "id.timestamp.body")>` entry per
//! currently valid key, separated by spaces, so a receiver holding either the old or the
//! new key during a rotation accepts the request. Secrets are written `whsec_<base64 key>`.
//!
//! Key bytes never leave this module in a printable form except through
//! [`SigningKey::to_whsec`]; `Debug` shows only the key id.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

/// Prefix of every serialized secret.
pub const SECRET_PREFIX: &str = "whsec_";
/// The specification asks for keys of 24 to 64 random bytes.
pub const MIN_KEY_BYTES: usize = 24;
/// Upper bound of a key's length.
pub const MAX_KEY_BYTES: usize = 64;
/// Length of the keys Herald generates.
pub const GENERATED_KEY_BYTES: usize = 32;
/// Default tolerance between a signature's timestamp and the verifier's clock.
pub const DEFAULT_TOLERANCE_SECS: u64 = 5 * 60;
/// Version tag of the only signature scheme defined (symmetric HMAC-SHA256).
const VERSION: &str = "v1";

/// Why a secret could not be parsed or generated.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("secret does not start with \"{SECRET_PREFIX}\"")]
    MissingPrefix,
    #[error("secret after \"{SECRET_PREFIX}\" is not valid base64: {0}")]
    NotBase64(#[source] base64::DecodeError),
    #[error(
        "secret decodes to {0} bytes; Standard Webhooks keys are {MIN_KEY_BYTES} to {MAX_KEY_BYTES} bytes"
    )]
    BadLength(usize),
    #[error("the operating system's random number generator failed: {0}")]
    Random(getrandom::Error),
}

/// Why a signed request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("webhook-timestamp {0:?} is not a whole number of seconds")]
    BadTimestamp(String),
    #[error("webhook-timestamp is {0} s older than the tolerance allows")]
    TooOld(u64),
    #[error("webhook-timestamp is {0} s in the future, beyond the tolerance")]
    TooNew(u64),
    #[error("webhook-signature has no v1 signature")]
    NoSignature,
    #[error("webhook-signature entry {0:?} is not \"v1,<base64>\"")]
    MalformedSignature(String),
    #[error("no signature matches any of the keys")]
    NoMatch,
}

/// One HMAC key. Cloning is cheap enough for per-endpoint caches; signing reuses the keyed
/// HMAC state instead of re-deriving it for every attempt.
#[derive(Clone)]
pub struct SigningKey {
    mac: HmacSha256,
    id: String,
}

impl SigningKey {
    /// A fresh key of [`GENERATED_KEY_BYTES`] from the operating system's CSPRNG.
    pub fn generate() -> Result<Self, KeyError> {
        let mut bytes = [0u8; GENERATED_KEY_BYTES];
        getrandom::fill(&mut bytes).map_err(KeyError::Random)?;
        Self::from_bytes(&bytes)
    }

    /// A key from its raw bytes (24 to 64 of them).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, KeyError> {
        if !(MIN_KEY_BYTES..=MAX_KEY_BYTES).contains(&bytes.len()) {
            return Err(KeyError::BadLength(bytes.len()));
        }
        let mac = HmacSha256::new_from_slice(bytes).expect("HMAC accepts keys of any length");
        // The id is a digest prefix: stable for the same key, and it reveals nothing useful.
        let digest = Sha256::digest(bytes);
        let id = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
        Ok(Self { mac, id })
    }

    /// Parses a `whsec_<base64>` secret.
    pub fn from_whsec(text: &str) -> Result<Self, KeyError> {
        let encoded = text
            .trim()
            .strip_prefix(SECRET_PREFIX)
            .ok_or(KeyError::MissingPrefix)?;
        let bytes = BASE64.decode(encoded).map_err(KeyError::NotBase64)?;
        Self::from_bytes(&bytes)
    }

    /// A short, stable, non-secret identifier of the key (12 hex digits of its SHA-256),
    /// safe to show in status and logs.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The raw HMAC of `id.timestamp.body`.
    fn mac(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> HmacSha256 {
        let mut mac = self.mac.clone();
        mac.update(msg_id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }
}

/// Serializes a key back to `whsec_<base64>`. Separate from the type so that every place
/// that reveals key material is easy to find.
pub fn to_whsec(bytes: &[u8]) -> String {
    format!("{SECRET_PREFIX}{}", BASE64.encode(bytes))
}

/// Generates a new secret and returns it serialized, with its key id.
pub fn generate_whsec() -> Result<(String, String), KeyError> {
    let mut bytes = [0u8; GENERATED_KEY_BYTES];
    getrandom::fill(&mut bytes).map_err(KeyError::Random)?;
    let key = SigningKey::from_bytes(&bytes)?;
    Ok((to_whsec(&bytes), key.id().to_owned()))
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SigningKey(id={}, <redacted>)", self.id)
    }
}

/// The `webhook-signature` header value: one `v1,<base64>` entry per key, in key order.
pub fn sign(keys: &[SigningKey], msg_id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut header = String::with_capacity(keys.len() * 48);
    for (i, key) in keys.iter().enumerate() {
        if i > 0 {
            header.push(' ');
        }
        header.push_str(VERSION);
        header.push(',');
        BASE64.encode_string(
            key.mac(msg_id, timestamp, body).finalize().into_bytes(),
            &mut header,
        );
    }
    header
}

/// Verifies a delivery the way a receiver does: the timestamp lies within `tolerance_secs`
/// of `now` (Unix seconds), and at least one `v1` entry of the signature header matches one
/// of `keys` (compared in constant time). Entries of other versions are ignored.
pub fn verify(
    keys: &[SigningKey],
    msg_id: &str,
    timestamp: &str,
    signature_header: &str,
    body: &[u8],
    now: i64,
    tolerance_secs: u64,
) -> Result<(), VerifyError> {
    let ts: i64 = timestamp
        .trim()
        .parse()
        .map_err(|_| VerifyError::BadTimestamp(timestamp.to_owned()))?;
    // In i128: the distance between two i64 can exceed i64::MAX, and a saturated one
    // would let a tolerance above 2^63 s accept a timestamp outside it.
    let skew = i128::from(now) - i128::from(ts);
    let beyond = |skew: i128| {
        let past = skew
            .unsigned_abs()
            .saturating_sub(u128::from(tolerance_secs));
        u64::try_from(past).unwrap_or(u64::MAX)
    };
    if skew > 0 && beyond(skew) > 0 {
        return Err(VerifyError::TooOld(beyond(skew)));
    }
    if skew < 0 && beyond(skew) > 0 {
        return Err(VerifyError::TooNew(beyond(skew)));
    }
    let mut saw_v1 = false;
    for entry in signature_header.split(' ').filter(|e| !e.is_empty()) {
        let (version, encoded) = entry
            .split_once(',')
            .ok_or_else(|| VerifyError::MalformedSignature(entry.to_owned()))?;
        if version != VERSION {
            continue;
        }
        saw_v1 = true;
        let Ok(expected) = BASE64.decode(encoded) else {
            return Err(VerifyError::MalformedSignature(entry.to_owned()));
        };
        for key in keys {
            if key.mac(msg_id, ts, body).verify_slice(&expected).is_ok() {
                return Ok(());
            }
        }
    }
    if saw_v1 {
        Err(VerifyError::NoMatch)
    } else {
        Err(VerifyError::NoSignature)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // The test vector published with the Standard Webhooks specification and used by the
    // reference libraries in github.com/standard-webhooks/standard-webhooks (and Svix's).
    const VECTOR_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const VECTOR_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const VECTOR_TS: i64 = 1_614_265_330;
    const VECTOR_BODY: &[u8] = br#"{"test": 2432232314}"#;
    const VECTOR_SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    fn vector_key() -> SigningKey {
        SigningKey::from_whsec(VECTOR_SECRET).unwrap()
    }

    #[test]
    fn signs_the_specification_vector() {
        assert_eq!(
            sign(&[vector_key()], VECTOR_ID, VECTOR_TS, VECTOR_BODY),
            VECTOR_SIGNATURE
        );
    }

    #[test]
    fn verifies_the_specification_vector() {
        let keys = [vector_key()];
        let ts = VECTOR_TS.to_string();
        let check = |now| {
            verify(
                &keys,
                VECTOR_ID,
                &ts,
                VECTOR_SIGNATURE,
                VECTOR_BODY,
                now,
                300,
            )
        };
        assert_eq!(check(VECTOR_TS), Ok(()));
        assert_eq!(check(VECTOR_TS + 300), Ok(()));
        assert_eq!(check(VECTOR_TS + 301), Err(VerifyError::TooOld(1)));
        assert_eq!(check(VECTOR_TS - 302), Err(VerifyError::TooNew(2)));
    }

    /// Found writing the window property of the `signature` fuzz target (fuzz/): the
    /// clock distance saturated at i64::MAX, so with a tolerance of 2^63 s a timestamp
    /// 2^64 - 1 s away was accepted.
    #[test]
    fn the_window_holds_at_the_ends_of_i64() {
        let keys = [vector_key()];
        let header = sign(&keys, VECTOR_ID, i64::MIN, VECTOR_BODY);
        let ts = i64::MIN.to_string();
        let check =
            |now, tolerance| verify(&keys, VECTOR_ID, &ts, &header, VECTOR_BODY, now, tolerance);
        assert_eq!(
            check(i64::MAX, 1 << 63),
            Err(VerifyError::TooOld((1 << 63) - 1))
        );
        assert_eq!(check(i64::MAX, u64::MAX), Ok(()));
        assert_eq!(check(i64::MIN, 0), Ok(()));
        let header = sign(&keys, VECTOR_ID, i64::MAX, VECTOR_BODY);
        let ts = i64::MAX.to_string();
        let check =
            |now, tolerance| verify(&keys, VECTOR_ID, &ts, &header, VECTOR_BODY, now, tolerance);
        assert_eq!(
            check(i64::MIN, 1 << 63),
            Err(VerifyError::TooNew((1 << 63) - 1))
        );
    }

    #[test]
    fn verify_skips_other_versions_and_unknown_keys() {
        let header = format!(
            "v1a,aGVsbG8= v1,tFtCZ5RDCPxzWQRWXWPgrCgE2frDBe9gjpbWQxnVfsQ= {VECTOR_SIGNATURE}"
        );
        let ts = VECTOR_TS.to_string();
        let keys = [vector_key()];
        assert_eq!(
            verify(&keys, VECTOR_ID, &ts, &header, VECTOR_BODY, VECTOR_TS, 300),
            Ok(())
        );
        assert_eq!(
            verify(
                &keys,
                VECTOR_ID,
                &ts,
                "v1a,aGVsbG8=",
                VECTOR_BODY,
                VECTOR_TS,
                300
            ),
            Err(VerifyError::NoSignature)
        );
        assert_eq!(
            verify(&keys, VECTOR_ID, &ts, "v1,!!", VECTOR_BODY, VECTOR_TS, 300),
            Err(VerifyError::MalformedSignature("v1,!!".into()))
        );
        assert_eq!(
            verify(
                &keys,
                VECTOR_ID,
                "soon",
                VECTOR_SIGNATURE,
                VECTOR_BODY,
                VECTOR_TS,
                300
            ),
            Err(VerifyError::BadTimestamp("soon".into()))
        );
    }

    #[test]
    fn parses_and_refuses_secrets_with_reasons() {
        assert!(matches!(
            SigningKey::from_whsec("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
            Err(KeyError::MissingPrefix)
        ));
        assert!(matches!(
            SigningKey::from_whsec("whsec_not base64!"),
            Err(KeyError::NotBase64(_))
        ));
        assert!(matches!(
            SigningKey::from_whsec("whsec_c2hvcnQ="),
            Err(KeyError::BadLength(5))
        ));
        assert_eq!(vector_key().id().len(), 12);
    }

    #[test]
    fn generated_secrets_are_fresh_and_parse_back() {
        let (a, id_a) = generate_whsec().unwrap();
        let (b, _) = generate_whsec().unwrap();
        assert_ne!(a, b);
        assert!(a.starts_with(SECRET_PREFIX));
        let key = SigningKey::from_whsec(&a).unwrap();
        assert_eq!(key.id(), id_a);
        let decoded = BASE64.decode(&a[SECRET_PREFIX.len()..]).unwrap();
        assert_eq!(decoded.len(), GENERATED_KEY_BYTES);
        assert!(SigningKey::generate().is_ok());
    }

    #[test]
    fn debug_output_hides_the_key() {
        let printed = format!("{:?}", vector_key());
        assert!(!printed.contains("MfKQ9r8"));
        assert!(printed.contains("redacted"));
    }

    fn key_strategy() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(any::<u8>(), MIN_KEY_BYTES..=MAX_KEY_BYTES)
    }

    proptest! {
        #[test]
        fn round_trip(key in key_strategy(), id in "[a-zA-Z0-9_]{1,40}",
                      ts in 0i64..4_000_000_000, body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let key = SigningKey::from_whsec(&to_whsec(&key)).unwrap();
            let header = sign(std::slice::from_ref(&key), &id, ts, &body);
            prop_assert_eq!(verify(&[key], &id, &ts.to_string(), &header, &body, ts, 0), Ok(()));
        }

        // Changing any single byte of the id, the timestamp, the body or the signature
        // makes verification fail.
        #[test]
        fn any_changed_byte_fails(key in key_strategy(), body in proptest::collection::vec(any::<u8>(), 1..256),
                                  which in 0usize..4, pos in any::<prop::sample::Index>(), flip in 1u8..=255) {
            let key = SigningKey::from_bytes(&key).unwrap();
            let keys = [key];
            let (mut id, mut ts, mut body) = (b"msg_2a9x0c".to_vec(), b"1700000000".to_vec(), body);
            let mut header = sign(&keys, "msg_2a9x0c", 1_700_000_000, &body).into_bytes();
            match which {
                0 => { let i = pos.index(id.len()); id[i] ^= flip; }
                1 => { let i = pos.index(ts.len()); ts[i] ^= flip; }
                2 => { let i = pos.index(body.len()); body[i] ^= flip; }
                _ => { let i = 3 + pos.index(header.len() - 3); header[i] ^= flip; }
            }
            let id = String::from_utf8_lossy(&id).into_owned();
            let ts = String::from_utf8_lossy(&ts).into_owned();
            let header = String::from_utf8_lossy(&header).into_owned();
            // A huge tolerance isolates the signature check from the clock check.
            prop_assert!(verify(&keys, &id, &ts, &header, &body, 1_700_000_000, u64::MAX / 2).is_err());
        }

        // During a rotation both keys sign; a receiver holding either one accepts.
        #[test]
        fn rotation_verifies_with_either_key(old in key_strategy(), new in key_strategy(),
                                            body in proptest::collection::vec(any::<u8>(), 0..256)) {
            prop_assume!(old != new);
            let old = SigningKey::from_bytes(&old).unwrap();
            let new = SigningKey::from_bytes(&new).unwrap();
            let header = sign(&[new.clone(), old.clone()], "msg_1", 42, &body);
            prop_assert_eq!(header.split(' ').count(), 2);
            prop_assert_eq!(verify(&[old], "msg_1", "42", &header, &body, 42, 0), Ok(()));
            prop_assert_eq!(verify(&[new], "msg_1", "42", &header, &body, 42, 0), Ok(()));
            let stranger = SigningKey::generate().unwrap();
            prop_assert_eq!(verify(&[stranger], "msg_1", "42", &header, &body, 42, 0), Err(VerifyError::NoMatch));
        }
    }
}
