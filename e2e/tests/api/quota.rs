//! A tenant's own ingest quota, the way a platform team sets it: annotations on the
//! tenant's Namespace (`herald.dev/api-rate`, `herald.dev/api-burst`), published by the
//! operator as the tenant policy and applied by `herald-api` (a process of its own)
//! against the real API server and NATS.

use std::collections::HashMap;
use std::time::Instant;

use super::support::{ApiProcess, WAIT};
use futures::future::join_all;
use herald_core::dataplane::{BucketKey, TenantPolicy};
use herald_e2e::dataplane::{DataPlane, TEST_SECRET, endpoint, shared_dispatcher, until_applied};
use herald_e2e::receiver::Receiver;
use herald_e2e::{TestContext, env, eventually, unique_name};
use reqwest::Method;
use serde_json::json;

/// Tenant A (quota 5/s, bursts of 5, from its Namespace) sends 50 events at once — ten
/// times its quota — while tenant B (the defaults) sends 20 a second: A's excess is
/// refused with 429 and `Retry-After` before anything is stored (exactly A's accepted
/// events are delivered), and B is never refused and keeps its latency.
#[tokio::test]
async fn a_tenants_own_quota_sheds_its_burst_and_leaves_another_tenant_alone() {
    let ctx = TestContext::new("quota").await;
    ctx.annotate(&[("herald.dev/api-rate", "5"), ("herald.dev/api-burst", "5")])
        .await;
    let stop_operator = herald_e2e::start_operator(env(), &ctx.namespace, &[]);
    let dp = DataPlane::new(env().nats().await).await;
    let key = BucketKey::Tenant(ctx.namespace.clone()).to_string();
    let policy = eventually(
        "the operator publishing the tenant policy",
        WAIT,
        || async {
            let value = dp.config.get(&key).await.ok()??;
            serde_json::from_slice::<TenantPolicy>(&value).ok()
        },
    )
    .await;
    assert_eq!((policy.api_rate, policy.api_burst), (Some(5), Some(5)));

    let rx = Receiver::start().await;
    let other = unique_name("quota-other");
    for (ns, path) in [(ctx.namespace.as_str(), "a"), (other.as_str(), "b")] {
        dp.put_keys(ns, "signing", &[TEST_SECRET]).await;
        let config = endpoint(ns, path, json!({"url": rx.url(path)}));
        dp.put_endpoint(&config).await;
        until_applied(shared_dispatcher(env()), &config).await;
    }
    // B's default is well above its 20 events/s.
    let api = ApiProcess::start(&[
        "--insecure-dev-no-auth",
        "--rate-per-namespace",
        "100",
        "--burst-per-namespace",
        "100",
    ])
    .await;
    let post = async |ns: &str, n: i64| {
        let body = serde_json::to_vec(&json!({"type": "tick", "data": n})).unwrap();
        let path = format!("/v1/namespaces/{ns}/events");
        let key = format!("{ns}-{n}");
        api.send(
            Method::POST,
            &path,
            None,
            Some(body),
            &[("Idempotency-Key", &key)],
        )
        .await
    };

    // Warm: the first delivery also waits for this process's dispatcher to take the
    // shards over from the previous test process's.
    let (status, body) = post(&other, -1).await;
    assert_eq!(status, 202, "{body}");
    eventually("tenant B's first event", WAIT, || async {
        rx.received("b").into_iter().next()
    })
    .await;

    let burst = async {
        let started = Instant::now();
        let answers = join_all((0..50).map(|n| post(&ctx.namespace, n))).await;
        (answers, started.elapsed())
    };
    let steady = async {
        let mut accepted = HashMap::new();
        for n in 0..40 {
            let (status, body) = post(&other, n).await;
            assert_eq!(status, 202, "tenant B refused: {body}");
            accepted.insert(n, Instant::now());
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        accepted
    };
    let ((answers, took), accepted_b) = tokio::join!(burst, steady);
    let accepted_a: Vec<i64> = answers
        .iter()
        .zip(0..)
        .filter(|((status, _), _)| *status == 202)
        .map(|(_, n)| n)
        .collect();
    let refused: Vec<_> = answers
        .iter()
        .filter(|(status, _)| *status == 429)
        .collect();
    println!(
        "tenant A: {} of 50 accepted in {:.0} ms, {} refused",
        accepted_a.len(),
        took.as_secs_f64() * 1e3,
        refused.len()
    );
    assert_eq!(accepted_a.len() + refused.len(), 50, "{answers:?}");
    // The burst, plus what the rate refilled while the requests arrived.
    let allowed = 5 + (5.0 * took.as_secs_f64()).ceil() as usize;
    assert!(
        (5..=allowed).contains(&accepted_a.len()),
        "tenant A had {} accepted, its quota allows {allowed}",
        accepted_a.len()
    );
    for (_, body) in &refused {
        assert_eq!(body["error"]["code"], "TooManyRequests", "{body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("5 requests/s"), "{message}");
    }

    // Exactly A's accepted events are delivered: nothing refused was stored.
    let got_a = eventually("tenant A's accepted events", WAIT, || async {
        let got = rx.received("a");
        (got.len() >= accepted_a.len()).then_some(got)
    })
    .await;
    let mut delivered_a: Vec<i64> = got_a
        .iter()
        .filter_map(|r| r.json()["data"].as_i64())
        .collect();
    delivered_a.sort();
    assert_eq!(delivered_a, accepted_a);
    // B: every event delivered (and the warm-up's); its latency from the accepted answer
    // to the request.
    let got_b = eventually("tenant B's events", WAIT, || async {
        let got = rx.received("b");
        (got.len() > 40).then_some(got)
    })
    .await;
    let mut ms: Vec<f64> = got_b
        .iter()
        .filter_map(|r| {
            let at = accepted_b.get(&r.json()["data"].as_i64()?)?;
            Some(r.at.saturating_duration_since(*at).as_secs_f64() * 1e3)
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    let p99 = ms[(ms.len() * 99 / 100).min(ms.len() - 1)];
    println!("tenant B: 40 of 40 accepted, p99 {p99:.1} ms from the answer to the request");
    // Loose for a debug build on a shared 2-core machine; A's refused requests cost B
    // nothing it could wait for.
    assert!(p99 < 250.0, "tenant B's p99 was {p99:.1} ms");
    let _ = stop_operator.send(());
    ctx.cleanup().await;
}
