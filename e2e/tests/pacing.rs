//! Recovery against a receiver's rate limiter, against the real NATS: a backlog drains at
//! the pace the receiver accepts, not in bursts it refuses (docs/architecture.md,
//! "Per-endpoint scheduling": the rate learned from refusals).

use std::time::{Duration, Instant};

use herald_e2e::dataplane::{DataPlane, TEST_SECRET, endpoint, shared_dispatcher, until_applied};
use herald_e2e::receiver::{Answer, Behavior, Receiver};
use herald_e2e::{env, eventually, unique_name};
use serde_json::json;

/// An endpoint whose receiver accepts 200 requests/s with bursts of 20 and answers 429
/// without `Retry-After` beyond that (what many real limiters do) gets a backlog of 3,000
/// events: it drains near the ideal 15 s with few refusals. Before the learned rate the
/// same run took 158 s, 23 % of the requests refused.
#[tokio::test]
async fn a_backlog_drains_at_the_pace_a_rate_limited_receiver_accepts() {
    drain(Behavior::rate_limited(200.0, 20.0)).await;
}

/// The same receiver answering its 429s with `Retry-After: 1`: the endpoint waits as
/// asked and then goes on at the pace the receiver accepted. Before, it came back at
/// full concurrency after every pause and tripped the limiter again: 142 s, 21 % of the
/// requests refused.
#[tokio::test]
async fn a_backlog_drains_at_the_pace_of_a_receiver_that_asks_for_pauses() {
    drain(Behavior::rate_limited_with_pause(200.0, 20.0, 1)).await;
}

/// A backlog of 3,000 events to a receiver that accepts 200 requests/s with bursts of 20
/// and answers `behavior`'s 429s beyond: under 5 % refused, within twice the ideal.
async fn drain(behavior: Behavior) {
    const EVENTS: usize = 3000;
    let index = shared_dispatcher(env());
    let dp = DataPlane::new(env().nats().await).await;
    let rx = Receiver::start().await;
    rx.behave("limited", behavior);
    let ns = unique_name("pacing");
    dp.put_keys(&ns, "signing", &[TEST_SECRET]).await;
    let mut spec = json!({"url": rx.url("limited"), "paused": true});
    let config = endpoint(&ns, "limited", spec.clone());
    dp.put_endpoint(&config).await;
    until_applied(index, &config).await;
    for i in 0..EVENTS {
        dp.publish(&ns, "tick", json!(i)).await;
    }
    // The backlog is stored; the endpoint comes back.
    spec["paused"] = json!(false);
    let config = endpoint(&ns, "limited", spec);
    dp.put_endpoint(&config).await;
    let started = Instant::now();
    eventually(
        "the backlog delivered",
        Duration::from_secs(120),
        || async { (rx.succeeded_ids("limited").len() >= EVENTS).then_some(()) },
    )
    .await;
    let took = started.elapsed();
    let requests = rx.request_count("limited");
    let refused = requests - EVENTS;
    let share = refused as f64 / requests as f64;
    let ideal = Duration::from_secs_f64((EVENTS as f64 - 20.0) / 200.0);
    println!(
        "{EVENTS} events drained in {:.1} s (ideal {:.1} s, {:.2}×); {refused} of {requests} requests refused ({:.1} %)",
        took.as_secs_f64(),
        ideal.as_secs_f64(),
        took.as_secs_f64() / ideal.as_secs_f64(),
        share * 100.0
    );
    // Requests and refusals per second of the drain, so a slow run shows its shape.
    let mut seconds: Vec<(usize, usize)> = Vec::new();
    for x in rx.exchanges("limited") {
        let second = x.at.saturating_duration_since(started).as_secs() as usize;
        if seconds.len() <= second {
            seconds.resize(second + 1, (0, 0));
        }
        seconds[second].0 += 1;
        if matches!(x.answer, Answer::Status(429)) {
            seconds[second].1 += 1;
        }
    }
    println!("requests (refused) per second: {seconds:?}");
    assert!(
        share < 0.05,
        "{:.1} % of the requests refused",
        share * 100.0
    );
    // The target is 1.5× (docs/benchmark.md measures it on a release build); a debug
    // build on a shared 2-core machine gets 2×.
    assert!(
        took < ideal * 2,
        "drained in {took:?}, more than twice the ideal {ideal:?}"
    );
}
