//! Herald the way a tenant uses it: `WebhookEndpoint` and `SigningSecret` applied to the
//! real API server, the operator and a dispatcher running, a producer publishing to NATS,
//! a receiver verifying signatures with the generated key — and delivery going on while
//! the Kubernetes API is unreachable, with status catching up afterwards; a key rotation
//! signing with both keys; no key material in any log line; a move to Ed25519
//! signatures, verified with the public key alone; and endpoint verification
//! ([`verification`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald_core::signing::{SigningKey, VerifyingKey, verify};
use herald_core::v1alpha1::{EndpointState, WebhookEndpoint};
use herald_e2e::dataplane::{DataPlane, shared_dispatcher};
use herald_e2e::receiver::{Behavior, Received, Receiver};
use herald_e2e::{TestContext, eventually, fault_lock, private_env};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use serde_json::json;
use tokio::sync::oneshot;

const WAIT: Duration = Duration::from_secs(60);

#[path = "full_stack/verification.rs"]
mod verification;

/// What each test here runs against: its namespace with a SigningSecret, an operator
/// for it, the shared dispatcher, a receiver and a publisher.
struct Stack {
    _faults: tokio::sync::MutexGuard<'static, ()>,
    ctx: TestContext,
    stop_operator: oneshot::Sender<()>,
    rx: Receiver,
    dp: DataPlane,
}

impl Stack {
    async fn start(prefix: &str, signing_secret: &str) -> Self {
        let faults = fault_lock().await;
        let ctx = TestContext::new_in(private_env(), prefix).await;
        shared_dispatcher(private_env());
        let stop_operator = start_operator(&ctx);
        let rx = Receiver::start().await;
        let dp = DataPlane::new(private_env().nats().await).await;
        apply(
            &ctx,
            json!({
                "apiVersion": "herald.dev/v1alpha1", "kind": "SigningSecret",
                "metadata": {"name": signing_secret}, "spec": {}
            }),
        );
        Self {
            _faults: faults,
            ctx,
            stop_operator,
            rx,
            dp,
        }
    }
}

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
        "--header-secret-refresh",
        "1s",
        "--namespace-refresh",
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

/// The `(status, reason, message)` of condition `type_` of endpoint `name`.
async fn condition(
    endpoints: &Api<WebhookEndpoint>,
    name: &str,
    type_: &str,
) -> Option<(String, String, String)> {
    let status = endpoints.get(name).await.ok()?.status?;
    let c = status.conditions.into_iter().find(|c| c.type_ == type_)?;
    Some((c.status, c.reason, c.message))
}

/// Waits until condition `type_` of `name` has `status` and `reason`; its message.
async fn until_condition(
    endpoints: &Api<WebhookEndpoint>,
    name: &str,
    type_: &str,
    (status, reason): (&str, &str),
) -> String {
    eventually(
        &format!("{name}: {type_} {status} {reason}"),
        WAIT,
        || async {
            condition(endpoints, name, type_)
                .await
                .filter(|(s, r, _)| s == status && r == reason)
                .map(|(_, _, message)| message)
        },
    )
    .await
}

/// The key a SigningSecret's Secret `name` signs with now.
async fn current_key(ctx: &TestContext, name: &str) -> SigningKey {
    let secret: Secret = ctx.api::<Secret>().get(name).await.unwrap();
    let whsec = String::from_utf8(secret.data.unwrap()["current"].0.clone()).unwrap();
    SigningKey::from_whsec(&whsec).unwrap()
}

fn apply(ctx: &TestContext, manifest: serde_json::Value) {
    let out = private_env().kubectl_apply(&ctx.namespace, &manifest);
    assert!(
        out.status.success(),
        "kubectl apply failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Publishes `event_type` events to `ctx`'s namespace until a request to `path` among
/// those received after the call satisfies `wanted`, and returns it.
async fn publish_until(
    (dp, rx, ctx): (&DataPlane, &Receiver, &TestContext),
    path: &str,
    event_type: &str,
    what: &str,
    wanted: impl Fn(&Received) -> bool,
) -> Received {
    let seen = rx.received(path).len();
    let wanted = &wanted;
    let mut n = 0;
    eventually(what, WAIT, || {
        n += 1;
        let found = rx.received(path).into_iter().skip(seen).find(|r| wanted(r));
        async move {
            if found.is_some() {
                return found;
            }
            dp.publish(&ctx.namespace, event_type, json!({"n": n}))
                .await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            rx.received(path).into_iter().skip(seen).find(|r| wanted(r))
        }
    })
    .await
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
    let Stack {
        _faults,
        ctx,
        stop_operator,
        rx,
        dp,
    } = Stack::start("tour", "orders").await;
    apply(
        &ctx,
        json!({
            "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookEndpoint",
            "metadata": {"name": "orders"},
            "spec": {"url": rx.url("orders"), "eventTypes": ["order.*"], "secretRef": {"name": "orders"}}
        }),
    );
    let endpoints: Api<WebhookEndpoint> = ctx.api();
    until_condition(&endpoints, "orders", "Ready", ("True", "Accepted")).await;
    // Config reaches the dispatcher through KV a moment after Ready.
    let secret: Secret = ctx.api::<Secret>().get("orders").await.unwrap();
    let whsec = String::from_utf8(secret.data.unwrap()["current"].0.clone()).unwrap();
    let key = SigningKey::from_whsec(&whsec).unwrap();

    publish_until(
        (&dp, &rx, &ctx),
        "orders",
        "order.created",
        "the first delivery",
        |_| true,
    )
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
    let signed_twice = publish_until(
        (&dp, &rx, &ctx),
        "orders",
        "order.created",
        "a delivery signed with both keys",
        |r| r.header("webhook-signature").split(' ').count() == 2,
    )
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

/// `python3` with the packages of the Python receiver example, or why not.
fn python_receiver_ready() -> Result<(), String> {
    let out = std::process::Command::new("python3")
        .args(["-c", "import standardwebhooks, cryptography"])
        .output()
        .map_err(|e| format!("python3 is not available ({e})"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "pip install -r examples/receivers/python/requirements.txt: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The Python receiver example's `verify` (the cryptography package: OpenSSL's Ed25519,
/// an implementation independent of Herald's) on one received request with `keys`:
/// `ok` or `rejected: <why>`.
fn python_verify(keys: &[&str], request: &Received) -> String {
    let input = json!({
        "keys": keys,
        "headers": {
            "webhook-id": request.header("webhook-id"),
            "webhook-timestamp": request.header("webhook-timestamp"),
            "webhook-signature": request.header("webhook-signature"),
        },
        "body": String::from_utf8_lossy(&request.body),
    });
    let code = r#"
import json, sys
from receiver import verify, WebhookVerificationError
r = json.load(sys.stdin)
try:
    verify(r["keys"], r["headers"], r["body"].encode())
    print("ok")
except WebhookVerificationError as e:
    print(f"rejected: {e}")
"#;
    let mut child = std::process::Command::new("python3")
        .args(["-c", code])
        .env(
            "PYTHONPATH",
            herald_e2e::repo_root().join("examples/receivers/python"),
        )
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), input.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "python: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A tenant moves a SigningSecret from HMAC to Ed25519 by setting `spec.algorithm`: the
/// operator rotates to an Ed25519 key pair (the private key in the Secret, the public key
/// in the status), both keys sign through the overlap, and a receiver holding only the
/// public key verifies `v1a` — with Herald's code and with the Python receiver example
/// (the cryptography package) — while one holding the old HMAC secret still verifies `v1`.
#[tokio::test]
async fn a_signing_secret_moves_to_ed25519_and_receivers_verify_with_the_public_key() {
    let python = python_receiver_ready();
    let Stack {
        _faults,
        ctx,
        stop_operator,
        rx,
        dp,
    } = Stack::start("ed25519", "keys").await;
    let secret = |spec: serde_json::Value| {
        json!({
            "apiVersion": "herald.dev/v1alpha1", "kind": "SigningSecret",
            "metadata": {"name": "keys"}, "spec": spec
        })
    };
    apply(
        &ctx,
        json!({
            "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookEndpoint",
            "metadata": {"name": "invoices"},
            "spec": {"url": rx.url("invoices"), "eventTypes": ["invoice.*"], "secretRef": {"name": "keys"}}
        }),
    );
    let secrets: Api<Secret> = ctx.api();
    let current = |secrets: Api<Secret>| async move {
        let data = secrets.get("keys").await.ok()?.data?;
        String::from_utf8(data.get("current")?.0.clone()).ok()
    };
    let whsec = eventually("a generated HMAC key", WAIT, || current(secrets.clone())).await;
    assert!(whsec.starts_with("whsec_"), "HMAC is the default");

    // A delivery that arrives signed with `entries` signatures.
    let delivered_with = |entries: usize, what: &'static str| {
        publish_until(
            (&dp, &rx, &ctx),
            "invoices",
            "invoice.paid",
            what,
            move |r| r.header("webhook-signature").split(' ').count() == entries,
        )
    };
    let first = delivered_with(1, "a delivery signed with the HMAC key").await;
    assert!(first.header("webhook-signature").starts_with("v1,"));

    apply(
        &ctx,
        secret(json!({"algorithm": "Ed25519", "rotation": {"overlap": "1h"}})),
    );
    let signing_secrets: Api<herald_core::v1alpha1::SigningSecret> = ctx.api();
    let public = eventually("the public key in the status", WAIT, || {
        let api = signing_secrets.clone();
        async move { api.get("keys").await.ok()?.status?.active_public_key }
    })
    .await;
    assert!(public.starts_with("whpk_"), "{public}");
    let whsk = current(secrets.clone()).await.unwrap();
    assert!(
        whsk.starts_with("whsk_"),
        "the Secret holds the Ed25519 private key"
    );
    let status = signing_secrets.get("keys").await.unwrap().status.unwrap();
    let status_text = serde_json::to_string(&status).unwrap();
    assert!(
        !status_text.contains(whsk.trim_start_matches("whsk_"))
            && !status_text.contains(whsec.trim_start_matches("whsec_")),
        "key material in the status: {status_text}"
    );
    let public_key = VerifyingKey::parse(&public).unwrap();
    assert_eq!(status.active_key_id.as_deref(), Some(public_key.id()));

    let both = delivered_with(2, "a delivery signed by the Ed25519 and the HMAC key").await;
    let signature = both.header("webhook-signature");
    assert!(
        signature.starts_with("v1a,") && signature.contains(" v1,"),
        "{signature}"
    );
    let now = jiff::Timestamp::now().as_second();
    let check = |key: VerifyingKey, body: &[u8]| {
        verify(
            &[key],
            both.header("webhook-id"),
            both.header("webhook-timestamp"),
            signature,
            body,
            now,
            300,
        )
    };
    check(public_key.clone(), &both.body).expect("the public key verifies v1a");
    check(VerifyingKey::parse(&whsec).unwrap(), &both.body)
        .expect("the previous HMAC secret verifies v1 during the overlap");
    let mut tampered = both.body.to_vec();
    tampered.extend_from_slice(b" ");
    assert!(check(public_key, &tampered).is_err());

    match python {
        Ok(()) => {
            assert_eq!(python_verify(&[&public], &both), "ok");
            assert_eq!(python_verify(&[&whsec], &both), "ok");
            let stranger = "whpk_ZlN4eg7dSSqi0moX9hQUk3orrOouK3QVQSlJa248c/g=";
            assert!(
                python_verify(&[stranger], &both).starts_with("rejected"),
                "another public key verified"
            );
            // Before the move, a public key had nothing to verify.
            assert!(python_verify(&[&public], &first).starts_with("rejected"));
        }
        Err(reason) => eprintln!("SKIPPED the Python receiver's part: {reason}"),
    }
    let _ = stop_operator.send(());
    ctx.cleanup().await;
}

/// `kubectl apply` that is expected to fail: its stderr.
fn apply_refused(ctx: &TestContext, manifest: serde_json::Value) -> String {
    let out = private_env().kubectl_apply(&ctx.namespace, &manifest);
    assert!(!out.status.success(), "kubectl apply accepted {manifest}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}
/// A receiver that demands a bearer token: the tenant keeps it in a Secret and the
/// endpoint's header takes it from there (`valueFrom.secretKeyRef`). The token arrives
/// with every request, a changed Secret changes it without touching the endpoint, a
/// broken reference holds deliveries (nothing lost) and says which header, Secret and key,
/// and the token never shows in the endpoint's status or Events.
#[tokio::test]
async fn a_header_takes_its_value_from_a_secret_and_follows_it() {
    let Stack {
        _faults,
        ctx,
        stop_operator,
        rx,
        dp,
    } = Stack::start("hdrsecret", "keys").await;
    let token_secret = |data: serde_json::Value| json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "receiver-auth"}, "stringData": data});
    apply(&ctx, token_secret(json!({"token": "Bearer first-7c1d"})));
    let endpoint = |headers: serde_json::Value| {
        json!({
            "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookEndpoint",
            "metadata": {"name": "billing"},
            "spec": {"url": rx.url("billing"), "eventTypes": ["bill.*"], "secretRef": {"name": "keys"},
                     "headers": headers}
        })
    };
    let from_secret = json!([
        {"name": "Authorization", "valueFrom": {"secretKeyRef": {"name": "receiver-auth", "key": "token"}}},
        {"name": "X-Tenant", "value": "shop"}
    ]);
    // The schema refuses a header with both a value and a Secret.
    let refused = apply_refused(
        &ctx,
        endpoint(json!([{"name": "Authorization", "value": "x",
            "valueFrom": {"secretKeyRef": {"name": "receiver-auth", "key": "token"}}}])),
    );
    assert!(refused.contains("either value or valueFrom"), "{refused}");
    apply(&ctx, endpoint(from_secret));

    // Publishes until a delivery carries `token`.
    let delivered_with = |token: &'static str| {
        publish_until((&dp, &rx, &ctx), "billing", "bill.sent", token, move |r| {
            r.header("authorization") == token
        })
    };
    let first = delivered_with("Bearer first-7c1d").await;
    assert_eq!(first.header("x-tenant"), "shop");

    // The tenant rotates the token in the Secret alone.
    apply(&ctx, token_secret(json!({"token": "Bearer second-9e2f"})));
    delivered_with("Bearer second-9e2f").await;

    // A broken reference (the key renamed): Ready False naming header, Secret and key;
    // deliveries are held, not dropped.
    let secrets: Api<Secret> = ctx.api();
    let mut broken: Secret = secrets.get("receiver-auth").await.unwrap();
    let value = broken.data.as_mut().unwrap().remove("token").unwrap();
    broken.data.as_mut().unwrap().insert("bearer".into(), value);
    broken.metadata.managed_fields = None;
    secrets
        .replace("receiver-auth", &Default::default(), &broken)
        .await
        .unwrap();
    let endpoints: Api<WebhookEndpoint> = ctx.api();
    let message = until_condition(
        &endpoints,
        "billing",
        "Ready",
        ("False", "HeaderSecretNotFound"),
    )
    .await;
    assert!(
        message.contains("Authorization") && message.contains("receiver-auth/token"),
        "{message}"
    );
    // Held: the dispatcher has the hold once the configuration carries it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = rx.received("billing").len();
    for i in 0..3 {
        dp.publish(&ctx.namespace, "bill.sent", json!({"held": i}))
            .await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        rx.received("billing").len(),
        before,
        "delivered while the header's Secret was broken"
    );
    apply(&ctx, token_secret(json!({"token": "Bearer third-4a0b"})));
    eventually("the held events, with the fixed token", WAIT, || {
        let rx = rx.clone();
        async move {
            let held = rx
                .received("billing")
                .into_iter()
                .filter(|r| r.json()["data"].get("held").is_some())
                .collect::<Vec<_>>();
            (held.len() >= 3
                && held
                    .iter()
                    .all(|r| r.header("authorization") == "Bearer third-4a0b"))
            .then_some(())
        }
    })
    .await;

    // No token in the endpoint's status or in the namespace's Events.
    let status = serde_json::to_string(&endpoints.get("billing").await.unwrap().status).unwrap();
    let events: Api<k8s_openapi::api::events::v1::Event> = ctx.api();
    let events =
        serde_json::to_string(&events.list(&Default::default()).await.unwrap().items).unwrap();
    assert!(
        events.contains("HeaderSecretNotFound"),
        "the Event of the hold is missing"
    );
    // Nor in the endpoint's entry in herald-config, which herald-api reads: the value is
    // in the dispatchers-only `cred.` entry.
    let js = async_nats::jetstream::new(ctx.nats.clone());
    let config = js.get_key_value("herald-config").await.unwrap();
    let key = herald_core::dataplane::EndpointKey::new(&ctx.namespace, "billing");
    let entry = config.get(key.config_key()).await.unwrap().unwrap();
    let entry = String::from_utf8_lossy(&entry).into_owned();
    assert!(entry.contains("\"credentials\""), "{entry}");
    let credentials = herald_core::dataplane::BucketKey::Credentials(key).to_string();
    let credentials = config.get(credentials).await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&credentials).contains("third-4a0b"));
    for token in ["first-7c1d", "second-9e2f", "third-4a0b"] {
        assert!(!status.contains(token), "{token} in the status: {status}");
        assert!(!events.contains(token), "{token} in an Event");
        assert!(!entry.contains(token), "{token} in the ep. entry: {entry}");
    }
    let _ = stop_operator.send(());
    ctx.cleanup().await;
}

/// A receiver behind mutual TLS with a private CA: the endpoint's `spec.tls` names a
/// `kubernetes.io/tls` Secret with its client certificate and a Secret with the CA; the
/// operator reads both, and the dispatcher presents the certificate and verifies the
/// receiver with the CA. The schema refuses `tls` on an `http://` URL; no key material
/// reaches the status.
#[tokio::test]
async fn an_endpoint_presents_a_client_certificate_to_a_mutual_tls_receiver() {
    use herald_e2e::receiver::tls::{fixture, mtls_front};
    let Stack {
        _faults,
        ctx,
        stop_operator,
        rx,
        dp,
    } = Stack::start("mtls", "keys").await;
    let port = mtls_front(rx.addr).await;
    let text = |name: &str| std::fs::read_to_string(fixture(name)).unwrap();
    apply(
        &ctx,
        json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
               "metadata": {"name": "receiver-client"},
               "stringData": {"tls.crt": text("client.pem"), "tls.key": text("client.key")}}),
    );
    apply(
        &ctx,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "receiver-ca"},
               "stringData": {"ca.crt": text("ca.pem")}}),
    );
    let tls = json!({"clientCertificate": {"secretName": "receiver-client"},
                     "ca": {"name": "receiver-ca", "key": "ca.crt"}});
    let endpoint = |url: String| {
        json!({
            "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookEndpoint",
            "metadata": {"name": "secure"},
            "spec": {"url": url, "eventTypes": ["audit.*"], "secretRef": {"name": "keys"}, "tls": tls}
        })
    };
    let refused = apply_refused(&ctx, endpoint(rx.url("secure")));
    assert!(refused.contains("tls needs an https:// url"), "{refused}");
    apply(&ctx, endpoint(format!("https://127.0.0.1:{port}/secure")));
    let delivered = publish_until(
        (&dp, &rx, &ctx),
        "secure",
        "audit.logged",
        "a delivery through mutual TLS",
        |_| true,
    )
    .await;
    assert!(delivered.header("webhook-signature").starts_with("v1,"));
    let endpoints: Api<WebhookEndpoint> = ctx.api();
    let status = serde_json::to_string(&endpoints.get("secure").await.unwrap().status).unwrap();
    assert!(
        !status.contains("PRIVATE KEY") && !status.contains("BEGIN CERTIFICATE"),
        "{status}"
    );
    let _ = stop_operator.send(());
    ctx.cleanup().await;
}

/// Operational events: a tenant subscribes to `herald.*` with an ordinary endpoint and
/// hears, as signed webhooks, that an endpoint was disabled (a receiver answering 410),
/// that a delivery went dead (a final status), and that the disabled endpoint recovered
/// once re-enabled. An endpoint that fails to receive operational events generates none
/// about itself.
#[tokio::test]
async fn a_tenant_hears_about_its_endpoints_through_operational_events() {
    let Stack {
        _faults,
        ctx,
        stop_operator,
        rx,
        dp,
    } = Stack::start("opevents", "keys").await;
    let endpoint = |name: &str, types: serde_json::Value, delivery: serde_json::Value| {
        json!({
            "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookEndpoint",
            "metadata": {"name": name},
            "spec": {"url": rx.url(name), "eventTypes": types, "secretRef": {"name": "keys"},
                     "delivery": delivery}
        })
    };
    rx.behave("gone", Behavior::statuses(&[410]));
    rx.behave("final", Behavior::statuses(&[400]));
    rx.behave("ops-broken", Behavior::statuses(&[400]));
    let final_400 = json!({"finalStatusCodes": [400]});
    apply(&ctx, endpoint("ops", json!(["herald.*"]), json!({})));
    apply(
        &ctx,
        endpoint("ops-broken", json!(["herald.*"]), final_400.clone()),
    );
    apply(&ctx, endpoint("gone", json!(["order.*"]), json!({})));
    apply(&ctx, endpoint("final", json!(["order.*"]), final_400));

    // What `ops` received: (type, data).
    let heard = |rx: &Receiver| -> Vec<(String, serde_json::Value)> {
        rx.received("ops")
            .iter()
            .map(|r| {
                let body = r.json();
                (
                    body["type"].as_str().unwrap_or_default().to_owned(),
                    body["data"].clone(),
                )
            })
            .collect()
    };
    let mut n = 0;
    eventually(
        "herald.endpoint.disabled and herald.delivery.dead",
        WAIT,
        || {
            n += 1;
            let (dp, rx, ns) = (dp.clone(), rx.clone(), ctx.namespace.clone());
            async move {
                let got = heard(&rx);
                let disabled = got
                    .iter()
                    .any(|(t, d)| t == "herald.endpoint.disabled" && d["endpoint"] == "gone");
                let dead = got
                    .iter()
                    .any(|(t, d)| t == "herald.delivery.dead" && d["endpoint"] == "final");
                if disabled && dead {
                    return Some(());
                }
                if rx.received("gone").is_empty() || rx.received("final").is_empty() {
                    dp.publish(&ns, "order.created", json!({"n": n})).await;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
                None
            }
        },
    )
    .await;
    let got = heard(&rx);
    let (_, dead) = got
        .iter()
        .find(|(t, d)| t == "herald.delivery.dead" && d["endpoint"] == "final")
        .unwrap();
    assert_eq!(dead["eventType"], "order.created");
    assert_eq!(dead["reason"], "FinalStatus");
    let (_, disabled) = got
        .iter()
        .find(|(t, _)| t == "herald.endpoint.disabled")
        .unwrap();
    assert_eq!(disabled["reason"], "Gone");
    // They are signed like any event.
    let request = &rx.received("ops")[0];
    assert!(request.header("webhook-signature").starts_with("v1,"));

    // The disabled endpoint is re-enabled and delivers again: recovered.
    rx.behave("gone", Behavior::statuses(&[200]));
    let status = private_env()
        .kubectl()
        .args([
            "annotate",
            "-n",
            &ctx.namespace,
            "webhookendpoint",
            "gone",
            "herald.dev/enable=1",
            "--overwrite",
        ])
        .status()
        .unwrap();
    assert!(status.success());
    eventually("herald.endpoint.recovered", WAIT, || {
        let rx = rx.clone();
        async move {
            heard(&rx)
                .iter()
                .any(|(t, d)| {
                    t == "herald.endpoint.recovered"
                        && d["endpoint"] == "gone"
                        && d["from"] == "disabled"
                })
                .then_some(())
        }
    })
    .await;

    // `ops-broken` refused every operational event (each delivery dead at once): no
    // `herald.delivery.dead` about those, and its own decline is told once (one
    // transition), not once per refused event.
    let refused = rx.received("ops-broken").len();
    assert!(
        refused >= 3,
        "ops-broken was sent {refused} operational events: the check below proves little"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let about_broken: Vec<_> = heard(&rx)
        .into_iter()
        .filter(|(_, d)| d["endpoint"] == "ops-broken")
        .collect();
    assert!(
        about_broken
            .iter()
            .all(|(t, _)| t != "herald.delivery.dead"),
        "{about_broken:?}"
    );
    assert!(about_broken.len() <= 1, "{about_broken:?}");
    let _ = stop_operator.send(());
    ctx.cleanup().await;
}
