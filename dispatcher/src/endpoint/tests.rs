use std::time::{Duration, Instant};

use bytes::Bytes;
use herald_core::dataplane::{EndpointConfig, Lane};
use herald_core::v1alpha1::{CircuitState, DeliveryPolicy, EndpointState as State};
use serde_json::json;

use super::*;
use crate::http::{Outcome, Response};
use crate::index::Endpoint;

/// An endpoint built from a JSON delivery policy, with a key so it may deliver.
fn state(delivery: serde_json::Value, ordered: bool) -> EndpointState {
    let delivery: DeliveryPolicy = serde_json::from_value(delivery).unwrap();
    let config = EndpointConfig {
        namespace: "shop".into(),
        name: "orders".into(),
        uid: "u".into(),
        generation: 1,
        url: "https://hooks.example.com/".into(),
        event_types: vec!["*".into()],
        secret: "s".into(),
        ordered,
        ordering_key: None,
        paused: false,
        delivery: Arc::new(delivery),
        headers: vec![],
        shard: 0,
        enable_token: None,
        held: None,
    };
    let ep = Endpoint::compile_for_test(config);
    let key =
        herald_core::signing::SigningKey::from_whsec("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
            .unwrap();
    EndpointState::new(Some(Arc::new(ep)), Some(Arc::from(vec![key])))
}

fn item(seq: u64, lane: Lane) -> Item {
    Item {
        seq,
        lane,
        event_id: format!("msg_{seq}").into(),
        body: Bytes::from_static(b"{}"),
        published_ms: 1000 + seq,
        attempt: 1,
        first_attempt_ms: None,
        not_before: None,
        ordering_key: None,
    }
}

fn response(outcome: Outcome, status: Option<u16>, latency_ms: u64) -> Response {
    Response {
        outcome,
        status,
        latency: Duration::from_millis(latency_ms),
        snippet: String::new(),
        retry_after: None,
    }
}

fn ok() -> Response {
    response(Outcome::Success, Some(200), 5)
}

fn fail() -> Response {
    response(Outcome::HttpError, Some(500), 5)
}

/// Starts one attempt from whichever lane is ready.
fn start(s: &mut EndpointState, now: Instant) -> Option<Item> {
    match s.readiness(now) {
        Readiness::Ready(lane) => s.start(lane, now),
        _ => None,
    }
}

#[test]
fn concurrency_starts_small_grows_on_success_and_halves_on_failure() {
    let now = Instant::now();
    let mut s = state(json!({"maxInFlight": 10}), false);
    for seq in 1..=40 {
        s.lane(Lane::New).offer(item(seq, Lane::New), 64);
    }
    assert_eq!(s.limit, INITIAL_LIMIT);
    let started: Vec<Item> = std::iter::from_fn(|| start(&mut s, now)).collect();
    assert_eq!(started.len(), 4, "the initial limit caps what is in flight");
    for item in started {
        s.finish(item, &ok(), Disposition::Done, now, 0);
    }
    assert_eq!(s.limit, 5, "a window of successes adds one");
    let item = start(&mut s, now).unwrap();
    s.finish(
        item,
        &fail(),
        Disposition::Scheduled(Duration::from_secs(1)),
        now,
        0,
    );
    assert_eq!(s.limit, 2, "a 5xx halves the limit");
    // Never above maxInFlight.
    for _ in 0..200 {
        let Some(item) = start(&mut s, now) else {
            break;
        };
        s.finish(item, &ok(), Disposition::Done, now, 0);
        let next = item_clone_seq(&s);
        s.lane(Lane::New).offer(next, 64);
    }
    assert!(s.limit <= 10);
}

fn item_clone_seq(s: &EndpointState) -> Item {
    item(s.lanes[0].last_seen() + 1, Lane::New)
}

#[test]
fn slow_successes_lower_the_limit_before_anything_fails() {
    let now = Instant::now();
    let mut s = state(json!({"maxInFlight": 10, "timeout": "1s"}), false);
    s.limit = 4;
    for seq in 1..=4 {
        s.lane(Lane::New).offer(item(seq, Lane::New), 64);
    }
    let started: Vec<Item> = std::iter::from_fn(|| start(&mut s, now)).collect();
    for item in started {
        s.finish(
            item,
            &response(Outcome::Success, Some(200), 900),
            Disposition::Done,
            now,
            0,
        );
    }
    assert_eq!(s.limit, 3);
    assert_eq!(
        s.health(0).unwrap().state,
        Some(State::Degraded),
        "p95 near the timeout"
    );
}

#[test]
fn the_circuit_opens_after_the_threshold_and_a_probe_closes_it() {
    let now = Instant::now();
    let mut s = state(
        json!({"circuitBreaker": {"failureThreshold": 3, "probeInterval": "30s"}}),
        false,
    );
    for seq in 1..=10 {
        s.lane(Lane::New).offer(item(seq, Lane::New), 64);
    }
    for _ in 0..3 {
        let item = start(&mut s, now).unwrap();
        s.finish(
            item,
            &fail(),
            Disposition::Scheduled(Duration::from_secs(1)),
            now,
            0,
        );
    }
    assert_eq!(s.circuit, CircuitState::Open);
    assert_eq!(
        s.readiness(now),
        Readiness::Until(now + Duration::from_secs(30))
    );
    let later = now + Duration::from_secs(31);
    let probe = start(&mut s, later).expect("one probe after the interval");
    assert_eq!(s.circuit, CircuitState::HalfOpen);
    assert_eq!(
        s.readiness(later),
        Readiness::Idle,
        "only one probe at a time"
    );
    s.finish(probe, &ok(), Disposition::Done, later, 0);
    assert_eq!(s.circuit, CircuitState::Closed);
    assert!(matches!(s.readiness(later), Readiness::Ready(_)));
}

#[test]
fn a_failed_probe_reopens_the_circuit() {
    let now = Instant::now();
    let mut s = state(
        json!({"circuitBreaker": {"failureThreshold": 1, "probeInterval": "10s"}}),
        false,
    );
    for seq in 1..=3 {
        s.lane(Lane::New).offer(item(seq, Lane::New), 64);
    }
    let first = start(&mut s, now).unwrap();
    s.finish(
        first,
        &fail(),
        Disposition::Scheduled(Duration::from_secs(1)),
        now,
        0,
    );
    let t = now + Duration::from_secs(11);
    let probe = start(&mut s, t).unwrap();
    s.finish(
        probe,
        &fail(),
        Disposition::Scheduled(Duration::from_secs(1)),
        t,
        0,
    );
    assert_eq!(s.circuit, CircuitState::Open);
    assert_eq!(
        s.readiness(t),
        Readiness::Until(t + Duration::from_secs(10))
    );
}

#[test]
fn retry_after_holds_the_endpoint() {
    let now = Instant::now();
    let mut s = state(json!({}), false);
    for seq in 1..=2 {
        s.lane(Lane::New).offer(item(seq, Lane::New), 64);
    }
    let item = start(&mut s, now).unwrap();
    let mut busy = response(Outcome::RateLimited, Some(429), 5);
    busy.retry_after = Some(Duration::from_secs(20));
    s.finish(
        item,
        &busy,
        Disposition::Scheduled(Duration::from_secs(20)),
        now,
        0,
    );
    assert_eq!(
        s.readiness(now),
        Readiness::Until(now + Duration::from_secs(20))
    );
}

#[test]
fn lanes_alternate_so_retries_share_capacity_with_fresh_events() {
    let now = Instant::now();
    let mut s = state(json!({"maxInFlight": 100}), false);
    s.limit = 100;
    for seq in 1..=4 {
        s.lane(Lane::New).offer(item(seq, Lane::New), 64);
        s.lane(Lane::Retry).offer(item(100 + seq, Lane::Retry), 64);
    }
    let lanes: Vec<Lane> = std::iter::from_fn(|| start(&mut s, now))
        .map(|i| i.lane)
        .collect();
    assert_eq!(lanes.len(), 8);
    assert!(lanes.windows(2).all(|w| w[0] != w[1]), "{lanes:?}");
}

#[test]
fn a_full_buffer_leaves_the_backlog_in_jetstream_and_refills_in_order() {
    let mut lane = LaneQueue::default();
    for seq in 1..=10 {
        lane.offer(item(seq, Lane::New), 4);
    }
    assert_eq!(lane.pending(), 10);
    assert_eq!(lane.low_water(), 1);
    // Nothing to refill while the buffer is more than half full.
    assert_eq!(lane.refill_from(4), None);
    for _ in 0..3 {
        lane.buf.pop_front();
    }
    assert_eq!(lane.refill_from(4), Some(5));
    assert_eq!(lane.refill_from(4), None, "one refill at a time");
    lane.refilled((5..=7).map(|s| item(s, Lane::New)).collect(), Some(8));
    let seqs: Vec<u64> = lane.buf.iter().map(|i| i.seq).collect();
    assert_eq!(seqs, [4, 5, 6, 7]);
    assert_eq!(lane.pending(), 7);
    assert_eq!(lane.low_water(), 4);
}

#[test]
fn the_low_water_mark_waits_for_the_oldest_in_flight_item() {
    let now = Instant::now();
    let mut s = state(json!({}), false);
    for seq in 1..=3 {
        s.lane(Lane::New).offer(item(seq, Lane::New), 64);
    }
    let a = start(&mut s, now).unwrap();
    let b = start(&mut s, now).unwrap();
    let c = start(&mut s, now).unwrap();
    s.finish(b, &ok(), Disposition::Done, now, 0);
    s.finish(c, &ok(), Disposition::Done, now, 0);
    assert_eq!(
        s.lane(Lane::New).purge_point(),
        Some(1),
        "nothing below 1 is done yet"
    );
    s.finish(a, &ok(), Disposition::Done, now, 0);
    assert_eq!(s.lane(Lane::New).purge_point(), Some(4));
    assert_eq!(s.lane(Lane::New).purge_point(), None, "already purged");
}

#[test]
fn ordered_endpoints_keep_one_in_flight_and_retry_the_head_in_place() {
    let now = Instant::now();
    let mut s = state(json!({"maxInFlight": 10}), true);
    for seq in 1..=3 {
        s.lane(Lane::New).offer(item(seq, Lane::New), 64);
    }
    let head = start(&mut s, now).unwrap();
    assert_eq!(s.readiness(now), Readiness::Idle, "one in flight");
    s.finish(
        head,
        &fail(),
        Disposition::Requeue(Duration::from_secs(5)),
        now,
        0,
    );
    assert_eq!(
        s.readiness(now),
        Readiness::Until(now + Duration::from_secs(5))
    );
    let again = start(&mut s, now + Duration::from_secs(5)).unwrap();
    assert_eq!(
        (again.seq, again.attempt),
        (1, 2),
        "the same event, next attempt, first"
    );
}

#[test]
fn gone_and_sustained_failure_disable_and_a_new_token_re_enables() {
    let now = Instant::now();
    let mut s = state(json!({"disableAfter": "1h"}), false);
    for seq in 1..=3 {
        s.lane(Lane::New).offer(item(seq, Lane::New), 64);
    }
    let a = start(&mut s, now).unwrap();
    s.finish(
        a,
        &fail(),
        Disposition::Scheduled(Duration::from_secs(1)),
        now,
        0,
    );
    assert!(s.disabled.is_none());
    let b = start(&mut s, now).unwrap();
    s.finish(
        b,
        &fail(),
        Disposition::Scheduled(Duration::from_secs(1)),
        now,
        3_600_000,
    );
    assert_eq!(
        s.disabled.as_ref().unwrap().reason,
        DisabledReason::SustainedFailure
    );
    assert_eq!(s.readiness(now), Readiness::Idle);
    assert_eq!(s.health(3_600_000).unwrap().state, Some(State::Disabled));

    let mut ep = (**s.ep.as_ref().unwrap()).clone_for_test();
    ep.config.enable_token = Some("1".into());
    assert!(
        s.configure(Some(Arc::new(ep))),
        "a new enable token re-enables"
    );
    assert!(matches!(s.readiness(now), Readiness::Ready(_)));

    let mut gone = state(json!({}), false);
    gone.lane(Lane::New).offer(item(1, Lane::New), 64);
    let a = start(&mut gone, now).unwrap();
    gone.finish(
        a,
        &response(Outcome::Gone, Some(410), 5),
        Disposition::Scheduled(Duration::from_secs(1)),
        now,
        0,
    );
    assert_eq!(gone.disabled.as_ref().unwrap().reason, DisabledReason::Gone);
}

#[test]
fn a_rate_limit_spaces_attempts() {
    let now = Instant::now();
    let mut s = state(
        json!({"maxInFlight": 100, "rateLimit": {"perSecond": 2, "burst": 2}}),
        false,
    );
    s.limit = 100;
    for seq in 1..=5 {
        s.lane(Lane::New).offer(item(seq, Lane::New), 64);
    }
    assert!(start(&mut s, now).is_some());
    assert!(start(&mut s, now).is_some());
    match s.readiness(now) {
        Readiness::Until(at) => assert_eq!(at - now, Duration::from_millis(500)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_idle_endpoint_is_small() {
    let s = state(json!({}), false);
    // The state itself, without the shared configuration it points to.
    assert!(
        std::mem::size_of_val(&s) < 1024,
        "{} bytes",
        std::mem::size_of_val(&s)
    );
}

#[test]
fn ordering_keys_run_in_parallel_and_stay_in_order_each() {
    let now = Instant::now();
    let mut s = state(json!({"maxInFlight": 10}), true);
    s.limit = 10;
    // Keys: a b a c b
    for (seq, key) in [(1, 1), (2, 2), (3, 1), (4, 3), (5, 2)] {
        let mut it = item(seq, Lane::New);
        it.ordering_key = Some(key);
        s.lane(Lane::New).offer(it, 64);
    }
    let first: Vec<u64> = std::iter::from_fn(|| start(&mut s, now))
        .map(|i| i.seq)
        .collect();
    assert_eq!(first, [1, 2, 4], "one per key, the oldest of each");
    // Key 1's head fails and is retried in place; key 1's next event waits for it.
    let mut head = item(1, Lane::New);
    head.ordering_key = Some(1);
    s.finish(
        head,
        &fail(),
        Disposition::Requeue(Duration::from_secs(5)),
        now,
        0,
    );
    assert_eq!(
        s.readiness(now),
        Readiness::Until(now + Duration::from_secs(5))
    );
    let mut b = item(2, Lane::New);
    b.ordering_key = Some(2);
    s.finish(b, &ok(), Disposition::Done, now, 0);
    let next = start(&mut s, now).unwrap();
    assert_eq!(next.seq, 5, "key 2 goes on while key 1 waits");
    let retried = start(&mut s, now + Duration::from_secs(5)).unwrap();
    assert_eq!((retried.seq, retried.attempt), (1, 2));
}
