//! Tenant policies: how a tenant (namespace) shares the dispatchers and herald-api, from
//! its Namespace's annotations, published as `tenant.<ns>` in `herald-config` (docs/architecture.md,
//! "Fairness"), and whether its endpoints must be verified (for the endpoint controller,
//! `crate::endpoint::verification`). Namespaces are the platform team's objects, not the
//! tenants': a tenant cannot raise its own share or waive verification.
//!
//! The served namespaces are read every `--namespace-refresh` (listed when the operator serves
//! them all, read one by one when it serves a list, which its per-namespace rights
//! allow); a policy is written only when it changed and deleted when the annotations
//! go. An annotation that does not parse is logged with what is wrong and left out (the
//! dispatchers' default applies).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use herald_core::dataplane::{BucketKey, TenantPolicy};
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, ListParams};

use tokio::sync::watch;

use crate::endpoint::verification;
use crate::nats;

/// Consecutive attempts per turn of a shard's tenant ring, 1 to 100.
pub const WEIGHT: &str = "herald.dev/weight";
/// Most attempts of the tenant in flight per shard, 1 to 100000.
pub const MAX_IN_FLIGHT: &str = "herald.dev/max-in-flight";
/// Requests per second the tenant may make to herald-api (HTTP ingest included), 1 to
/// 1000000.
pub const API_RATE: &str = "herald.dev/api-rate";
/// Requests the tenant may make to herald-api at once above its rate, 1 to 1000000.
pub const API_BURST: &str = "herald.dev/api-burst";

/// Pure: the policy the annotations ask for (`None`: the defaults), and what is wrong
/// with those that do not parse.
pub fn policy(annotations: &BTreeMap<String, String>) -> (Option<TenantPolicy>, Vec<String>) {
    let mut problems = Vec::new();
    let mut number = |name: &str, max: u32| -> Option<u32> {
        let text = annotations.get(name)?;
        match text.trim().parse::<u32>() {
            Ok(n) if (1..=max).contains(&n) => Some(n),
            _ => {
                problems.push(format!(
                    "annotation {name}: {text:?} is not a whole number from 1 to {max}"
                ));
                None
            }
        }
    };
    let policy = TenantPolicy {
        weight: number(WEIGHT, 100),
        max_in_flight: number(MAX_IN_FLIGHT, 100_000),
        api_rate: number(API_RATE, 1_000_000),
        api_burst: number(API_BURST, 1_000_000),
    };
    let set = policy != TenantPolicy::default();
    (set.then_some(policy), problems)
}

/// Keeps the tenant policies of `namespaces` (empty: every namespace) in `config`, and
/// the namespaces that require endpoint verification in `verifying`, until `stop`.
pub async fn run(
    client: Client,
    config: kv::Store,
    namespaces: Vec<String>,
    interval: Duration,
    verifying: watch::Sender<Option<Arc<BTreeSet<String>>>>,
    stop: impl std::future::Future<Output = ()>,
) {
    let mut published: HashMap<String, Option<TenantPolicy>> = HashMap::new();
    let work = async {
        let mut tick = tokio::time::interval(interval);
        loop {
            tick.tick().await;
            match read(&client, &namespaces).await {
                Ok(found) => {
                    let (required, problems) = verification::requiring(
                        found
                            .iter()
                            .map(|(ns, a)| (ns.as_str(), a.get(verification::REQUIRE_ANNOTATION))),
                    );
                    for problem in problems {
                        tracing::warn!("{problem}");
                    }
                    verifying.send_if_modified(|known| {
                        let changed = known.as_deref() != Some(&required);
                        if changed {
                            tracing::info!(namespaces = ?required, "namespaces requiring endpoint verification");
                            *known = Some(Arc::new(required));
                        }
                        changed
                    });
                    sync(&config, &mut published, found).await
                }
                Err(error) => tracing::warn!(%error, "reading namespaces for tenant policies"),
            }
        }
    };
    tokio::select! {
        () = work => {}
        () = stop => {}
    }
}

/// The served namespaces and their annotations.
async fn read(
    client: &Client,
    namespaces: &[String],
) -> Result<Vec<(String, BTreeMap<String, String>)>, kube::Error> {
    let api: Api<Namespace> = Api::all(client.clone());
    let objects = if namespaces.is_empty() {
        api.list(&ListParams::default()).await?.items
    } else {
        let mut objects = Vec::new();
        for name in namespaces {
            objects.extend(api.get_opt(name).await?);
        }
        objects
    };
    Ok(objects
        .into_iter()
        .filter_map(|ns| {
            let annotations = ns.metadata.annotations.unwrap_or_default();
            Some((ns.metadata.name?, annotations))
        })
        .collect())
}

/// Writes what changed since the last round (the first round checks every key).
async fn sync(
    config: &kv::Store,
    published: &mut HashMap<String, Option<TenantPolicy>>,
    found: Vec<(String, BTreeMap<String, String>)>,
) {
    let mut seen = HashMap::new();
    for (namespace, annotations) in found {
        let (policy, problems) = policy(&annotations);
        for problem in problems {
            tracing::warn!(namespace, "{problem}; the default applies");
        }
        seen.insert(namespace, policy);
    }
    let present: std::collections::HashSet<String> = seen.keys().cloned().collect();
    // Namespaces that are gone lose their policy.
    for namespace in published.keys() {
        seen.entry(namespace.clone()).or_insert(None);
    }
    for (namespace, policy) in seen {
        if published.get(&namespace) == Some(&policy) {
            continue;
        }
        let key = BucketKey::Tenant(namespace.clone()).to_string();
        let written = match policy {
            Some(policy) => {
                let value = serde_json::to_vec(&policy).expect("a policy serializes");
                nats::put_if_changed(config, &key, value).await.map(|_| ())
            }
            None => nats::delete_if_present(config, &key).await.map(|_| ()),
        };
        match written {
            Ok(()) => {
                tracing::info!(namespace, ?policy, "tenant policy");
                published.insert(namespace, policy);
            }
            Err(error) => tracing::warn!(namespace, %error, "writing a tenant policy"),
        }
    }
    published.retain(|namespace, _| present.contains(namespace));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn annotations_become_a_policy_and_bad_ones_say_why() {
        assert_eq!(policy(&annotations(&[])), (None, vec![]));
        assert_eq!(
            policy(&annotations(&[(WEIGHT, "3"), (MAX_IN_FLIGHT, " 40 ")])),
            (
                Some(TenantPolicy {
                    weight: Some(3),
                    max_in_flight: Some(40),
                    ..TenantPolicy::default()
                }),
                vec![]
            )
        );
        let (p, problems) = policy(&annotations(&[(WEIGHT, "0"), (MAX_IN_FLIGHT, "12")]));
        assert_eq!(
            p,
            Some(TenantPolicy {
                max_in_flight: Some(12),
                ..TenantPolicy::default()
            })
        );
        assert_eq!(
            problems,
            ["annotation herald.dev/weight: \"0\" is not a whole number from 1 to 100"]
        );
        let (p, problems) = policy(&annotations(&[(WEIGHT, "lots")]));
        assert_eq!(p, None);
        assert_eq!(problems.len(), 1);
        let (p, problems) = policy(&annotations(&[(API_RATE, "50"), (API_BURST, "-1")]));
        assert_eq!(
            p,
            Some(TenantPolicy {
                api_rate: Some(50),
                ..TenantPolicy::default()
            })
        );
        assert_eq!(
            problems,
            ["annotation herald.dev/api-burst: \"-1\" is not a whole number from 1 to 1000000"]
        );
    }
}
