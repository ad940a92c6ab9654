//! A tenant attacking the API that every tenant shares, with what any pod has: its own
//! ServiceAccount token, made-up tokens and made-up namespaces. Against the real API
//! server (TokenReview, SubjectAccessReview) and `herald-api` as a process of its own.
//! Each attack is bounded: it cannot spend another namespace's request budget, what it
//! makes the Kubernetes API server do is limited per source, per user and in total, and
//! no message id it publishes can make another tenant's event a duplicate.

use std::time::Instant;

use super::support::{ApiProcess, token};
use herald_core::dataplane::event_sequence;
use herald_core::dataplane::idempotency::{Claim, entry_key};
use herald_core::dataplane::{
    EVENTS_STREAM, IDEMPOTENCY_BUCKET, event_subject, parse_event_subject,
};
use herald_e2e::dataplane::DataPlane;
use herald_e2e::{TestContext, env, unique_name};
use reqwest::Method;
use serde_json::json;

/// `herald_api_reviews_total{kind="<kind>"}` from the API's metrics.
async fn reviews(api: &ApiProcess, kind: &str) -> f64 {
    let metrics = api.metrics().await;
    let prefix = format!("herald_api_reviews_total{{kind=\"{kind}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// A ServiceAccount with rights only in its own namespace sends 60 requests to another
/// namespace: every one is refused 403 and none spends the victim's budget (before,
/// the budget was taken before authorization: 10 × 403, then 429, and the victim's own
/// requests were refused).
#[tokio::test]
async fn a_caller_without_rights_cannot_spend_another_namespaces_budget() {
    herald_api::install_crypto_provider();
    let victim = TestContext::new("hostile-victim").await;
    let attacker = TestContext::new("hostile-attacker").await;
    let own = token(&victim, "reader", "herald-delivery-viewer").await;
    let foreign = token(&attacker, "intruder", "herald-delivery-viewer").await;
    let api =
        ApiProcess::start(&["--rate-per-namespace", "1", "--burst-per-namespace", "10"]).await;
    let path = format!(
        "/v1/namespaces/{}/endpoints/orders/deliveries",
        victim.namespace
    );
    let mut statuses = Vec::new();
    for _ in 0..60 {
        let (status, _) = api
            .send(Method::GET, &path, Some(&foreign), None, &[])
            .await;
        statuses.push(status);
    }
    assert!(statuses.iter().all(|s| *s == 403), "{statuses:?}");
    // The victim's whole burst is still there: 10 answers that are not 429 (404: Herald
    // does not deliver to `orders`, which is what the victim may read).
    for _ in 0..10 {
        let (status, body) = api.send(Method::GET, &path, Some(&own), None, &[]).await;
        assert_eq!(status, 404, "the victim's own request: {body}");
    }
    let (status, _) = api.send(Method::GET, &path, Some(&own), None, &[]).await;
    assert_eq!(status, 429, "the victim's budget is its own to spend");
}

/// A flood of made-up tokens from one source costs a bounded number of TokenReviews,
/// and a caller whose token is already reviewed keeps working through it; a valid token
/// rotating made-up namespaces costs a bounded number of SubjectAccessReviews.
#[tokio::test]
async fn made_up_tokens_and_namespaces_cost_a_bounded_number_of_reviews() {
    herald_api::install_crypto_provider();
    let ctx = TestContext::new("hostile-reviews").await;
    let reader = token(&ctx, "reader", "herald-delivery-viewer").await;
    let api = ApiProcess::start(&[]).await;
    let path = format!(
        "/v1/namespaces/{}/endpoints/orders/deliveries",
        ctx.namespace
    );
    let (status, _) = api.send(Method::GET, &path, Some(&reader), None, &[]).await;
    assert_eq!(status, 404, "the reader is reviewed and allowed");

    let started = Instant::now();
    let tokens_before = reviews(&api, "token").await;
    let mut refused = 0;
    for i in 0..100 {
        let made_up = format!("made-up-token-{i}-{}", herald_e2e::unique_name("t"));
        let (status, body) = api
            .send(Method::GET, &path, Some(&made_up), None, &[])
            .await;
        match status {
            401 => {}
            429 => {
                assert_eq!(body["error"]["code"], "TooManyReviews", "{body}");
                refused += 1;
            }
            other => panic!("a made-up token answered {other}: {body}"),
        }
        if i % 10 == 0 {
            // The reviewed caller is answered from the cache, flood or not.
            let (status, body) = api.send(Method::GET, &path, Some(&reader), None, &[]).await;
            assert_eq!(status, 404, "the reader during the flood: {body}");
        }
    }
    let token_reviews = reviews(&api, "token").await - tokens_before;
    let allowed = 20.0 + 5.0 * started.elapsed().as_secs_f64().ceil();
    println!("100 made-up tokens: {token_reviews} TokenReviews, {refused} refused");
    assert!(
        token_reviews <= allowed,
        "{token_reviews} TokenReviews, at most {allowed}"
    );
    assert!(refused > 0, "the source's allowance ran out");

    let started = Instant::now();
    let access_before = reviews(&api, "access").await;
    let mut refused = 0;
    for i in 0..120 {
        let path = format!("/v1/namespaces/made-up-{i}/endpoints/orders/deliveries");
        let (status, body) = api.send(Method::GET, &path, Some(&reader), None, &[]).await;
        match status {
            403 => {}
            429 => {
                assert_eq!(body["error"]["code"], "TooManyReviews", "{body}");
                refused += 1;
            }
            other => panic!("a made-up namespace answered {other}: {body}"),
        }
    }
    let access_reviews = reviews(&api, "access").await - access_before;
    let allowed = 50.0 + 10.0 * started.elapsed().as_secs_f64().ceil();
    println!("120 made-up namespaces: {access_reviews} SubjectAccessReviews, {refused} refused");
    assert!(
        access_reviews <= allowed,
        "{access_reviews} reviews, at most {allowed}"
    );
    assert!(refused > 0, "the user's allowance ran out");
}

/// Tenant A publishes over NATS first, under every message id tenant B's key could be
/// turned into (HTTP ingest's former `http.<ns>.<SHA-256 of the key>`, the key itself):
/// B's request is still stored as B's event and answered as new (before, it was answered
/// `duplicate: true` with A's event id, and B's event was never stored). A key claimed
/// hours ago — past JetStream's 2-minute duplicate window — is still answered as the
/// duplicate it is, from the namespace's own claim.
#[tokio::test]
async fn another_tenant_cannot_make_an_event_a_duplicate() {
    herald_api::install_crypto_provider();
    let dp = DataPlane::new(env().nats().await).await;
    let api = ApiProcess::start(&["--insecure-dev-no-auth"]).await;
    let (victim, attacker) = (unique_name("victim"), unique_name("attacker"));
    let key = "order-1";
    let guesses = [
        format!("http.{}", entry_key(&victim, key)),
        key.to_owned(),
        format!("http.{victim}.{key}"),
    ];
    for guess in &guesses {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", guess.as_str());
        let body = serde_json::to_vec(&json!({"type": "order.created", "data": "forged"})).unwrap();
        let ack = dp
            .js
            .publish_with_headers(
                event_subject(&attacker, "order.created"),
                headers,
                body.into(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(!ack.duplicate);
    }
    let path = format!("/v1/namespaces/{victim}/events");
    let event = json!({"type": "order.created", "data": "mine"});
    let body = serde_json::to_vec(&event).unwrap();
    let (status, answer) = api
        .send(
            Method::POST,
            &path,
            None,
            Some(body.clone()),
            &[("Idempotency-Key", key)],
        )
        .await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["duplicate"], false, "{answer}");
    let id = answer["eventId"].as_str().unwrap().to_owned();
    let events = dp.js.get_stream(EVENTS_STREAM).await.unwrap();
    let seq = event_sequence(&id).unwrap();
    let stored = events
        .direct_get(seq)
        .await
        .expect("the victim's event is stored");
    let (ns, _) = parse_event_subject(stored.subject.as_str()).unwrap();
    assert_eq!(ns, victim, "stored under the victim's namespace");
    assert_eq!(&stored.payload[..], &body[..]);

    // A claim made three hours ago is answered from the bucket, nothing published.
    let bucket = dp.js.get_key_value(IDEMPOTENCY_BUCKET).await.unwrap();
    let window = bucket.status().await.unwrap().max_age();
    assert_eq!(
        window,
        std::time::Duration::from_secs(24 * 3600),
        "the default window"
    );
    let old = Claim {
        event_id: Some(id.clone()),
        ..Claim::new(
            &victim,
            &body,
            herald_core::clock::now_ms() - 3 * 3_600_000,
            7,
        )
    };
    bucket
        .put(entry_key(&victim, "order-0"), old.encode())
        .await
        .unwrap();
    let last = events.get_info().await.unwrap().state.last_sequence;
    let (status, again) = api
        .send(
            Method::POST,
            &path,
            None,
            Some(body),
            &[("Idempotency-Key", "order-0")],
        )
        .await;
    assert_eq!(status, 202, "{again}");
    assert_eq!(
        (again["eventId"].as_str(), again["duplicate"].as_bool()),
        (Some(id.as_str()), Some(true))
    );
    assert_eq!(
        events.get_info().await.unwrap().state.last_sequence,
        last,
        "nothing stored"
    );
}
