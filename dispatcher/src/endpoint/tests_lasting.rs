//! State that must outlive the process, held endpoints, and a deleted endpoint's
//! leftovers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use herald_core::dataplane::{AttemptOutcome as Outcome, DisabledReason, Lane};
use herald_core::v1alpha1::{CircuitState, EndpointState as State};
use serde_json::json;

use super::Readiness;
use super::tests::{after, item, response, start, state};

#[test]
fn lasting_state_survives_a_restart() {
    let now = Instant::now();
    let mut s = state(json!({"circuitBreaker": {"failureThreshold": 1}}), false);
    assert_eq!(s.lasting(now, 0), None, "a healthy endpoint saves nothing");
    for seq in 1..=2 {
        s.lanes.queue(Lane::New).offer(item(seq, Lane::New), 64);
    }
    let a = start(&mut s, now).unwrap();
    let mut busy = response(Outcome::RateLimited, Some(429), 5);
    busy.retry_after = Some(Duration::from_secs(3));
    after(&mut s, a, &busy, now, 1_000);
    let saved = s
        .lasting(now, 1_000)
        .expect("failing, open, paused by the receiver");
    assert_eq!(saved.failing_since_ms, Some(1_000));
    assert_eq!(saved.circuit, Some(CircuitState::Open));
    assert_eq!(saved.retry_after_until_ms, Some(4_000));
    assert_eq!(saved.concurrency_limit, Some(2), "halved by the 429");

    // A new owner: fresh state, restored.
    let mut fresh = state(json!({"circuitBreaker": {"failureThreshold": 1}}), false);
    fresh.lanes.queue(Lane::New).offer(item(2, Lane::New), 64);
    fresh.restore(&saved, now, 2_000);
    assert_eq!(fresh.limit(), 2, "not four at once after the pause");
    assert_eq!(
        fresh.failing_since_ms(),
        Some(1_000),
        "the disableAfter clock goes on"
    );
    assert_eq!(
        fresh.readiness(now),
        Readiness::Until(now + Duration::from_secs(2)),
        "the receiver's Retry-After still holds"
    );
    let disabled = herald_core::dataplane::LastingState {
        uid: "u".into(),
        disabled_reason: Some(DisabledReason::Gone),
        disabled_message: Some("the receiver answered 410 Gone".into()),
        ..Default::default()
    };
    let mut again = state(json!({}), false);
    again.restore(&disabled, now, 0);
    assert_eq!(
        again.health(0).unwrap().state,
        Some(State::Disabled),
        "stays disabled"
    );
    let other = herald_core::dataplane::LastingState {
        uid: "another".into(),
        ..disabled
    };
    let mut recreated = state(json!({}), false);
    recreated.restore(&other, now, 0);
    assert!(
        recreated.disabled.is_none(),
        "a re-created endpoint starts afresh"
    );
}

#[test]
fn held_endpoints_deliver_nothing_and_keep_their_work() {
    let now = Instant::now();
    let mut s = state(json!({}), false);
    s.lanes.queue(Lane::New).offer(item(1, Lane::New), 64);
    let mut ep = (**s.ep.as_ref().unwrap()).clone_for_test();
    ep.config.held = Some(Box::new(herald_core::dataplane::Hold {
        reason: "SecretNotReady".into(),
        message: "typo".into(),
    }));
    s.configure(Some(Arc::new(ep)));
    assert_eq!(s.readiness(now), Readiness::Idle);
    assert_eq!(s.pending(), 1, "the backlog is kept");
    let mut ep = (**s.ep.as_ref().unwrap()).clone_for_test();
    ep.config.held = None;
    s.configure(Some(Arc::new(ep)));
    assert!(matches!(s.readiness(now), Readiness::Ready(_)));
}

#[test]
fn a_deleted_endpoints_leftovers_are_not_delivered_to_its_successor() {
    let now = Instant::now();
    let mut s = state(json!({}), false);
    let mut stale = item(1, Lane::New);
    stale.endpoint_uid = Some(herald_core::dataplane::fnv1a("old-uid".bytes()));
    let mut fresh = item(2, Lane::New);
    fresh.endpoint_uid = Some(herald_core::dataplane::fnv1a("u".bytes()));
    s.lanes.queue(Lane::New).offer(stale, 64);
    s.lanes.queue(Lane::New).offer(fresh, 64);
    let started = start(&mut s, now).unwrap();
    assert_eq!(started.seq, 2, "the old endpoint's message is skipped");
    assert_eq!(
        s.lanes.queue(Lane::New).low_water(),
        2,
        "and counts as done"
    );
}
