//! An endpoint's values from Secrets (`herald_core::dataplane::credentials`): kept for the
//! shards this replica delivers, merged into the endpoint's configuration as it enters
//! the index. An endpoint whose entry names credentials the index does not hold in that
//! version is held (nothing sent, its backlog kept) until they arrive; the entry is kept
//! as read, so the credentials' arrival applies it again.

use std::sync::Arc;

use herald_core::dataplane::{Credentials, EndpointConfig, EndpointKey, Hold};

use super::{Change, ConfigError, Endpoint, Index, compile_config};

/// The hold reason of an endpoint waiting for its credentials.
pub const CREDENTIALS_PENDING: &str = "CredentialsPending";

impl Index {
    /// Decodes an `ep.` entry and compiles it with its credentials.
    pub(super) fn compile_with_credentials(
        &self,
        key: &EndpointKey,
        value: &[u8],
    ) -> Result<Endpoint, ConfigError> {
        let mut config: EndpointConfig = serde_json::from_slice(value)?;
        if config.credentials.is_some() {
            let held = self
                .inner
                .read()
                .expect("index lock")
                .credentials
                .get(key)
                .cloned();
            let merged = match held {
                Some(credentials) => credentials.merge(&mut config).map_err(|e| e.to_string()),
                None => Err("they have not arrived".to_owned()),
            };
            if let Err(why) = merged {
                // An operator's hold says more than this one.
                config.held.get_or_insert_with(|| {
                    Box::new(Hold {
                        reason: CREDENTIALS_PENDING.to_owned(),
                        message: format!(
                            "waiting for the endpoint's values from Secrets from the operator: {why}"
                        ),
                    })
                });
            }
        }
        compile_config(config)
    }

    /// Applies a `cred.` entry: kept when the scope delivers its shard; the endpoint's
    /// entry, if it needs them, is applied again.
    pub(super) fn apply_credentials(
        &self,
        key: &str,
        ep_key: EndpointKey,
        value: Option<&[u8]>,
    ) -> Option<Change> {
        let credentials = match value.map(serde_json::from_slice::<Credentials>) {
            None => None,
            Some(Ok(credentials)) => Some(Arc::new(credentials)),
            Some(Err(error)) => {
                // serde's message names the field, never the value.
                tracing::warn!(key, %error, "ignoring invalid endpoint credentials");
                return None;
            }
        };
        let entry = {
            let mut inner = self.inner.write().expect("index lock");
            let before = match credentials {
                Some(c) if inner.scope.keeps_shard(c.shard) => {
                    inner.credentials.insert(ep_key.clone(), c.clone())
                }
                _ => inner.credentials.remove(&ep_key),
            };
            let now = inner.credentials.get(&ep_key);
            if before.as_deref() == now.map(|c| &**c) {
                return None;
            }
            inner.needing.get(&ep_key).cloned()
        };
        let entry = entry?;
        self.apply_endpoint(key, ep_key, Some(&entry))
    }
}
