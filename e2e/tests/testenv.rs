//! The test environment is real: the CRDs install into a real kube-apiserver, which
//! enforces their schema and CEL rules, `kubectl explain` shows the field docs, and NATS
//! JetStream works (see also `faults.rs` for restarts and blackouts).

use std::time::Duration;

use herald_core::v1alpha1::{SigningSecret, WebhookEndpoint, WebhookReplay};
use herald_e2e::{TestContext, env, eventually, repo_root, unique_name};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Resource};
use serde_json::{Value, json};

#[tokio::test]
async fn crds_install_and_become_established() {
    let ctx = TestContext::new("crds").await;
    let crds: Api<CustomResourceDefinition> = Api::all(ctx.client.clone());
    for name in [
        "webhookendpoints.herald.dev",
        "signingsecrets.herald.dev",
        "webhookreplays.herald.dev",
    ] {
        let crd = crds.get(name).await.unwrap();
        let conditions = crd.status.unwrap().conditions.unwrap_or_default();
        assert!(
            conditions
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True"),
            "{name}: {conditions:?}"
        );
    }
    ctx.cleanup().await;
}

#[tokio::test]
async fn kubectl_explain_prints_the_field_docs() {
    let ctx = TestContext::new("explain").await;
    // Discovery may lag a moment behind Established.
    let out = eventually("kubectl explain", Duration::from_secs(30), || async {
        let out = env()
            .kubectl()
            .args(["explain", "webhookendpoint.spec.url"])
            .output()
            .unwrap();
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    })
    .await;
    assert!(out.contains("The URL Herald POSTs events to"), "{out}");
    let out = env()
        .kubectl()
        .args(["explain", "webhookendpoint.spec.delivery.retry.exponential"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("full jitter"), "{text}");
    ctx.cleanup().await;
}

#[tokio::test]
async fn the_examples_are_accepted_and_defaults_applied() {
    let ctx = TestContext::new("examples").await;
    for file in [
        "tenant/signing-secret.yaml",
        "tenant/orders.yaml",
        "tenant/ordered-endpoint.yaml",
        "tenant/retry-policy.yaml",
        "replay/replay.yaml",
    ] {
        let out = env()
            .kubectl()
            .args(["apply", "-n", &ctx.namespace, "-f"])
            .arg(repo_root().join("examples").join(file))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{file}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let endpoint = ctx.api::<WebhookEndpoint>().get("orders").await.unwrap();
    assert_eq!(endpoint.spec.delivery.max_in_flight, 8);
    // Fields the manifest left out were defaulted by the API server from the schema.
    assert!(endpoint.spec.delivery.disable_on_gone);
    assert_eq!(endpoint.spec.delivery.disable_after.as_str(), "72h");
    assert!(ctx.api::<SigningSecret>().get("orders").await.is_ok());
    assert!(
        ctx.api::<WebhookReplay>()
            .get("orders-november")
            .await
            .is_ok()
    );
    // The printer columns are served (values arrive once the operator writes status).
    let out = env()
        .kubectl()
        .args(["get", "whe", "-n", &ctx.namespace])
        .output()
        .unwrap();
    let header = String::from_utf8_lossy(&out.stdout);
    for column in ["STATE", "SUCCESS", "BACKLOG", "AGE"] {
        assert!(header.contains(column), "{header}");
    }
    ctx.cleanup().await;
}

fn endpoint(spec: Value) -> Value {
    let mut base = json!({
        "url": "https://hooks.example.com/x",
        "eventTypes": ["order.created"],
        "secretRef": {"name": "s"}
    });
    merge(&mut base, spec);
    json!({"apiVersion": "herald.dev/v1alpha1", "kind": "WebhookEndpoint", "spec": base})
}

fn merge(base: &mut Value, patch: Value) {
    match (base, patch) {
        (Value::Object(base), Value::Object(patch)) => {
            for (k, v) in patch {
                merge(base.entry(k).or_insert(Value::Null), v);
            }
        }
        (base, patch) => *base = patch,
    }
}

/// Creates `object` and returns the API server's refusal, or panics if it was accepted.
async fn refused<K: Resource<DynamicType = ()>>(ctx: &TestContext, mut object: Value) -> String {
    let ar = ApiResource::erase::<K>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ctx.namespace, &ar);
    object["metadata"] = json!({"name": unique_name("bad")});
    let object: DynamicObject = serde_json::from_value(object).unwrap();
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => panic!("accepted: {}", serde_json::to_string(&object).unwrap()),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn invalid_endpoints_are_refused_naming_the_field() {
    let ctx = TestContext::new("invalid").await;
    let cases: Vec<(Value, &[&str])> = vec![
        (json!({"url": "ftp://x"}), &["spec.url", "https://"]),
        (json!({"url": "https://"}), &["spec.url", "absolute URL"]),
        (
            json!({"delivery": {"maxInFlight": 0}}),
            &["spec.delivery.maxInFlight", "greater than or equal to 1"],
        ),
        (
            json!({"delivery": {"maxInFlight": 5000}}),
            &["spec.delivery.maxInFlight", "less than or equal to 1024"],
        ),
        (
            json!({"eventTypes": []}),
            &["spec.eventTypes", "at least 1"],
        ),
        (json!({"eventTypes": ["order..x"]}), &["spec.eventTypes[0]"]),
        (
            json!({"eventTypes": ["order.cre*"]}),
            &["spec.eventTypes[0]"],
        ),
        (
            json!({"delivery": {"timeout": "5 seconds"}}),
            &["spec.delivery.timeout"],
        ),
        (
            json!({"delivery": {"timeout": "0s"}}),
            &["spec.delivery.timeout", "positive duration"],
        ),
        (
            json!({"delivery": {"retry": {"exponential": {}, "schedule": ["5s"]}}}),
            &[
                "spec.delivery.retry",
                "at most one of exponential and schedule",
            ],
        ),
        (
            json!({"delivery": {"retry": {"exponential": {"base": "2h", "cap": "1h"}}}}),
            &[
                "spec.delivery.retry.exponential",
                "base must not exceed cap",
            ],
        ),
        (
            json!({"delivery": {"finalStatusCodes": [500]}}),
            &["spec.delivery.finalStatusCodes[0]"],
        ),
        (
            json!({"orderingKey": "/data/id"}),
            &["spec.orderingKey", "needs ordered: true"],
        ),
        (
            json!({"headers": [{"name": "Webhook-Id", "value": "x"}]}),
            &["spec.headers[0].name", "may not override"],
        ),
        (
            json!({"headers": [{"name": "Host", "value": "internal"}]}),
            &["spec.headers[0].name", "may not override"],
        ),
        (
            json!({"headers": [{"name": "X-Tenant", "value": "a\r\nX-Injected: 1"}]}),
            &["spec.headers[0].value", "control characters"],
        ),
        (
            json!({"headers": [{"name": "X-Tenant", "value": "a\u{0}b"}]}),
            &["spec.headers[0].value", "control characters"],
        ),
        (
            json!({"headers": [{"name": "X Tenant", "value": "a"}]}),
            &["spec.headers[0].name"],
        ),
        (
            json!({"delivery": {"redactResponseFields": ["/token", "user.email"]}}),
            &["spec.delivery.redactResponseFields[1]", "JSON Pointer"],
        ),
        (
            json!({"delivery": {"redactResponseFields": [""]}}),
            &["spec.delivery.redactResponseFields[0]", "JSON Pointer"],
        ),
        (
            json!({"delivery": {"redactResponseFields": ["/a~2b"]}}),
            &["spec.delivery.redactResponseFields[0]", "JSON Pointer"],
        ),
        (
            json!({"delivery": {"proxy": {}}}),
            &["spec.delivery.proxy", "exactly one of name"],
        ),
        (
            json!({"delivery": {"proxy": {"name": "eu", "direct": true}}}),
            &["spec.delivery.proxy", "exactly one of name"],
        ),
        (
            json!({"delivery": {"proxy": {"direct": false}}}),
            &["spec.delivery.proxy", "exactly one of name"],
        ),
        (
            json!({"delivery": {"proxy": {"name": "http://10.0.0.1:3128"}}}),
            &["spec.delivery.proxy.name"],
        ),
    ];
    // A tab is the one control character a header value may hold.
    let tab = endpoint(json!({"headers": [{"name": "X-Tenant", "value": "a\tb"}]}));
    let ar = ApiResource::erase::<WebhookEndpoint>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ctx.namespace, &ar);
    let mut accepted = tab;
    accepted["metadata"] = json!({"name": unique_name("tab")});
    api.create(
        &PostParams::default(),
        &serde_json::from_value(accepted).unwrap(),
    )
    .await
    .expect("a header value with a tab is valid");
    let mut pointers = endpoint(json!({"delivery": {"redactResponseFields": [
        "/token", "/user/email", "/items/0/key", "/a~1b", "/~0x", "/"
    ]}}));
    pointers["metadata"] = json!({"name": unique_name("pointers")});
    api.create(
        &PostParams::default(),
        &serde_json::from_value(pointers).unwrap(),
    )
    .await
    .expect("JSON Pointers with escapes and array indexes are valid");
    for proxy in [json!({"name": "eu-static-ip"}), json!({"direct": true})] {
        let mut valid = endpoint(json!({"delivery": {"proxy": proxy}}));
        valid["metadata"] = json!({"name": unique_name("proxy")});
        api.create(
            &PostParams::default(),
            &serde_json::from_value(valid).unwrap(),
        )
        .await
        .unwrap_or_else(|e| panic!("proxy {proxy} is valid: {e}"));
    }
    for (spec, expected) in cases {
        let message = refused::<WebhookEndpoint>(&ctx, endpoint(spec.clone())).await;
        for needle in expected {
            assert!(
                message.contains(needle),
                "spec {spec}: expected {needle:?} in the refusal, got: {message}"
            );
        }
    }
    ctx.cleanup().await;
}

#[tokio::test]
async fn invalid_replays_are_refused_and_specs_are_immutable() {
    let ctx = TestContext::new("replay").await;
    let replay = |from: &str, to: &str| {
        json!({
            "apiVersion": "herald.dev/v1alpha1",
            "kind": "WebhookReplay",
            "spec": {"endpoint": "orders", "from": from, "to": to}
        })
    };
    let message =
        refused::<WebhookReplay>(&ctx, replay("2026-11-02T00:00:00Z", "2026-11-01T00:00:00Z"))
            .await;
    assert!(
        message.contains("spec.from") && message.contains("from must be before to"),
        "{message}"
    );

    let api = ctx.api::<WebhookReplay>();
    let mut ok = replay("2026-11-01T00:00:00Z", "2026-11-02T00:00:00Z");
    ok["metadata"] = json!({"name": "r1"});
    api.create(&PostParams::default(), &serde_json::from_value(ok).unwrap())
        .await
        .unwrap();
    let change = json!({"spec": {"onlyFailed": true}});
    let err = api
        .patch("r1", &PatchParams::default(), &Patch::Merge(&change))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("cannot change after creation"), "{err}");
    ctx.cleanup().await;
}
