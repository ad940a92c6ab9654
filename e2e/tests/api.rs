//! Herald's HTTP API (`herald-api`, a process of its own) against the real API server
//! and NATS: real ServiceAccount tokens decide what a caller may do (TokenReview and
//! SubjectAccessReview), the delivery log shows what the in-process dispatcher did, and
//! every answer validates against the committed OpenAPI document.
//!
//! Needs the binary: `cargo build -p herald-api` (the test command builds every binary).

#[path = "api/support.rs"]
mod support;

#[path = "api/quota.rs"]
mod quota;

#[path = "api/bounded.rs"]
mod bounded;

#[path = "api/hostile.rs"]
mod hostile;

#[path = "api/suite.rs"]
mod suite;

use std::collections::HashSet;
use std::time::Duration;

use herald_core::dataplane::{EVENTS_STREAM, STORED_PREFIX};
use herald_core::signing::{SigningKey, verify};
use herald_e2e::dataplane::{
    DataPlane, TEST_SECRET, endpoint, fast_retries, read_all, shared_dispatcher, until_applied,
};
use herald_e2e::receiver::{Behavior, Receiver};
use herald_e2e::{TestContext, env, eventually, free_port, repo_root};
use reqwest::Method;
use serde_json::{Value, json};
use support::{ApiProcess, WAIT, token};

const LIST: &str = "/v1/namespaces/{ns}/endpoints/{name}/deliveries";
const DETAIL: &str = "/v1/namespaces/{ns}/endpoints/{name}/deliveries/{eventId}";
const EVENTS: &str = "/v1/namespaces/{ns}/events";
const REDELIVER: &str = "/v1/namespaces/{ns}/endpoints/{name}/redeliver/{eventId}";
const REDRIVE: &str = "/v1/namespaces/{ns}/endpoints/{name}/redrive-dead";
const TEST: &str = "/v1/namespaces/{ns}/endpoints/{name}/test";

/// An endpoint `name` of the test's namespace, delivered to by the shared dispatcher.
async fn endpoint_at(ctx: &TestContext, dp: &DataPlane, name: &str, spec: Value) {
    dp.put_keys(&ctx.namespace, "signing", &[TEST_SECRET]).await;
    let config = endpoint(&ctx.namespace, name, spec);
    dp.put_endpoint(&config).await;
    until_applied(shared_dispatcher(env()), &config).await;
}

fn list_path(ns: &str, name: &str, query: &str) -> String {
    format!("/v1/namespaces/{ns}/endpoints/{name}/deliveries{query}")
}

/// Waits until the listed deliveries of an endpoint satisfy `done`.
async fn listed(
    api: &ApiProcess,
    ns: &str,
    name: &str,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    eventually(&format!("the deliveries of {name}"), WAIT, || async {
        let (status, body) = api
            .send(
                Method::GET,
                &list_path(ns, name, "?limit=500"),
                None,
                None,
                &[],
            )
            .await;
        let items = body["items"].as_array().cloned().unwrap_or_default();
        (status == 200 && done(&items)).then_some(items)
    })
    .await
}

#[tokio::test]
async fn rbac_decides_who_reads_and_who_publishes() {
    let ctx = TestContext::new("api-rbac").await;
    let other = TestContext::new("api-rbac-other").await;
    let dp = DataPlane::new(env().nats().await).await;
    let rx = Receiver::start().await;
    endpoint_at(&ctx, &dp, "orders", json!({"url": rx.url("orders")})).await;
    let api = ApiProcess::start(&[]).await;
    let tenant = token(&ctx, "tenant", "herald-delivery-operator").await;
    let producer = token(&ctx, "producer", "herald-event-producer").await;
    let ns = &ctx.namespace;

    // The producer publishes; the tenant reads the delivery.
    let event = json!({"type": "order.created", "data": {"n": 1}});
    let accepted = api
        .call(
            Method::POST,
            EVENTS,
            &format!("/v1/namespaces/{ns}/events"),
            Some(&producer),
            Some(event),
            &[("Idempotency-Key", "rbac-1")],
            202,
        )
        .await;
    let id = accepted["eventId"].as_str().unwrap().to_owned();
    eventually("the delivery listed for the tenant", WAIT, || async {
        let (status, body) = api
            .send(
                Method::GET,
                &list_path(ns, "orders", ""),
                Some(&tenant),
                None,
                &[],
            )
            .await;
        (status == 200 && body["items"][0]["state"] == "succeeded").then_some(())
    })
    .await;
    let page = api
        .call(
            Method::GET,
            LIST,
            &list_path(ns, "orders", ""),
            Some(&tenant),
            None,
            &[],
            200,
        )
        .await;
    assert_eq!(page["items"][0]["eventId"], id.as_str());
    assert_eq!(page["items"][0]["type"], "order.created");
    api.call(
        Method::GET,
        DETAIL,
        &format!("{}/{id}", list_path(ns, "orders", "")),
        Some(&tenant),
        None,
        &[],
        200,
    )
    .await;

    // Not in another namespace, not for the producer, not without a valid token.
    let forbidden = api
        .call(
            Method::GET,
            LIST,
            &list_path(&other.namespace, "orders", ""),
            Some(&tenant),
            None,
            &[],
            403,
        )
        .await;
    assert_eq!(forbidden["error"]["code"], "Forbidden");
    assert!(
        forbidden["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&other.namespace)
    );
    api.call(
        Method::GET,
        LIST,
        &list_path(ns, "orders", ""),
        Some(&producer),
        None,
        &[],
        403,
    )
    .await;
    api.call(
        Method::POST,
        REDRIVE,
        &format!("/v1/namespaces/{ns}/endpoints/orders/redrive-dead"),
        Some(&producer),
        None,
        &[],
        403,
    )
    .await;
    let event = json!({"type": "order.created", "data": {}});
    api.call(
        Method::POST,
        EVENTS,
        &format!("/v1/namespaces/{ns}/events"),
        Some(&tenant),
        Some(event),
        &[("Idempotency-Key", "rbac-2")],
        403,
    )
    .await;
    let none = api
        .call(
            Method::GET,
            LIST,
            &list_path(ns, "orders", ""),
            None,
            None,
            &[],
            401,
        )
        .await;
    assert_eq!(none["error"]["code"], "Unauthorized");
    api.call(
        Method::GET,
        LIST,
        &list_path(ns, "orders", ""),
        Some("not-a-token"),
        None,
        &[],
        401,
    )
    .await;
    // An endpoint Herald does not deliver to.
    let missing = api
        .call(
            Method::GET,
            LIST,
            &list_path(ns, "nope", ""),
            Some(&tenant),
            None,
            &[],
            404,
        )
        .await;
    assert_eq!(missing["error"]["code"], "EndpointNotFound");

    // The operator role may queue a test event; the producer may not.
    let test_path = format!("/v1/namespaces/{ns}/endpoints/orders/test");
    api.call(
        Method::POST,
        TEST,
        &test_path,
        Some(&tenant),
        None,
        &[],
        202,
    )
    .await;
    api.call(
        Method::POST,
        TEST,
        &test_path,
        Some(&producer),
        None,
        &[],
        403,
    )
    .await;

    let metrics = api.metrics().await;
    for name in documented_api_metrics() {
        assert!(
            metrics.contains(&format!("# TYPE {name} ")),
            "{name} not exposed"
        );
    }
    assert!(metrics.contains("herald_api_reviews_total{kind=\"token\"}"));
    assert!(!metrics.contains(&tenant) && !metrics.contains(&producer));
    // Tokens never reach the log (Herald and kube at debug level).
    let log = std::fs::read_to_string(&api.log).expect("the API's log");
    assert!(
        log.contains("token reviewed") && log.contains("access reviewed"),
        "{log}"
    );
    for token in [&tenant, &producer] {
        let middle = &token[token.len() / 2..token.len() / 2 + 24];
        assert!(!log.contains(middle), "a token in the API's log");
    }
    ctx.cleanup().await;
    other.cleanup().await;
}

/// The API's families in docs/metrics.md (the dispatcher/operator test skips them).
fn documented_api_metrics() -> Vec<String> {
    let doc =
        std::fs::read_to_string(repo_root().join("docs/metrics.md")).expect("docs/metrics.md");
    let names: Vec<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `herald_api_"))
        .map(|l| format!("herald_api_{}", l.split('`').next().unwrap_or_default()))
        .map(|n| n.trim_end_matches("_total").to_owned())
        .collect();
    assert!(names.len() >= 4, "docs/metrics.md lists the API's metrics");
    names
}

#[tokio::test]
async fn ingest_is_idempotent_and_refuses_bad_events_with_their_reason() {
    let ctx = TestContext::new("api-ingest").await;
    let dp = DataPlane::new(env().nats().await).await;
    let api = ApiProcess::start(&["--insecure-dev-no-auth", "--max-event-bytes", "2048"]).await;
    let path = format!("/v1/namespaces/{}/events", ctx.namespace);
    let event = json!({"type": "order.created", "data": {"id": 7}});
    let key = [("Idempotency-Key", "order-7")];
    let first = api
        .call(
            Method::POST,
            EVENTS,
            &path,
            None,
            Some(event.clone()),
            &key,
            202,
        )
        .await;
    let again = api
        .call(Method::POST, EVENTS, &path, None, Some(event), &key, 202)
        .await;
    assert_eq!(first["eventId"], again["eventId"]);
    assert_eq!(
        (first["duplicate"].as_bool(), again["duplicate"].as_bool()),
        (Some(false), Some(true))
    );
    let stored = read_all(
        &dp.js,
        EVENTS_STREAM,
        &format!("{STORED_PREFIX}.*.{}.order.created", ctx.namespace),
    )
    .await;
    assert_eq!(stored.len(), 1, "one stored event for one key");
    let other = api
        .call(
            Method::POST,
            EVENTS,
            &path,
            None,
            Some(json!({"type": "order.created", "data": 1})),
            &[("Idempotency-Key", "order-8")],
            202,
        )
        .await;
    assert_ne!(other["eventId"], first["eventId"]);
    // The same key with another body is refused, naming the key.
    let reused = api
        .call(
            Method::POST,
            EVENTS,
            &path,
            None,
            Some(json!({"type": "order.created", "data": {"id": 999}})),
            &key,
            409,
        )
        .await;
    assert_eq!(reused["error"]["code"], "IdempotencyKeyReused");
    assert!(
        reused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("order-7")
    );

    let bad = |body: &'static [u8], key: Option<&'static str>| {
        let api = &api;
        let path = path.clone();
        async move {
            let headers: Vec<(&str, &str)> =
                key.map(|k| ("Idempotency-Key", k)).into_iter().collect();
            api.send(Method::POST, &path, None, Some(body.to_vec()), &headers)
                .await
        }
    };
    let cases: [(&[u8], Option<&str>, u16, &str); 6] = [
        (
            br#"{"type":"a.b","data":1}"#,
            None,
            400,
            "MissingIdempotencyKey",
        ),
        (b"not json", Some("k1"), 400, "NotJson"),
        (br#"{"data":1}"#, Some("k2"), 400, "MissingType"),
        (
            br#"{"type":"a..b","data":1}"#,
            Some("k3"),
            400,
            "InvalidType",
        ),
        (
            br#"{"type":"order.*","data":1}"#,
            Some("k4"),
            400,
            "InvalidType",
        ),
        (br#"{"type":"a.b"}"#, Some("k5"), 400, "MissingData"),
    ];
    let doc: Value = serde_norway::from_str(herald_api::openapi::YAML).unwrap();
    for (body, key, status, code) in cases {
        let (got, answer) = bad(body, key).await;
        assert_eq!(
            (got, answer["error"]["code"].as_str()),
            (status, Some(code)),
            "{answer}"
        );
        assert!(
            answer["error"]["message"]
                .as_str()
                .is_some_and(|m| m.len() > 10)
        );
        let schema = herald_api::openapi::response_schema(&doc, "post", EVENTS, status).unwrap();
        assert!(herald_api::openapi::check(&doc, schema, &answer).is_empty());
    }
    let large = serde_json::to_vec(&json!({"type": "a.b", "data": "x".repeat(4096)})).unwrap();
    let (status, answer) = api
        .send(
            Method::POST,
            &path,
            None,
            Some(large),
            &[("Idempotency-Key", "big")],
        )
        .await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (413, Some("TooLarge")),
        "{answer}"
    );
    ctx.cleanup().await;
}

#[tokio::test]
async fn the_log_shows_each_state_and_redelivery_sends_the_same_ids() {
    let ctx = TestContext::new("api-log").await;
    let dp = DataPlane::new(env().nats().await).await;
    let rx = Receiver::start().await;
    rx.behave("dead", Behavior::statuses(&[400]));
    rx.behave("retrying", Behavior::statuses(&[503]));
    for name in ["ok", "dead", "retrying"] {
        let mut spec = json!({"url": rx.url(name), "eventTypes": ["order.*"],
            "delivery": {"finalStatusCodes": [400], "retry": {"schedule": ["1h"]}}});
        if name == "dead" {
            // Shown redacted in the request body too, as in responses.
            spec["delivery"]["redactResponseFields"] = json!(["/data"]);
        }
        endpoint_at(&ctx, &dp, name, spec).await;
    }
    let _ = fast_retries(&["1h"]);
    let api = ApiProcess::start(&["--insecure-dev-no-auth"]).await;
    let ns = ctx.namespace.clone();
    for n in 0..3 {
        dp.publish(&ns, "order.created", json!(n)).await;
    }
    dp.publish(&ns, "invoice.sent", json!(9)).await; // taken by none of them

    let ok = listed(&api, &ns, "ok", |i| {
        i.len() == 3 && i.iter().all(|d| d["state"] == "succeeded")
    })
    .await;
    let dead = listed(&api, &ns, "dead", |i| {
        i.len() == 3 && i.iter().all(|d| d["state"] == "dead")
    })
    .await;
    let retrying = listed(&api, &ns, "retrying", |i| {
        i.len() == 3 && i.iter().all(|d| d["state"] == "retrying")
    })
    .await;
    for (items, status) in [(&ok, 200), (&dead, 400), (&retrying, 503)] {
        for d in items.iter() {
            assert_eq!(
                (d["lastStatus"].as_u64(), d["attempts"].as_u64()),
                (Some(status), Some(1)),
                "{d}"
            );
            assert_eq!(d["type"], "order.created");
        }
    }
    assert!(retrying.iter().all(|d| d["nextAttemptTime"].is_string()));
    assert!(dead.iter().all(|d| d["nextAttemptTime"].is_null()));
    let page = api
        .call(
            Method::GET,
            LIST,
            &list_path(&ns, "dead", "?status=dead&type=order.*&since=1h"),
            None,
            None,
            &[],
            200,
        )
        .await;
    assert_eq!(page["items"].as_array().unwrap().len(), 3);
    let page = api
        .call(
            Method::GET,
            LIST,
            &list_path(&ns, "dead", "?status=succeeded"),
            None,
            None,
            &[],
            200,
        )
        .await;
    assert_eq!(page["items"].as_array().unwrap().len(), 0);
    let id = dead[0]["eventId"].as_str().unwrap().to_owned();
    let detail = api
        .call(
            Method::GET,
            DETAIL,
            &format!("{}/{id}", list_path(&ns, "dead", "")),
            None,
            None,
            &[],
            200,
        )
        .await;
    assert_eq!(detail["state"], "dead");
    assert_eq!(detail["attempts"][0]["status"], 400);
    assert_eq!(detail["attempts"][0]["outcome"], "HttpError");
    // What exactly was sent and what came back: the body the attempt sent (the event as
    // delivered), its headers with the signature redacted, the response's headers.
    let body = detail["requestBody"]["body"].as_str().unwrap_or_default();
    let sent: serde_json::Value = serde_json::from_str(body).expect("the body sent is JSON");
    assert_eq!(sent["type"], detail["type"], "{detail}");
    assert!(sent.get("timestamp").is_some(), "{body}");
    assert_eq!(sent["data"], "[redacted]", "redactResponseFields: {body}");
    let header = |list: &str, name: &str| {
        detail["attempts"][0][list]
            .as_array()
            .and_then(|h| h.iter().find(|h| h["name"] == name))
            .and_then(|h| h["value"].as_str())
            .map(str::to_owned)
    };
    assert_eq!(
        header("requestHeaders", "webhook-signature").as_deref(),
        Some("v1,[redacted]"),
        "{detail}"
    );
    assert_eq!(
        header("requestHeaders", "webhook-id").as_deref(),
        Some(id.as_str()),
        "{detail}"
    );
    assert!(
        header("responseHeaders", "content-length").is_some(),
        "{detail}"
    );
    let unseen = herald_core::dataplane::event_id(1, 1);
    api.call(
        Method::GET,
        DETAIL,
        &format!("{}/{unseen}", list_path(&ns, "dead", "")),
        None,
        None,
        &[],
        404,
    )
    .await;

    // Redrive the dead ones once the receiver is fixed: the same ids, nothing else.
    rx.behave("dead", Behavior::statuses(&[200]));
    let redrive = api
        .call(
            Method::POST,
            REDRIVE,
            &format!("/v1/namespaces/{ns}/endpoints/dead/redrive-dead"),
            None,
            None,
            &[],
            202,
        )
        .await;
    let dead_ids: HashSet<String> = dead
        .iter()
        .map(|d| d["eventId"].as_str().unwrap().to_owned())
        .collect();
    let redriven: HashSet<String> = redrive["eventIds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    assert_eq!((redrive["count"].as_u64(), &redriven), (Some(3), &dead_ids));
    eventually("the redriven events received", WAIT, || async {
        let ok: HashSet<String> = rx.succeeded_ids("dead");
        (ok == dead_ids).then_some(())
    })
    .await;
    assert_eq!(
        rx.request_count("dead"),
        6,
        "each dead event sent once more"
    );
    listed(&api, &ns, "dead", |i| {
        i.iter()
            .all(|d| d["state"] == "succeeded" && d["attempts"] == 2)
    })
    .await;

    // Redeliver one event: the same webhook-id again.
    let one = ok[0]["eventId"].as_str().unwrap().to_owned();
    let answer = api
        .call(
            Method::POST,
            REDELIVER,
            &format!("/v1/namespaces/{ns}/endpoints/ok/redeliver/{one}"),
            None,
            None,
            &[],
            202,
        )
        .await;
    assert_eq!(answer["eventId"], one.as_str());
    eventually("the redelivery received", WAIT, || async {
        let n = rx
            .received("ok")
            .iter()
            .filter(|r| r.header("webhook-id") == one)
            .count();
        (n == 2).then_some(())
    })
    .await;
    let missing = api
        .call(
            Method::POST,
            REDELIVER,
            &format!("/v1/namespaces/{ns}/endpoints/ok/redeliver/{unseen}"),
            None,
            None,
            &[],
            404,
        )
        .await;
    assert_eq!(missing["error"]["code"], "EventNotFound");

    // A test event reaches this endpoint only, signed.
    let test = api
        .call(
            Method::POST,
            TEST,
            &format!("/v1/namespaces/{ns}/endpoints/ok/test"),
            None,
            None,
            &[],
            202,
        )
        .await;
    let test_id = test["eventId"].as_str().unwrap().to_owned();
    let received = eventually("the test event received", WAIT, || async {
        rx.received("ok")
            .into_iter()
            .find(|r| r.header("webhook-id") == test_id)
    })
    .await;
    assert_eq!(received.json()["type"], "herald.test");
    let key = SigningKey::from_whsec(TEST_SECRET).unwrap();
    let now = jiff::Timestamp::now().as_second();
    verify(
        &[key],
        &test_id,
        received.header("webhook-timestamp"),
        received.header("webhook-signature"),
        &received.body,
        now,
        300,
    )
    .expect("the test event is signed");
    assert!(
        rx.received("retrying")
            .iter()
            .all(|r| r.header("webhook-id") != test_id)
    );
    ctx.cleanup().await;
}

#[tokio::test]
async fn pages_are_stable_while_new_attempts_arrive() {
    let ctx = TestContext::new("api-pages").await;
    let dp = DataPlane::new(env().nats().await).await;
    let rx = Receiver::start().await;
    endpoint_at(&ctx, &dp, "orders", json!({"url": rx.url("orders")})).await;
    let api = ApiProcess::start(&["--insecure-dev-no-auth"]).await;
    let ns = ctx.namespace.clone();
    for n in 0..40 {
        dp.publish(&ns, "order.created", json!(n)).await;
    }
    let before = listed(&api, &ns, "orders", |i| {
        i.len() == 40 && i.iter().all(|d| d["state"] == "succeeded")
    })
    .await;
    let expected: Vec<String> = before
        .iter()
        .map(|d| d["eventId"].as_str().unwrap().to_owned())
        .collect();

    // Page through 7 at a time while 30 more events are published and delivered, and the
    // oldest 10 listed events are redelivered (new attempts of events already listed).
    let mut publisher = Some({
        let (dp, ns) = (dp.clone(), ns.clone());
        let (http, base) = (api.http.clone(), api.base.clone());
        let again: Vec<String> = expected.iter().rev().take(10).cloned().collect();
        tokio::spawn(async move {
            for n in 100..130 {
                dp.publish(&ns, "order.created", json!(n)).await;
                if let Some(id) = again.get(n as usize - 100) {
                    let url = format!("{base}/v1/namespaces/{ns}/endpoints/orders/redeliver/{id}");
                    let answer = http.post(url).send().await.expect("redeliver");
                    assert_eq!(answer.status().as_u16(), 202);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    });
    let mut attempts = Vec::new();
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let query = match &cursor {
            Some(c) => format!("?limit=7&cursor={c}"),
            None => "?limit=7".to_owned(),
        };
        let page = api
            .call(
                Method::GET,
                LIST,
                &list_path(&ns, "orders", &query),
                None,
                None,
                &[],
                200,
            )
            .await;
        for d in page["items"].as_array().unwrap() {
            seen.push(d["eventId"].as_str().unwrap().to_owned());
            attempts.push(d["attempts"].as_u64());
        }
        // After the first page: the new events and the redeliveries are all delivered
        // and logged before the later pages are read.
        if let Some(publisher) = publisher.take() {
            publisher.await.unwrap();
            eventually("the redeliveries received", WAIT, || async {
                let again = expected.iter().rev().take(10).all(|id| {
                    rx.received("orders")
                        .iter()
                        .filter(|r| r.header("webhook-id") == id)
                        .count()
                        == 2
                });
                (again && rx.request_count("orders") == 80).then_some(())
            })
            .await;
            eventually("the new attempts logged", WAIT, || async {
                (dp.attempts(&ns, "orders").await.len() == 80).then_some(())
            })
            .await;
        }
        match page["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    // Newest first, no event twice, and none of the events there before paging began
    // skipped; events published while paging show only if they came before the first
    // page (at its top), never later.
    assert!(
        seen.windows(2).all(|w| w[0] > w[1]),
        "strictly newest first: {seen:?}"
    );
    assert!(
        seen.ends_with(&expected),
        "the 40 earlier events, in order, without gaps"
    );
    // Each page shows the state of the first: the redeliveries made while paging are not
    // counted on the later pages either.
    let old = &attempts[attempts.len() - expected.len()..];
    assert!(old.iter().all(|a| *a == Some(1)), "{old:?}");
    assert!(
        seen.len() < expected.len() + 30,
        "new events joined only at the first page"
    );
    let (status, answer) = api
        .send(
            Method::GET,
            &list_path(&ns, "orders", "?limit=501"),
            None,
            None,
            &[],
        )
        .await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (400, Some("LimitTooLarge"))
    );
    ctx.cleanup().await;
}

#[tokio::test]
async fn a_tenant_over_its_rate_gets_429_with_retry_after() {
    let ctx = TestContext::new("api-rate").await;
    DataPlane::new(env().nats().await).await;
    let api = ApiProcess::start(&[
        "--insecure-dev-no-auth",
        "--rate-per-namespace",
        "0.2",
        "--burst-per-namespace",
        "2",
    ])
    .await;
    let path = list_path(&ctx.namespace, "orders", "");
    for _ in 0..2 {
        api.call(Method::GET, LIST, &path, None, None, &[], 404)
            .await;
    }
    let response = api
        .http
        .get(format!("{}{path}", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 429);
    let retry_after: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=5).contains(&retry_after), "Retry-After: {retry_after}");
    let body: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "TooManyRequests");
    // Another tenant is not affected.
    api.call(
        Method::GET,
        LIST,
        &list_path("someone-else", "orders", ""),
        None,
        None,
        &[],
        404,
    )
    .await;
    ctx.cleanup().await;
}

#[tokio::test]
async fn development_mode_refuses_an_address_other_than_loopback() {
    let port = free_port();
    let output = support::command(
        port,
        &[
            "--insecure-dev-no-auth",
            "--listen",
            &format!("0.0.0.0:{port}"),
        ],
    )
    .output()
    .expect("running herald-api");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("loopback"), "{stderr}");
}
