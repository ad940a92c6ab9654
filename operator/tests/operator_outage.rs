//! The operator in an API server outage, the way a user meets one: the API server is
//! unreachable for 60 s — four times the Lease duration used here. The operator must not
//! exit (under Kubernetes that is a crash loop whose back-off freezes status for minutes
//! after the API returns); it steps down to standby in-process once its Lease could have
//! expired, leads again when the API is back, and status catches up within seconds.

mod support;

use std::time::{Duration, Instant};

use herald_core::dataplane::{EndpointHealth, EndpointKey};
use herald_core::v1alpha1::WebhookEndpoint;
use herald_e2e::{TestContext, eventually, fault_lock, private_env};
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use serde_json::json;
use support::*;

const URL: &str = "https://127.0.0.1:8443/hook";
const BLACKOUT: Duration = Duration::from_secs(60);
/// "Within a few seconds" of the API's return.
const CATCH_UP: Duration = Duration::from_secs(10);

#[tokio::test]
async fn the_operator_survives_an_api_outage_and_catches_up_within_seconds() {
    let _faults = fault_lock().await;
    let env = private_env();
    let ctx = TestContext::new_in(env, "op-outage").await;
    let flags = [
        "--allow-network",
        "127.0.0.0/8",
        "--status-interval",
        "1s",
        "--lease-duration",
        "5s",
        "--lease-renew",
        "1s",
    ];
    let op = Operator::start_in(env, &ctx, "a", &flags);
    let (_, health_kv) = buckets(&ctx).await;
    create_secret(&ctx, "keys", json!({})).await;
    create_endpoint(&ctx, "before", URL, "keys").await;
    let uid = endpoint_ready(&ctx, "before", "True").await.uid().unwrap();

    env.blackout_apiserver(BLACKOUT.as_secs_f64());
    let dark = Instant::now();
    let endpoints = ctx.api::<WebhookEndpoint>();
    assert!(
        tokio::time::timeout(Duration::from_secs(2), endpoints.get("before"))
            .await
            .map_or(true, |r| r.is_err()),
        "the API server was reachable: the test proves nothing"
    );
    // Meanwhile the data plane reports (NATS is up): status must show it afterwards.
    let health = EndpointHealth {
        uid,
        state: Some(herald_core::v1alpha1::EndpointState::Active),
        success_permille: Some(987),
        ..Default::default()
    };
    let key = EndpointKey::new(&ctx.namespace, "before").config_key();
    health_kv
        .put(key, serde_json::to_vec(&health).unwrap().into())
        .await
        .unwrap();
    while dark.elapsed() < BLACKOUT {
        assert!(
            op.is_running(),
            "the operator exited {:?} into the outage",
            dark.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    eventually("the API server back", Duration::from_secs(30), || async {
        endpoints.get("before").await.ok()
    })
    .await;
    let back = Instant::now();
    assert!(op.is_running(), "the operator exited during the outage");
    create_endpoint(&ctx, "after", URL, "keys").await;
    eventually(
        "a new endpoint Ready after the outage",
        CATCH_UP,
        || async {
            let obj = endpoints.get("after").await.ok()?;
            let ready = condition(&obj.status?.conditions, "Ready")?.clone();
            (ready.status == "True").then_some(())
        },
    )
    .await;
    eventually(
        "health reported during the outage in status",
        CATCH_UP,
        || async {
            let status = endpoints.get("before").await.ok()?.status?;
            (status.success_rate.as_deref() == Some("98.7%")).then_some(())
        },
    )
    .await;
    eprintln!("caught up {:?} after the API returned", back.elapsed());
    let lease = ctx.api::<Lease>().get("herald-operator").await.unwrap();
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("a"),
        "leading again"
    );
    finish(ctx, vec![op]).await;
}
