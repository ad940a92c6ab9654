//! 1000 endpoints created at once all become Ready; prints how long it took (the
//! number in docs/operator.md).

mod support;

use std::time::{Duration, Instant};

use futures::StreamExt;
use herald_core::dataplane::BucketKey;
use herald_core::v1alpha1::WebhookEndpoint;
use herald_e2e::{TestContext, eventually};
use kube::api::PostParams;
use serde_json::json;
use support::*;

const ENDPOINTS: usize = 1000;

/// Endpoint config entries of `ns` in `herald-config`.
async fn config_keys(store: &async_nats::jetstream::kv::Store, ns: &str) -> usize {
    let keys: Vec<String> = store
        .keys()
        .await
        .expect("listing keys")
        .filter_map(|k| async move { k.ok() })
        .collect()
        .await;
    keys.iter()
        .filter(|k| {
            matches!(BucketKey::parse(k), Some(BucketKey::Endpoint(key)) if key.namespace() == ns)
        })
        .count()
}

#[tokio::test]
async fn a_thousand_endpoints_become_ready() {
    let ctx = TestContext::new("op-scale").await;
    let op = Operator::start(&ctx, "a", &["--allow-network", "127.0.0.0/8"]);
    let (config_kv, _) = buckets(&ctx).await;
    create_secret(&ctx, "keys", json!({})).await;
    let api = ctx.api::<WebhookEndpoint>();
    let started = Instant::now();
    futures::stream::iter(0..ENDPOINTS)
        .map(|i| {
            let api = api.clone();
            async move {
                let obj: WebhookEndpoint = serde_json::from_value(json!({
                    "apiVersion": "herald.dev/v1alpha1",
                    "kind": "WebhookEndpoint",
                    "metadata": {"name": format!("ep-{i}")},
                    "spec": {"url": format!("https://127.0.0.1:8443/{i}"), "eventTypes": ["order.*"], "secretRef": {"name": "keys"}},
                }))
                .unwrap();
                api.create(&PostParams::default(), &obj).await.expect("create");
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    let created = started.elapsed();
    eventually("every endpoint Ready", Duration::from_secs(300), || async {
        let list = api.list(&Default::default()).await.ok()?;
        let ready = list
            .items
            .iter()
            .filter(|e| {
                e.status
                    .as_ref()
                    .and_then(|s| condition(&s.conditions, "Ready"))
                    .is_some_and(|c| c.status == "True")
            })
            .count();
        (ready == ENDPOINTS).then_some(())
    })
    .await;
    let all_ready = started.elapsed();
    eprintln!("{ENDPOINTS} endpoints: created in {created:?}, all Ready after {all_ready:?}");
    assert_eq!(config_keys(&config_kv, &ctx.namespace).await, ENDPOINTS);
    let deleting = Instant::now();
    delete_all(&ctx, Duration::from_secs(300)).await;
    eprintln!(
        "{ENDPOINTS} endpoints: deleted (config withdrawn, finalizers removed) in {:?}",
        deleting.elapsed()
    );
    finish(ctx, vec![op]).await;
}
