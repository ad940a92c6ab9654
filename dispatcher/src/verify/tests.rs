use super::*;
use crate::attempt::AttemptResult;
use herald_core::dataplane::{AttemptOutcome, EndpointConfig};

fn endpoint(name: &str, url: &str, generation: i64) -> Arc<Endpoint> {
    let config: EndpointConfig = serde_json::from_value(serde_json::json!({
        "namespace": "shop", "name": name, "uid": "u1", "generation": generation,
        "url": url, "eventTypes": ["*"], "secret": "s", "delivery": {}, "shard": 0,
        "verify": true
    }))
    .unwrap();
    Arc::new(Endpoint::compile_for_test(config))
}

#[test]
fn challenges_go_at_once_then_back_off_and_start_over_on_a_new_url() {
    let t0 = Instant::now();
    let mut s = Schedule::default();
    let a = endpoint("a", "https://a.example/", 1);
    let key = EndpointKey::new("shop", "a");
    assert_eq!(s.due(std::slice::from_ref(&a), t0, 8).len(), 1);
    assert!(
        s.due(std::slice::from_ref(&a), t0, 8).is_empty(),
        "one in flight"
    );
    s.finished(&key, false, t0);
    assert!(
        s.due(std::slice::from_ref(&a), t0 + Duration::from_secs(4), 8)
            .is_empty()
    );
    assert_eq!(
        s.due(std::slice::from_ref(&a), t0 + Duration::from_secs(5), 8)
            .len(),
        1
    );
    s.finished(&key, false, t0 + Duration::from_secs(5));
    assert!(
        s.due(std::slice::from_ref(&a), t0 + Duration::from_secs(19), 8)
            .is_empty()
    );
    assert_eq!(
        s.due(std::slice::from_ref(&a), t0 + Duration::from_secs(20), 8)
            .len(),
        1
    );
    s.finished(&key, false, t0 + Duration::from_secs(20));
    // A new URL is challenged at once.
    let moved = endpoint("a", "https://b.example/", 2);
    assert_eq!(
        s.due(
            std::slice::from_ref(&moved),
            t0 + Duration::from_secs(21),
            8
        )
        .len(),
        1
    );
    s.finished(&key, true, t0 + Duration::from_secs(21));
    assert!(
        s.due(
            std::slice::from_ref(&moved),
            t0 + Duration::from_secs(60),
            8
        )
        .is_empty()
    );
    assert_eq!(s.due(&[moved], t0 + Duration::from_secs(81), 8).len(), 1);
}

#[test]
fn a_url_that_never_echoes_is_given_up_after_a_day_until_the_spec_changes() {
    let t0 = Instant::now();
    let mut s = Schedule::default();
    let a = endpoint("a", "https://a.example/", 1);
    let key = EndpointKey::new("shop", "a");
    let mut now = t0;
    let mut sent = 0;
    loop {
        if s.due(std::slice::from_ref(&a), now, 8).len() == 1 {
            sent += 1;
            if s.finished(&key, false, now) {
                break;
            }
        }
        now += Duration::from_secs(1);
        assert!(now < t0 + 2 * GIVE_UP_AFTER, "never gave up");
    }
    // 5 s, 15 s, 30 s, 1 min, then every 5 min for a day.
    assert!((285..=295).contains(&sent), "{sent} challenges in a day");
    assert!(s.due(&[a], now + GIVE_UP_AFTER, 8).is_empty(), "given up");
    let edited = endpoint("a", "https://a.example/", 2);
    assert_eq!(s.due(&[edited], now, 8).len(), 1, "an edit starts over");
}

#[test]
fn a_tenant_with_many_endpoints_cannot_hold_every_challenge_slot() {
    let t0 = Instant::now();
    let mut s = Schedule::default();
    let config = |ns: &str, name: &str| -> Arc<Endpoint> {
        let config: EndpointConfig = serde_json::from_value(serde_json::json!({
            "namespace": ns, "name": name, "uid": name, "generation": 1,
            "url": "https://slow.example/", "eventTypes": ["*"], "secret": "s",
            "delivery": {}, "shard": 0, "verify": true
        }))
        .unwrap();
        Arc::new(Endpoint::compile_for_test(config))
    };
    // The hostile tenant's 500 endpoints come first.
    let mut asking: Vec<_> = (0..500).map(|i| config("aaa", &format!("e{i}"))).collect();
    asking.push(config("zzz", "mine"));
    let due = s.due(&asking, t0, CONCURRENT);
    let of = |ns: &str| due.iter().filter(|e| e.config.namespace == ns).count();
    assert_eq!((of("aaa"), of("zzz")), (PER_TENANT, 1));
    // While those hang, the next round gives the hostile tenant nothing more.
    assert!(
        s.due(&asking, t0 + Duration::from_secs(1), CONCURRENT)
            .is_empty()
    );
}

#[test]
fn the_room_bounds_a_round_and_those_that_stop_asking_are_forgotten() {
    let t0 = Instant::now();
    let mut s = Schedule::default();
    let many: Vec<_> = (0..20)
        .map(|i| endpoint(&format!("e{i}"), "https://a.example/", 1))
        .collect();
    assert_eq!(s.due(&many, t0, 1).len(), 1);
    assert_eq!(s.due(&many, t0, 8).len(), PER_TENANT - 1, "one namespace");
    for i in 0..PER_TENANT {
        s.finished(&EndpointKey::new("shop", &format!("e{i}")), true, t0);
    }
    assert_eq!(s.due(&[], t0, 8).len(), 0);
    assert!(s.tracks.is_empty(), "none in flight, none asking");
    let failures = |n: usize| BACKOFF[n.min(BACKOFF.len() - 1)];
    assert_eq!(failures(9), Duration::from_secs(300));
}

#[test]
fn a_verdict_says_what_to_fix() {
    let answered = |status: u16, body: &str| AttemptResult {
        status: Some(status),
        snippet: body.into(),
        ..AttemptResult::failed(
            if (200..300).contains(&status) {
                AttemptOutcome::Success
            } else {
                AttemptOutcome::HttpError
            },
            Duration::ZERO,
            String::new(),
        )
    };
    assert_eq!(verdict(&answered(200, "hvc_1"), "hvc_1"), Ok(()));
    assert_eq!(
        verdict(&answered(200, r#"{"challenge":"hvc_1"}"#), "hvc_1"),
        Ok(())
    );
    let not_echoed = verdict(&answered(200, "ok"), "hvc_1").unwrap_err();
    assert!(not_echoed.contains("without echoing"), "{not_echoed}");
    assert_eq!(
        verdict(&answered(404, "hvc_1"), "hvc_1").unwrap_err(),
        "the receiver answered the challenge with 404"
    );
    let refused = AttemptResult::failed(
        AttemptOutcome::ConnectError,
        Duration::ZERO,
        "connect: connection refused".into(),
    );
    assert_eq!(
        verdict(&refused, "hvc_1").unwrap_err(),
        "the challenge was not answered: connect: connection refused"
    );
}
