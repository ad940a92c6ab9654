use super::*;
use herald_core::dataplane::{AttemptOutcome, event_id};

fn record(seq: u64, id: &str, attempt: u32, time_ms: u64, state: DeliveryState) -> Logged {
    Logged {
        seq,
        record: AttemptRecord {
            event_id: id.into(),
            attempt,
            time_ms,
            outcome: AttemptOutcome::of_status(if state == DeliveryState::Succeeded {
                200
            } else {
                500
            }),
            http_status: Some(if state == DeliveryState::Succeeded {
                200
            } else {
                500
            }),
            latency_ms: 7,
            response: String::new(),
            state,
            next_attempt_ms: (state == DeliveryState::Retrying).then_some(time_ms + 1000),
            dead_reason: None,
            replay: None,
            event_type: Some("order.created".into()),
            request_headers: Vec::new(),
            response_headers: Vec::new(),
        },
    }
}

fn queued(seq: u64, id: &str, published_ms: u64) -> Queued {
    Queued {
        seq,
        event_id: id.into(),
        event_type: Some("order.paid".into()),
        published_ms,
    }
}

/// The page a listing answers: everything folded as the handler folds it.
fn listed(records: &[Logged], at: &Cursor, filter: &Filter, limit: usize, now_ms: u64) -> Page {
    let mut fold = Fold::new(at, filter);
    for l in records.iter().cloned() {
        fold.record(l.seq, l.record);
    }
    fold.page(filter, 0, limit, now_ms)
}

fn at(attempts_seq: u64, lanes_seq: u64) -> Cursor {
    Cursor {
        attempts_seq,
        lanes_seq,
        after: None,
    }
}

#[test]
fn states_come_from_the_newest_record_and_what_is_queued() {
    let (a, b, c, d, e, f) = (
        event_id(1000, 1),
        event_id(1001, 2),
        event_id(1002, 3),
        event_id(1003, 4),
        event_id(1004, 5),
        event_id(1005, 6),
    );
    let records = vec![
        record(1, &a, 1, 2000, DeliveryState::Retrying),
        record(2, &a, 2, 3000, DeliveryState::Succeeded),
        record(3, &b, 1, 2000, DeliveryState::Retrying),
        record(4, &c, 1, 2000, DeliveryState::Dead),
        record(5, &d, 1, 9000, DeliveryState::Retrying),
    ];
    let lanes = vec![
        queued(1, &e, 1004),
        queued(2, &c, 5000),
        queued(3, &a, 1000),
    ];
    let list = summarize(records, lanes, &at(5, 3), 4000);
    let state = |id: &str| list.iter().find(|x| &*x.event_id == id).unwrap().clone();
    assert_eq!(state(&a).state, State::Succeeded.into());
    assert_eq!(state(&a).attempts, 2);
    assert_eq!(state(&a).last_status, Some(200));
    assert_eq!(state(&b).state, State::InFlight.into(), "its retry is due");
    assert_eq!(
        state(&c).state,
        State::InFlight.into(),
        "queued again after dying"
    );
    assert_eq!(state(&d).state, State::Retrying.into());
    assert_eq!(
        state(&d).next_attempt_time.as_ref().map(time::format),
        Some("1970-01-01T00:00:10.000Z".to_owned())
    );
    assert_eq!(state(&e).state, State::Pending.into());
    assert_eq!(state(&e).event_type.as_deref(), Some("order.paid"));
    assert!(list.iter().all(|x| *x.event_id != *f));
    let ids: Vec<_> = list.iter().map(|x| x.event_id.to_string()).collect();
    assert_eq!(ids, [e, d, c, b, a], "newest event first");
}

#[test]
fn pages_stay_stable_while_new_attempts_arrive() {
    let ids: Vec<String> = (0..10).map(|i| event_id(1000 + i, i + 1)).collect();
    let mut records: Vec<Logged> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| record(i as u64 + 1, id, 1, 2000, DeliveryState::Retrying))
        .collect();
    let first_at = at(10, 0);
    let filter = Filter {
        states: Some(vec![State::Retrying]),
        ..Default::default()
    };
    let first = listed(&records, &first_at, &filter, 4, 1500);
    // Meanwhile: every listed event succeeds, and a new event arrives.
    for (i, id) in ids.iter().enumerate() {
        records.push(record(20 + i as u64, id, 2, 2500, DeliveryState::Succeeded));
    }
    let newer = event_id(5000, 99);
    records.push(record(40, &newer, 1, 5001, DeliveryState::Retrying));
    let mut seen: Vec<String> = first.items.iter().map(|d| d.event_id.to_string()).collect();
    let mut next = first.next;
    while let Some(cursor) = next {
        let cursor = Cursor::decode(&cursor.encode()).unwrap();
        let p = listed(&records, &cursor, &filter, 4, 1500);
        seen.extend(p.items.iter().map(|d| d.event_id.to_string()));
        next = p.next;
    }
    let mut expected = ids.clone();
    expected.reverse();
    assert_eq!(seen, expected, "every event once, none new, in order");
}

#[test]
fn filters_by_type_pattern_status_and_time() {
    let (a, b) = (event_id(1000, 1), event_id(5000, 2));
    let mut rb = record(2, &b, 1, 6000, DeliveryState::Dead);
    rb.record.event_type = Some("invoice.sent".into());
    let records = [record(1, &a, 1, 2000, DeliveryState::Succeeded), rb];
    let pick = |filter: Filter| -> Vec<String> {
        listed(&records, &at(2, 0), &filter, 50, 7000)
            .items
            .iter()
            .map(|d| d.event_id.to_string())
            .collect()
    };
    assert_eq!(
        pick(Filter {
            event_type: Some("order.*".parse().unwrap()),
            ..Default::default()
        }),
        [a.as_str()]
    );
    assert_eq!(
        pick(Filter {
            states: Some(Filter::states("failed").unwrap()),
            ..Default::default()
        }),
        [b.as_str()]
    );
    assert_eq!(
        pick(Filter {
            since_ms: Some(2000),
            ..Default::default()
        }),
        [b.as_str()]
    );
    assert_eq!(
        pick(Filter {
            until_ms: Some(2000),
            ..Default::default()
        }),
        [a.as_str()]
    );
    assert!(Filter::states("nope").is_err());
}

#[test]
fn cursors_round_trip_and_refuse_garbage() {
    let c = Cursor {
        attempts_seq: 42,
        lanes_seq: 7,
        after: Some(event_id(1000, 3)),
    };
    assert_eq!(Cursor::decode(&c.encode()).unwrap(), c);
    for bad in ["", "v1", "v2.1.2.x", "v1.a.2.msg_x", "v1.1.2."] {
        assert!(Cursor::decode(bad).is_err(), "{bad}");
    }
}
