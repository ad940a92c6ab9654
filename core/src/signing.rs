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
use ed25519_dalek::{Signer, Verifier};
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

/// An Ed25519 public key, `whpk_<base64>`: what a receiver of `v1a` signatures holds.
#[derive(Clone, PartialEq, Eq)]
pub struct PublicKey {
    key: ed25519_dalek::VerifyingKey,
    id: String,
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

    // The Ed25519 vector of the Standard Webhooks reference library's tests (Go,
    // libraries/go/webhook_asymmetric_test.go): the seed, then the expected `v1a` entry.
    const ED25519_SEED: &str = "VEVTVFNJR05JTkdLRVlET05PVFVTRVRISVNGT1JBTlk=";
    const ED25519_SIGNATURE: &str = "v1a,tQ9V2XOqn7jL/DQenEFpqIugdBVtiMmER5mhSkXBNwM0mkATuDe6KYYUuxqtaiHeYGb7KaaBRdM5WqyeFiL8Ag==";

    fn ed25519_vector_key() -> SigningKey {
        SigningKey::parse(&format!("{PRIVATE_KEY_PREFIX}{ED25519_SEED}")).unwrap()
    }

    #[test]
    fn signs_the_reference_ed25519_vector() {
        let key = ed25519_vector_key();
        assert_eq!(key.scheme(), Scheme::Ed25519);
        assert_eq!(
            sign(&[key], VECTOR_ID, VECTOR_TS, VECTOR_BODY),
            ED25519_SIGNATURE
        );
    }

    #[test]
    fn a_public_key_verifies_v1a_and_nothing_else() {
        let key = ed25519_vector_key();
        let public = key.public_key().expect("Ed25519 keys have a public half");
        let text = public.to_string();
        assert!(text.starts_with(PUBLIC_KEY_PREFIX), "{text}");
        let parsed = VerifyingKey::parse(&text).unwrap();
        assert_eq!(parsed.id(), key.id());
        let ts = VECTOR_TS.to_string();
        let check = |header: &str, body: &[u8]| {
            verify(
                std::slice::from_ref(&parsed),
                VECTOR_ID,
                &ts,
                header,
                body,
                VECTOR_TS,
                300,
            )
        };
        assert_eq!(check(ED25519_SIGNATURE, VECTOR_BODY), Ok(()));
        assert_eq!(
            check(ED25519_SIGNATURE, br#"{"test": 2432232315}"#),
            Err(VerifyError::NoMatch)
        );
        // A v1 entry is not something a public key can check.
        assert_eq!(
            check(VECTOR_SIGNATURE, VECTOR_BODY),
            Err(VerifyError::NoSignature)
        );
        // During a move from HMAC to Ed25519 both sign; each receiver finds its entry.
        let both = sign(
            &[ed25519_vector_key(), vector_key()],
            VECTOR_ID,
            VECTOR_TS,
            VECTOR_BODY,
        );
        assert_eq!(both, format!("{ED25519_SIGNATURE} {VECTOR_SIGNATURE}"));
        assert_eq!(check(&both, VECTOR_BODY), Ok(()));
        let hmac = [VerifyingKey::parse(VECTOR_SECRET).unwrap()];
        assert_eq!(
            verify(&hmac, VECTOR_ID, &ts, &both, VECTOR_BODY, VECTOR_TS, 300),
            Ok(())
        );
        // The private key verifies too (through its public half).
        let private =
            [VerifyingKey::parse(&format!("{PRIVATE_KEY_PREFIX}{ED25519_SEED}")).unwrap()];
        assert_eq!(
            verify(&private, VECTOR_ID, &ts, &both, VECTOR_BODY, VECTOR_TS, 300),
            Ok(())
        );
    }

    #[test]
    fn ed25519_keys_are_refused_with_reasons_and_never_printed() {
        assert!(matches!(
            SigningKey::parse("whsk_c2hvcnQ="),
            Err(KeyError::BadEd25519Length(5))
        ));
        assert!(matches!(
            PublicKey::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
            Err(KeyError::MissingPrefix)
        ));
        let (whsk, id) = generate(Scheme::Ed25519).unwrap();
        assert!(whsk.starts_with(PRIVATE_KEY_PREFIX));
        let key = SigningKey::parse(&whsk).unwrap();
        assert_eq!(key.id(), id);
        let printed = format!("{key:?}");
        assert!(
            !printed.contains(&whsk[PRIVATE_KEY_PREFIX.len()..]),
            "{printed}"
        );
        assert!(printed.contains("v1a"), "{printed}");
        let (whsec, _) = generate(Scheme::Hmac).unwrap();
        assert_eq!(SigningKey::parse(&whsec).unwrap().scheme(), Scheme::Hmac);
        assert!(SigningKey::parse(&whsec).unwrap().public_key().is_none());
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

        #[test]
        fn ed25519_round_trip(seed in proptest::collection::vec(any::<u8>(), ED25519_KEY_BYTES),
                              ts in 0i64..4_000_000_000, body in proptest::collection::vec(any::<u8>(), 0..512),
                              pos in any::<prop::sample::Index>(), flip in 1u8..=255) {
            let key = SigningKey::ed25519_from_seed(&seed).unwrap();
            let public = [key.public_key().unwrap()];
            let header = sign(std::slice::from_ref(&key), "msg_1", ts, &body);
            prop_assert_eq!(verify(&public, "msg_1", &ts.to_string(), &header, &body, ts, 0), Ok(()));
            let mut tampered = body.clone();
            tampered.push(0);
            let i = pos.index(tampered.len());
            tampered[i] ^= flip;
            prop_assert!(verify(&public, "msg_1", &ts.to_string(), &header, &tampered, ts, 0).is_err());
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
