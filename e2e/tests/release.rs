//! A dispatcher holds delivery state only for endpoints with work, recent traffic or
//! state that must outlive them: a drained, quiet endpoint's is released
//! (`--release-idle-after`), shown by `herald_dispatcher_endpoint_states` on a dispatcher
//! process against the real NATS, and an endpoint whose state was released is delivered
//! to again like any other.

use std::time::Duration;

use herald_e2e::dataplane::{DataPlane, TEST_SECRET, endpoint, fast_retries};
use herald_e2e::faults::Dispatchers;
use herald_e2e::receiver::{Behavior, Receiver};
use herald_e2e::{eventually, free_port, private_env, unique_name};
use serde_json::json;

const DISPATCHER: &str = env!("CARGO_BIN_EXE_herald-test-dispatcher");
const WAIT: Duration = Duration::from_secs(90);
const HEALTHY: usize = 100;

/// The endpoint states the dispatcher holds, over all its shards.
async fn states(port: u16) -> Option<f64> {
    let text = herald_e2e::scrape_metrics(port).await?;
    let values: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with("herald_dispatcher_endpoint_states{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

#[tokio::test]
async fn a_drained_endpoints_state_is_released_and_it_is_delivered_to_again() {
    herald_dispatcher::install_crypto_provider();
    // An environment of its own: the count is exact, no other test's endpoints in it.
    let env = private_env();
    let dp = DataPlane::new(env.nats().await).await;
    let rx = Receiver::start().await;
    let ns = unique_name("release");
    dp.put_keys(&ns, "signing", &[TEST_SECRET]).await;
    let names: Vec<String> = (0..HEALTHY).map(|i| format!("e{i}")).collect();
    for name in &names {
        dp.put_endpoint(&endpoint(&ns, name, json!({"url": rx.url(name)})))
            .await;
    }
    // One failing endpoint: its failure clock must outlive any quiet.
    rx.behave("failing", Behavior::statuses(&[500]));
    let mut failing = endpoint(&ns, "failing", json!({"url": rx.url("failing")}));
    failing.delivery = std::sync::Arc::new(fast_retries(&["1h"]));
    dp.put_endpoint(&failing).await;

    let port = free_port();
    let mut dispatchers = Dispatchers::new(DISPATCHER, env.nats_url(), "release").with_args(&[
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--release-idle-after",
        "2s",
    ]);
    dispatchers.start("d0");

    dp.publish(&ns, "tick", json!(1)).await;
    let delivered = |round: usize| {
        let (rx, names) = (&rx, &names);
        async move {
            names
                .iter()
                .all(|name| rx.received(name).len() >= round)
                .then_some(())
        }
    };
    eventually("the first event at every healthy endpoint", WAIT, || {
        delivered(1)
    })
    .await;
    eventually("the failing endpoint attempted", WAIT, || async {
        (rx.request_count("failing") >= 1).then_some(())
    })
    .await;
    let held = eventually("the states counted", WAIT, || async {
        states(port).await.filter(|n| *n >= (HEALTHY + 1) as f64)
    })
    .await;
    println!("endpoint states while delivering: {held}");
    let left = eventually("the drained endpoints' states released", WAIT, || async {
        states(port).await.filter(|n| *n <= 1.0)
    })
    .await;
    assert_eq!(left, 1.0, "the failing endpoint's state is kept");

    // Released, not forgotten: the next event reaches every healthy endpoint again.
    dp.publish(&ns, "tick", json!(2)).await;
    eventually("the second event at every healthy endpoint", WAIT, || {
        delivered(2)
    })
    .await;
    for name in names.iter().chain([&"failing".to_owned()]) {
        dp.delete_endpoint(&ns, name).await;
    }
    dispatchers.stop_all().await;
}
