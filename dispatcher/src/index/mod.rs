//! The dispatcher's view of configuration: every endpoint and key set from the
//! `herald-config` KV bucket, kept current by a watch. Fan-out reads it to match events;
//! shards read it to deliver. While the Kubernetes API (or the operator) is down, this
//! view simply stops changing — delivery goes on with the last known configuration.

use std::collections::HashMap;
use std::sync::{Arc, RwLock, Weak};

use futures::StreamExt;
use herald_core::dataplane::{
    BucketKey, EndpointConfig, EndpointKey, KeySet, TenantPolicy, keyset_key,
};
use herald_core::pattern::Pattern;
use herald_core::signing::SigningKey;
use herald_core::v1alpha1::DeliveryPolicy;

use crate::supervise::Readiness;
use matcher::Namespace;
use tokio::sync::{broadcast, watch};

/// An endpoint as the data plane uses it: the configuration plus what is derived once.
/// Kept small: every replica holds one per endpoint of the installation.
#[derive(Debug)]
pub struct Endpoint {
    pub config: EndpointConfig,
    pub key: EndpointKey,
    /// The wildcard patterns (exact types are matched through the namespace's hash map
    /// and `config.event_types`, so they are not kept twice).
    wildcards: Box<[Pattern]>,
}

impl Endpoint {
    /// An endpoint straight from a configuration (tests).
    #[cfg(test)]
    pub fn compile_for_test(config: EndpointConfig) -> Self {
        compile(&serde_json::to_vec(&config).expect("config serializes")).expect("valid config")
    }

    /// A copy (tests change configurations through it).
    #[cfg(test)]
    pub fn clone_for_test(&self) -> Self {
        Self {
            config: self.config.clone(),
            key: self.key.clone(),
            wildcards: self.wildcards.clone(),
        }
    }

    fn exact_types(&self) -> impl Iterator<Item = &str> {
        self.config
            .event_types
            .iter()
            .map(String::as_str)
            .filter(|t| !t.contains('*'))
    }

    pub fn matches(&self, event_type: &str) -> bool {
        self.exact_types().any(|t| t == event_type)
            || self.wildcards.iter().any(|p| p.matches(event_type))
    }
}

/// What changed, for shards to refresh their state.
#[derive(Debug, Clone)]
pub enum Change {
    Endpoint(EndpointKey),
    Keys {
        namespace: String,
        secret: String,
    },
    /// A tenant's policy changed (or was removed).
    Tenant(String),
}

#[derive(Default)]
struct Inner {
    endpoints: HashMap<EndpointKey, Arc<Endpoint>>,
    /// Delivery policies shared by endpoints that use the same one.
    policies: HashMap<Arc<str>, Weak<DeliveryPolicy>>,
    namespaces: HashMap<String, Namespace>,
    keys: HashMap<String, Arc<[SigningKey]>>,
    tenants: HashMap<String, TenantPolicy>,
}

impl Inner {
    /// Replaces the endpoint's delivery policy by an identical shared one, if any.
    fn intern(&mut self, mut endpoint: Arc<Endpoint>) -> Arc<Endpoint> {
        let Ok(text) = serde_json::to_string(&*endpoint.config.delivery) else {
            return endpoint;
        };
        let text: Arc<str> = text.into();
        match self.policies.get(&text).and_then(Weak::upgrade) {
            Some(shared) => {
                if let Some(e) = Arc::get_mut(&mut endpoint) {
                    e.config.delivery = shared;
                }
            }
            None => {
                if self.policies.len() > 4 * (self.endpoints.len() + 16) {
                    self.policies.retain(|_, p| p.strong_count() > 0);
                }
                self.policies
                    .insert(text, Arc::downgrade(&endpoint.config.delivery));
            }
        }
        endpoint
    }
}

/// Shared, cheaply cloned.
#[derive(Clone)]
pub struct Index {
    inner: Arc<RwLock<Inner>>,
    changes: broadcast::Sender<Change>,
    loaded: Arc<watch::Sender<bool>>,
}

impl Default for Index {
    fn default() -> Self {
        Self {
            inner: Arc::default(),
            changes: broadcast::channel(4096).0,
            loaded: Arc::new(watch::channel(false).0),
        }
    }
}

impl Index {
    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    pub fn endpoint(&self, key: &EndpointKey) -> Option<Arc<Endpoint>> {
        self.inner
            .read()
            .expect("index lock")
            .endpoints
            .get(key)
            .cloned()
    }

    /// The endpoints of `namespace` that receive `event_type`, or `None` when the
    /// namespace has no endpoints at all (an unknown tenant). Costs the matches and the
    /// type's depth, never the endpoints that do not match (see [`matcher`]).
    pub fn matching(&self, namespace: &str, event_type: &str) -> Option<Vec<Arc<Endpoint>>> {
        let inner = self.inner.read().expect("index lock");
        Some(inner.namespaces.get(namespace)?.matching(event_type))
    }

    /// The keys that sign for the endpoint's secret (newest first).
    pub fn keys(&self, namespace: &str, secret: &str) -> Option<Arc<[SigningKey]>> {
        self.inner
            .read()
            .expect("index lock")
            .keys
            .get(&keyset_key(namespace, secret))
            .cloned()
    }

    pub fn endpoint_count(&self) -> usize {
        self.inner.read().expect("index lock").endpoints.len()
    }

    /// Applies one KV entry. Malformed values are logged and skipped: one bad entry must
    /// not stop the others from being used.
    pub fn apply(&self, key: &str, value: Option<&[u8]>) {
        let change = match BucketKey::parse(key) {
            None => {
                tracing::warn!(key, "ignoring a config entry with a malformed key");
                return;
            }
            Some(BucketKey::Endpoint(endpoint)) => self.apply_endpoint(key, endpoint, value),
            Some(BucketKey::KeySet(secret)) => self.apply_keys(key, secret, value),
            Some(BucketKey::Tenant(namespace)) => self.apply_tenant(key, namespace, value),
            // Not endpoint configuration.
            Some(BucketKey::Lasting { .. } | BucketKey::ShardCount | BucketKey::Replay(_)) => None,
        };
        if let Some(change) = change {
            let _ = self.changes.send(change);
        }
    }

    fn apply_endpoint(
        &self,
        key: &str,
        ep_key: EndpointKey,
        value: Option<&[u8]>,
    ) -> Option<Change> {
        let endpoint = match value.map(compile) {
            None => None,
            Some(Ok(endpoint)) => Some(Arc::new(endpoint)),
            Some(Err(error)) => {
                tracing::warn!(key, %error, "ignoring an invalid endpoint config");
                return None;
            }
        };
        let mut guard = self.inner.write().expect("index lock");
        let inner = &mut *guard;
        let endpoint = endpoint.map(|e| inner.intern(e));
        let ns = ep_key.namespace().to_owned();
        // Out with the old entry first: old and new share the key, so removing the old
        // one after adding the new one would unindex the new one too.
        if let Some(old) = inner.endpoints.remove(&ep_key)
            && let Some(namespace) = inner.namespaces.get_mut(&ns)
        {
            namespace.remove(&old);
            if namespace.count == 0 {
                inner.namespaces.remove(&ns);
            }
        }
        if let Some(endpoint) = endpoint {
            inner
                .namespaces
                .entry(ns.clone())
                .or_default()
                .add(&endpoint);
            inner.endpoints.insert(ep_key.clone(), endpoint);
        }
        Some(Change::Endpoint(ep_key))
    }

    fn apply_keys(&self, key: &str, secret: EndpointKey, value: Option<&[u8]>) -> Option<Change> {
        let keys = match value.map(parse_keys) {
            None => None,
            Some(Ok(keys)) => Some(keys),
            Some(Err(error)) => {
                // The error names the problem, never the key material.
                tracing::warn!(key, %error, "ignoring an invalid key set");
                return None;
            }
        };
        let mut inner = self.inner.write().expect("index lock");
        match keys {
            Some(keys) => inner.keys.insert(key.to_owned(), keys),
            None => inner.keys.remove(key),
        };
        Some(Change::Keys {
            namespace: secret.namespace().to_owned(),
            secret: secret.name(),
        })
    }

    fn apply_tenant(&self, key: &str, namespace: String, value: Option<&[u8]>) -> Option<Change> {
        let policy = match value.map(serde_json::from_slice::<TenantPolicy>) {
            None => None,
            Some(Ok(policy)) => Some(policy),
            Some(Err(error)) => {
                tracing::warn!(key, %error, "ignoring an invalid tenant policy");
                return None;
            }
        };
        let mut inner = self.inner.write().expect("index lock");
        match policy {
            Some(policy) => inner.tenants.insert(namespace.clone(), policy),
            None => inner.tenants.remove(&namespace),
        };
        Some(Change::Tenant(namespace))
    }

    /// The policy of tenant `namespace`, if its namespace sets one.
    pub fn tenant(&self, namespace: &str) -> Option<TenantPolicy> {
        self.inner
            .read()
            .expect("index lock")
            .tenants
            .get(namespace)
            .copied()
    }

    /// Every tenant policy set.
    pub fn tenants(&self) -> Vec<(String, TenantPolicy)> {
        let inner = self.inner.read().expect("index lock");
        inner
            .tenants
            .iter()
            .map(|(ns, p)| (ns.clone(), *p))
            .collect()
    }

    /// Marks the configuration as completely loaded (the bucket's content as of the
    /// start, not just part of it).
    pub fn mark_loaded(&self) {
        self.loaded.send_replace(true);
    }

    pub fn is_loaded(&self) -> bool {
        *self.loaded.borrow()
    }

    /// Waits until the configuration is completely loaded.
    pub async fn wait_loaded(&self) {
        let mut loaded = self.loaded.subscribe();
        let _ = loaded.wait_for(|l| *l).await;
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("not a valid EndpointConfig: {0}")]
    Json(#[from] serde_json::Error),
    #[error("url: {0}")]
    Url(#[from] url::ParseError),
    #[error("event type pattern: {0}")]
    Pattern(#[from] herald_core::pattern::PatternError),
    #[error("signing key {index}: {source}")]
    Key {
        index: usize,
        #[source]
        source: herald_core::signing::KeyError,
    },
}

fn compile(value: &[u8]) -> Result<Endpoint, ConfigError> {
    let config: EndpointConfig = serde_json::from_slice(value)?;
    url::Url::parse(&config.url)?;
    let mut wildcards = Vec::new();
    for text in &config.event_types {
        let pattern: Pattern = text.parse()?;
        if !pattern.is_exact() {
            wildcards.push(pattern);
        }
    }
    Ok(Endpoint {
        key: config.key(),
        wildcards: wildcards.into(),
        config,
    })
}

fn parse_keys(value: &[u8]) -> Result<Arc<[SigningKey]>, ConfigError> {
    let set: KeySet = serde_json::from_slice(value)?;
    set.keys
        .iter()
        .enumerate()
        .map(|(index, k)| {
            SigningKey::from_whsec(k).map_err(|source| ConfigError::Key { index, source })
        })
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    #[error("watching the configuration bucket: {0}")]
    Watch(#[from] async_nats::jetstream::kv::WatchError),
    #[error("reading the configuration bucket: {0}")]
    Read(#[source] async_nats::Error),
    #[error("the configuration watch ended")]
    Ended,
}

/// The readiness part [`follow`] reports.
pub const PART: &str = "config";

/// Follows the configuration bucket into `index` until `stop` is set: applies the
/// bucket's current content and marks the index loaded only once all of it is applied
/// (an error before that is returned, never taken for an empty bucket), then applies
/// every change. Returns an error when the watch fails or ends, for the supervisor to
/// start it again; the index keeps its last known content meanwhile.
pub async fn follow(
    index: Index,
    bucket: async_nats::jetstream::kv::Store,
    readiness: Arc<Readiness>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), FollowError> {
    // Complete once the watch has delivered the bucket's last revision as of now (it
    // sends the latest entry of every key, in stream order).
    // Asked of the server now: `Store::status` answers from the handle's cached stream
    // info (as of when the bucket was opened), which after a restart of this watch would
    // be a stale target.
    let mut stream = bucket.stream.clone();
    let last = stream
        .info()
        .await
        .map_err(|e| FollowError::Read(e.into()))?
        .state
        .last_sequence;
    let mut watch = bucket.watch_with_history(">").await?;
    let mut loaded = last == 0;
    if loaded {
        index.mark_loaded();
        readiness.set(PART, true);
    }
    loop {
        let entry = tokio::select! {
            _ = stop.wait_for(|s| *s) => return Ok(()),
            entry = watch.next() => entry,
        };
        let entry = match entry {
            Some(Ok(entry)) => entry,
            Some(Err(error)) => return Err(FollowError::Read(error.into())),
            None => return Err(FollowError::Ended),
        };
        let value = matches!(entry.operation, async_nats::jetstream::kv::Operation::Put)
            .then_some(&entry.value[..]);
        index.apply(&entry.key, value);
        if !loaded && (entry.revision >= last || entry.delta == 0) {
            loaded = true;
            index.mark_loaded();
            readiness.set(PART, true);
            tracing::info!(endpoints = index.endpoint_count(), "configuration loaded");
        }
    }
}

mod matcher;
#[cfg(test)]
mod tests;
