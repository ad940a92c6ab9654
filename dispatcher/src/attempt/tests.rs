use super::*;
use serde_json::json;

const HOUR: u64 = 3_600_000;

fn policy(delivery: serde_json::Value) -> DeliveryPolicy {
    serde_json::from_value(delivery).unwrap()
}

fn result(outcome: AttemptOutcome, status: Option<u16>) -> AttemptResult {
    AttemptResult {
        outcome,
        status,
        latency: Duration::from_millis(5),
        snippet: String::new(),
        retry_after: None,
        request_headers: Vec::new(),
        response_headers: Vec::new(),
    }
}

fn facts(policy: &DeliveryPolicy) -> Facts<'_> {
    Facts {
        policy,
        ordered: false,
        attempt: 1,
        first_attempt_ms: None,
        failing_since_ms: None,
        max_delay: Duration::from_secs(30 * 24 * 3600),
    }
}

fn retry(delay: u64, in_place: bool) -> Fate {
    Fate::Retry {
        delay: Duration::from_secs(delay),
        in_place,
    }
}

/// The table: (policy, facts change, outcome, status, Retry-After, now) → decision.
#[test]
fn decisions_by_outcome_status_attempt_and_time() {
    use AttemptOutcome::*;
    let schedule = policy(json!({"retry": {"schedule": ["10s", "1m"]},
                                 "finalStatusCodes": [400, 422]}));
    let gone = policy(json!({"retry": {"schedule": ["10s"]}}));
    let keep = policy(json!({"retry": {"schedule": ["10s"]}, "disableOnGone": false}));
    let t0 = 100 * HOUR;
    type Case<'a> = (
        &'a str,
        &'a DeliveryPolicy,
        fn(&mut Facts),
        AttemptOutcome,
        Option<u16>,
        Option<u64>,
        u64,
        Fate,
        Option<DisabledReason>,
    );
    let cases: Vec<Case> = vec![
        (
            "2xx is done",
            &schedule,
            |_| {},
            Success,
            Some(204),
            None,
            t0,
            Fate::Done,
            None,
        ),
        (
            "5xx retries on the schedule",
            &schedule,
            |_| {},
            HttpError,
            Some(500),
            None,
            t0,
            retry(10, false),
            None,
        ),
        (
            "the second retry takes the second step",
            &schedule,
            |f| f.attempt = 2,
            HttpError,
            Some(500),
            None,
            t0,
            retry(60, false),
            None,
        ),
        (
            "the schedule ends",
            &schedule,
            |f| f.attempt = 3,
            HttpError,
            Some(500),
            None,
            t0,
            Fate::Dead(DeadReason::RetriesExhausted),
            None,
        ),
        (
            "a final status is dead at once",
            &schedule,
            |_| {},
            HttpError,
            Some(422),
            None,
            t0,
            Fate::Dead(DeadReason::FinalStatus),
            None,
        ),
        (
            "404 is not final unless listed",
            &schedule,
            |_| {},
            HttpError,
            Some(404),
            None,
            t0,
            retry(10, false),
            None,
        ),
        (
            "timeouts retry",
            &schedule,
            |_| {},
            Timeout,
            None,
            None,
            t0,
            retry(10, false),
            None,
        ),
        (
            "connection errors retry",
            &schedule,
            |_| {},
            ConnectError,
            None,
            None,
            t0,
            retry(10, false),
            None,
        ),
        (
            "a redirect is a failure",
            &schedule,
            |_| {},
            Redirect,
            Some(302),
            None,
            t0,
            retry(10, false),
            None,
        ),
        (
            "Retry-After lengthens the delay",
            &schedule,
            |_| {},
            RateLimited,
            Some(429),
            Some(30),
            t0,
            retry(30, false),
            None,
        ),
        (
            "Retry-After never shortens it",
            &schedule,
            |_| {},
            RateLimited,
            Some(503),
            Some(1),
            t0,
            retry(10, false),
            None,
        ),
        (
            "ordered endpoints retry in place",
            &schedule,
            |f| f.ordered = true,
            HttpError,
            Some(500),
            None,
            t0,
            retry(10, true),
            None,
        ),
        (
            "410 disables and keeps the delivery",
            &gone,
            |_| {},
            Gone,
            Some(410),
            None,
            t0,
            retry(10, false),
            Some(DisabledReason::Gone),
        ),
        (
            "410 without disableOnGone only retries",
            &keep,
            |_| {},
            Gone,
            Some(410),
            None,
            t0,
            retry(10, false),
            None,
        ),
        (
            "72 h of failure disables",
            &schedule,
            |f| f.failing_since_ms = Some(28 * HOUR),
            HttpError,
            Some(500),
            None,
            t0,
            retry(10, false),
            Some(DisabledReason::SustainedFailure),
        ),
        (
            "71 h of failure does not",
            &schedule,
            |f| f.failing_since_ms = Some(29 * HOUR + 1),
            HttpError,
            Some(500),
            None,
            t0,
            retry(10, false),
            None,
        ),
        (
            "a success never disables",
            &schedule,
            |f| f.failing_since_ms = Some(0),
            Success,
            Some(200),
            None,
            t0,
            Fate::Done,
            None,
        ),
        (
            "retries never outlive the retention",
            &schedule,
            |f| f.max_delay = Duration::from_secs(3),
            HttpError,
            Some(500),
            None,
            t0,
            retry(3, false),
            None,
        ),
    ];
    for (name, policy, change, outcome, status, retry_after, now, fate, disable) in cases {
        let mut f = facts(policy);
        change(&mut f);
        let mut r = result(outcome, status);
        r.retry_after = retry_after.map(Duration::from_secs);
        assert_eq!(
            decide(&f, &r, now, 0.5),
            Decision { fate, disable },
            "{name}"
        );
    }
}

#[test]
fn the_exponential_deadline_counts_from_the_first_attempt() {
    let p =
        policy(json!({"retry": {"exponential": {"base": "1s", "cap": "1h", "deadline": "1h"}}}));
    let mut f = facts(&p);
    f.attempt = 5;
    f.first_attempt_ms = Some(0);
    let late = decide(&f, &result(AttemptOutcome::HttpError, Some(500)), HOUR, 0.5);
    assert_eq!(late.fate, Fate::Dead(DeadReason::RetriesExhausted));
    f.first_attempt_ms = Some(HOUR - 1000);
    let early = decide(&f, &result(AttemptOutcome::HttpError, Some(500)), HOUR, 0.5);
    assert_eq!(
        early.retry_delay(),
        Some(Duration::from_secs(8)),
        "jitter 0.5 of 16 s"
    );
}

#[test]
fn congestion_is_timeouts_rate_limits_and_5xx() {
    assert!(result(AttemptOutcome::Timeout, None).is_congestion());
    assert!(result(AttemptOutcome::RateLimited, Some(429)).is_congestion());
    assert!(result(AttemptOutcome::HttpError, Some(502)).is_congestion());
    assert!(!result(AttemptOutcome::HttpError, Some(404)).is_congestion());
    assert!(!result(AttemptOutcome::ConnectError, None).is_congestion());
}
