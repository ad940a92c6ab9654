//! No secret leaves where it belongs. A full run — the operator and a dispatcher as
//! processes logging at debug level, a tenant's `SigningSecret` (generated, then rotated)
//! and endpoints with an `Authorization` header, receivers that succeed, fail and refuse,
//! an invalid event — and then every log line of both processes, every
//! Kubernetes Event of the namespace, every status field, every attempt record, every
//! dead letter and both `/metrics` pages are searched for the signing keys (as `whsec_`
//! strings and as the bare base64 of the key), the NATS credentials of both processes
//! (NKey seeds, TLS client keys: the environment is `testenv --nats-secure`) and the
//! receivers' header values: none may appear.

use std::time::Duration;

use herald_core::dataplane::{DEADLETTER_PREFIX, DEADLETTER_STREAM, EndpointKey};
use herald_core::names::ROTATE_ANNOTATION;
use herald_core::v1alpha1::{SigningSecret, WebhookEndpoint};
use herald_e2e::dataplane::{DataPlane, read_all};
use herald_e2e::faults::{Dispatchers, Operators};
use herald_e2e::receiver::{Behavior, Receiver};
use herald_e2e::{TestContext, TestEnv, eventually, fault_lock, free_port, private_secure_env};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const DISPATCHER: &str = env!("CARGO_BIN_EXE_herald-test-dispatcher");
const OPERATOR: &str = env!("CARGO_BIN_EXE_herald-test-operator");
const WAIT: Duration = Duration::from_secs(90);

/// The key material of the tenant's Secret (`current`, `previous`): each `whsec_...`
/// value and its base64 part.
async fn keys(ctx: &TestContext) -> Vec<String> {
    let secret: Secret = ctx
        .api::<Secret>()
        .get("keys")
        .await
        .expect("the keys Secret");
    let mut found = Vec::new();
    let data = secret.data.unwrap_or_default();
    // `previousValidUntil` is a time, not a secret.
    for value in ["current", "previous"].iter().filter_map(|k| data.get(*k)) {
        let text = String::from_utf8(value.0.clone()).expect("a whsec_ string");
        for key in text.split_whitespace() {
            found.push(key.to_owned());
            if let Some(bare) = key.strip_prefix("whsec_") {
                found.push(bare.to_owned());
            }
        }
    }
    assert!(!found.is_empty(), "the Secret holds no keys");
    found
}

/// The NATS credentials Herald's processes used: their NKey seeds and each base64 line of
/// their TLS client keys.
fn nats_secrets(env: &TestEnv) -> Vec<String> {
    let dir = env.nats_secure_dir().expect("a secure environment");
    let mut found = Vec::new();
    for identity in ["operator", "dispatcher"] {
        let seed = std::fs::read_to_string(dir.join(format!("{identity}.nk"))).expect("seed");
        found.push(seed.trim().to_owned());
        let key = std::fs::read_to_string(dir.join(format!("{identity}.key"))).expect("key");
        found.extend(
            key.lines()
                .filter(|l| !l.starts_with("-----") && l.len() >= 16)
                .map(str::to_owned),
        );
    }
    assert!(
        found.len() >= 4,
        "no NATS credentials found in {}",
        dir.display()
    );
    found
}

async fn get_text(url: String) -> String {
    let response = reqwest::Client::new()
        .get(url)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .expect("GET");
    response.text().await.expect("body")
}

#[tokio::test]
async fn no_key_or_header_value_appears_in_logs_events_status_attempts_or_metrics() {
    let _lock = fault_lock().await;
    // NATS with TLS client certificates and NKeys: their secrets are searched for too.
    let env = private_secure_env();
    let ctx = TestContext::new_in(env, "secrets").await;
    let ns = ctx.namespace.clone();
    let dp = DataPlane::new(ctx.nats.clone()).await;
    let rx = Receiver::start().await;
    let token = format!("Bearer tok-{}", herald_e2e::unique_name("s3cr3t"));
    let (op_port, disp_port) = (free_port(), free_port());
    let mut operator_flags = env.nats_flags("operator");
    operator_flags.extend(["--listen".into(), format!("127.0.0.1:{op_port}")]);
    let flags: Vec<&str> = operator_flags.iter().map(String::as_str).collect();
    let mut operators = Operators::new(OPERATOR, env, &ns, "secrets").with_args(&flags);
    operators.set_env("RUST_LOG", "debug");
    operators.start("op0");
    let mut dispatcher_flags = env.nats_flags("dispatcher");
    dispatcher_flags.extend(["--listen".into(), format!("127.0.0.1:{disp_port}")]);
    let flags: Vec<&str> = dispatcher_flags.iter().map(String::as_str).collect();
    let mut dispatchers = Dispatchers::new(DISPATCHER, env.nats_url(), "secrets").with_args(&flags);
    dispatchers.set_env("RUST_LOG", "debug");
    dispatchers.start("d0");

    rx.behave("ok", Behavior::default());
    rx.behave("failing", Behavior::statuses(&[500]));
    rx.behave("refusing", Behavior::statuses(&[401]));
    let secret: SigningSecret = serde_json::from_value(json!({
        "apiVersion": "herald.dev/v1alpha1", "kind": "SigningSecret",
        "metadata": {"name": "keys"}, "spec": {}
    }))
    .expect("SigningSecret");
    ctx.api::<SigningSecret>()
        .create(&PostParams::default(), &secret)
        .await
        .expect("creating the SigningSecret");
    let names = ["ok", "failing", "refusing"];
    for name in names {
        let obj: WebhookEndpoint = serde_json::from_value(json!({
            "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookEndpoint",
            "metadata": {"name": name},
            "spec": {"url": rx.url(name), "eventTypes": ["s.*"], "secretRef": {"name": "keys"},
                     "headers": [{"name": "Authorization", "value": token}],
                     "delivery": {"retry": {"schedule": ["1s"]},
                                  "circuitBreaker": {"failureThreshold": 1000}}}
        }))
        .expect("WebhookEndpoint");
        ctx.api::<WebhookEndpoint>()
            .create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("creating WebhookEndpoint {name}: {e}"));
    }
    for name in names {
        let key = EndpointKey::new(&ns, name).config_key();
        eventually(&format!("{name} configured"), WAIT, || async {
            dp.config.get(&key).await.ok()??;
            Some(())
        })
        .await;
    }
    for i in 0..20 {
        dp.publish(&ns, "s.created", json!({"n": i})).await;
    }
    dp.publish_raw(
        &format!("herald.events.{ns}.s.created"),
        b"{broken".to_vec(),
    )
    .await;
    eventually("deliveries and retries", WAIT, || async {
        let ok = rx.received("ok").len() >= 20;
        // Every failing event tried twice (the schedule's one retry), then dead.
        let retried = rx.received("failing").len() >= 40 && rx.received("refusing").len() >= 40;
        (ok && retried).then_some(())
    })
    .await;
    // The header reached the receivers (so it was there to leak).
    assert_eq!(rx.received("ok")[0].header("authorization"), token);

    // A rotation: the previous key and the new one are both secrets now.
    let mut secrets = keys(&ctx).await;
    let rotate = json!({"metadata": {"annotations": {ROTATE_ANNOTATION: "now"}}});
    ctx.api::<SigningSecret>()
        .patch("keys", &PatchParams::default(), &Patch::Merge(&rotate))
        .await
        .expect("asking for a rotation");
    let first = secrets.clone();
    eventually("the key rotated", WAIT, || async {
        let now = keys(&ctx).await;
        (now.iter().any(|k| !first.contains(k))).then_some(now)
    })
    .await
    .into_iter()
    .for_each(|k| {
        if !secrets.contains(&k) {
            secrets.push(k);
        }
    });
    for i in 20..25 {
        dp.publish(&ns, "s.created", json!({"n": i})).await;
    }
    eventually("deliveries after the rotation", WAIT, || async {
        (rx.received("ok").len() >= 25).then_some(())
    })
    .await;
    // Status catches up (written every second by the test operator).
    tokio::time::sleep(Duration::from_secs(3)).await;

    let mut haystacks: Vec<(String, String)> = Vec::new();
    haystacks.push((
        "dispatcher /metrics".into(),
        get_text(format!("http://127.0.0.1:{disp_port}/metrics")).await,
    ));
    haystacks.push((
        "operator /metrics".into(),
        get_text(format!("http://127.0.0.1:{op_port}/metrics")).await,
    ));
    dispatchers.stop_all().await;
    operators.stop_all().await;
    for file in dispatchers
        .log_files()
        .into_iter()
        .chain(operators.log_files())
    {
        let text = std::fs::read_to_string(&file).expect("a process log");
        assert!(
            text.lines().any(|l| l.contains("DEBUG")),
            "{} has no debug lines",
            file.display()
        );
        haystacks.push((file.display().to_string(), text));
    }
    let mut events = env.kubectl();
    events.args(["get", "events", "-n", &ns, "-o", "json"]);
    let events = events.output().expect("kubectl get events");
    let events = String::from_utf8_lossy(&events.stdout).into_owned();
    assert!(
        events.contains("\"involvedObject\""),
        "no Events recorded:\n{events}"
    );
    haystacks.push(("Kubernetes Events".into(), events));
    for name in names {
        let obj = ctx
            .api::<WebhookEndpoint>()
            .get(name)
            .await
            .expect("endpoint");
        let status = serde_json::to_string(&obj.status).expect("status");
        haystacks.push((format!("WebhookEndpoint {name} status"), status));
        let attempts = dp.attempts(&ns, name).await;
        assert!(!attempts.is_empty(), "no attempt records for {name}");
        haystacks.push((
            format!("attempt records of {name}"),
            Value::from(attempts).to_string(),
        ));
    }
    let obj = ctx
        .api::<SigningSecret>()
        .get("keys")
        .await
        .expect("SigningSecret");
    haystacks.push((
        "SigningSecret status".into(),
        serde_json::to_string(&obj.status).expect("status"),
    ));
    let dead = read_all(&dp.js, DEADLETTER_STREAM, &format!("{DEADLETTER_PREFIX}.>")).await;
    assert!(!dead.is_empty(), "no dead letter (the broken event)");
    haystacks.push((
        "dead letters".into(),
        dead.iter()
            .map(|d| String::from_utf8_lossy(d).into_owned())
            .collect::<Vec<_>>()
            .join("\n"),
    ));

    let bare_token = token.trim_start_matches("Bearer ").to_owned();
    let mut needles: Vec<(&str, &str)> = secrets
        .iter()
        .map(|k| ("a signing key", k.as_str()))
        .collect();
    needles.push(("the Authorization header value", bare_token.as_str()));
    let nats_secrets = nats_secrets(env);
    needles.extend(
        nats_secrets
            .iter()
            .map(|s| ("a NATS credential", s.as_str())),
    );
    let mut leaks = Vec::new();
    for (place, text) in &haystacks {
        for (what, needle) in &needles {
            if let Some(at) = text.find(needle) {
                let line = text[..at].lines().count();
                leaks.push(format!("{what} in {place} (line {line})"));
            }
        }
    }
    ctx.cleanup().await;
    assert!(leaks.is_empty(), "secrets found:\n{}", leaks.join("\n"));
}
