//! The pods start as rendered, deliver, stop in time, and survive a rolling upgrade.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_pods_start_as_rendered_deliver_and_stop_in_time() {
    herald_dispatcher::install_crypto_provider();
    let ctx = TestContext::new("chart-pods").await;
    let ns = ctx.namespace.clone();
    let release = Release::install(&ctx, "pods", &[]);
    let (deployment, statefulset) = (
        release.workload("Deployment"),
        release.workload("StatefulSet"),
    );
    assert_eq!(
        statefulset["spec"]["template"]["spec"]["automountServiceAccountToken"], false,
        "the dispatcher's pod gets no API credentials"
    );
    let mut operator = release.pod(&deployment, "0");
    let mut dispatcher = release.pod(&statefulset, "0");
    for pod in [&mut operator, &mut dispatcher] {
        pod.until_ready().await;
    }
    // A tenant's endpoint, reconciled by the operator with the chart's RBAC and served by
    // the dispatcher with the chart's settings.
    let rx = Receiver::start().await;
    tenant_endpoint(&ctx, &rx.url("orders")).await;
    let dp = DataPlane::new(env().nats().await).await;
    dp.publish(&ns, "order.created", json!({"id": 1})).await;
    let delivered = eventually("the event delivered", WAIT, || {
        let got = rx.received("orders");
        async move { got.first().cloned() }
    })
    .await;
    assert_eq!(delivered.json()["data"]["id"], 1);
    assert!(delivered.header("webhook-signature").starts_with("v1,"));

    for pod in [dispatcher, operator] {
        let (name, grace) = (pod.name.clone(), pod.termination_grace);
        let took = pod.terminate().await;
        println!("{name}: stopped {took:?} after SIGTERM (grace {grace:?})");
        assert!(took < grace, "{name} took {took:?}, its grace is {grace:?}");
    }
    release.uninstall();
    ctx.cleanup().await;
}

/// A rolling upgrade as Kubernetes performs it, while a producer publishes: `helm
/// upgrade` with new values, then the dispatcher StatefulSet's pods replaced one at a
/// time from the highest ordinal (each stopped with SIGTERM, its successor started from
/// the new rendering and ready before the next), and the operator Deployment surged (a
/// new pod ready before an old one stops). Every event is delivered; each pod stops
/// inside its grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_delivers_every_event() {
    herald_dispatcher::install_crypto_provider();
    let ctx = TestContext::new("chart-roll").await;
    let ns = ctx.namespace.clone();
    let release = Release::install(&ctx, "roll", &["dispatcher.replicas=2"]);
    let (deployment, statefulset) = (
        release.workload("Deployment"),
        release.workload("StatefulSet"),
    );
    let mut operators = vec![release.pod(&deployment, "a"), release.pod(&deployment, "b")];
    let mut dispatchers = vec![
        release.pod(&statefulset, "0"),
        release.pod(&statefulset, "1"),
    ];
    for pod in operators.iter_mut().chain(dispatchers.iter_mut()) {
        pod.until_ready().await;
    }
    let rx = Receiver::start().await;
    tenant_endpoint(&ctx, &rx.url("orders")).await;

    const EVENTS: i64 = 800;
    let dp = DataPlane::new(env().nats().await).await;
    let producer = tokio::spawn({
        let (dp, ns) = (dp.clone(), ns.clone());
        async move {
            for i in 0..EVENTS {
                dp.publish(&ns, "order.created", json!(i)).await;
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;

    release.helm(
        "upgrade",
        &[
            "dispatcher.replicas=2",
            "dispatcher.maxInFlightPerShard=512",
        ],
    );
    let statefulset = release.workload("StatefulSet");
    let env_of = |w: &Value| w["spec"]["template"]["spec"]["containers"][0]["env"].clone();
    assert!(
        env_of(&statefulset).to_string().contains("\"512\""),
        "the upgrade changes the dispatcher's environment"
    );
    assert!(
        !producer.is_finished(),
        "the rollout starts while events flow"
    );
    let mut stops = Vec::new();
    // StatefulSet: highest ordinal first, each successor ready before the next.
    for ordinal in (0..dispatchers.len()).rev() {
        let old = dispatchers.remove(ordinal);
        let (name, grace) = (old.name.clone(), old.termination_grace);
        stops.push((name, old.terminate().await, grace));
        let mut new = release.pod(&statefulset, &ordinal.to_string());
        new.until_ready().await;
        dispatchers.insert(ordinal, new);
    }
    println!(
        "dispatchers replaced while the producer {}",
        if producer.is_finished() {
            "had finished"
        } else {
            "was still publishing"
        }
    );
    // Deployment: surge one new pod, then stop one old.
    let deployment = release.workload("Deployment");
    for suffix in ["c", "d"] {
        let mut new = release.pod(&deployment, suffix);
        new.until_ready().await;
        let old = operators.remove(0);
        let (name, grace) = (old.name.clone(), old.termination_grace);
        stops.push((name, old.terminate().await, grace));
        operators.push(new);
    }
    producer.await.expect("the producer");

    if let Err(missing) = rx.until_numbered("orders", EVENTS, WAIT).await {
        panic!(
            "after the rollout, {} missing, e.g. {:?}",
            missing.len(),
            &missing[..missing.len().min(20)]
        );
    }
    let duplicates = rx.received("orders").len() as i64 - EVENTS;
    println!("rolling upgrade: {EVENTS} events delivered, {duplicates} duplicates");
    for (name, took, grace) in stops {
        println!("{name}: stopped {took:?} after SIGTERM (grace {grace:?})");
        assert!(took < grace, "{name} took {took:?}, its grace is {grace:?}");
    }
    for pod in operators.into_iter().chain(dispatchers) {
        pod.terminate().await;
    }
    release.uninstall();
    ctx.cleanup().await;
}
