//! Holds against the real API server and NATS: an endpoint that stops validating for a
//! while keeps its last good configuration in `herald-config`, marked `held` (so the
//! dispatchers keep its backlog), says so in `Ready`, and resumes when fixed. Only
//! deleting the endpoint removes its configuration.

mod support;

use herald_core::dataplane::EndpointKey;
use herald_core::v1alpha1::WebhookEndpoint;
use herald_e2e::{TestContext, eventually};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use support::*;

const ALLOW_LOOPBACK: &[&str] = &["--allow-network", "127.0.0.0/8"];
const URL: &str = "https://127.0.0.1:8443/hook";

/// Waits until the endpoint's config entry satisfies `check`.
async fn config_where(
    store: &async_nats::jetstream::kv::Store,
    key: &str,
    what: &str,
    check: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    eventually(what, WAIT, || async {
        let config = kv_get(store, key).await?;
        check(&config).then_some(config)
    })
    .await
}

#[tokio::test]
async fn a_typo_in_the_signing_secret_holds_deliveries_until_it_is_fixed() {
    let ctx = TestContext::new("op-hold-secret").await;
    let op = Operator::start(&ctx, "a", ALLOW_LOOPBACK);
    let (config_kv, _) = buckets(&ctx).await;
    create_secret(&ctx, "keys", json!({})).await;
    create_endpoint(&ctx, "orders", URL, "keys").await;
    endpoint_ready(&ctx, "orders", "True").await;
    let key = EndpointKey::new(&ctx.namespace, "orders").config_key();
    config_where(&config_kv, &key, "published config", |c| {
        c["held"].is_null()
    })
    .await;

    // The tenant breaks the Kubernetes Secret with a typo.
    let secrets = ctx.api::<Secret>();
    let good = secrets.get("keys").await.unwrap().data.unwrap()["current"].clone();
    let typo = ByteString(b"whsec_not!base64".to_vec());
    let patch = |value: ByteString| json!({"data": {"current": value}});
    secrets
        .patch("keys", &PatchParams::default(), &Patch::Merge(patch(typo)))
        .await
        .unwrap();

    let held = config_where(&config_kv, &key, "config held", |c| {
        c["held"]["reason"] == json!("SecretNotReady")
    })
    .await;
    assert_eq!(
        held["url"],
        json!(URL),
        "the last good configuration is kept"
    );
    let ready = endpoint_reason(&ctx, "orders", "SecretNotReady").await;
    assert_eq!(ready.status, "False");
    assert!(ready.message.contains("keys"), "{}", ready.message);
    assert!(
        ready.message.contains("events keep queueing"),
        "the message says events are kept: {}",
        ready.message
    );
    let obj = ctx.api::<WebhookEndpoint>().get("orders").await.unwrap();
    assert!(
        obj.status.unwrap().shard.is_some(),
        "the lanes stay on their shard"
    );

    // Fixed: delivery resumes with a fresh, unheld configuration.
    secrets
        .patch("keys", &PatchParams::default(), &Patch::Merge(patch(good)))
        .await
        .unwrap();
    endpoint_ready(&ctx, "orders", "True").await;
    config_where(&config_kv, &key, "config released", |c| c["held"].is_null()).await;
    finish(ctx, vec![op]).await;
}

#[tokio::test]
async fn a_host_that_stops_resolving_holds_the_last_good_url() {
    let ctx = TestContext::new("op-hold-dns").await;
    let op = Operator::start(&ctx, "a", ALLOW_LOOPBACK);
    let (config_kv, _) = buckets(&ctx).await;
    create_secret(&ctx, "keys", json!({})).await;
    create_endpoint(&ctx, "orders", URL, "keys").await;
    endpoint_ready(&ctx, "orders", "True").await;
    let key = EndpointKey::new(&ctx.namespace, "orders").config_key();
    config_where(&config_kv, &key, "published config", |c| {
        c["held"].is_null()
    })
    .await;

    let api = ctx.api::<WebhookEndpoint>();
    let set_url = |url: &str| json!({"spec": {"url": url}});
    api.patch(
        "orders",
        &PatchParams::default(),
        &Patch::Merge(set_url("https://does-not-exist.invalid/hook")),
    )
    .await
    .unwrap();
    let held = config_where(&config_kv, &key, "config held", |c| {
        c["held"]["reason"] == json!("UrlUnresolvable")
    })
    .await;
    assert_eq!(held["url"], json!(URL), "the last good URL is kept");
    assert_eq!(held["generation"], json!(1));
    let ready = endpoint_reason(&ctx, "orders", "UrlUnresolvable").await;
    assert!(
        ready.message.contains("does-not-exist.invalid"),
        "{}",
        ready.message
    );
    assert!(ready.message.contains("held"), "{}", ready.message);

    // A URL the policy forbids is held too: the resource still exists.
    api.patch(
        "orders",
        &PatchParams::default(),
        &Patch::Merge(set_url("https://169.254.169.254/latest")),
    )
    .await
    .unwrap();
    config_where(&config_kv, &key, "config held (forbidden)", |c| {
        c["held"]["reason"] == json!("UrlForbidden") && c["url"] == json!(URL)
    })
    .await;

    api.patch(
        "orders",
        &PatchParams::default(),
        &Patch::Merge(set_url(URL)),
    )
    .await
    .unwrap();
    let fresh = config_where(&config_kv, &key, "config released", |c| {
        c["held"].is_null() && c["generation"] == json!(4)
    })
    .await;
    assert_eq!(fresh["url"], json!(URL));
    endpoint_reason(&ctx, "orders", "Accepted").await;

    // Deleting the endpoint is what removes its configuration.
    api.delete("orders", &Default::default()).await.unwrap();
    eventually("config withdrawn on deletion", WAIT, || async {
        kv_get(&config_kv, &key).await.is_none().then_some(())
    })
    .await;
    finish(ctx, vec![op]).await;
}
