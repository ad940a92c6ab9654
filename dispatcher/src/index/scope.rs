//! Which endpoints a replica keeps in its index: those of the shards it owns (it delivers
//! to them) and those of the namespaces of its ingest partitions (it matches their
//! events; partition `p` is fanned out by the owner of shard `p`) — or every endpoint
//! while something holds a claim on all of them (events stored before partitioning,
//! whose namespaces any partition may hold).
//!
//! Contract: [`Scope::keeps`] is the whole rule; claims are counted, so a shard started
//! again before its old task ended keeps what both need. An unscoped index (the
//! default: unit tests, embeddings that want everything) keeps every endpoint.

use std::collections::HashMap;

use herald_core::dataplane::{EndpointConfig, partition_of};

/// What a claim covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Claim {
    /// A shard's endpoints and its partition's namespaces.
    Shard(u32),
    /// Every endpoint.
    Everything,
}

#[derive(Debug, Default)]
pub struct Scope {
    /// The installation's shard (and partition) count; `None`: unscoped.
    shards: Option<u32>,
    claims: HashMap<Claim, usize>,
}

impl Scope {
    /// A scope over `shards` shards that keeps nothing until claims are made.
    pub fn scoped(shards: u32) -> Self {
        Self {
            shards: Some(shards.max(1)),
            claims: HashMap::new(),
        }
    }

    pub fn keeps(&self, config: &EndpointConfig) -> bool {
        let Some(shards) = self.shards else {
            return true;
        };
        self.claims.contains_key(&Claim::Everything)
            || self.claims.contains_key(&Claim::Shard(config.shard))
            || self
                .claims
                .contains_key(&Claim::Shard(partition_of(&config.namespace, shards)))
    }

    /// Whether the scope delivers `shard` (its endpoints' credentials are needed here).
    pub fn keeps_shard(&self, shard: u32) -> bool {
        self.shards.is_none()
            || self.claims.contains_key(&Claim::Everything)
            || self.claims.contains_key(&Claim::Shard(shard))
    }

    /// Adds a claim; true when the scope grew (the first claim of its kind on a scoped
    /// index), so entries skipped before must be read again.
    pub fn add(&mut self, claim: Claim) -> bool {
        let count = self.claims.entry(claim).or_default();
        *count += 1;
        *count == 1 && self.shards.is_some()
    }

    /// Removes a claim; true when the scope shrank, so entries it no longer keeps can
    /// be dropped.
    pub fn remove(&mut self, claim: Claim) -> bool {
        let Some(count) = self.claims.get_mut(&claim) else {
            return false;
        };
        *count -= 1;
        if *count > 0 {
            return false;
        }
        self.claims.remove(&claim);
        self.shards.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(namespace: &str, shard: u32) -> EndpointConfig {
        serde_json::from_value(serde_json::json!({
            "namespace": namespace, "name": "hook", "uid": "u1", "generation": 1,
            "url": "https://hooks.example.com/", "eventTypes": ["*"], "secret": "s",
            "delivery": {}, "shard": shard
        }))
        .unwrap()
    }

    #[test]
    fn a_scope_keeps_its_shards_and_its_partitions_namespaces() {
        let shards = 4;
        // A namespace whose partition is not the endpoint's shard.
        let ns = (0..)
            .map(|i| format!("tenant-{i}"))
            .find(|ns| partition_of(ns, shards) != 1)
            .unwrap();
        let partition = partition_of(&ns, shards);
        let ep = config(&ns, 1);

        let mut scope = Scope::scoped(shards);
        assert!(!scope.keeps(&ep), "nothing claimed, nothing kept");
        assert!(
            scope.add(Claim::Shard(1)),
            "the first claim grows the scope"
        );
        assert!(scope.keeps(&ep), "its shard's endpoint");
        assert!(!scope.add(Claim::Shard(1)), "a second claim does not");
        assert!(!scope.remove(Claim::Shard(1)));
        assert!(scope.keeps(&ep), "one claim still holds it");
        assert!(scope.remove(Claim::Shard(1)), "the last claim shrinks it");
        assert!(!scope.keeps(&ep));

        scope.add(Claim::Shard(partition));
        assert!(scope.keeps(&ep), "its namespace's partition");
        scope.remove(Claim::Shard(partition));
        scope.add(Claim::Everything);
        assert!(scope.keeps(&ep));
        assert!(scope.remove(Claim::Everything));
        assert!(!scope.keeps(&ep));
        assert!(!scope.remove(Claim::Everything), "no claim to remove");
    }

    #[test]
    fn an_unscoped_index_keeps_everything_and_never_rereads() {
        let mut scope = Scope::default();
        assert!(scope.keeps(&config("shop", 3)));
        assert!(!scope.add(Claim::Shard(3)));
        assert!(!scope.remove(Claim::Shard(3)));
    }
}
