//! The dispatcher's view of configuration: the endpoints its shards and partitions need
//! ([`scope`]), every key set and tenant policy, from the `herald-config` KV bucket,
//! kept current by a watch. Fan-out reads it to match events; shards read it to
//! deliver. While the Kubernetes API (or the operator) is down, this view simply stops
//! changing — delivery goes on with the last known configuration.
//!
//! Contract: a shard (and its partition) starts only after [`Index::cover`] returned,
//! i.e. after a complete pass over the bucket that kept its endpoints; an entry the
//! scope does not keep is never half-applied (skipped whole); a pass that re-reads what
//! the index already holds announces no change.

use std::collections::{BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, RwLock, Weak};

use herald_core::dataplane::{
    BucketKey, Credentials, EndpointConfig, EndpointKey, KeySet, TenantPolicy, keyset_key,
};
use herald_core::pattern::Pattern;
use herald_core::signing::SigningKey;
use herald_core::v1alpha1::DeliveryPolicy;

use matcher::Namespace;
pub use scope::Claim;
use scope::Scope;
use tokio::sync::{broadcast, watch};

/// An endpoint as the data plane uses it: the configuration plus what is derived once.
/// Kept small: a replica holds one per endpoint of its shards and partitions.
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
        compile_config(config).expect("valid config")
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
    /// Per key set: a hash of its stored value (so reading it again is no change) and
    /// the keys.
    keys: HashMap<String, (u64, Arc<[SigningKey]>)>,
    tenants: HashMap<String, TenantPolicy>,
    /// The endpoints whose configuration asks for a verification challenge (few).
    verifying: BTreeSet<EndpointKey>,
    /// The values from Secrets of the endpoints of the shards delivered here.
    credentials: HashMap<EndpointKey, Arc<Credentials>>,
    /// The entries, as read, of the endpoints that need credentials: applied again when
    /// theirs arrive or change.
    needing: HashMap<EndpointKey, Vec<u8>>,
    scope: Scope,
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

    /// Drops the endpoints the scope no longer keeps. No change is announced: the shards
    /// that delivered to them have stopped.
    fn narrow(&mut self) {
        let Self {
            endpoints,
            namespaces,
            verifying,
            credentials,
            needing,
            scope,
            ..
        } = self;
        verifying.retain(|key| endpoints.get(key).is_some_and(|e| scope.keeps(&e.config)));
        credentials.retain(|_, c| scope.keeps_shard(c.shard));
        needing.retain(|key, _| endpoints.get(key).is_some_and(|e| scope.keeps(&e.config)));
        endpoints.retain(|_, endpoint| {
            let keep = scope.keeps(&endpoint.config);
            if !keep && let Some(namespace) = namespaces.get_mut(&endpoint.config.namespace) {
                namespace.remove(endpoint);
                if namespace.count == 0 {
                    namespaces.remove(&endpoint.config.namespace);
                }
            }
            keep
        });
    }
}

/// The passes over the bucket: the generation the scope asks for (raised when it grows)
/// and the one the last complete pass read. Generation 1 is the first load.
struct Passes {
    wanted: watch::Sender<u64>,
    read: watch::Sender<u64>,
}

/// Shared, cheaply cloned.
#[derive(Clone)]
pub struct Index {
    inner: Arc<RwLock<Inner>>,
    changes: broadcast::Sender<Change>,
    passes: Arc<Passes>,
}

impl Default for Index {
    fn default() -> Self {
        Self {
            inner: Arc::default(),
            changes: broadcast::channel(4096).0,
            passes: Arc::new(Passes {
                wanted: watch::channel(1).0,
                read: watch::channel(0).0,
            }),
        }
    }
}

/// A claim on part of the configuration ([`Index::cover`]); dropping it gives the part
/// up.
pub struct Cover {
    index: Index,
    claim: Claim,
}

impl Drop for Cover {
    fn drop(&mut self) {
        let mut inner = self.index.inner.write().expect("index lock");
        if inner.scope.remove(self.claim) {
            inner.narrow();
        }
    }
}

impl Index {
    /// From now on keeps only what claims ask for, in an installation of `shards`
    /// shards (a dispatcher's: see [`scope`]); called before the index is followed.
    pub fn scope_to(&self, shards: u32) {
        let mut inner = self.inner.write().expect("index lock");
        inner.scope = Scope::scoped(shards);
        inner.narrow();
    }

    /// Keeps the endpoints `claim` needs from now on; returns once the index holds all
    /// of them (after a complete pass over the bucket when the scope grew), or `None`
    /// when `stop` is set first.
    pub async fn cover(&self, claim: Claim, stop: &mut watch::Receiver<bool>) -> Option<Cover> {
        let grew = self.inner.write().expect("index lock").scope.add(claim);
        let cover = Cover {
            index: self.clone(),
            claim,
        };
        if grew {
            self.passes.wanted.send_modify(|wanted| *wanted += 1);
        }
        let target = *self.passes.wanted.borrow();
        let mut read = self.passes.read.subscribe();
        tokio::select! {
            _ = read.wait_for(|read| *read >= target) => Some(cover),
            _ = stop.wait_for(|s| *s) => None,
        }
    }

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
            .map(|(_, keys)| keys.clone())
    }

    /// The endpoints of `shard` whose configuration asks for a verification challenge.
    pub fn awaiting_verification(&self, shard: u32) -> Vec<Arc<Endpoint>> {
        let inner = self.inner.read().expect("index lock");
        inner
            .verifying
            .iter()
            .filter_map(|key| inner.endpoints.get(key))
            .filter(|e| e.config.shard == shard)
            .cloned()
            .collect()
    }

    /// The endpoints held (those the scope keeps).
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
            Some(BucketKey::Credentials(endpoint)) => self.apply_credentials(key, endpoint, value),
            // Not endpoint configuration.
            Some(
                BucketKey::Lasting { .. }
                | BucketKey::ShardCount
                | BucketKey::Replay(_)
                | BucketKey::Verification(_),
            ) => None,
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
        let endpoint = match value.map(|v| self.compile_with_credentials(&ep_key, v)) {
            None => None,
            Some(Ok(endpoint)) => Some(Arc::new(endpoint)),
            Some(Err(error)) => {
                tracing::warn!(key, %error, "ignoring an invalid endpoint config");
                return None;
            }
        };
        let mut guard = self.inner.write().expect("index lock");
        let inner = &mut *guard;
        let old = inner.endpoints.get(&ep_key);
        match &endpoint {
            // Not this replica's: skipped whole (a deletion of one it holds is not).
            Some(new) if !inner.scope.keeps(&new.config) && old.is_none() => return None,
            // Read again by a pass: nothing changed.
            Some(new) if old.is_some_and(|old| old.config == new.config) => return None,
            _ => {}
        }
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
        inner.verifying.remove(&ep_key);
        match (&endpoint, value) {
            (Some(e), Some(entry)) if e.config.credentials.is_some() => {
                inner.needing.insert(ep_key.clone(), entry.to_vec());
            }
            _ => {
                inner.needing.remove(&ep_key);
            }
        }
        if let Some(endpoint) = endpoint {
            if endpoint.config.verify {
                inner.verifying.insert(ep_key.clone());
            }
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
        let keys = match value.map(|v| parse_keys(v).map(|keys| (hash_of(v), keys))) {
            None => None,
            Some(Ok(keys)) => Some(keys),
            Some(Err(error)) => {
                // The error names the problem, never the key material.
                tracing::warn!(key, %error, "ignoring an invalid key set");
                return None;
            }
        };
        let mut inner = self.inner.write().expect("index lock");
        let unchanged = match keys {
            Some((hash, keys)) => inner
                .keys
                .insert(key.to_owned(), (hash, keys))
                .is_some_and(|(before, _)| before == hash),
            None => inner.keys.remove(key).is_none(),
        };
        if unchanged {
            return None;
        }
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
        let before = match policy {
            Some(policy) => inner.tenants.insert(namespace.clone(), policy),
            None => inner.tenants.remove(&namespace),
        };
        if before == policy {
            return None;
        }
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

    /// Marks pass `generation` complete: the bucket's content as of its start is
    /// applied (not just part of it), for the scope as it was then or wider.
    fn mark_read(&self, generation: u64) {
        self.passes
            .read
            .send_if_modified(|read| std::mem::replace(read, generation.max(*read)) < generation);
    }

    /// Whether the first complete pass is in.
    pub fn is_loaded(&self) -> bool {
        *self.passes.read.borrow() >= 1
    }

    /// Waits until the configuration is completely loaded (the first pass).
    pub async fn wait_loaded(&self) {
        let mut read = self.passes.read.subscribe();
        let _ = read.wait_for(|read| *read >= 1).await;
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

fn compile_config(config: EndpointConfig) -> Result<Endpoint, ConfigError> {
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

fn hash_of(value: &[u8]) -> u64 {
    let mut hasher = DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

fn parse_keys(value: &[u8]) -> Result<Arc<[SigningKey]>, ConfigError> {
    let set: KeySet = serde_json::from_slice(value)?;
    set.keys
        .iter()
        .enumerate()
        .map(|(index, k)| SigningKey::parse(k).map_err(|source| ConfigError::Key { index, source }))
        .collect()
}

mod credentials;
mod follow;
mod matcher;
pub mod scope;

pub use follow::{FollowError, PART, follow};
#[cfg(test)]
mod tests;
