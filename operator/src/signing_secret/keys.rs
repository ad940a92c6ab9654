//! Pure: the keys as the Kubernetes Secret holds them, read and written.
//!
//! Contract: a Secret holds `current` (`whsec_...` for HMAC, `whsk_...` for Ed25519) and, during a rotation's overlap,
//! `previous` and `previousValidUntil` (RFC 3339). Problems are described by the data
//! key and what is wrong, never by the value.

use std::collections::BTreeMap;

use herald_core::dataplane::KeySet;
use herald_core::names;
use herald_core::signing::{KeyError, Scheme, SigningKey};
use herald_core::v1alpha1::SigningSecret;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use serde_json::json;

pub const CURRENT: &str = "current";
pub const PREVIOUS: &str = "previous";
pub const PREVIOUS_VALID_UNTIL: &str = "previousValidUntil";

/// The keys as stored in the Secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Keys {
    pub current: String,
    pub previous: Option<(String, Timestamp)>,
}

impl Keys {
    /// The keys that sign, newest first.
    pub fn key_set(&self) -> KeySet {
        let mut keys = vec![self.current.clone()];
        keys.extend(self.previous.as_ref().map(|(p, _)| p.clone()));
        KeySet { keys }
    }
}

/// A data key of the Secret that does not hold what it should. The message names the
/// key and the problem, never the value.
#[derive(Debug, PartialEq, Eq)]
pub struct BadData {
    pub key: &'static str,
    pub problem: String,
}

/// What the Secret holds.
pub enum Stored {
    /// There is no Secret: Herald generates one.
    Missing,
    Valid(Keys),
    Invalid(BadData),
}

/// Reads the Secret (`None`: it does not exist).
pub fn stored(secret: Option<&Secret>) -> Stored {
    match secret {
        None => Stored::Missing,
        Some(secret) => match read_keys(&secret.data.clone().unwrap_or_default()) {
            Ok(keys) => Stored::Valid(keys),
            Err(bad) => Stored::Invalid(bad),
        },
    }
}

/// Reads the keys out of Secret data.
pub fn read_keys(data: &BTreeMap<String, ByteString>) -> Result<Keys, BadData> {
    let text = |key: &'static str| -> Result<Option<String>, BadData> {
        data.get(key)
            .map(|v| {
                String::from_utf8(v.0.clone()).map_err(|_| BadData {
                    key,
                    problem: "is not UTF-8 text".into(),
                })
            })
            .transpose()
    };
    let check = |key: &'static str, value: &str| {
        SigningKey::parse(value).map_err(|e| BadData {
            key,
            problem: describe(&e),
        })
    };
    let current = text(CURRENT)?.ok_or(BadData {
        key: CURRENT,
        problem: "is missing".into(),
    })?;
    check(CURRENT, &current)?;
    let previous = match (text(PREVIOUS)?, text(PREVIOUS_VALID_UNTIL)?) {
        (Some(previous), Some(until)) => {
            check(PREVIOUS, &previous)?;
            let until = until.trim().parse::<Timestamp>().map_err(|_| BadData {
                key: PREVIOUS_VALID_UNTIL,
                problem: "is not an RFC 3339 time such as 2026-11-30T12:00:00Z".into(),
            })?;
            Some((previous.trim().to_owned(), until))
        }
        (Some(_), None) => {
            return Err(BadData {
                key: PREVIOUS_VALID_UNTIL,
                problem: "is missing while `previous` is set".into(),
            });
        }
        (None, _) => None,
    };
    Ok(Keys {
        current: current.trim().to_owned(),
        previous,
    })
}

/// A key error in words that cannot leak key material (base64 decode errors quote the
/// offending byte, so they are not passed through).
fn describe(e: &KeyError) -> String {
    match e {
        KeyError::NotBase64(_) => {
            "is not valid base64 after its \"whsec_\" or \"whsk_\" prefix".into()
        }
        other => format!("is not a valid key: {other}"),
    }
}

/// The id of a stored key, for status and Events.
pub fn key_id(stored: &str) -> Option<String> {
    SigningKey::parse(stored).ok().map(|k| k.id().to_owned())
}

/// The `whpk_` public key of a stored Ed25519 key, for status; `None` for HMAC.
pub fn public_key(stored: &str) -> Option<String> {
    SigningKey::parse(stored)
        .ok()
        .and_then(|k| k.public_key())
        .map(|k| k.to_string())
}

/// The scheme a stored key signs with.
pub fn scheme(stored: &str) -> Option<Scheme> {
    SigningKey::parse(stored).ok().map(|k| k.scheme())
}

/// The Secret to apply for `keys`. `data`, not `stringData`: server-side apply tracks
/// ownership of `data` keys, so leaving `previous` out of the next apply removes it.
/// A Secret Herald did not create (`owned` false) gets no labels, owner or type.
pub fn manifest(
    obj: &SigningSecret,
    namespace: &str,
    name: &str,
    keys: &Keys,
    owned: bool,
) -> serde_json::Value {
    let bytes = |s: &str| ByteString(s.as_bytes().to_vec());
    let mut data = BTreeMap::from([(CURRENT.to_owned(), bytes(&keys.current))]);
    if let Some((previous, until)) = &keys.previous {
        data.insert(PREVIOUS.to_owned(), bytes(previous));
        data.insert(PREVIOUS_VALID_UNTIL.to_owned(), bytes(&until.to_string()));
    }
    let mut secret = json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "data": data,
    });
    if owned {
        secret["metadata"]["labels"] = json!({names::MANAGED_BY_LABEL: names::MANAGED_BY});
        secret["metadata"]["ownerReferences"] = json!([obj.controller_owner_ref(&())]);
        secret["type"] = json!("Opaque");
    }
    secret
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_core::signing::generate_whsec;

    #[test]
    fn bad_data_names_the_key_not_the_value() {
        let value = "whsec_!!notbase64!!";
        let data = BTreeMap::from([(CURRENT.to_owned(), ByteString(value.as_bytes().to_vec()))]);
        let bad = read_keys(&data).err().unwrap();
        assert_eq!(bad.key, CURRENT);
        assert!(!bad.problem.contains("notbase64"), "{}", bad.problem);
        let current = generate_whsec().unwrap().0;
        let data = BTreeMap::from([
            (CURRENT.to_owned(), ByteString(current.into_bytes())),
            (PREVIOUS.to_owned(), ByteString(b"nope".to_vec())),
            (
                PREVIOUS_VALID_UNTIL.to_owned(),
                ByteString(b"2026-01-01T00:00:00Z".to_vec()),
            ),
        ]);
        assert_eq!(read_keys(&data).err().unwrap().key, PREVIOUS);
    }

    #[test]
    fn key_sets_are_newest_first() {
        let (a, b) = (generate_whsec().unwrap().0, generate_whsec().unwrap().0);
        let keys = Keys {
            current: a.clone(),
            previous: Some((b.clone(), Timestamp::UNIX_EPOCH)),
        };
        assert_eq!(keys.key_set().keys, vec![a, b]);
    }
}
