//! A tenant attacking the API that every tenant shares, with what any pod has: its own
//! ServiceAccount token, made-up tokens and made-up namespaces. Against the real API
//! server (TokenReview, SubjectAccessReview) and `herald-api` as a process of its own.
//! Each attack is bounded: it cannot spend another namespace's request budget, and what
//! it makes the Kubernetes API server do is limited per source, per user and in total.

use std::time::Instant;

use super::support::{ApiProcess, token};
use herald_e2e::TestContext;
use reqwest::Method;

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
