//! The receiver's side: the keys a signature is checked with (a shared secret, an
//! Ed25519 public key) and [`verify`], which checks a delivery's headers.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use ed25519_dalek::Verifier;
use hmac::Mac;

use super::{
    KeyError, PUBLIC_KEY_PREFIX, Scheme, Secret, SigningKey, VerifyError, decode, ed25519_bytes,
    feed_mac, key_id, signed_content,
};

/// An Ed25519 public key, `whpk_<base64>`: what a receiver of `v1a` signatures holds.
#[derive(Clone, PartialEq, Eq)]
pub struct PublicKey {
    pub(super) key: ed25519_dalek::VerifyingKey,
    pub(super) id: String,
}

impl PublicKey {
    /// Parses `whpk_<base64 of 32 bytes>`.
    pub fn parse(text: &str) -> Result<Self, KeyError> {
        let encoded = text
            .trim()
            .strip_prefix(PUBLIC_KEY_PREFIX)
            .ok_or(KeyError::MissingPrefix)?;
        let bytes = ed25519_bytes(&decode(encoded)?)?;
        let key =
            ed25519_dalek::VerifyingKey::from_bytes(&bytes).map_err(|_| KeyError::BadPublicKey)?;
        Ok(Self {
            id: key_id(&bytes),
            key,
        })
    }

    /// The key's id, the same as its private key's.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{PUBLIC_KEY_PREFIX}{}",
            BASE64.encode(self.key.as_bytes())
        )
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

/// A key a receiver verifies with: a shared `whsec_` secret, an Ed25519 `whpk_` public key,
/// or (for tools that hold it) a `whsk_` private key, verified through its public half.
#[derive(Clone, Debug)]
pub enum VerifyingKey {
    Secret(SigningKey),
    Public(PublicKey),
}

impl VerifyingKey {
    /// Parses `whsec_...`, `whpk_...` or `whsk_...`.
    pub fn parse(text: &str) -> Result<Self, KeyError> {
        let text = text.trim();
        if text.starts_with(PUBLIC_KEY_PREFIX) {
            return PublicKey::parse(text).map(Self::Public);
        }
        let key = SigningKey::parse(text)?;
        Ok(match key.public_key() {
            Some(public) => Self::Public(public),
            None => Self::Secret(key),
        })
    }

    /// The key's id, as status shows it.
    pub fn id(&self) -> &str {
        match self {
            Self::Secret(key) => key.id(),
            Self::Public(key) => key.id(),
        }
    }
}

/// What [`verify`] checks a signature entry with.
pub trait Verify {
    /// The scheme whose entries this key checks.
    fn scheme(&self) -> Scheme;
    /// Whether `signature` (decoded) signs `id.timestamp.body` under this key; HMACs are
    /// compared in constant time.
    fn matches(&self, msg_id: &str, timestamp: i64, body: &[u8], signature: &[u8]) -> bool;
}

impl Verify for SigningKey {
    fn scheme(&self) -> Scheme {
        SigningKey::scheme(self)
    }

    fn matches(&self, msg_id: &str, timestamp: i64, body: &[u8], signature: &[u8]) -> bool {
        match &self.secret {
            Secret::Hmac(mac) => feed_mac(mac.clone(), msg_id, timestamp, body)
                .verify_slice(signature)
                .is_ok(),
            Secret::Ed25519(key) => PublicKey {
                key: key.verifying_key(),
                id: String::new(),
            }
            .matches(msg_id, timestamp, body, signature),
        }
    }
}

impl Verify for PublicKey {
    fn scheme(&self) -> Scheme {
        Scheme::Ed25519
    }

    fn matches(&self, msg_id: &str, timestamp: i64, body: &[u8], signature: &[u8]) -> bool {
        let Ok(signature) = ed25519_dalek::Signature::from_slice(signature) else {
            return false;
        };
        self.key
            .verify(&signed_content(msg_id, timestamp, body), &signature)
            .is_ok()
    }
}

impl Verify for VerifyingKey {
    fn scheme(&self) -> Scheme {
        match self {
            Self::Secret(key) => Verify::scheme(key),
            Self::Public(key) => key.scheme(),
        }
    }

    fn matches(&self, msg_id: &str, timestamp: i64, body: &[u8], signature: &[u8]) -> bool {
        match self {
            Self::Secret(key) => key.matches(msg_id, timestamp, body, signature),
            Self::Public(key) => key.matches(msg_id, timestamp, body, signature),
        }
    }
}

/// Verifies a delivery the way a receiver does: the timestamp lies within `tolerance_secs`
/// of `now` (Unix seconds), and at least one entry of the signature header of a scheme one
/// of `keys` checks (`v1` for secrets, `v1a` for Ed25519 keys) matches one of them.
/// Entries of other versions are ignored.
pub fn verify<K: Verify>(
    keys: &[K],
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
    let mut saw_checkable = false;
    for entry in signature_header.split(' ').filter(|e| !e.is_empty()) {
        let (version, encoded) = entry
            .split_once(',')
            .ok_or_else(|| VerifyError::MalformedSignature(entry.to_owned()))?;
        let Some(scheme) = Scheme::of_tag(version) else {
            continue;
        };
        if !keys.iter().any(|k| k.scheme() == scheme) {
            continue;
        }
        saw_checkable = true;
        let Ok(signature) = BASE64.decode(encoded) else {
            return Err(VerifyError::MalformedSignature(entry.to_owned()));
        };
        let matched = keys
            .iter()
            .filter(|k| k.scheme() == scheme)
            .any(|k| k.matches(msg_id, ts, body, &signature));
        if matched {
            return Ok(());
        }
    }
    if saw_checkable {
        Err(VerifyError::NoMatch)
    } else {
        Err(VerifyError::NoSignature)
    }
}
