//! Tenants share a dispatcher fairly, against the real NATS: the shard serves tenants in
//! turn before endpoints (docs/architecture.md, "Fairness"), and a tenant holds at most
//! its cap of a shard's attempts, so neither a tenant with many endpoints nor one with
//! slow endpoints takes the others' share.
//!
//! The dispatcher here has small pools so a test can fill them: 16 attempts per shard,
//! 12 per tenant. Each test keeps to a shard of its own (the tests of this file run at
//! the same time) and deletes its endpoints at the end, which purges what they still had
//! queued.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures::StreamExt;
use herald_core::dataplane::{
    DELIVERIES_STREAM, EndpointConfig, TenantPolicy, namespace_lanes_filter,
};
use herald_dispatcher::index::Index;
use herald_e2e::dataplane::{DataPlane, TEST_SECRET, endpoint, spawn_dispatcher, until_applied};
use herald_e2e::receiver::{Behavior, Receiver};
use herald_e2e::{TestContext, env, eventually, unique_name};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);
const PER_SHARD: usize = 16;
const PER_TENANT: usize = 12;

fn dispatcher() -> &'static Index {
    static DISPATCHER: OnceLock<Index> = OnceLock::new();
    DISPATCHER.get_or_init(|| {
        spawn_dispatcher(env(), |config| {
            config.limits.per_shard = PER_SHARD;
            config.limits.per_tenant = PER_TENANT;
        })
    })
}

/// Configures endpoints `(name, spec)` of tenant `ns` on `shard`, each delivering to the
/// receiver path of its name, and waits until the dispatcher has them.
async fn tenant(
    dp: &DataPlane,
    rx: &Receiver,
    ns: &str,
    shard: u32,
    endpoints: &[(String, serde_json::Value)],
) -> Vec<EndpointConfig> {
    dp.put_keys(ns, "signing", &[TEST_SECRET]).await;
    let mut configs = Vec::new();
    for (name, spec) in endpoints {
        let mut spec = spec.clone();
        spec["url"] = json!(rx.url(name));
        let mut config = endpoint(ns, name, spec);
        config.shard = shard;
        dp.put_endpoint(&config).await;
        configs.push(config);
    }
    for config in &configs {
        until_applied(dispatcher(), config).await;
    }
    configs
}

/// Deletes the tenant's endpoints and waits until the dispatcher purged their lanes.
async fn remove(dp: &DataPlane, ns: &str, configs: &[EndpointConfig]) {
    for config in configs {
        dp.delete_endpoint(ns, &config.name).await;
    }
    let js = jetstream::new(env().nats().await);
    let filter = |shard: u32| namespace_lanes_filter(shard, ns);
    eventually("the tenant's lanes purged", WAIT, || async {
        let stream = js.get_stream(DELIVERIES_STREAM).await.ok()?;
        let shard = configs.first()?.shard;
        let info = stream.info_with_subjects(filter(shard)).await.ok()?;
        let left: usize = info
            .fold(0, |sum, subject| async move {
                sum + subject.map_or(0, |(_, n)| n)
            })
            .await;
        (left == 0).then_some(())
    })
    .await;
}

/// Requests received on `paths` so far.
fn requests(rx: &Receiver, paths: &[String]) -> usize {
    paths.iter().map(|p| rx.request_count(p)).sum()
}

/// The tests of this file one at a time: each measures latency or shares, which a
/// neighbouring test's load on a 2-core machine would blur.
async fn one_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

/// A tenant with 1,000 endpoints and a tenant with one, both with more work than the
/// shard can do at once: each gets half of the shard's attempts (the ring used to turn
/// over endpoints, which gave the one endpoint 1/1,001 of the turns).
#[tokio::test]
async fn a_tenant_with_a_thousand_endpoints_and_a_tenant_with_one_share_a_shard_evenly() {
    let _serial = one_at_a_time().await;
    dispatcher();
    let dp = DataPlane::new(env().nats().await).await;
    let rx = Receiver::start().await;
    let slow = Behavior::delayed(Duration::from_millis(100));
    let (many, one) = (unique_name("many"), unique_name("one"));
    let paths_many: Vec<String> = (0..1000).map(|i| format!("m{i}")).collect();
    for path in paths_many.iter().chain([&"single".to_owned()]) {
        rx.behave(path, slow.clone());
    }
    let specs: Vec<_> = paths_many.iter().map(|p| (p.clone(), json!({}))).collect();
    let configs_many = tenant(&dp, &rx, &many, 0, &specs).await;
    let single = [(
        "single".to_owned(),
        json!({"delivery": {"maxInFlight": 16}}),
    )];
    let configs_one = tenant(&dp, &rx, &one, 0, &single).await;

    // Two events for each of the 1,000 endpoints, 1,500 for the single one.
    for i in 0..2 {
        dp.publish(&many, "tick", json!(i)).await;
    }
    for i in 0..1500 {
        dp.publish(&one, "tick", json!(i)).await;
    }
    // The single endpoint's concurrency limit grows from its start value with successes.
    eventually("both tenants delivering", WAIT, || async {
        let busy = rx.request_count("single") >= 150 && requests(&rx, &paths_many) > 0;
        busy.then_some(())
    })
    .await;
    let single = ["single".to_owned()];
    let (many_before, one_before) = (requests(&rx, &paths_many), requests(&rx, &single));
    tokio::time::sleep(Duration::from_secs(6)).await;
    let got_many = requests(&rx, &paths_many) - many_before;
    let got_one = requests(&rx, &single) - one_before;
    let share = got_one as f64 / (got_many + got_one) as f64;
    println!("in 6 s: the tenant with 1,000 endpoints {got_many}, the tenant with one {got_one}");
    assert!(
        (0.35..=0.65).contains(&share),
        "the single endpoint's tenant got {:.0}% of the attempts ({got_one} of {})",
        share * 100.0,
        got_many + got_one
    );
    remove(&dp, &many, &configs_many).await;
    remove(&dp, &one, &configs_one).await;
}

/// Twenty endpoints of one tenant that answer only after 3 s, flooded with events, hold
/// at most the tenant's cap of the shard's attempts: another tenant's endpoint on the
/// same shard keeps its latency.
#[tokio::test]
async fn slow_endpoints_of_one_tenant_leave_another_tenants_latency_alone() {
    let _serial = one_at_a_time().await;
    dispatcher();
    let dp = DataPlane::new(env().nats().await).await;
    let rx = Receiver::start().await;
    let (slow, steady) = (unique_name("slow"), unique_name("steady"));
    let paths_slow: Vec<String> = (0..20).map(|i| format!("s{i}")).collect();
    for path in &paths_slow {
        rx.behave(path, Behavior::delayed(Duration::from_secs(3)));
    }
    let spec = json!({"delivery": {"maxInFlight": 64, "timeout": "10s"}});
    let specs: Vec<_> = paths_slow
        .iter()
        .map(|p| (p.clone(), spec.clone()))
        .collect();
    let configs_slow = tenant(&dp, &rx, &slow, 1, &specs).await;
    let configs_steady = tenant(&dp, &rx, &steady, 1, &[("t".to_owned(), json!({}))]).await;

    // The steady tenant's latency from the publish acknowledgement to the request.
    let mut next = 0i64;
    let mut published = HashMap::new();
    let mut p99 = async |count: i64| {
        let first = next;
        for _ in 0..count {
            dp.publish(&steady, "tick", json!(next)).await;
            published.insert(next, Instant::now());
            next += 1;
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let wanted = next;
        let got = eventually("the steady tenant's events", WAIT, || async {
            let got = rx.received("t");
            (got.len() as i64 >= wanted).then_some(got)
        })
        .await;
        let mut ms: Vec<f64> = got
            .iter()
            .filter_map(|r| {
                let n = r.json()["data"].as_i64()?;
                (n >= first).then(|| (r.at - published[&n]).as_secs_f64() * 1e3)
            })
            .collect();
        ms.sort_by(f64::total_cmp);
        ms[(ms.len() * 99 / 100).min(ms.len() - 1)]
    };
    let before = p99(40).await;
    // 40 events for each of the 20 slow endpoints: they would take 800 attempts at once.
    for i in 0..40 {
        dp.publish(&slow, "tick", json!(i)).await;
    }
    eventually("the slow tenant holding its cap", WAIT, || async {
        (requests(&rx, &paths_slow) >= PER_TENANT).then_some(())
    })
    .await;
    let during = p99(80).await;
    println!("steady tenant p99: {before:.1} ms alone, {during:.1} ms beside the slow tenant");
    // Without the cap the slow tenant holds all 16 slots and each steady request waits
    // up to 3 s for one (p99 near 3 s); a loose bound for a shared 2-core machine and a
    // debug build: at a load average of 8 the capped run measured 29.9 → 469 ms.
    assert!(
        during < before + 1000.0,
        "the steady tenant's p99 went from {before:.1} ms to {during:.1} ms"
    );
    remove(&dp, &slow, &configs_slow).await;
    remove(&dp, &steady, &configs_steady).await;
}

/// A Namespace's annotations set its tenant's share: the operator publishes them as the
/// tenant's policy, the dispatchers apply it, and with `herald.dev/weight: "3"` the
/// tenant gets three attempts for each of another's (within its cap). An annotation that
/// does not parse is left out.
#[tokio::test]
async fn a_namespace_weight_gives_its_tenant_that_many_turns() {
    let _serial = one_at_a_time().await;
    let index = dispatcher();
    let ctx = TestContext::new("weighted").await;
    ctx.annotate(&[
        ("herald.dev/weight", "3"),
        ("herald.dev/max-in-flight", "many"),
    ])
    .await;
    let stop_operator = herald_e2e::start_operator(env(), &ctx.namespace, &[]);
    let want = TenantPolicy {
        weight: Some(3),
        ..TenantPolicy::default()
    };
    eventually(
        "the dispatcher applying the tenant policy",
        WAIT,
        || async { (index.tenant(&ctx.namespace) == Some(want)).then_some(()) },
    )
    .await;

    let dp = DataPlane::new(env().nats().await).await;
    let rx = Receiver::start().await;
    let light = unique_name("light");
    let spec = json!({"delivery": {"maxInFlight": 16}});
    // Slow enough that the shard's slots, not the CPU, bound what is delivered: with
    // 100 ms, a machine at a load average of 8 delivered 57 a second, far from the 160 of
    // 16 slots, and both tenants got all they asked for (49 %). At 300 ms the slots allow
    // 53 a second.
    for path in ["heavy", "light"] {
        rx.behave(path, Behavior::delayed(Duration::from_millis(300)));
    }
    let heavy_cfg = tenant(
        &dp,
        &rx,
        &ctx.namespace,
        2,
        &[("heavy".into(), spec.clone())],
    )
    .await;
    let light_cfg = tenant(&dp, &rx, &light, 2, &[("light".into(), spec)]).await;
    for i in 0..800 {
        dp.publish(&ctx.namespace, "tick", json!(i)).await;
        dp.publish(&light, "tick", json!(i)).await;
    }
    eventually("both tenants delivering", WAIT, || async {
        let busy = rx.request_count("heavy") >= 100 && rx.request_count("light") >= 30;
        busy.then_some(())
    })
    .await;
    let (heavy_before, light_before) = (rx.request_count("heavy"), rx.request_count("light"));
    tokio::time::sleep(Duration::from_secs(5)).await;
    let heavy = rx.request_count("heavy") - heavy_before;
    let light_got = rx.request_count("light") - light_before;
    let share = heavy as f64 / (heavy + light_got) as f64;
    println!("in 5 s: the tenant of weight 3 {heavy}, the other {light_got}");
    // Three turns for one, within the weighted tenant's cap of 12 of the 16 slots: 75 %
    // (equal weights share the shard evenly, see the test above).
    assert!(
        (0.65..=0.85).contains(&share),
        "the weighted tenant got {:.0}% ({heavy} of {})",
        share * 100.0,
        heavy + light_got
    );
    remove(&dp, &ctx.namespace, &heavy_cfg).await;
    remove(&dp, &light, &light_cfg).await;
    let _ = stop_operator.send(());
    ctx.cleanup().await;
}
