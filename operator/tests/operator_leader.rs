//! Leader election: of several operators exactly one leads (holds the Lease and
//! reconciles); a standby takes over when the leader stops gracefully (at once) or dies
//! (within the lease duration plus one retry period).

mod support;

use std::time::{Duration, Instant};

use herald_e2e::{TestContext, eventually};
use k8s_openapi::api::coordination::v1::Lease;
use serde_json::json;
use support::*;

async fn holder(ctx: &TestContext) -> Option<String> {
    let lease = ctx.api::<Lease>().get_opt("herald-operator").await.ok()??;
    lease.spec?.holder_identity.filter(|h| !h.is_empty())
}

#[tokio::test]
async fn one_leader_and_failover_on_stop_and_on_crash() {
    let ctx = TestContext::new("op-leader").await;
    let allow = ["--allow-network", "127.0.0.0/8"];
    let mut ops = vec![
        Operator::start(&ctx, "op-a", &allow),
        Operator::start(&ctx, "op-b", &allow),
    ];
    let first = eventually("a leader", WAIT, || holder(&ctx)).await;
    assert!(first == "op-a" || first == "op-b", "{first}");
    // The leader reconciles.
    create_secret(&ctx, "keys", json!({})).await;
    create_endpoint(&ctx, "one", "https://127.0.0.1:8443/hook", "keys").await;
    endpoint_ready(&ctx, "one", "True").await;
    // It stays the only leader: the standby does not steal a renewed Lease.
    let lease = ctx.api::<Lease>().get("herald-operator").await.unwrap();
    let transitions = lease.spec.as_ref().and_then(|s| s.lease_transitions);
    assert_eq!(holder(&ctx).await.as_deref(), Some(first.as_str()));

    // Graceful stop: the Lease is released and the standby takes over quickly.
    let leader = ops.remove(ops.iter().position(|o| o.identity == first).unwrap());
    let stopped = Instant::now();
    leader.stop().await.expect("a graceful stop is Ok");
    let second = eventually("the standby takes over", WAIT, || async {
        holder(&ctx).await.filter(|h| *h != first)
    })
    .await;
    let graceful = stopped.elapsed();
    eprintln!("failover after graceful stop: {graceful:?}");
    assert!(graceful < Duration::from_secs(8), "{graceful:?}");
    let lease = ctx.api::<Lease>().get("herald-operator").await.unwrap();
    assert!(lease.spec.as_ref().and_then(|s| s.lease_transitions) > transitions);
    create_endpoint(&ctx, "two", "https://127.0.0.1:8443/hook", "keys").await;
    endpoint_ready(&ctx, "two", "True").await;

    // Crash: no release; a new standby takes over once the Lease expires (15 s).
    ops.push(Operator::start(&ctx, "op-c", &allow));
    let leader = ops.remove(ops.iter().position(|o| o.identity == second).unwrap());
    // Let the new standby observe the current Lease record first.
    eventually("op-c is a standby", WAIT, || async {
        (holder(&ctx).await.as_deref() == Some(second.as_str())).then_some(())
    })
    .await;
    let crashed = Instant::now();
    leader.crash();
    let third = eventually(
        "takeover after a crash",
        Duration::from_secs(45),
        || async { holder(&ctx).await.filter(|h| *h != second) },
    )
    .await;
    let crash = crashed.elapsed();
    eprintln!("failover after crash: {crash:?}");
    assert_eq!(third, "op-c");
    assert!(crash < Duration::from_secs(25), "{crash:?}");
    create_endpoint(&ctx, "three", "https://127.0.0.1:8443/hook", "keys").await;
    endpoint_ready(&ctx, "three", "True").await;
    finish(ctx, ops).await;
}
