//! A backlog larger than what an endpoint's lane holds, against the real NATS, with the
//! dispatcher's lane budget (`--lane-buffer-bytes`) at zero: every lane keeps to its base
//! cap (twice `maxInFlight`), so the backlog is read back from JetStream by refills —
//! with the default budget a delivering endpoint buffers it instead (the other test
//! files). Either way each event arrives, once.

use std::time::Duration;

use herald_e2e::dataplane::{DataPlane, TEST_SECRET, endpoint, spawn_dispatcher, until_applied};
use herald_e2e::receiver::Receiver;
use herald_e2e::{env, eventually, unique_name};
use serde_json::json;

#[tokio::test]
async fn without_a_lane_budget_a_backlog_is_read_back_and_delivered_once() {
    const EVENTS: usize = 400;
    let index = Box::leak(Box::new(spawn_dispatcher(env(), |config| {
        config.lane_buffer_bytes = 0;
    })));
    let dp = DataPlane::new(env().nats().await).await;
    let rx = Receiver::start().await;
    let ns = unique_name("budget");
    dp.put_keys(&ns, "signing", &[TEST_SECRET]).await;
    // Two in flight: lanes of four items, a hundred times fewer than the backlog.
    let mut spec =
        json!({"url": rx.url("backlog"), "paused": true, "delivery": {"maxInFlight": 2}});
    let config = endpoint(&ns, "backlog", spec.clone());
    dp.put_endpoint(&config).await;
    until_applied(index, &config).await;
    for i in 0..EVENTS {
        dp.publish(&ns, "tick", json!(i)).await;
    }
    spec["paused"] = json!(false);
    let config = endpoint(&ns, "backlog", spec);
    dp.put_endpoint(&config).await;
    eventually(
        "the backlog delivered",
        Duration::from_secs(120),
        || async { (rx.distinct_count("backlog") >= EVENTS).then_some(()) },
    )
    .await;
    // Nothing more arrives: no event twice, none beyond the backlog.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(rx.distinct_count("backlog"), EVENTS);
    assert_eq!(rx.duplicate_count("backlog"), 0, "an event arrived twice");
    assert_eq!(rx.request_count("backlog"), EVENTS);
}
