//! Standard Webhooks signatures (<https://www.standardwebhooks.com/>, spec v1.0.0).
//!
//! A delivery carries `webhook-id`, `webhook-timestamp` (Unix seconds) and
//! `webhook-signature`: one entry per currently valid key, separated by spaces, so a
//! receiver holding either the old or the new key during a rotation accepts the request.
//! Two schemes, both from the specification:
//!
//! - `v1,<base64 HMAC-SHA256(key, "id.timestamp.body")>`, symmetric: the receiver holds
//!   the same secret, written `whsec_<base64 key>`;
//! - `v1a,<base64 Ed25519 signature of "id.timestamp.body">`, asymmetric: Herald holds
//!   the private key, written `whsk_<base64 of its 32-byte seed>`, and the receiver only
//!   the public key, `whpk_<base64 of 32 bytes>`, which need not be kept secret.
//!
//! Key bytes never leave this module in a printable form except through [`to_whsec`] and
//! the generators; `Debug` shows only the key id.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use ed25519_dalek::Signer;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

/// Prefix of every serialized symmetric secret.
pub const SECRET_PREFIX: &str = "whsec_";
/// Prefix of a serialized Ed25519 private key (its 32-byte seed).
pub const PRIVATE_KEY_PREFIX: &str = "whsk_";
/// Prefix of a serialized Ed25519 public key.
pub const PUBLIC_KEY_PREFIX: &str = "whpk_";
/// The specification asks for keys of 24 to 64 random bytes.
pub const MIN_KEY_BYTES: usize = 24;
/// Upper bound of a key's length.
pub const MAX_KEY_BYTES: usize = 64;
/// Length of the keys Herald generates.
pub const GENERATED_KEY_BYTES: usize = 32;
/// Length of an Ed25519 seed and of an Ed25519 public key.
pub const ED25519_KEY_BYTES: usize = 32;
/// Default tolerance between a signature's timestamp and the verifier's clock.
pub const DEFAULT_TOLERANCE_SECS: u64 = 5 * 60;

/// The two signature schemes of the specification, by their version tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// `v1`: HMAC-SHA256 with a shared secret.
    Hmac,
    /// `v1a`: Ed25519 with a key pair.
    Ed25519,
}

impl Scheme {
    /// The version tag of the scheme's entries in `webhook-signature`.
    pub fn tag(self) -> &'static str {
        match self {
            Self::Hmac => "v1",
            Self::Ed25519 => "v1a",
        }
    }

    fn of_tag(tag: &str) -> Option<Self> {
        match tag {
            "v1" => Some(Self::Hmac),
            "v1a" => Some(Self::Ed25519),
            _ => None,
        }
    }
}

/// Why a secret could not be parsed or generated.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error(
        "secret does not start with \"{SECRET_PREFIX}\" (or \"{PRIVATE_KEY_PREFIX}\" for an Ed25519 private key)"
    )]
    MissingPrefix,
    #[error("key after its prefix is not valid base64: {0}")]
    NotBase64(#[source] base64::DecodeError),
    #[error(
        "secret decodes to {0} bytes; Standard Webhooks keys are {MIN_KEY_BYTES} to {MAX_KEY_BYTES} bytes"
    )]
    BadLength(usize),
    #[error("Ed25519 key decodes to {0} bytes; it must be {ED25519_KEY_BYTES}")]
    BadEd25519Length(usize),
    #[error("public key is not a valid Ed25519 point")]
    BadPublicKey,
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
    #[error(
        "webhook-signature has no signature of a scheme the keys verify (v1 for whsec_, v1a for whpk_)"
    )]
    NoSignature,
    #[error("webhook-signature entry {0:?} is not \"<version>,<base64>\"")]
    MalformedSignature(String),
    #[error("no signature matches any of the keys")]
    NoMatch,
}

#[derive(Clone)]
enum Secret {
    Hmac(HmacSha256),
    Ed25519(Box<ed25519_dalek::SigningKey>),
}

/// One signing key: an HMAC secret or an Ed25519 private key. Cloning is cheap enough
/// for per-endpoint caches; HMAC signing reuses the keyed state instead of re-deriving it
/// for every attempt.
#[derive(Clone)]
pub struct SigningKey {
    secret: Secret,
    id: String,
}

/// A short, stable, non-secret identifier: 12 hex digits of the SHA-256 of the HMAC key
/// or of the Ed25519 public key (so a receiver holding only the public key computes it).
fn key_id(bytes: &[u8]) -> String {
    Sha256::digest(bytes)[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn random_bytes() -> Result<[u8; GENERATED_KEY_BYTES], KeyError> {
    let mut bytes = [0u8; GENERATED_KEY_BYTES];
    getrandom::fill(&mut bytes).map_err(KeyError::Random)?;
    Ok(bytes)
}

fn decode(encoded: &str) -> Result<Vec<u8>, KeyError> {
    BASE64.decode(encoded).map_err(KeyError::NotBase64)
}

fn ed25519_bytes(bytes: &[u8]) -> Result<[u8; ED25519_KEY_BYTES], KeyError> {
    bytes
        .try_into()
        .map_err(|_| KeyError::BadEd25519Length(bytes.len()))
}

impl SigningKey {
    /// A fresh HMAC key of [`GENERATED_KEY_BYTES`] from the operating system's CSPRNG.
    pub fn generate() -> Result<Self, KeyError> {
        Self::from_bytes(&random_bytes()?)
    }

    /// An HMAC key from its raw bytes (24 to 64 of them).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, KeyError> {
        if !(MIN_KEY_BYTES..=MAX_KEY_BYTES).contains(&bytes.len()) {
            return Err(KeyError::BadLength(bytes.len()));
        }
        let mac = HmacSha256::new_from_slice(bytes).expect("HMAC accepts keys of any length");
        Ok(Self {
            secret: Secret::Hmac(mac),
            id: key_id(bytes),
        })
    }

    /// An Ed25519 key from its 32-byte seed.
    pub fn ed25519_from_seed(seed: &[u8]) -> Result<Self, KeyError> {
        let key = ed25519_dalek::SigningKey::from_bytes(&ed25519_bytes(seed)?);
        let id = key_id(key.verifying_key().as_bytes());
        Ok(Self {
            secret: Secret::Ed25519(Box::new(key)),
            id,
        })
    }

    /// Parses a `whsec_<base64>` secret.
    pub fn from_whsec(text: &str) -> Result<Self, KeyError> {
        let encoded = text
            .trim()
            .strip_prefix(SECRET_PREFIX)
            .ok_or(KeyError::MissingPrefix)?;
        Self::from_bytes(&decode(encoded)?)
    }

    /// Parses a signing key as a Secret holds it: `whsec_<base64>` (HMAC, `v1`) or
    /// `whsk_<base64 seed>` (Ed25519, `v1a`).
    pub fn parse(text: &str) -> Result<Self, KeyError> {
        let text = text.trim();
        match text.strip_prefix(PRIVATE_KEY_PREFIX) {
            Some(encoded) => Self::ed25519_from_seed(&decode(encoded)?),
            None => Self::from_whsec(text),
        }
    }

    /// A short, stable, non-secret identifier of the key (12 hex digits of its SHA-256,
    /// of the public key for Ed25519), safe to show in status and logs.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Which scheme the key signs with.
    pub fn scheme(&self) -> Scheme {
        match self.secret {
            Secret::Hmac(_) => Scheme::Hmac,
            Secret::Ed25519(_) => Scheme::Ed25519,
        }
    }

    /// The `whpk_...` public key of an Ed25519 key, for status and receivers; `None` for
    /// an HMAC secret, which has no public half.
    pub fn public_key(&self) -> Option<PublicKey> {
        match &self.secret {
            Secret::Hmac(_) => None,
            Secret::Ed25519(key) => Some(PublicKey {
                key: key.verifying_key(),
                id: self.id.clone(),
            }),
        }
    }

    /// Appends the base64 of this key's signature of `id.timestamp.body`.
    fn sign_into(&self, msg_id: &str, timestamp: i64, body: &[u8], out: &mut String) {
        match &self.secret {
            Secret::Hmac(mac) => {
                let mac = feed_mac(mac.clone(), msg_id, timestamp, body);
                BASE64.encode_string(mac.finalize().into_bytes(), out);
            }
            Secret::Ed25519(key) => {
                let signature = key.sign(&signed_content(msg_id, timestamp, body));
                BASE64.encode_string(signature.to_bytes(), out);
            }
        }
    }
}

/// `id.timestamp.body` into an HMAC state.
fn feed_mac(mut mac: HmacSha256, msg_id: &str, timestamp: i64, body: &[u8]) -> HmacSha256 {
    mac.update(msg_id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// `id.timestamp.body` as one buffer (Ed25519 hashes its message twice, so it takes it whole).
fn signed_content(msg_id: &str, timestamp: i64, body: &[u8]) -> Vec<u8> {
    let timestamp = timestamp.to_string();
    let mut content = Vec::with_capacity(msg_id.len() + timestamp.len() + body.len() + 2);
    content.extend_from_slice(msg_id.as_bytes());
    content.push(b'.');
    content.extend_from_slice(timestamp.as_bytes());
    content.push(b'.');
    content.extend_from_slice(body);
    content
}

/// Serializes an HMAC key back to `whsec_<base64>`. Separate from the type so that every
/// place that reveals key material is easy to find.
pub fn to_whsec(bytes: &[u8]) -> String {
    format!("{SECRET_PREFIX}{}", BASE64.encode(bytes))
}

/// Generates a new HMAC secret and returns it serialized, with its key id.
pub fn generate_whsec() -> Result<(String, String), KeyError> {
    let bytes = random_bytes()?;
    let key = SigningKey::from_bytes(&bytes)?;
    Ok((to_whsec(&bytes), key.id().to_owned()))
}

/// Generates a new Ed25519 private key and returns it serialized (`whsk_<base64 seed>`),
/// with its key id.
pub fn generate_whsk() -> Result<(String, String), KeyError> {
    let seed = random_bytes()?;
    let key = SigningKey::ed25519_from_seed(&seed)?;
    Ok((
        format!("{PRIVATE_KEY_PREFIX}{}", BASE64.encode(seed)),
        key.id().to_owned(),
    ))
}

/// Generates a key of `scheme`, serialized, with its key id.
pub fn generate(scheme: Scheme) -> Result<(String, String), KeyError> {
    match scheme {
        Scheme::Hmac => generate_whsec(),
        Scheme::Ed25519 => generate_whsk(),
    }
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SigningKey({} id={}, <redacted>)",
            self.scheme().tag(),
            self.id
        )
    }
}

/// The `webhook-signature` header value: one `v1,<base64>` or `v1a,<base64>` entry per
/// key, in key order.
pub fn sign(keys: &[SigningKey], msg_id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut header = String::with_capacity(keys.len() * 96);
    for (i, key) in keys.iter().enumerate() {
        if i > 0 {
            header.push(' ');
        }
        header.push_str(key.scheme().tag());
        header.push(',');
        key.sign_into(msg_id, timestamp, body, &mut header);
    }
    header
}

mod verify;
pub use verify::{PublicKey, Verify, VerifyingKey, verify};

#[cfg(test)]
mod tests;
