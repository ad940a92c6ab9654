//! The WebhookEndpoint controller against the real API server and NATS: validation,
//! the config entry in `herald-config`, health into status, deletion.

mod support;

use std::time::{Duration, Instant};

use herald_core::dataplane::{EndpointHealth, EndpointKey, shard_for};
use herald_core::v1alpha1::{WebhookEndpoint, WebhookReplay};
use herald_e2e::{TestContext, env, eventually, private_env};
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::*;

/// 127.0.0.1 is allowlisted so a URL needs no DNS and no real receiver.
const ALLOW_LOOPBACK: &[&str] = &["--allow-network", "127.0.0.0/8"];

#[tokio::test]
async fn a_valid_endpoint_becomes_ready_and_its_config_reaches_nats() {
    let ctx = TestContext::new("op-ready").await;
    let op = Operator::start(&ctx, "a", ALLOW_LOOPBACK);
    let (config_kv, _) = buckets(&ctx).await;
    create_secret(&ctx, "keys", json!({})).await;
    create_endpoint(&ctx, "orders", "https://127.0.0.1:8443/hook", "keys").await;

    let obj = endpoint_ready(&ctx, "orders", "True").await;
    let status = obj.status.clone().unwrap();
    let ready = condition(&status.conditions, "Ready").unwrap();
    assert_eq!(ready.reason, "Accepted");
    assert_eq!(ready.observed_generation, obj.metadata.generation);
    let shard = shard_for(&ctx.namespace, "orders", herald_e2e::dataplane::TEST_SHARDS);
    assert_eq!(status.shard, Some(shard));
    // `state` follows Ready, written by the health writer.
    eventually("state Pending", WAIT, || async {
        let obj = ctx.api::<WebhookEndpoint>().get("orders").await.ok()?;
        (obj.status?.state == Some(herald_core::v1alpha1::EndpointState::Pending)).then_some(())
    })
    .await;
    assert!(
        obj.finalizers()
            .iter()
            .any(|f| f == herald_core::names::ENDPOINT_FINALIZER)
    );

    let key = EndpointKey::new(&ctx.namespace, "orders").config_key();
    let config = eventually("config entry", WAIT, || kv_get(&config_kv, &key)).await;
    assert_eq!(config["uid"], json!(obj.uid().unwrap()));
    assert_eq!(config["url"], json!("https://127.0.0.1:8443/hook"));
    assert_eq!(config["shard"], json!(shard));
    assert_eq!(config["secret"], json!("keys"));

    // Re-enabling: the annotation's value becomes the enable token.
    ctx.api::<WebhookEndpoint>()
        .patch(
            "orders",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"herald.dev/enable": "42"}}})),
        )
        .await
        .unwrap();
    eventually("enable token in config", WAIT, || async {
        let config = kv_get(&config_kv, &key).await?;
        (config["enableToken"] == json!("42")).then_some(())
    })
    .await;

    // Pausing reaches the data plane and the state column.
    ctx.api::<WebhookEndpoint>()
        .patch(
            "orders",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"paused": true}})),
        )
        .await
        .unwrap();
    eventually("paused in config and status", WAIT, || async {
        let config = kv_get(&config_kv, &key).await?;
        let obj = ctx.api::<WebhookEndpoint>().get("orders").await.ok()?;
        let paused = obj.status?.state == Some(herald_core::v1alpha1::EndpointState::Paused);
        (config["paused"] == json!(true) && paused).then_some(())
    })
    .await;
    let reasons = event_reasons(&ctx).await;
    assert!(reasons.iter().any(|r| r == "Accepted"), "{reasons:?}");
    finish(ctx, vec![op]).await;
}

#[tokio::test]
async fn internal_addresses_are_refused_and_get_no_config() {
    let ctx = TestContext::new("op-ssrf").await;
    let op = Operator::start(&ctx, "a", &[]);
    let (config_kv, _) = buckets(&ctx).await;
    create_secret(&ctx, "keys", json!({})).await;
    let cases = [
        (
            "metadata",
            "https://169.254.169.254/latest",
            "cloud metadata",
        ),
        ("private", "https://10.0.0.1/hook", "private-network"),
        ("loopback6", "https://[::1]/hook", "loopback"),
        ("localhost", "https://localhost:8443/hook", "loopback"),
    ];
    for (name, url, _) in cases {
        create_endpoint(&ctx, name, url, "keys").await;
    }
    for (name, url, class) in cases {
        let ready = endpoint_reason(&ctx, name, "UrlForbidden").await;
        assert_eq!(ready.status, "False");
        assert!(ready.message.contains(class), "{url}: {}", ready.message);
        assert!(
            ready.message.contains("allowlist"),
            "actionable: {}",
            ready.message
        );
        let key = EndpointKey::new(&ctx.namespace, name).config_key();
        assert!(
            kv_get(&config_kv, &key).await.is_none(),
            "{url} must have no config entry"
        );
    }
    // A host that does not resolve is not refused, but reported and retried.
    create_endpoint(
        &ctx,
        "nowhere",
        "https://does-not-exist.invalid/hook",
        "keys",
    )
    .await;
    let ready = endpoint_reason(&ctx, "nowhere", "UrlUnresolvable").await;
    assert_eq!(ready.status, "False");
    assert!(
        ready.message.contains("does-not-exist.invalid"),
        "{}",
        ready.message
    );

    // A Warning Event names the reason.
    let reasons = eventually("UrlForbidden Events", WAIT, || async {
        let reasons = event_reasons(&ctx).await;
        reasons
            .iter()
            .any(|r| r == "UrlForbidden")
            .then_some(reasons)
    })
    .await;
    assert!(reasons.iter().any(|r| r == "UrlForbidden"), "{reasons:?}");
    finish(ctx, vec![op]).await;
}

#[tokio::test]
async fn a_missing_secret_is_reported_until_it_is_created() {
    let ctx = TestContext::new("op-nosecret").await;
    let op = Operator::start(&ctx, "a", ALLOW_LOOPBACK);
    let (config_kv, _) = buckets(&ctx).await;
    create_endpoint(&ctx, "orders", "https://127.0.0.1:8443/hook", "later").await;
    let obj = endpoint_ready(&ctx, "orders", "False").await;
    let ready = condition(&obj.status.as_ref().unwrap().conditions, "Ready")
        .unwrap()
        .clone();
    assert_eq!(ready.reason, "SecretNotFound");
    assert!(ready.message.contains("later"), "{}", ready.message);
    let key = EndpointKey::new(&ctx.namespace, "orders").config_key();
    assert!(kv_get(&config_kv, &key).await.is_none());

    create_secret(&ctx, "later", json!({})).await;
    let obj = endpoint_ready(&ctx, "orders", "True").await;
    let ready = condition(&obj.status.as_ref().unwrap().conditions, "Ready")
        .unwrap()
        .clone();
    assert_eq!(ready.reason, "Accepted");
    assert!(kv_get(&config_kv, &key).await.is_some());
    finish(ctx, vec![op]).await;
}

async fn put_health(
    store: &async_nats::jetstream::kv::Store,
    ns: &str,
    name: &str,
    health: &EndpointHealth,
) {
    let key = EndpointKey::new(ns, name).config_key();
    store
        .put(key, serde_json::to_vec(health).unwrap().into())
        .await
        .expect("putting health");
}

fn success_rate(obj: &WebhookEndpoint) -> Option<String> {
    obj.status.as_ref()?.success_rate.clone()
}

#[tokio::test]
async fn health_reaches_status_at_most_once_per_interval() {
    let ctx = TestContext::new("op-health").await;
    let interval = Duration::from_secs(4);
    let op = Operator::start(
        &ctx,
        "a",
        &["--allow-network", "127.0.0.0/8", "--status-interval", "4s"],
    );
    let (_, health_kv) = buckets(&ctx).await;
    create_secret(&ctx, "keys", json!({})).await;
    create_endpoint(&ctx, "orders", "https://127.0.0.1:8443/hook", "keys").await;
    let obj = endpoint_ready(&ctx, "orders", "True").await;
    let uid = obj.uid().unwrap();
    let api = ctx.api::<WebhookEndpoint>();

    // A stale record of an earlier endpoint of the same name is ignored.
    let mut health = EndpointHealth {
        uid: "someone-else".into(),
        state: Some(herald_core::v1alpha1::EndpointState::Active),
        success_permille: Some(500),
        ..Default::default()
    };
    put_health(&health_kv, &ctx.namespace, "orders", &health).await;

    let first_put = Instant::now();
    health.uid = uid.clone();
    health.success_permille = Some(998);
    health.p95_latency_ms = Some(120);
    health.backlog = Some(5);
    health.concurrency_limit = Some(4);
    health.circuit = Some(herald_core::v1alpha1::CircuitState::Closed);
    health.oldest_pending_ms = Some(1_800_000_000_000);
    put_health(&health_kv, &ctx.namespace, "orders", &health).await;
    let obj = eventually("health in status", WAIT, || async {
        let obj = api.get("orders").await.ok()?;
        (success_rate(&obj).as_deref() == Some("99.8%")).then_some(obj)
    })
    .await;
    let status = obj.status.unwrap();
    assert_eq!(
        status.state,
        Some(herald_core::v1alpha1::EndpointState::Active)
    );
    assert_eq!(status.p95_latency.as_deref(), Some("120ms"));
    assert_eq!(status.backlog, Some(5));
    assert_eq!(status.concurrency_limit, Some(4));
    assert!(status.oldest_pending.is_some());
    let healthy = condition(&status.conditions, "Healthy").unwrap();
    assert_eq!(
        (healthy.status.as_str(), healthy.reason.as_str()),
        ("True", "Delivering")
    );

    // The printer columns show it.
    let out = env()
        .kubectl()
        .args(["get", "whe", "orders", "-n", &ctx.namespace])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("99.8%") && table.contains("Active"),
        "{table}"
    );

    // Two more reports within the interval: only the last one shows, and not before the
    // interval since the first one has passed.
    health.success_permille = Some(950);
    put_health(&health_kv, &ctx.namespace, "orders", &health).await;
    health.success_permille = Some(900);
    health.state = Some(herald_core::v1alpha1::EndpointState::Degraded);
    put_health(&health_kv, &ctx.namespace, "orders", &health).await;
    let seen = std::cell::RefCell::new(Vec::new());
    eventually("coalesced health in status", WAIT, || async {
        let obj = api.get("orders").await.ok()?;
        let rate = success_rate(&obj)?;
        if !seen.borrow().contains(&rate) {
            seen.borrow_mut().push(rate.clone());
        }
        (rate == "90.0%").then_some(())
    })
    .await;
    let elapsed = first_put.elapsed();
    let seen = seen.into_inner();
    assert!(
        !seen.contains(&"95.0%".to_owned()),
        "intermediate report was written: {seen:?}"
    );
    assert!(
        elapsed >= interval,
        "second write after {elapsed:?}, interval {interval:?}"
    );
    let obj = api.get("orders").await.unwrap();
    let healthy = condition(&obj.status.as_ref().unwrap().conditions, "Healthy")
        .unwrap()
        .clone();
    assert_eq!(
        (healthy.status.as_str(), healthy.reason.as_str()),
        ("False", "Degraded")
    );

    // Disabled: a condition that says how to re-enable, and a Warning Event.
    health.disabled_reason = Some(herald_core::dataplane::DisabledReason::Gone);
    health.disabled_message = Some("the receiver answered 410 Gone".into());
    put_health(&health_kv, &ctx.namespace, "orders", &health).await;
    let disabled = eventually("Disabled condition", WAIT, || async {
        let obj = api.get("orders").await.ok()?;
        let c = condition(&obj.status.as_ref()?.conditions, "Disabled")?.clone();
        (c.status == "True").then_some(c)
    })
    .await;
    assert_eq!(disabled.reason, "Gone");
    assert!(
        disabled
            .message
            .contains("kubectl annotate webhookendpoint orders")
            && disabled
                .message
                .contains("herald.dev/enable=$(date +%s) --overwrite"),
        "{}",
        disabled.message
    );
    eventually("Disabled Event", WAIT, || async {
        event_reasons(&ctx)
            .await
            .iter()
            .any(|r| r == "Disabled")
            .then_some(())
    })
    .await;
    finish(ctx, vec![op]).await;
}

/// The health writer keeps no record in memory and reads the newest from the bucket when
/// it renders; a gauge-only change still waits for `--status-refresh`, also when the
/// writer runs for another reason that changes nothing it renders from (here a label
/// edit), and goes out with the next material change.
#[tokio::test]
async fn gauges_wait_for_the_refresh_whatever_else_wakes_the_writer() {
    let ctx = TestContext::new("op-gauges").await;
    let op = Operator::start(
        &ctx,
        "a",
        &[
            "--allow-network",
            "127.0.0.0/8",
            "--status-interval",
            "2s",
            "--status-refresh",
            "10m",
        ],
    );
    let (_, health_kv) = buckets(&ctx).await;
    create_secret(&ctx, "keys", json!({})).await;
    create_endpoint(&ctx, "orders", "https://127.0.0.1:8443/hook", "keys").await;
    let obj = endpoint_ready(&ctx, "orders", "True").await;
    let api = ctx.api::<WebhookEndpoint>();
    let mut health = EndpointHealth {
        uid: obj.uid().unwrap(),
        state: Some(herald_core::v1alpha1::EndpointState::Active),
        success_permille: Some(1000),
        p95_latency_ms: Some(120),
        ..Default::default()
    };
    put_health(&health_kv, &ctx.namespace, "orders", &health).await;
    let p95 = async || {
        let obj = api.get("orders").await.ok()?;
        obj.status?.p95_latency
    };
    eventually("health in status", WAIT, || async {
        (p95().await.as_deref() == Some("120ms")).then_some(())
    })
    .await;

    // A gauge alone, then an edit that wakes the writer but changes nothing it renders.
    health.p95_latency_ms = Some(300);
    put_health(&health_kv, &ctx.namespace, "orders", &health).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let label = json!({"metadata": {"labels": {"team": "payments"}}});
    api.patch("orders", &PatchParams::default(), &Patch::Merge(&label))
        .await
        .expect("labelling the endpoint");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        p95().await.as_deref(),
        Some("120ms"),
        "a gauge-only change went out before the refresh"
    );

    // A material change goes out within the interval, with the newest gauges.
    health.success_permille = Some(900);
    put_health(&health_kv, &ctx.namespace, "orders", &health).await;
    let obj = eventually("the material change in status", WAIT, || async {
        let obj = api.get("orders").await.ok()?;
        (success_rate(&obj).as_deref() == Some("90.0%")).then_some(obj)
    })
    .await;
    assert_eq!(
        obj.status.unwrap().p95_latency.as_deref(),
        Some("300ms"),
        "the write took the newest record"
    );

    // A new leader renders every endpoint from what the bucket holds: an unchanged
    // status is not written again, a new record is.
    let written = api.get("orders").await.unwrap().resource_version();
    op.stop().await.expect("the first operator stops");
    let op = Operator::start(
        &ctx,
        "b",
        &["--allow-network", "127.0.0.0/8", "--status-interval", "2s"],
    );
    let leases = ctx.api::<k8s_openapi::api::coordination::v1::Lease>();
    eventually("the second operator leading", WAIT, || async {
        let lease = leases.get_opt("herald-operator").await.ok()??;
        (lease.spec?.holder_identity.as_deref() == Some("b")).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let obj = api.get("orders").await.unwrap();
    assert_eq!(success_rate(&obj).as_deref(), Some("90.0%"));
    assert_eq!(
        obj.resource_version(),
        written,
        "the new leader rewrote an unchanged status"
    );
    health.success_permille = Some(800);
    put_health(&health_kv, &ctx.namespace, "orders", &health).await;
    eventually("the new leader writing a new record", WAIT, || async {
        let obj = api.get("orders").await.ok()?;
        (success_rate(&obj).as_deref() == Some("80.0%")).then_some(())
    })
    .await;
    finish(ctx, vec![op]).await;
}

#[tokio::test]
async fn deleting_an_endpoint_withdraws_its_config_then_the_finalizer() {
    let ctx = TestContext::new("op-delete").await;
    let op = Operator::start(&ctx, "a", ALLOW_LOOPBACK);
    let (config_kv, _) = buckets(&ctx).await;
    create_secret(&ctx, "keys", json!({})).await;
    create_endpoint(&ctx, "orders", "https://127.0.0.1:8443/hook", "keys").await;
    endpoint_ready(&ctx, "orders", "True").await;
    let key = EndpointKey::new(&ctx.namespace, "orders").config_key();
    eventually("config entry", WAIT, || kv_get(&config_kv, &key)).await;

    let api = ctx.api::<WebhookEndpoint>();
    api.delete("orders", &DeleteParams::default())
        .await
        .unwrap();
    eventually("endpoint gone", WAIT, || async {
        api.get_opt("orders").await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(
        kv_get(&config_kv, &key).await.is_none(),
        "config entry must be gone"
    );
    finish(ctx, vec![op]).await;
}

#[tokio::test]
async fn replays_are_validated_requested_and_withdrawn_but_not_run() {
    let ctx = TestContext::new("op-replay").await;
    // The event store exists (as the dispatchers create it), with the default retention.
    herald_e2e::dataplane::DataPlane::new(ctx.nats.clone()).await;
    let op = Operator::start(&ctx, "a", ALLOW_LOOPBACK);
    let from = k8s_openapi::jiff::Timestamp::now()
        .checked_sub(k8s_openapi::jiff::SignedDuration::from_hours(1))
        .unwrap();
    let replay: WebhookReplay = serde_json::from_value(json!({
        "apiVersion": "herald.dev/v1alpha1",
        "kind": "WebhookReplay",
        "metadata": {"name": "again"},
        "spec": {"endpoint": "orders", "from": from.to_string()},
    }))
    .unwrap();
    let api = ctx.api::<WebhookReplay>();
    api.create(&PostParams::default(), &replay).await.unwrap();
    let status = eventually("replay status", WAIT, || async {
        let r = api.get("again").await.ok()?;
        let status = r.status?;
        (condition(&status.conditions, "Ready")?.reason == "EndpointNotFound").then_some(status)
    })
    .await;
    assert_eq!(
        status.phase,
        Some(herald_core::v1alpha1::ReplayPhase::Pending)
    );
    let complete = condition(&status.conditions, "Complete").unwrap();
    assert_eq!(
        (complete.status.as_str(), complete.reason.as_str()),
        ("False", "Waiting")
    );
    assert!(
        status.matched.is_none() && status.delivered.is_none(),
        "no invented progress"
    );

    create_secret(&ctx, "keys", json!({})).await;
    create_endpoint(&ctx, "orders", "https://127.0.0.1:8443/hook", "keys").await;
    eventually("replay valid once its endpoint exists", WAIT, || async {
        let r = api.get("again").await.ok()?;
        (condition(&r.status?.conditions, "Ready")?.status == "True").then_some(())
    })
    .await;

    // A valid replay is handed to the data plane in herald-config, its range fixed
    // (`to`: the creation time), and the resource holds a finalizer for it.
    let (config_kv, _) = buckets(&ctx).await;
    let key = herald_core::dataplane::BucketKey::replay(&ctx.namespace, "again").to_string();
    let request = eventually("replay request", WAIT, || kv_get(&config_kv, &key)).await;
    let obj = api.get("again").await.unwrap();
    let created = obj.metadata.creation_timestamp.clone().unwrap().0;
    assert_eq!(request["uid"], json!(obj.uid().unwrap()));
    assert_eq!(request["endpoint"], json!("orders"));
    assert_eq!(request["fromMs"], json!(obj.spec.from.0.as_millisecond()));
    assert_eq!(request["toMs"], json!(created.as_millisecond() + 1_000));
    assert_eq!(request["onlyFailed"], json!(false));
    assert!(
        obj.finalizers()
            .iter()
            .any(|f| f == herald_core::names::REPLAY_FINALIZER)
    );

    // Deleting the replay withdraws the request, then the resource goes.
    api.delete("again", &DeleteParams::default()).await.unwrap();
    eventually("replay gone", WAIT, || async {
        api.get_opt("again").await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(
        kv_get(&config_kv, &key).await.is_none(),
        "the request must be withdrawn"
    );
    finish(ctx, vec![op]).await;
}

/// The retention a replay is checked against is the event store's own `max_age`, read
/// from NATS, not a constant: in an environment of its own, a stream of 2 hours makes a
/// replay from 3 hours ago `OutsideRetention` (saying 2h), and one from 1 hour ago
/// valid; before the stream exists, the replay says so and is checked again.
#[tokio::test]
async fn a_replay_is_checked_against_the_event_stores_real_retention() {
    use herald_core::dataplane::layout;
    let env = private_env();
    let ctx = TestContext::new_in(env, "op-retention").await;
    let js = async_nats::jetstream::new(ctx.nats.clone());
    // No dispatcher has run in this environment: no event store (yet).
    let _ = js
        .delete_stream(herald_core::dataplane::EVENTS_STREAM)
        .await;
    let op = Operator::start_in(env, &ctx, "a", ALLOW_LOOPBACK);
    create_secret(&ctx, "keys", json!({})).await;
    create_endpoint(&ctx, "orders", "https://127.0.0.1:8443/hook", "keys").await;
    let api = ctx.api::<WebhookReplay>();
    let hours_ago = |h: i64| {
        (k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_hours(h))
            .to_string()
    };
    for (name, from) in [("three-hours", hours_ago(3)), ("one-hour", hours_ago(1))] {
        let replay: WebhookReplay = serde_json::from_value(json!({
            "apiVersion": "herald.dev/v1alpha1",
            "kind": "WebhookReplay",
            "metadata": {"name": name},
            "spec": {"endpoint": "orders", "from": from},
        }))
        .unwrap();
        api.create(&PostParams::default(), &replay).await.unwrap();
    }
    let ready = |name: &'static str, reason: &'static str| {
        let api = api.clone();
        async move {
            eventually(&format!("{name}: {reason}"), WAIT, || async {
                let r = api.get(name).await.ok()?;
                let ready = condition(&r.status?.conditions, "Ready")?.clone();
                (ready.reason == reason).then_some(ready)
            })
            .await
        }
    };
    let missing = ready("one-hour", "EventStoreMissing").await;
    assert_eq!(missing.status, "False");
    assert!(missing.message.contains("HERALD_EVENTS"), "{missing:?}");

    // The dispatchers create it with --retention 2h.
    layout::ensure_stream(
        &js,
        &layout::events_stream(
            Duration::from_secs(7200),
            herald_e2e::dataplane::TEST_SHARDS,
        ),
        1,
    )
    .await
    .expect("the event store");
    let old = ready("three-hours", "OutsideRetention").await;
    assert_eq!(old.status, "False");
    assert!(old.message.contains("2h retention window"), "{old:?}");
    let recent = ready("one-hour", "Valid").await;
    assert_eq!(recent.status, "True");
    finish(ctx, vec![op]).await;
}

/// A free loopback port for the metrics server.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

async fn http_get(port: u16, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    Some(response)
}

#[tokio::test]
async fn metrics_and_probes_are_served() {
    let ctx = TestContext::new("op-metrics").await;
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let op = Operator::start(
        &ctx,
        "a",
        &["--allow-network", "127.0.0.0/8", "--listen", &listen],
    );
    eventually("/healthz", WAIT, || async {
        http_get(port, "/healthz")
            .await
            .filter(|r| r.starts_with("HTTP/1.0 200"))
    })
    .await;
    eventually("/readyz", WAIT, || async {
        http_get(port, "/readyz")
            .await
            .filter(|r| r.starts_with("HTTP/1.0 200"))
    })
    .await;
    create_secret(&ctx, "keys", json!({})).await;
    create_endpoint(&ctx, "orders", "https://127.0.0.1:8443/hook", "keys").await;
    create_endpoint(&ctx, "meta", "https://169.254.169.254/", "keys").await;
    endpoint_ready(&ctx, "orders", "True").await;
    let metrics = eventually("endpoint gauge", WAIT, || async {
        let body = http_get(port, "/metrics").await?;
        (body.contains(r#"herald_operator_endpoints{state="Pending"} 1"#)
            && body.contains(r#"herald_operator_endpoints{state="NotReady"} 1"#))
        .then_some(body)
    })
    .await;
    for needle in [
        r#"herald_operator_reconciles_total{kind="WebhookEndpoint",result="ok"}"#,
        r#"herald_operator_reconciles_total{kind="SigningSecret",result="ok"}"#,
        "herald_operator_reconcile_duration_seconds_bucket",
        "herald_operator_leader 1",
    ] {
        assert!(metrics.contains(needle), "{needle} missing in:\n{metrics}");
    }
    assert!(
        !metrics.contains("orders"),
        "object names never become labels"
    );
    finish(ctx, vec![op]).await;
}

#[tokio::test]
async fn an_undecodable_endpoint_is_reported_held_and_still_deletable() {
    let ctx = TestContext::new("op-guard").await;
    let op = Operator::start(&ctx, "a", ALLOW_LOOPBACK);
    let (config_kv, _) = buckets(&ctx).await;
    create_secret(&ctx, "keys", json!({})).await;
    create_endpoint(&ctx, "orders", "https://127.0.0.1:8443/hook", "keys").await;
    endpoint_ready(&ctx, "orders", "True").await;
    let key = EndpointKey::new(&ctx.namespace, "orders").config_key();
    eventually("config entry", WAIT, || kv_get(&config_kv, &key)).await;

    // The schema allows it, the Rust type (u32) does not: what a newer Herald version
    // or a hand-edited status could leave behind.
    let raw = kube::Api::<kube::api::DynamicObject>::namespaced_with(
        ctx.client.clone(),
        &ctx.namespace,
        &kube::api::ApiResource::erase::<WebhookEndpoint>(&()),
    );
    raw.patch_status(
        "orders",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"concurrencyLimit": 5_000_000_000u64}})),
    )
    .await
    .unwrap();
    // Another annotation change makes it relevant again for the controller.
    raw.patch(
        "orders",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"herald.dev/enable": "1"}}})),
    )
    .await
    .unwrap();
    // Held, not withdrawn: only deletion drops an endpoint's backlog.
    let held = eventually("config held", WAIT, || async {
        let config = kv_get(&config_kv, &key).await?;
        (config["held"]["reason"] == json!("InvalidSpec")).then_some(config)
    })
    .await;
    assert_eq!(held["url"], json!("https://127.0.0.1:8443/hook"));
    let text = eventually("a Warning Event", WAIT, || async {
        let text = events_text(&ctx).await;
        text.contains("cannot read this object").then_some(text)
    })
    .await;
    assert!(text.contains("InvalidSpec"), "{text}");

    raw.delete("orders", &DeleteParams::default())
        .await
        .unwrap();
    eventually("undecodable endpoint deleted", WAIT, || async {
        raw.get_opt("orders").await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(
        kv_get(&config_kv, &key).await.is_none(),
        "deletion withdraws the configuration"
    );
    finish(ctx, vec![op]).await;
}
