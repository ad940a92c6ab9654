//! Egress through HTTP proxies: a dispatcher process (the real one, as a separate
//! process: its proxies are flags) against the real NATS of a private test environment,
//! forward proxies on loopback (`herald_e2e::proxy`). Deliveries go through the
//! dispatcher-wide proxy with its credentials, or the one an endpoint picks; the proxy is
//! asked for the vetted address only; the address policy still refuses a forbidden
//! target; a proxy that is down gives attempts that name it, and the deliveries go
//! through once it is back.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use herald_core::signing::{SigningKey, verify};
use herald_e2e::dataplane::{DataPlane, TEST_SECRET, endpoint};
use herald_e2e::proxy::ForwardProxy;
use herald_e2e::receiver::Receiver;
use herald_e2e::{eventually, fault_lock, free_port, private_env, stop, unique_name};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);
const CREDENTIALS: &str = "herald:pr0xy-s3cret";

/// A dispatcher process that allows only 127.0.0.2 (the receiver's address), with a
/// default proxy (credentials from a file) and the named ones.
fn spawn_dispatcher(id: &str, proxy: &str, named: &str, credentials: &std::path::Path) -> Child {
    let log = |stream: &str| {
        let path = std::env::temp_dir().join(format!("herald-egress-{id}.{stream}.log"));
        std::fs::File::create(path).map_or_else(|_| Stdio::null(), Stdio::from)
    };
    Command::new(env!("CARGO_BIN_EXE_herald-test-dispatcher"))
        .args(["--nats-url", private_env().nats_url(), "--replica-id", id])
        .args([
            "--shards",
            "4",
            "--listen",
            "127.0.0.1:0",
            "--health-interval",
            "1s",
        ])
        .args(["--allow-network", "127.0.0.2/32", "--allow-http"])
        .args(["--egress-proxy", proxy, "--egress-proxy-named", named])
        .arg("--egress-proxy-credentials")
        .arg(credentials)
        // Debug logs (hyper's, reqwest's and Herald's) must not hold the credentials either.
        .env("RUST_LOG", "debug")
        .stdin(Stdio::null())
        .stdout(log("out"))
        .stderr(log("err"))
        .spawn()
        .expect("starting a dispatcher process")
}

/// The attempt records of an endpoint once there are at least `n`.
async fn attempts(dp: &DataPlane, ns: &str, name: &str, n: usize) -> Vec<Value> {
    eventually(&format!("{n} attempts of {name}"), WAIT, || async {
        let records = dp.attempts(ns, name).await;
        (records.len() >= n).then_some(records)
    })
    .await
}

#[tokio::test]
async fn deliveries_go_through_the_allowed_proxies_and_the_address_policy_still_applies() {
    let _faults = fault_lock().await;
    let dp = DataPlane::new(private_env().nats().await).await;
    let rx = Receiver::start_on("127.0.0.2").await;
    let port = rx.addr.port();
    let corp = ForwardProxy::start(Some(CREDENTIALS)).await;
    let eu = ForwardProxy::start(None).await;
    let down_port = free_port();
    let dir = std::env::temp_dir().join(unique_name("herald-proxy-credentials"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("default"), format!("{CREDENTIALS}\n")).unwrap();

    let ns = unique_name("egress");
    dp.put_keys(&ns, "signing", &[TEST_SECRET]).await;
    let retry_fast = json!({"schedule": vec!["1s"; 20]});
    for (name, url, delivery) in [
        ("default", rx.url("default"), json!({})),
        ("eu", rx.url("eu"), json!({"proxy": {"name": "eu"}})),
        // 127.0.0.1 is not allowed: refused by Herald, never asked of a proxy.
        (
            "forbidden",
            format!("http://localhost:{port}/forbidden"),
            json!({}),
        ),
        (
            "unknown",
            rx.url("unknown"),
            json!({"proxy": {"name": "elsewhere"}}),
        ),
        (
            "down",
            rx.url("down"),
            json!({"proxy": {"name": "down"}, "retry": retry_fast, "circuitBreaker": {"failureThreshold": 100}}),
        ),
    ] {
        let spec = json!({"url": url, "eventTypes": ["order.*"], "delivery": delivery});
        dp.put_endpoint(&endpoint(&ns, name, spec)).await;
    }
    let named = format!("eu={},down=http://127.0.0.1:{down_port}", eu.url());
    let dispatcher = spawn_dispatcher("egress", &corp.url(), &named, &dir);
    for i in 0..3 {
        dp.publish(&ns, "order.created", json!({"n": i})).await;
    }

    // Through the default proxy (with its credentials) and the endpoint's own.
    for path in ["default", "eu"] {
        let got = eventually(&format!("3 deliveries to {path}"), WAIT, || {
            let got = rx.received(path);
            async move { (got.len() >= 3).then_some(got) }
        })
        .await;
        let key = SigningKey::from_whsec(TEST_SECRET).unwrap();
        for req in &got {
            assert_eq!(req.header("host"), format!("127.0.0.2:{port}"));
            verify(
                std::slice::from_ref(&key),
                req.header("webhook-id"),
                req.header("webhook-timestamp"),
                req.header("webhook-signature"),
                &req.body,
                jiff::Timestamp::now().as_second(),
                300,
            )
            .expect("signed with the endpoint's secret");
            assert!(
                req.header("proxy-authorization").is_empty(),
                "leaked to the receiver"
            );
        }
    }
    let target = format!("127.0.0.2:{port}");
    for (proxy, name) in [(&corp, "default"), (&eu, "eu")] {
        let seen = proxy.seen();
        assert!(!seen.connects.is_empty(), "{name}: no tunnel");
        assert!(
            seen.connects.iter().all(|t| *t == target),
            "{name}: {seen:?}"
        );
        assert!(
            seen.forwarded.is_empty(),
            "{name}: absolute-form used: {seen:?}"
        );
        assert_eq!(seen.refused_auth, 0, "{name}: credentials refused");
    }

    // Refused by the address policy and by the proxy choice, with the proxy configured.
    for (name, says) in [
        ("forbidden", "127.0.0.1"),
        ("unknown", "spec.delivery.proxy.name"),
    ] {
        let records = attempts(&dp, &ns, name, 1).await;
        assert_eq!(
            records[0]["outcome"], "AddressForbidden",
            "{name}: {records:?}"
        );
        let response = records[0]["response"].as_str().unwrap_or_default();
        assert!(response.contains(says), "{name}: {response}");
        assert!(rx.received(name).is_empty(), "{name} was delivered");
    }

    // A proxy that is down: connect errors naming it, retried; delivered once it is up.
    let records = attempts(&dp, &ns, "down", 4).await;
    let says = format!("egress proxy \"down\" (127.0.0.1:{down_port}) is unreachable");
    for record in &records {
        assert_eq!(record["outcome"], "ConnectError", "{record}");
        let response = record["response"].as_str().unwrap_or_default();
        assert!(response.contains(&says), "{response}");
    }
    assert!(
        records.iter().any(|r| r["attempt"].as_u64() > Some(1)),
        "not retried"
    );
    let back = ForwardProxy::start_on(&format!("127.0.0.1:{down_port}"), None).await;
    eventually("the 3 events through the proxy once it is up", WAIT, || {
        let n = rx.received("down").len();
        async move { (n >= 3).then_some(()) }
    })
    .await;
    assert!(back.seen().connects.iter().all(|t| *t == target));

    // The credentials appear in no attempt record and no log line (at debug level).
    let leaks =
        |text: &str| text.contains("pr0xy-s3cret") || text.contains("aGVyYWxkOnByMHh5LXMzY3JldA");
    for name in ["default", "eu", "forbidden", "unknown", "down"] {
        let text = serde_json::to_string(&dp.attempts(&ns, name).await).unwrap();
        assert!(!leaks(&text), "{name}: {text}");
    }
    stop(dispatcher).await;
    for stream in ["out", "err"] {
        let path = std::env::temp_dir().join(format!("herald-egress-egress.{stream}.log"));
        let log = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(!leaks(&log), "credentials in {}", path.display());
        if stream == "out" {
            assert!(log.contains("DEBUG"), "not a debug log: {}", path.display());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The operator takes the dispatchers' egress flags: an endpoint naming a proxy the
/// platform did not configure, or asking for direct egress where it is not allowed, is
/// `Ready=False` with reason `ProxyNotAllowed` (and `Stalled`), against the real API
/// server; one naming an allowed proxy is Ready.
#[tokio::test]
async fn the_operator_refuses_a_proxy_the_platform_did_not_configure() {
    use herald_core::v1alpha1::{SigningSecret, WebhookEndpoint};
    use herald_e2e::TestContext;
    use herald_e2e::faults::Operators;
    use kube::api::PostParams;

    let _faults = fault_lock().await;
    let env = private_env();
    let ctx = TestContext::new_in(env, "egress-op").await;
    let mut operators = Operators::new(
        env!("CARGO_BIN_EXE_herald-test-operator"),
        env,
        &ctx.namespace,
        "egress",
    )
    .with_args(&[
        "--egress-proxy",
        "http://127.0.0.1:9",
        "--egress-proxy-named",
        "eu=http://127.0.0.1:9",
    ]);
    operators.start("op0");
    let secret: SigningSecret =
        serde_json::from_value(json!({"metadata": {"name": "signing"}, "spec": {}})).unwrap();
    ctx.api::<SigningSecret>()
        .create(&PostParams::default(), &secret)
        .await
        .expect("the SigningSecret");
    let endpoints = ctx.api::<WebhookEndpoint>();
    for (name, proxy) in [
        ("eu", json!({"name": "eu"})),
        ("unknown", json!({"name": "elsewhere"})),
        ("direct", json!({"direct": true})),
    ] {
        let endpoint: WebhookEndpoint = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "url": "http://127.0.0.1:9/hook",
                "eventTypes": ["*"],
                "secretRef": {"name": "signing"},
                "delivery": {"proxy": proxy},
            }
        }))
        .unwrap();
        endpoints
            .create(&PostParams::default(), &endpoint)
            .await
            .expect("an endpoint the schema accepts");
    }
    let ready = |name: &'static str| {
        let endpoints = endpoints.clone();
        async move {
            let status = endpoints.get(name).await.ok()?.status?;
            status.conditions.into_iter().find(|c| c.type_ == "Ready")
        }
    };
    let eu = eventually("eu Ready", WAIT, || async {
        ready("eu").await.filter(|c| c.status == "True")
    })
    .await;
    assert_eq!(eu.reason, "Accepted");
    for (name, says) in [
        (
            "unknown",
            "\"elsewhere\" is not a proxy this platform allows (allowed: default, eu)",
        ),
        ("direct", "spec.delivery.proxy.direct is not allowed"),
    ] {
        let condition = eventually(&format!("{name} refused"), WAIT, || async {
            ready(name).await.filter(|c| c.reason == "ProxyNotAllowed")
        })
        .await;
        assert_eq!(condition.status, "False");
        assert!(
            condition.message.contains(says),
            "{name}: {}",
            condition.message
        );
    }
    operators.stop_all().await;
    ctx.cleanup().await;
}
