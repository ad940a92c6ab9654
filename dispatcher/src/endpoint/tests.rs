use std::time::{Duration, Instant};

use bytes::Bytes;
use herald_core::dataplane::{EndpointConfig, Lane};
use herald_core::v1alpha1::{CircuitState, DeliveryPolicy, EndpointState as State};
use serde_json::json;

use super::*;
use crate::attempt::{AttemptResult, Decision, Fate};
use crate::index::Endpoint;
use herald_core::dataplane::{AttemptOutcome as Outcome, DisabledReason};

/// An endpoint built from a JSON delivery policy, with a key so it may deliver.
pub(super) fn state(delivery: serde_json::Value, ordered: bool) -> EndpointState {
    state_keyed(delivery, ordered, None)
}

/// Like [`state`], ordered by the JSON pointer `ordering_key` when given.
pub(super) fn state_keyed(
    delivery: serde_json::Value,
    ordered: bool,
    ordering_key: Option<&str>,
) -> EndpointState {
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
        ordering_key: ordering_key.map(Into::into),
        paused: false,
        delivery: Arc::new(delivery),
        headers: vec![],
        tls: None,
        shard: 0,
        enable_token: None,
        held: None,
        verify: false,
        credentials: None,
    };
    let ep = Endpoint::compile_for_test(config);
    let key =
        herald_core::signing::SigningKey::from_whsec("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
            .unwrap();
    EndpointState::new(Some(Arc::new(ep)), Some(Arc::from(vec![key])))
}

pub(super) fn item(seq: u64, lane: Lane) -> Item {
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
        endpoint_uid: None,
        replay: None,
    }
}

pub(super) fn done() -> Decision {
    Decision {
        fate: Fate::Done,
        disable: None,
    }
}

pub(super) fn retry(delay: Duration) -> Decision {
    Decision {
        fate: Fate::Retry {
            delay,
            in_place: false,
        },
        disable: None,
    }
}

pub(super) fn in_place(delay: Duration) -> Decision {
    Decision {
        fate: Fate::Retry {
            delay,
            in_place: true,
        },
        disable: None,
    }
}

/// What the shard does after an attempt: decide from the endpoint's facts, then finish.
pub(super) fn after(
    s: &mut EndpointState,
    item: Item,
    result: &AttemptResult,
    now: Instant,
    now_ms: u64,
) -> super::Finished {
    let ep = s.ep.clone().unwrap();
    let facts = crate::attempt::Facts {
        policy: &ep.config.delivery,
        ordered: ep.config.ordered,
        attempt: item.attempt,
        first_attempt_ms: item.first_attempt_ms,
        failing_since_ms: s.failing_since_ms(),
        max_delay: Duration::from_secs(30 * 86_400),
    };
    let decision = crate::attempt::decide(&facts, result, now_ms, 0.5);
    s.finish(item, result, &decision, now, now_ms)
}

pub(super) fn response(outcome: Outcome, status: Option<u16>, latency_ms: u64) -> AttemptResult {
    AttemptResult {
        outcome,
        status,
        latency: Duration::from_millis(latency_ms),
        snippet: String::new(),
        retry_after: None,
        request_headers: Vec::new(),
        response_headers: Vec::new(),
    }
}

pub(super) fn ok() -> AttemptResult {
    response(Outcome::Success, Some(200), 5)
}

pub(super) fn fail() -> AttemptResult {
    response(Outcome::HttpError, Some(500), 5)
}

/// Starts one attempt from whichever lane is ready.
pub(super) fn start(s: &mut EndpointState, now: Instant) -> Option<Item> {
    match s.readiness(now) {
        Readiness::Ready(lane) => s.start(lane, now, &|_| false),
        _ => None,
    }
}

#[test]
fn concurrency_starts_small_grows_on_success_and_halves_on_failure() {
    let now = Instant::now();
    let mut s = state(json!({"maxInFlight": 10}), false);
    for seq in 1..=40 {
        s.lanes.queue(Lane::New).offer(item(seq, Lane::New), 64);
    }
    assert_eq!(s.limit(), INITIAL_LIMIT);
    let started: Vec<Item> = std::iter::from_fn(|| start(&mut s, now)).collect();
    assert_eq!(started.len(), 4, "the initial limit caps what is in flight");
    for item in started {
        s.finish(item, &ok(), &done(), now, 0);
    }
    assert_eq!(s.limit(), 5, "a window of successes adds one");
    let item = start(&mut s, now).unwrap();
    s.finish(item, &fail(), &retry(Duration::from_secs(1)), now, 0);
    assert_eq!(s.limit(), 2, "a 5xx halves the limit");
    // Never above maxInFlight.
    for _ in 0..200 {
        let Some(item) = start(&mut s, now) else {
            break;
        };
        s.finish(item, &ok(), &done(), now, 0);
        let next = item_clone_seq(&s);
        s.lanes.queue(Lane::New).offer(next, 64);
    }
    assert!(s.limit() <= 10);
}

fn item_clone_seq(s: &EndpointState) -> Item {
    item(s.lanes.queue_ref(Lane::New).last_seen() + 1, Lane::New)
}

#[test]
fn slow_successes_lower_the_limit_before_anything_fails() {
    let now = Instant::now();
    let mut s = state(json!({"maxInFlight": 10, "timeout": "1s"}), false);
    s.limiter_mut().set(4);
    for seq in 1..=4 {
        s.lanes.queue(Lane::New).offer(item(seq, Lane::New), 64);
    }
    let started: Vec<Item> = std::iter::from_fn(|| start(&mut s, now)).collect();
    for item in started {
        s.finish(
            item,
            &response(Outcome::Success, Some(200), 900),
            &done(),
            now,
            0,
        );
    }
    assert_eq!(s.limit(), 3);
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
        s.lanes.queue(Lane::New).offer(item(seq, Lane::New), 64);
    }
    for _ in 0..3 {
        let item = start(&mut s, now).unwrap();
        s.finish(item, &fail(), &retry(Duration::from_secs(1)), now, 0);
    }
    assert_eq!(s.circuit(), CircuitState::Open);
    assert_eq!(
        s.readiness(now),
        Readiness::Until(now + Duration::from_secs(30))
    );
    let later = now + Duration::from_secs(31);
    let probe = start(&mut s, later).expect("one probe after the interval");
    assert_eq!(s.circuit(), CircuitState::HalfOpen);
    assert_eq!(
        s.readiness(later),
        Readiness::Idle,
        "only one probe at a time"
    );
    s.finish(probe, &ok(), &done(), later, 0);
    assert_eq!(s.circuit(), CircuitState::Closed);
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
        s.lanes.queue(Lane::New).offer(item(seq, Lane::New), 64);
    }
    let first = start(&mut s, now).unwrap();
    s.finish(first, &fail(), &retry(Duration::from_secs(1)), now, 0);
    let t = now + Duration::from_secs(11);
    let probe = start(&mut s, t).unwrap();
    s.finish(probe, &fail(), &retry(Duration::from_secs(1)), t, 0);
    assert_eq!(s.circuit(), CircuitState::Open);
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
        s.lanes.queue(Lane::New).offer(item(seq, Lane::New), 64);
    }
    let item = start(&mut s, now).unwrap();
    let mut busy = response(Outcome::RateLimited, Some(429), 5);
    busy.retry_after = Some(Duration::from_secs(20));
    s.finish(item, &busy, &retry(Duration::from_secs(20)), now, 0);
    assert_eq!(
        s.readiness(now),
        Readiness::Until(now + Duration::from_secs(20))
    );
}

#[test]
fn lanes_alternate_so_retries_share_capacity_with_fresh_events() {
    let now = Instant::now();
    let mut s = state(json!({"maxInFlight": 100}), false);
    s.limiter_mut().set(100);
    for seq in 1..=4 {
        s.lanes.queue(Lane::New).offer(item(seq, Lane::New), 64);
        s.lanes
            .queue(Lane::Retry)
            .offer(item(100 + seq, Lane::Retry), 64);
    }
    let lanes: Vec<Lane> = std::iter::from_fn(|| start(&mut s, now))
        .map(|i| i.lane)
        .collect();
    assert_eq!(lanes.len(), 8);
    assert!(lanes.windows(2).all(|w| w[0] != w[1]), "{lanes:?}");
}

#[test]
fn the_low_water_mark_waits_for_the_oldest_in_flight_item() {
    let now = Instant::now();
    let mut s = state(json!({}), false);
    for seq in 1..=3 {
        s.lanes.queue(Lane::New).offer(item(seq, Lane::New), 64);
    }
    let a = start(&mut s, now).unwrap();
    let b = start(&mut s, now).unwrap();
    let c = start(&mut s, now).unwrap();
    s.finish(b, &ok(), &done(), now, 0);
    s.finish(c, &ok(), &done(), now, 0);
    assert_eq!(
        s.lanes.queue(Lane::New).purge_point(),
        Some(1),
        "nothing below 1 is done yet"
    );
    s.finish(a, &ok(), &done(), now, 0);
    assert_eq!(s.lanes.queue(Lane::New).purge_point(), Some(4));
    assert_eq!(
        s.lanes.queue(Lane::New).purge_point(),
        None,
        "already purged"
    );
}

#[test]
fn ordered_endpoints_keep_one_in_flight_and_retry_the_head_in_place() {
    let now = Instant::now();
    let mut s = state(json!({"maxInFlight": 10}), true);
    for seq in 1..=3 {
        s.lanes.queue(Lane::New).offer(item(seq, Lane::New), 64);
    }
    let head = start(&mut s, now).unwrap();
    assert_eq!(s.readiness(now), Readiness::Idle, "one in flight");
    s.finish(head, &fail(), &in_place(Duration::from_secs(5)), now, 0);
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
        s.lanes.queue(Lane::New).offer(item(seq, Lane::New), 64);
    }
    let a = start(&mut s, now).unwrap();
    after(&mut s, a, &fail(), now, 0);
    assert!(s.disabled.is_none());
    let b = start(&mut s, now).unwrap();
    after(&mut s, b, &fail(), now, 3_600_000);
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
    gone.lanes.queue(Lane::New).offer(item(1, Lane::New), 64);
    let a = start(&mut gone, now).unwrap();
    after(&mut gone, a, &response(Outcome::Gone, Some(410), 5), now, 0);
    assert_eq!(gone.disabled.as_ref().unwrap().reason, DisabledReason::Gone);
}

#[test]
fn an_attempts_end_says_what_the_shard_must_do() {
    let now = Instant::now();
    let mut s = state(json!({"disableAfter": "1h"}), false);
    for seq in 1..=5 {
        s.lanes.queue(Lane::New).offer(item(seq, Lane::New), 64);
    }
    let next = start(&mut s, now).unwrap();
    let healthy = after(&mut s, next, &ok(), now, 0);
    assert!(
        !healthy.save_lasting && !healthy.disabled,
        "nothing to save"
    );
    assert_eq!(&*healthy.record.event_id, "msg_1");
    let next = start(&mut s, now).unwrap();
    let failed = after(&mut s, next, &fail(), now, 0);
    assert!(
        failed.save_lasting && !failed.disabled,
        "the failure clock started"
    );
    let next = start(&mut s, now).unwrap();
    let disabling = after(&mut s, next, &fail(), now, 3_600_000);
    assert!(
        disabling.save_lasting && disabling.disabled,
        "disabled: report at once"
    );
    let mut ep = (**s.ep.as_ref().unwrap()).clone_for_test();
    ep.config.enable_token = Some("1".into());
    assert!(
        s.configure(Some(Arc::new(ep))),
        "re-enabled (the shard saves that itself)"
    );
    let next = start(&mut s, now).unwrap();
    let failed = after(&mut s, next, &fail(), now, 3_600_001);
    assert!(failed.save_lasting);
    let next = start(&mut s, now).unwrap();
    let recovered = after(&mut s, next, &ok(), now, 3_600_002);
    assert!(
        recovered.save_lasting && !recovered.disabled,
        "a success after failures clears what was saved"
    );
}

#[test]
fn a_rate_limit_spaces_attempts() {
    let now = Instant::now();
    let mut s = state(
        json!({"maxInFlight": 100, "rateLimit": {"perSecond": 2, "burst": 2}}),
        false,
    );
    s.limiter_mut().set(100);
    for seq in 1..=5 {
        s.lanes.queue(Lane::New).offer(item(seq, Lane::New), 64);
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
    let mut s = state_keyed(json!({"maxInFlight": 10}), true, Some("/data/k"));
    s.limiter_mut().set(10);
    // Keys: a b a c b
    for (seq, key) in [(1, 1), (2, 2), (3, 1), (4, 3), (5, 2)] {
        let mut it = item(seq, Lane::New);
        it.ordering_key = Some(key);
        s.lanes.queue(Lane::New).offer(it, 64);
    }
    let first: Vec<u64> = std::iter::from_fn(|| start(&mut s, now))
        .map(|i| i.seq)
        .collect();
    assert_eq!(first, [1, 2, 4], "one per key, the oldest of each");
    // Key 1's head fails and is retried in place; key 1's next event waits for it.
    let mut head = item(1, Lane::New);
    head.ordering_key = Some(1);
    s.finish(head, &fail(), &in_place(Duration::from_secs(5)), now, 0);
    assert_eq!(
        s.readiness(now),
        Readiness::Until(now + Duration::from_secs(5))
    );
    let mut b = item(2, Lane::New);
    b.ordering_key = Some(2);
    s.finish(b, &ok(), &done(), now, 0);
    let next = start(&mut s, now).unwrap();
    assert_eq!(next.seq, 5, "key 2 goes on while key 1 waits");
    let retried = start(&mut s, now + Duration::from_secs(5)).unwrap();
    assert_eq!((retried.seq, retried.attempt), (1, 2));
}

#[test]
fn a_drained_quiet_healthy_endpoint_may_be_released_and_nothing_else() {
    let quiet = Duration::from_secs(120);
    let now = Instant::now();
    let mut s = state(json!({}), false);
    assert!(s.releasable(now, quiet), "never used");
    s.lanes.queue(Lane::New).offer(item(1, Lane::New), 64);
    assert!(!s.releasable(now, quiet), "work queued");
    let first = start(&mut s, now).unwrap();
    assert!(!s.releasable(now, quiet), "in flight");
    after(&mut s, first, &ok(), now, 0);
    assert!(s.is_idle());
    assert!(!s.releasable(now + quiet / 2, quiet), "not quiet yet");
    assert!(s.releasable(now + quiet, quiet), "drained and quiet");

    // Failing: its failure clock must outlive the quiet.
    s.lanes.queue(Lane::New).offer(item(2, Lane::New), 64);
    let later = now + quiet;
    let failing = start(&mut s, later).unwrap();
    after(&mut s, failing, &fail(), later, 0);
    let much_later = later + quiet * 10;
    assert!(!s.releasable(much_later, quiet), "a retry scheduled");
    // (its message arrived and was taken back out of the lane: only the failure is left)
    s.retry_arrived();
    assert!(s.is_idle());
    assert!(!s.releasable(much_later, quiet), "failing");

    // A Retry-After in force.
    let mut s = state(json!({}), false);
    s.lanes.queue(Lane::New).offer(item(3, Lane::New), 64);
    let busy_item = start(&mut s, now).unwrap();
    let mut busy = response(Outcome::RateLimited, Some(429), 5);
    busy.retry_after = Some(quiet * 2);
    s.finish(busy_item, &busy, &retry(quiet * 2), now, 0);
    s.retry_arrived();
    assert!(!s.releasable(now + quiet, quiet), "Retry-After in force");
}
