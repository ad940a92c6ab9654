//! What the replay tests share: the operator, applying manifests, endpoints and stored
//! events set up the way a tenant would.

use std::time::Duration;

use herald_core::v1alpha1::{WebhookEndpoint, WebhookReplay};
use herald_e2e::dataplane::DataPlane;
use herald_e2e::receiver::Receiver;
use herald_e2e::{TestContext, env, eventually};
use serde_json::json;
use tokio::sync::oneshot;

pub const WAIT: Duration = Duration::from_secs(60);

pub fn start_operator(ctx: &TestContext) -> oneshot::Sender<()> {
    let local = ["--allow-network", "127.0.0.0/8", "--allow-http"];
    herald_e2e::start_operator(env(), &ctx.namespace, &local)
}

pub fn apply(ctx: &TestContext, manifest: serde_json::Value) {
    let out = env().kubectl_apply(&ctx.namespace, &manifest);
    assert!(
        out.status.success(),
        "kubectl apply failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Creates the signing secret and an endpoint that treats 400 as final, and waits until
/// the dispatcher delivers to it (a probe event, `data` 1, which the receivers used here
/// accept).
pub async fn failing_endpoint(
    ctx: &TestContext,
    rx: &Receiver,
    dp: &DataPlane,
    extra: serde_json::Value,
) {
    apply(
        ctx,
        json!({
            "apiVersion": "herald.dev/v1alpha1", "kind": "SigningSecret",
            "metadata": {"name": "orders"}, "spec": {}
        }),
    );
    let mut delivery = json!({"finalStatusCodes": [400]});
    delivery
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    apply(
        ctx,
        json!({
            "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookEndpoint",
            "metadata": {"name": "orders"},
            "spec": {"url": rx.url("orders"), "eventTypes": ["order.*"],
                     "secretRef": {"name": "orders"}, "delivery": delivery}
        }),
    );
    eventually("the endpoint delivering", WAIT, || {
        let (dp, rx, ns) = (dp.clone(), rx.clone(), ctx.namespace.clone());
        async move {
            if rx.request_count("orders") == 0 {
                dp.publish(&ns, "order.probe", json!(1)).await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            (rx.request_count("orders") > 0).then_some(())
        }
    })
    .await;
}

/// Publishes `data` as `order.created` events and waits until each has a final attempt
/// record (delivered or dead).
pub async fn publish_and_settle(ctx: &TestContext, dp: &DataPlane, data: &[i64]) {
    let before = dp.attempts(&ctx.namespace, "orders").await.len();
    for i in data {
        dp.publish(&ctx.namespace, "order.created", json!(i)).await;
    }
    eventually("every event attempted", WAIT, || async {
        let attempts = dp.attempts(&ctx.namespace, "orders").await;
        (attempts.len() >= before + data.len()).then_some(())
    })
    .await;
}

/// The webhook-ids of the events whose `data` is in `data`, as the receiver saw them.
pub fn ids_of(rx: &Receiver, data: &[i64]) -> Vec<String> {
    let mut ids: Vec<String> = rx
        .received("orders")
        .iter()
        .filter(|r| r.json()["data"].as_i64().is_some_and(|d| data.contains(&d)))
        .map(|r| r.header("webhook-id").to_owned())
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

/// An endpoint `name` of the test's tenant, taking `types`, with `delivery`.
pub fn endpoint(
    ctx: &TestContext,
    rx: &Receiver,
    name: &str,
    types: &[&str],
    delivery: serde_json::Value,
) {
    apply(
        ctx,
        json!({
            "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookEndpoint",
            "metadata": {"name": name},
            "spec": {"url": rx.url(name), "eventTypes": types,
                     "secretRef": {"name": "orders"}, "delivery": delivery}
        }),
    );
}

/// Stores `count` `order.created` events (numbered from 0) that no endpoint takes yet,
/// then lets the endpoint `name` take them, and waits until the dispatcher delivers
/// with that configuration (an `order.probe` gets through). Returns the range that
/// holds the stored events and not the probes.
pub async fn stored_before_the_endpoint_takes_them(
    ctx: &TestContext,
    rx: &Receiver,
    dp: &DataPlane,
    (name, delivery): (&str, serde_json::Value),
    count: i64,
) -> (jiff::Timestamp, jiff::Timestamp) {
    apply(
        ctx,
        json!({
            "apiVersion": "herald.dev/v1alpha1", "kind": "SigningSecret",
            "metadata": {"name": "orders"}, "spec": {}
        }),
    );
    // The tenant exists (its events are not dead letters) but nothing takes orders.
    endpoint(ctx, rx, name, &["nothing.yet"], delivery.clone());
    eventually("the endpoint Ready", WAIT, || async {
        let status = ctx.api::<WebhookEndpoint>().get(name).await.ok()?.status?;
        let ready = status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        ready.then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let from = jiff::Timestamp::now();
    let js = async_nats::jetstream::new(env().nats().await);
    let mut acks = Vec::new();
    for i in 0..count {
        let subject = format!("herald.events.{}.order.created", ctx.namespace);
        let body = serde_json::to_vec(&json!({"type": "order.created", "data": i})).unwrap();
        acks.push(js.publish(subject, body.into()).await.unwrap());
        if acks.len() >= 1000 {
            for ack in acks.drain(..) {
                ack.await.unwrap();
            }
        }
    }
    for ack in acks {
        ack.await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let to = jiff::Timestamp::now();
    endpoint(ctx, rx, name, &["order.*"], delivery);
    eventually("the endpoint taking orders", WAIT, || {
        let (dp, rx, ns) = (dp.clone(), rx.clone(), ctx.namespace.clone());
        async move {
            if rx.request_count(name) == 0 {
                dp.publish(&ns, "order.probe", json!(-1)).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            (rx.request_count(name) > 0).then_some(())
        }
    })
    .await;
    (from, to)
}

pub fn create_replay(
    name: &str,
    endpoint: &str,
    (from, to): (jiff::Timestamp, jiff::Timestamp),
) -> WebhookReplay {
    serde_json::from_value(json!({
        "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookReplay",
        "metadata": {"name": name},
        "spec": {"endpoint": endpoint, "from": from.to_string(), "to": to.to_string()},
    }))
    .unwrap()
}
