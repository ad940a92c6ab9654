//! Herald the way a tenant uses it: `WebhookEndpoint` and `SigningSecret` applied to the
//! real API server, the operator and a dispatcher running, a producer publishing to NATS,
//! a receiver verifying signatures with the generated key — and delivery going on while
//! the Kubernetes API is unreachable, with status catching up afterwards; a key rotation
//! signing with both keys; and no key material in any log line.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald_core::signing::{SigningKey, verify};
use herald_core::v1alpha1::{EndpointState, WebhookEndpoint};
use herald_e2e::dataplane::{DataPlane, shared_dispatcher};
use herald_e2e::receiver::Receiver;
use herald_e2e::{TestContext, eventually, fault_lock, private_env};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use serde_json::json;
use tokio::sync::oneshot;

const WAIT: Duration = Duration::from_secs(60);

/// A log sink for the test's subscriber.
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn start_operator(ctx: &TestContext) -> oneshot::Sender<()> {
    let args = [
        "herald-operator",
        "--nats-url",
        private_env().nats_url(),
        "--namespace",
        &ctx.namespace,
        "--lease-namespace",
        &ctx.namespace,
        "--kubeconfig",
        &private_env().kubeconfig().display().to_string(),
        "--listen",
        "127.0.0.1:0",
        "--shards",
        "4",
        "--allow-network",
        "127.0.0.0/8",
        "--allow-http",
        "--status-interval",
        "1s",
        // This test follows lastDelivery, a gauge (refreshed every 5 min by default).
        "--status-refresh",
        "1s",
        "--lease-duration",
        "5s",
        "--lease-renew",
        "1s",
    ]
    .map(str::to_owned);
    let (tx, mut rx) = oneshot::channel::<()>();
    // Like its Deployment would: an operator process that ends is started again. (Losing
    // the Lease no longer ends it: it goes back to standby in-process.)
    tokio::spawn(async move {
        loop {
            let config = <herald_operator::Config as clap::Parser>::try_parse_from(args.clone())
                .expect("flags");
            let (stop_tx, stop_rx) = oneshot::channel::<()>();
            let mut run = tokio::spawn(herald_operator::run(config, async move {
                let _ = stop_rx.await;
            }));
            tokio::select! {
                _ = &mut rx => {
                    let _ = stop_tx.send(());
                    let _ = run.await;
                    return;
                }
                _ = &mut run => tokio::time::sleep(Duration::from_secs(1)).await,
            }
        }
    });
    tx
}

fn apply(ctx: &TestContext, manifest: serde_json::Value) {
    let mut child = private_env()
        .kubectl()
        .args(["apply", "--server-side", "-n", &ctx.namespace, "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::io::Write::write_all(
        child.stdin.as_mut().unwrap(),
        serde_json::to_string(&manifest).unwrap().as_bytes(),
    )
    .unwrap();
    assert!(child.wait().unwrap().success(), "kubectl apply failed");
}

#[tokio::test]
async fn a_tenant_applies_resources_and_receives_verified_webhooks_even_while_the_api_is_down() {
    // Every log line of the operator and the dispatcher (both run in this process), at
    // debug level, is kept to check that no key material is ever logged.
    let logs = Arc::new(Mutex::new(Vec::<u8>::new()));
    let sink = logs.clone();
    let _ = tracing_subscriber::fmt()
        .with_env_filter("herald_operator=debug,herald_dispatcher=debug,kube=info,async_nats=info")
        .with_ansi(false)
        .with_writer(move || Captured(sink.clone()))
        .try_init();
    let _faults = fault_lock().await;
    let ctx = TestContext::new_in(private_env(), "tour").await;
    shared_dispatcher(private_env());
    let stop_operator = start_operator(&ctx);
    let rx = Receiver::start().await;
    let dp = DataPlane::new(private_env().nats().await).await;

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
            "spec": {"url": rx.url("orders"), "eventTypes": ["order.*"], "secretRef": {"name": "orders"}}
        }),
    );
    let endpoints: Api<WebhookEndpoint> = ctx.api();
    eventually("the endpoint Ready", WAIT, || {
        let endpoints = endpoints.clone();
        async move {
            let ep = endpoints.get("orders").await.ok()?;
            let status = ep.status?;
            status
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
                .then_some(())
        }
    })
    .await;
    // Config reaches the dispatcher through KV a moment after Ready.
    let secret: Secret = ctx.api::<Secret>().get("orders").await.unwrap();
    let whsec = String::from_utf8(secret.data.unwrap()["current"].0.clone()).unwrap();
    let key = SigningKey::from_whsec(&whsec).unwrap();

    let mut n = 0;
    eventually("the first delivery", WAIT, || {
        n += 1;
        let (dp, rx, ns) = (dp.clone(), rx.clone(), ctx.namespace.clone());
        async move {
            if rx.received("orders").is_empty() {
                dp.publish(&ns, "order.created", json!({"n": n})).await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            (!rx.received("orders").is_empty()).then_some(())
        }
    })
    .await;
    let req = &rx.received("orders")[0];
    let now = jiff::Timestamp::now().as_second();
    verify(
        std::slice::from_ref(&key),
        req.header("webhook-id"),
        req.header("webhook-timestamp"),
        req.header("webhook-signature"),
        &req.body,
        now,
        300,
    )
    .expect("the receiver verifies with the key Herald generated into the Secret");

    // Status shows the delivery (written by the operator from the dispatcher's health).
    eventually("status with a last delivery", WAIT, || {
        let endpoints = endpoints.clone();
        async move {
            let status = endpoints.get("orders").await.ok()?.status?;
            (status.state == Some(EndpointState::Active) && status.last_delivery.is_some())
                .then_some(())
        }
    })
    .await;

    // The Kubernetes API goes away; producers and receivers do not notice.
    let before = rx.received("orders").len();
    private_env().blackout_apiserver(15.0);
    for i in 0..20 {
        dp.publish(&ctx.namespace, "order.paid", json!({"during": i}))
            .await;
    }
    eventually(
        "20 deliveries during the blackout",
        Duration::from_secs(12),
        || {
            let n = rx.received("orders").len();
            async move { (n >= before + 20).then_some(()) }
        },
    )
    .await;
    assert!(
        tokio::time::timeout(Duration::from_secs(1), endpoints.get("orders"))
            .await
            .map_or(true, |r| r.is_err()),
        "the API server was reachable: the test proved nothing"
    );

    // After the blackout, status catches up with what was delivered meanwhile (the
    // last delivery is one of those made during the blackout; with four in flight,
    // which one finished last is not the receiver's to say).
    let during: Vec<String> = rx.received("orders")[before..]
        .iter()
        .map(|r| r.header("webhook-id").to_owned())
        .collect();
    eventually("status to catch up after the blackout", WAIT, || {
        let (endpoints, during) = (endpoints.clone(), during.clone());
        async move {
            let status = endpoints.get("orders").await.ok()?.status?;
            during
                .contains(&status.last_delivery?.event_id)
                .then_some(())
        }
    })
    .await;
    // Rotation on request: during the overlap every request carries two signatures, one
    // per key, and a receiver holding either key accepts it.
    apply(
        &ctx,
        json!({
            "apiVersion": "herald.dev/v1alpha1", "kind": "SigningSecret",
            "metadata": {"name": "orders"}, "spec": {"rotation": {"request": "rotate-1"}}
        }),
    );
    let secrets: Api<Secret> = ctx.api();
    let new_whsec = eventually("a rotated key in the Secret", WAIT, || {
        let (secrets, old) = (secrets.clone(), whsec.clone());
        async move {
            let data = secrets.get("orders").await.ok()?.data?;
            let current = String::from_utf8(data.get("current")?.0.clone()).ok()?;
            (current != old).then_some(current)
        }
    })
    .await;
    let new_key = SigningKey::from_whsec(&new_whsec).unwrap();
    let seen = rx.received("orders").len();
    let mut n = 0;
    let signed_twice = eventually("a delivery signed with both keys", WAIT, || {
        n += 1;
        let (dp, rx, ns) = (dp.clone(), rx.clone(), ctx.namespace.clone());
        async move {
            dp.publish(&ns, "order.created", json!({"rotation": n}))
                .await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            rx.received("orders")
                .into_iter()
                .skip(seen)
                .find(|r| r.header("webhook-signature").split(' ').count() == 2)
        }
    })
    .await;
    let now = jiff::Timestamp::now().as_second();
    for (name, key) in [("previous", &key), ("new", &new_key)] {
        verify(
            std::slice::from_ref(key),
            signed_twice.header("webhook-id"),
            signed_twice.header("webhook-timestamp"),
            signed_twice.header("webhook-signature"),
            &signed_twice.body,
            now,
            300,
        )
        .unwrap_or_else(|e| panic!("the {name} key does not verify during the overlap: {e}"));
    }
    let _ = stop_operator.send(());
    let logs = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    assert!(
        logs.lines().count() > 20,
        "the log capture saw almost nothing:\n{logs}"
    );
    for secret in [&whsec, &new_whsec] {
        let encoded = secret.trim_start_matches("whsec_");
        assert!(
            !logs.contains("whsec_") && !logs.contains(encoded),
            "key material in the logs"
        );
    }
    ctx.cleanup().await;
}
