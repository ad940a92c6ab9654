//! `WebhookReplay` the way a tenant uses it, against the real API server and NATS: the
//! operator hands the replay to the dispatcher that owns the endpoint's shard, which
//! reads the range from the event store and reports progress the operator writes into
//! the status.
//!
//! A dry run counts what a replay would send (with `onlyFailed`, from the attempt log)
//! and sends nothing; any other replay queues those events on the endpoint's retry lane
//! again, with their original ids, and counts their deliveries.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use herald_core::dataplane::{BucketKey, CONFIG_BUCKET, HEALTH_BUCKET};
use herald_core::v1alpha1::{ReplayPhase, WebhookEndpoint, WebhookReplay};
use herald_e2e::dataplane::{DataPlane, shared_dispatcher};
use herald_e2e::receiver::{Behavior, Receiver};
use herald_e2e::{TestContext, env, eventually};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

#[path = "replay/sending.rs"]
mod sending;
#[path = "replay/support.rs"]
mod support;

use support::{WAIT, apply, failing_endpoint, start_operator};

/// A dry run counts the stored events the endpoint takes, of the replay's types, in its
/// range — including ones published before the endpoint was configured — and sends
/// none of them; its status ends `Completed` with `Complete=True`.
#[tokio::test]
async fn a_dry_run_replay_counts_what_it_would_send_and_sends_nothing() {
    let ctx = TestContext::new("replay-dry").await;
    shared_dispatcher(env());
    let stop_operator = start_operator(&ctx);
    let rx = Receiver::start().await;
    let dp = DataPlane::new(env().nats().await).await;
    let from = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(60);

    apply(
        &ctx,
        json!({
            "apiVersion": "herald.dev/v1alpha1", "kind": "SigningSecret",
            "metadata": {"name": "orders"}, "spec": {}
        }),
    );
    apply(
        &ctx,
        json!({
            "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookEndpoint",
            "metadata": {"name": "orders"},
            "spec": {"url": rx.url("orders"), "eventTypes": ["order.*", "invoice.*"],
                     "secretRef": {"name": "orders"}}
        }),
    );
    let endpoints: Api<WebhookEndpoint> = ctx.api();
    eventually("the endpoint Ready", WAIT, || {
        let endpoints = endpoints.clone();
        async move {
            let status = endpoints.get("orders").await.ok()?.status?;
            status
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
                .then_some(())
        }
    })
    .await;
    // Until the dispatcher has the configuration, events are stored but not delivered;
    // the replay counts them all the same.
    let orders = Arc::new(AtomicU64::new(0));
    eventually("the first delivery", WAIT, || {
        let (dp, rx, ns, orders) = (
            dp.clone(),
            rx.clone(),
            ctx.namespace.clone(),
            orders.clone(),
        );
        async move {
            if rx.received("orders").is_empty() {
                dp.publish(&ns, "order.created", json!({})).await;
                orders.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            (!rx.received("orders").is_empty()).then_some(())
        }
    })
    .await;
    let delivered = rx.received("orders").len() + 8;
    for i in 0..5 {
        dp.publish(&ctx.namespace, "order.paid", json!({ "i": i }))
            .await;
    }
    orders.fetch_add(5, Ordering::SeqCst);
    for i in 0..3 {
        dp.publish(&ctx.namespace, "invoice.paid", json!({ "i": i }))
            .await;
        // Not the endpoint's: never counted.
        dp.publish(&ctx.namespace, "user.created", json!({ "i": i }))
            .await;
    }
    eventually("the events delivered", WAIT, || async {
        (rx.received("orders").len() >= delivered).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let requests = rx.request_count("orders");

    let replay: WebhookReplay = serde_json::from_value(json!({
        "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookReplay",
        "metadata": {"name": "orders-again"},
        "spec": {"endpoint": "orders", "from": from.to_string(), "eventTypes": ["order.*"],
                 "dryRun": true},
    }))
    .unwrap();
    let replays: Api<WebhookReplay> = ctx.api();
    replays
        .create(&PostParams::default(), &replay)
        .await
        .expect("creating the WebhookReplay");
    let status = eventually("the dry run Complete", WAIT, || async {
        let status = replays.get("orders-again").await.ok()?.status?;
        let complete = status.conditions.iter().find(|c| c.type_ == "Complete")?;
        (complete.status == "True").then_some(status)
    })
    .await;
    assert_eq!(status.phase, Some(ReplayPhase::Completed), "{status:?}");
    assert_eq!(
        status.matched,
        Some(orders.load(Ordering::SeqCst)),
        "every order.* event in the range, none of the others: {status:?}"
    );
    assert_eq!(status.enqueued, Some(0), "{status:?}");
    let complete = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Complete")
        .unwrap();
    assert_eq!(complete.reason, "Completed");
    assert!(complete.message.contains("dry run"), "{complete:?}");
    assert!(status.completion_time.is_some());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        rx.request_count("orders"),
        requests,
        "a dry run sends nothing"
    );

    // With all types: the invoices too.
    let all: WebhookReplay = serde_json::from_value(json!({
        "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookReplay",
        "metadata": {"name": "everything"},
        "spec": {"endpoint": "orders", "from": from.to_string(), "dryRun": true},
    }))
    .unwrap();
    replays.create(&PostParams::default(), &all).await.unwrap();
    let matched = eventually("the second dry run Complete", WAIT, || async {
        let status = replays.get("everything").await.ok()?.status?;
        (status.phase == Some(ReplayPhase::Completed)).then_some(status.matched)
    })
    .await;
    assert_eq!(matched, Some(orders.load(Ordering::SeqCst) + 3));

    // Deleting a replay withdraws its request and the dispatcher deletes its progress.
    let js = async_nats::jetstream::new(env().nats().await);
    let config = js.get_key_value(CONFIG_BUCKET).await.unwrap();
    let health = js.get_key_value(HEALTH_BUCKET).await.unwrap();
    let key = BucketKey::replay(&ctx.namespace, "everything").to_string();
    assert!(
        health.get(&key).await.unwrap().is_some(),
        "progress reported"
    );
    replays
        .delete("everything", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the replay, its request and its progress gone",
        WAIT,
        || async {
            let gone = replays.get_opt("everything").await.ok()?.is_none()
                && config.get(&key).await.ok()?.is_none()
                && health.get(&key).await.ok()?.is_none();
            gone.then_some(())
        },
    )
    .await;
    let _ = stop_operator.send(());
    ctx.cleanup().await;
}

/// With `onlyFailed`, a dry run counts only the events whose delivery failed: here the
/// receiver answers a final 400 to the first request of every third event, so those
/// are dead, and the others delivered.
#[tokio::test]
async fn an_only_failed_dry_run_counts_the_failed_deliveries() {
    let ctx = TestContext::new("replay-failed").await;
    shared_dispatcher(env());
    let stop_operator = start_operator(&ctx);
    let rx = Receiver::start().await;
    rx.behave("orders", Behavior::fail_first_of_every(3, 400));
    let dp = DataPlane::new(env().nats().await).await;
    let from = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(60);
    // Configured at the dispatcher once a probe event (1, delivered) gets through.
    failing_endpoint(&ctx, &rx, &dp, json!({})).await;
    // 0, 3, 6 and 9 fail for good.
    for i in 0..10u64 {
        dp.publish(&ctx.namespace, "order.created", json!(i)).await;
    }
    let dead = eventually("every event attempted", WAIT, || async {
        let attempts = dp.attempts(&ctx.namespace, "orders").await;
        let count = |state: &str| {
            attempts
                .iter()
                .filter(|a| a["state"] == json!(state))
                .count()
        };
        let (dead, ok) = (count("dead"), count("succeeded"));
        (dead == 4 && ok >= 7).then_some(dead as u64)
    })
    .await;

    let replay: WebhookReplay = serde_json::from_value(json!({
        "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookReplay",
        "metadata": {"name": "failed-ones"},
        "spec": {"endpoint": "orders", "from": from.to_string(), "onlyFailed": true,
                 "dryRun": true},
    }))
    .unwrap();
    let replays: Api<WebhookReplay> = ctx.api();
    replays
        .create(&PostParams::default(), &replay)
        .await
        .expect("creating the WebhookReplay");
    let status = eventually("the dry run Complete", WAIT, || async {
        let status = replays.get("failed-ones").await.ok()?.status?;
        (status.phase == Some(ReplayPhase::Completed)).then_some(status)
    })
    .await;
    assert_eq!(status.matched, Some(dead), "{status:?}");
    let _ = stop_operator.send(());
    ctx.cleanup().await;
}
