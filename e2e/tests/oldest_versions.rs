//! The oldest releases Herald claims to run on, run for real: kube-apiserver 1.34
//! (`kube-apiserver-oldest`, built by `scripts/build-e2e.sh` from the Kubernetes module
//! pinned in `e2e/kube-oldest/go.mod`, run by `testenv --kube-apiserver`) and
//! nats-server 2.12 (`nats-server-oldest`). The README's table of versions names these;
//! when one of them stops working, the claim goes with it.
//!
//! What must hold there: the CRDs install and their validation refuses a bad spec with
//! its message (CEL rules compile on the old server), the operator turns a
//! `SigningSecret` and a `WebhookEndpoint` into a key and a Ready endpoint, and the
//! dispatcher delivers a signed event after a failed first attempt (a retry is a
//! JetStream per-message schedule, the feature that sets the NATS minimum).

use std::time::Duration;

use herald_core::signing::{SigningKey, verify};
use herald_core::v1alpha1::WebhookEndpoint;
use herald_e2e::dataplane::DataPlane;
use herald_e2e::faults::{Dispatchers, Operators};
use herald_e2e::nats_process::NatsProcess;
use herald_e2e::receiver::{Behavior, Receiver};
use herald_e2e::{TestContext, eventually, private_oldest_env};
use k8s_openapi::api::core::v1::Secret;
use kube::api::PostParams;
use serde_json::json;

const OPERATOR: &str = env!("CARGO_BIN_EXE_herald-test-operator");
const DISPATCHER: &str = env!("CARGO_BIN_EXE_herald-test-dispatcher");
const WAIT: Duration = Duration::from_secs(90);

/// The oldest Kubernetes minor and nats-server minor the README claims.
const KUBERNETES: &str = "v1.34.";
const NATS: &str = "2.12.";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn herald_runs_on_the_oldest_kubernetes_and_nats_it_supports() {
    let env = private_oldest_env();
    let ctx = TestContext::new_in(env, "oldest").await;
    let version = ctx
        .client
        .apiserver_version()
        .await
        .expect("the API server's version");
    assert!(
        version.git_version.starts_with(KUBERNETES),
        "the API server is {}, not the oldest supported ({KUBERNETES}x)",
        version.git_version
    );

    // Validation on the old server: a CEL rule's own message.
    let bad: WebhookEndpoint = serde_json::from_value(json!({
        "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookEndpoint",
        "metadata": {"name": "bad"},
        "spec": {"url": "ftp://example.com/hook", "eventTypes": ["a.b"], "secretRef": {"name": "s"}}
    }))
    .expect("an endpoint object");
    let refused = ctx
        .api::<WebhookEndpoint>()
        .create(&PostParams::default(), &bad)
        .await
        .expect_err("an ftp:// URL must be refused by the API server");
    assert!(
        refused.to_string().contains("https://"),
        "the refusal does not say what a URL must be: {refused}"
    );

    let nats = NatsProcess::start("nats-server-oldest", true);
    let client = async_nats::connect(&nats.url).await.expect("connecting");
    let server = client.server_info().version;
    assert!(
        server.starts_with(NATS),
        "nats-server is {server}, not the oldest supported ({NATS}x)"
    );

    let rx = Receiver::start().await;
    // The first attempt of every event whose data is a number fails: one retry each.
    rx.behave("orders", Behavior::fail_first_of_every(1, 500));
    let mut operators = Operators::new(OPERATOR, env, &ctx.namespace, "oldest")
        .with_args(&["--nats-url", &nats.url]);
    operators.start("oldest-op");
    let mut dispatchers = Dispatchers::new(DISPATCHER, &nats.url, "oldest");
    dispatchers.start("oldest-d0");

    for manifest in [
        json!({
            "apiVersion": "herald.dev/v1alpha1", "kind": "SigningSecret",
            "metadata": {"name": "orders"}, "spec": {}
        }),
        json!({
            "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookEndpoint",
            "metadata": {"name": "orders"},
            "spec": {
                "url": rx.url("orders"),
                "eventTypes": ["order.*"],
                "secretRef": {"name": "orders"},
                "delivery": {"retry": {"schedule": ["1s"]}}
            }
        }),
    ] {
        let out = env.kubectl_apply(&ctx.namespace, &manifest);
        assert!(
            out.status.success(),
            "kubectl apply on the oldest API server failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let endpoints = ctx.api::<WebhookEndpoint>();
    eventually("the endpoint to be Ready", WAIT, || async {
        let status = endpoints.get("orders").await.ok()?.status?;
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
            .then_some(())
    })
    .await;

    let dp = DataPlane::new(client).await;
    dp.publish(&ctx.namespace, "order.created", json!(1)).await;
    let requests = eventually("the retried delivery", WAIT, || async {
        let requests = rx.received("orders");
        (requests.len() >= 2).then_some(requests)
    })
    .await;
    assert_eq!(
        requests[0].header("webhook-id"),
        requests[1].header("webhook-id"),
        "the retry is the same delivery"
    );
    let secret: Secret = ctx
        .api::<Secret>()
        .get("orders")
        .await
        .expect("the key's Secret");
    let whsec = String::from_utf8(secret.data.expect("data")["current"].0.clone()).expect("utf-8");
    let key = SigningKey::from_whsec(&whsec).expect("a whsec key");
    let retried = &requests[1];
    verify(
        std::slice::from_ref(&key),
        retried.header("webhook-id"),
        retried.header("webhook-timestamp"),
        retried.header("webhook-signature"),
        &retried.body,
        jiff::Timestamp::now().as_second(),
        300,
    )
    .expect("the retried request verifies with the key the operator generated");

    let exited = [dispatchers.exited(), operators.exited()].concat();
    dispatchers.stop_all().await;
    operators.stop_all().await;
    assert!(exited.is_empty(), "exited on their own: {exited:?}");
    ctx.cleanup().await;
}
