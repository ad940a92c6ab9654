//! What an endpoint takes from Secrets — header values (`valueFrom.secretKeyRef`) and
//! its client certificate, key and CA (`spec.tls`) — kept out of its `ep.` entry, which
//! herald-api reads, in an entry of its own that only the dispatchers read, like the
//! signing keys: `cred.<ns>.<name>` in [`CONFIG_BUCKET`](super::CONFIG_BUCKET).
//!
//! Contract: the operator [`Credentials::split`]s a resolved configuration before it
//! publishes it — the `ep.` entry keeps each such header with an empty value and names
//! the credentials it needs by [`Credentials::fingerprint`] — and writes the `cred.`
//! entry first. A dispatcher [`Credentials::merge`]s them back and delivers nothing to
//! an endpoint whose credentials it does not hold in that version.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{EndpointConfig, TlsMaterial};

/// An endpoint's values from Secrets.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Credentials {
    /// The endpoint these belong to.
    pub uid: String,
    /// Its shard: a dispatcher keeps only the credentials of the shards it delivers.
    pub shard: u32,
    /// The values of the headers that take them from Secrets, in their order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub header_values: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsMaterial>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Credentials({} header values, TLS: {}, <redacted>)",
            self.header_values.len(),
            self.tls.is_some()
        )
    }
}

/// Credentials that do not belong to a configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    #[error("the credentials are another endpoint's (uid {0})")]
    OtherEndpoint(String),
    #[error("the configuration needs other credentials (another version)")]
    OtherVersion,
}

impl Credentials {
    /// Which version of the credentials a configuration needs: a hash of their content,
    /// which says nothing about it.
    pub fn fingerprint(&self) -> String {
        let bytes = serde_json::to_vec(self).expect("credentials serialize");
        let digest = Sha256::digest(&bytes);
        digest[..12].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Takes the secret values out of a resolved `config` (each header with a
    /// `valueFrom` keeps an empty value; `tls` goes) and names them in
    /// `config.credentials`. `None` when it has none.
    pub fn split(config: &mut EndpointConfig) -> Option<Self> {
        let header_values: Vec<String> = config
            .headers
            .iter_mut()
            .filter(|h| h.value_from.is_some())
            .map(|h| std::mem::take(&mut h.value))
            .collect();
        let tls = config.tls.take().map(Arc::unwrap_or_clone);
        if header_values.is_empty() && tls.is_none() {
            config.credentials = None;
            return None;
        }
        let credentials = Self {
            uid: config.uid.clone(),
            shard: config.shard,
            header_values,
            tls,
        };
        config.credentials = Some(credentials.fingerprint());
        Some(credentials)
    }

    /// Puts the values back into `config`, which must name this version of them.
    pub fn merge(&self, config: &mut EndpointConfig) -> Result<(), Mismatch> {
        if self.uid != config.uid {
            return Err(Mismatch::OtherEndpoint(self.uid.clone()));
        }
        let takes = config.headers.iter().filter(|h| h.value_from.is_some());
        if config.credentials.as_deref() != Some(self.fingerprint().as_str())
            || takes.count() != self.header_values.len()
        {
            return Err(Mismatch::OtherVersion);
        }
        let headers = config.headers.iter_mut().filter(|h| h.value_from.is_some());
        for (header, value) in headers.zip(&self.header_values) {
            header.value.clone_from(value);
        }
        config.tls = self.tls.clone().map(Arc::new);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1alpha1::Header;
    use serde_json::json;

    fn resolved() -> EndpointConfig {
        let mut config: EndpointConfig = serde_json::from_value(json!({
            "namespace": "shop", "name": "orders", "uid": "u1", "generation": 1,
            "url": "https://hooks.example.com/", "eventTypes": ["*"], "secret": "s",
            "delivery": {}, "shard": 3,
            "headers": [
                {"name": "X-Tenant", "value": "shop"},
                {"name": "Authorization", "value": "Bearer t0k3n",
                 "valueFrom": {"secretKeyRef": {"name": "auth", "key": "token"}}}
            ]
        }))
        .unwrap();
        config.tls = Some(Arc::new(TlsMaterial {
            client_cert: Some("CERT".into()),
            client_key: Some("PRIVATE KEY".into()),
            ca: None,
        }));
        config
    }

    #[test]
    fn the_published_entry_holds_no_secret_and_merging_restores_it() {
        let mut config = resolved();
        let credentials = Credentials::split(&mut config).unwrap();
        let published = serde_json::to_string(&config).unwrap();
        for secret in ["t0k3n", "PRIVATE KEY", "CERT"] {
            assert!(!published.contains(secret), "{secret} in {published}");
        }
        assert_eq!(config.headers[0], Header::literal("X-Tenant", "shop"));
        assert_eq!(credentials.shard, 3);
        assert!(!format!("{credentials:?}").contains("t0k3n"));
        // The dispatcher's side.
        let mut read: EndpointConfig = serde_json::from_str(&published).unwrap();
        credentials.merge(&mut read).unwrap();
        let mut expected = resolved();
        expected.credentials = config.credentials.clone();
        assert_eq!(read, expected);
    }

    #[test]
    fn credentials_of_another_version_or_endpoint_do_not_merge() {
        let mut config = resolved();
        let old = Credentials::split(&mut config).unwrap();
        let mut rotated = resolved();
        rotated.headers[1].value = "Bearer n3w".into();
        let new = Credentials::split(&mut rotated).unwrap();
        assert_ne!(old.fingerprint(), new.fingerprint());
        let mut read = rotated.clone();
        assert_eq!(old.merge(&mut read), Err(Mismatch::OtherVersion));
        let other = Credentials {
            uid: "u0".into(),
            ..new.clone()
        };
        assert!(matches!(
            other.merge(&mut read),
            Err(Mismatch::OtherEndpoint(_))
        ));
        new.merge(&mut read).unwrap();
        assert_eq!(read.headers[1].value, "Bearer n3w");
    }

    #[test]
    fn an_endpoint_without_secrets_has_no_credentials() {
        let mut config = resolved();
        config.headers.truncate(1);
        config.tls = None;
        config.credentials = Some("stale".into());
        assert_eq!(Credentials::split(&mut config), None);
        assert_eq!(config.credentials, None);
    }
}
