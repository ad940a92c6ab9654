use super::*;

fn item(seq: u64) -> Item {
    Item {
        seq,
        lane: Lane::New,
        event_id: format!("msg_{seq}").into(),
        body: Bytes::from_static(b"{}"),
        published_ms: seq,
        attempt: 1,
        first_attempt_ms: None,
        not_before: None,
        ordering_key: None,
        endpoint_uid: None,
        replay: None,
    }
}

/// Regression: a refill whose range came back empty forgot the messages that
/// arrived while it ran, and the low-water mark then purged them undelivered.
#[test]
fn messages_arriving_during_a_refill_are_not_forgotten() {
    let mut q = LaneQueue::default();
    for seq in 1..=4 {
        q.offer(item(seq), 2);
    }
    // Delivered 1 and 2 (buffer empty), 3..=4 wait in JetStream.
    q.buf.clear();
    let range = q.refill(2).expect("a refill is due");
    assert_eq!((range.from, range.until), (3, 4));
    // 5 and 6 arrive while the refill runs.
    q.offer(item(5), 2);
    q.offer(item(6), 2);
    // The refill read 3 and 4 and found nothing more up to 4.
    q.refilled(range, vec![item(3), item(4)], None);
    assert_eq!(q.low_water(), 3);
    q.buf.clear();
    assert_eq!(q.low_water(), 5, "5 and 6 are still owed");
    let range = q.refill(2).expect("the rest is read back");
    assert_eq!((range.from, range.until), (5, 6));
    // Even a refill that reads nothing (the messages were purged elsewhere) ends
    // the overflow only up to what it covered.
    q.refilled(range, vec![], None);
    assert_eq!(q.low_water(), 7);
    assert_eq!(q.pending(), 0);
}

#[test]
fn a_full_buffer_leaves_the_backlog_in_jetstream_and_refills_in_order() {
    let mut lane = LaneQueue::default();
    for seq in 1..=10 {
        lane.offer(item(seq), 4);
    }
    assert_eq!(lane.pending(), 10);
    assert_eq!(lane.low_water(), 1);
    // Nothing to refill while the buffer is more than half full.
    assert_eq!(lane.refill(4), None);
    for _ in 0..3 {
        lane.buf.pop_front();
    }
    let range = lane.refill(4).expect("due");
    assert_eq!((range.from, range.until), (5, 10));
    assert_eq!(lane.refill(4), None, "one refill at a time");
    lane.refilled(range, (5..=7).map(item).collect(), Some(8));
    let seqs: Vec<u64> = lane.buf.iter().map(|i| i.seq).collect();
    assert_eq!(seqs, [4, 5, 6, 7]);
    assert_eq!(lane.pending(), 7);
    assert_eq!(lane.low_water(), 4);
}

/// Regression: the room of a refill was counted against the whole backlog (which is
/// what is being read back), so behind a backlog every refill read one message, one
/// request each.
#[test]
fn a_refill_behind_a_long_backlog_fills_the_buffer() {
    let mut lane = LaneQueue::default();
    for seq in 1..=10_000 {
        lane.offer(item(seq), 64);
    }
    for _ in 0..40 {
        lane.buf.pop_front();
    }
    let range = lane.refill(64).expect("due");
    assert_eq!((range.from, range.room), (65, 40));
}

#[test]
fn a_busy_lane_is_purged_early() {
    let now = Instant::now();
    let mut lanes = Lanes::default();
    let n = u64::from(EARLY_PURGE_ITEMS) + 8;
    for seq in 1..=n {
        lanes.queue(Lane::New).offer(item(seq), n as usize);
    }
    for _ in 0..EARLY_PURGE_ITEMS - 1 {
        let item = lanes.take(Lane::New, false, now).unwrap();
        lanes.finished(&item);
    }
    assert_eq!(lanes.queue(Lane::New).early_purge_point(), None, "not yet");
    let item = lanes.take(Lane::New, false, now).unwrap();
    lanes.finished(&item);
    assert_eq!(
        lanes.queue(Lane::New).early_purge_point(),
        Some(u64::from(EARLY_PURGE_ITEMS) + 1)
    );
    assert_eq!(
        lanes.queue(Lane::New).early_purge_point(),
        None,
        "counted afresh"
    );
}

#[test]
fn lanes_alternate_and_ordered_keys_wait_for_their_head() {
    let now = Instant::now();
    let mut lanes = Lanes::default();
    lanes.queue(Lane::New).offer(item(1), 8);
    let mut retry = item(2);
    retry.lane = Lane::Retry;
    lanes.queue(Lane::Retry).offer(retry, 8);
    let first = lanes.next_ready(false, now).unwrap();
    lanes.take(first, false, now).unwrap();
    let second = lanes.next_ready(false, now).unwrap();
    assert_ne!(first, second, "the other lane goes next");

    let mut lanes = Lanes::default();
    for (seq, key) in [(1, 7), (2, 7), (3, 9)] {
        let mut i = item(seq);
        i.ordering_key = Some(key);
        lanes.queue(Lane::New).offer(i, 8);
    }
    assert_eq!(lanes.take(Lane::New, true, now).unwrap().seq, 1);
    assert_eq!(
        lanes.take(Lane::New, true, now).unwrap().seq,
        3,
        "key 9 passes key 7"
    );
    assert!(
        lanes.take(Lane::New, true, now).is_none(),
        "key 7 has one in flight"
    );
    assert_eq!(lanes.in_flight(), 2);
}

/// An ordered endpoint has one attempt in flight per key across both lanes: a
/// redelivery on the retry lane waits for the fresh event in flight of its key, and
/// the other way round; a retry put back in place keeps its `not_before` (it went out at
/// once before, ten times in a second, until its schedule was used up).
#[test]
fn an_ordered_endpoint_holds_one_in_flight_across_both_lanes_and_keeps_schedules() {
    let now = Instant::now();
    let mut lanes = Lanes::default();
    lanes.queue(Lane::New).offer(item(1), 8);
    let mut redelivery = item(2);
    redelivery.lane = Lane::Retry;
    lanes.queue(Lane::Retry).offer(redelivery, 8);
    assert_eq!(
        lanes.next_ready(true, now),
        Ok(Lane::New),
        "fresh events first"
    );
    let fresh = lanes.take(Lane::New, true, now).unwrap();
    assert_eq!(
        lanes.next_ready(true, now),
        Err(None),
        "the redelivery waits for the event in flight"
    );
    assert!(lanes.take(Lane::Retry, true, now).is_none());
    lanes.finished(&fresh);
    assert_eq!(lanes.next_ready(true, now), Ok(Lane::Retry));
    let redelivered = lanes.take(Lane::Retry, true, now).unwrap();
    lanes.queue(Lane::New).offer(item(3), 8);
    assert_eq!(
        lanes.next_ready(true, now),
        Err(None),
        "a fresh event waits for the redelivery in flight"
    );

    // The redelivery failed and is put back with its schedule.
    lanes.finished(&redelivered);
    let mut again = redelivered;
    let later = now + std::time::Duration::from_secs(60);
    again.not_before = Some(later);
    lanes.requeue(again);
    assert_eq!(lanes.next_ready(true, now), Ok(Lane::New));
    let third = lanes.take(Lane::New, true, now).unwrap();
    lanes.finished(&third);
    assert_eq!(
        lanes.next_ready(true, now),
        Err(Some(later)),
        "the retry waits for its time"
    );
    assert_eq!(lanes.next_ready(true, later), Ok(Lane::Retry));

    // An item taken before the endpoint became ordered held no key: its end frees none.
    let mut lanes = Lanes::default();
    lanes.queue(Lane::New).offer(item(1), 8);
    lanes.queue(Lane::New).offer(item(2), 8);
    lanes.queue(Lane::New).offer(item(3), 8);
    let unordered = lanes.take(Lane::New, false, now).unwrap();
    let ordered = lanes.take(Lane::New, true, now).unwrap();
    lanes.finished(&unordered);
    assert!(
        lanes.take(Lane::New, true, now).is_none(),
        "item 2 still holds the key"
    );
    lanes.finished(&ordered);
    assert_eq!(lanes.take(Lane::New, true, now).unwrap().seq, 3);
}

/// On an ordered endpoint an item enqueued on the retry lane (a replay, a redelivery)
/// never goes ahead of a fresh item stored before it, even of another key: a replayed
/// event the fresh lane has not delivered yet would otherwise reach the receiver first,
/// ahead of older events (found by the chaos soak: a replay requested while fan-out was
/// catching up after a failover sent 1,110 events out of publish order). Older ones and
/// fired retries go as before.
#[test]
fn an_ordered_endpoints_replay_waits_for_fresh_items_stored_before_it() {
    let now = Instant::now();
    let keyed = |seq: u64, key: u64, lane: Lane| Item {
        ordering_key: Some(key),
        lane,
        ..item(seq)
    };
    let mut lanes = Lanes::default();
    lanes.queue(Lane::New).offer(keyed(10, 1, Lane::New), 8);
    lanes.queue(Lane::New).offer(keyed(11, 1, Lane::New), 8);
    lanes.queue(Lane::Retry).offer(keyed(12, 2, Lane::Retry), 8);
    let first = lanes.take(Lane::New, true, now).unwrap();
    assert_eq!(first.seq, 10);
    assert_eq!(
        lanes.next_ready(true, now),
        Err(None),
        "fresh 11 waits for key 1; the replay of key 2 waits for fresh 11"
    );
    lanes.finished(&first);
    assert_eq!(lanes.take(Lane::New, true, now).unwrap().seq, 11);
    assert_eq!(
        lanes.next_ready(true, now),
        Ok(Lane::Retry),
        "nothing fresh is older: the replay goes beside key 1's event"
    );

    // An older replay item, and a fired retry, do not wait for newer fresh items.
    let mut lanes = Lanes::default();
    lanes.queue(Lane::Retry).offer(keyed(5, 2, Lane::Retry), 8);
    lanes.queue(Lane::New).offer(keyed(6, 1, Lane::New), 8);
    lanes.queue(Lane::New).offer(keyed(7, 1, Lane::New), 8);
    let fresh = lanes.take(Lane::New, true, now).unwrap();
    assert_eq!(lanes.next_ready(true, now), Ok(Lane::Retry));
    assert_eq!(lanes.take(Lane::Retry, true, now).unwrap().seq, 5);
    let mut retry = keyed(8, 3, Lane::Retry);
    retry.attempt = 2;
    lanes.queue(Lane::Retry).offer(retry, 8);
    assert_eq!(lanes.take(Lane::Retry, true, now).unwrap().seq, 8);
    lanes.finished(&fresh);

    // A fresh backlog still in JetStream counts too.
    let mut lanes = Lanes::default();
    lanes.queue(Lane::New).offer(keyed(20, 1, Lane::New), 1);
    lanes.queue(Lane::New).offer(keyed(21, 1, Lane::New), 1);
    lanes.queue(Lane::Retry).offer(keyed(22, 2, Lane::Retry), 8);
    let head = lanes.take(Lane::New, true, now).unwrap();
    assert!(
        lanes.take(Lane::Retry, true, now).is_none(),
        "21 waits in JetStream"
    );
    lanes.finished(&head);
}

/// What a lane buffers is counted in bytes as items come and go, and a lane that sheds
/// gives its newest items back to JetStream: nothing is forgotten, and a refill reads
/// them back in order.
#[test]
fn shedding_gives_the_newest_items_back_and_forgets_nothing() {
    let now = Instant::now();
    let mut lanes = Lanes::default();
    let w = 2 + ITEM_BYTES;
    for seq in 1..=10 {
        lanes.queue(Lane::New).offer(item(seq), 100);
    }
    assert_eq!(lanes.bytes(), 10 * w);
    let first = lanes.take(Lane::New, false, now).unwrap();
    assert_eq!(lanes.bytes(), 9 * w, "in flight is not buffered");
    lanes.shed(4);
    let q = lanes.queue(Lane::New);
    let seqs: Vec<u64> = q.buf.iter().map(|i| i.seq).collect();
    assert_eq!(seqs, [2, 3, 4, 5]);
    assert_eq!(q.bytes(), 4 * w);
    assert_eq!(q.pending(), 10, "1 in flight, 4 buffered, 5 in JetStream");
    assert_eq!(q.low_water(), 1);
    // Later messages are not buffered ahead of the ones given back.
    assert!(!q.offer(item(11), 100));
    q.buf.clear();
    q.bytes = 0;
    let range = q.refill(100).expect("the given-back items are read again");
    assert_eq!((range.from, range.until), (6, 11));
    q.refilled(range, (6..=11).map(item).collect(), None);
    let seqs: Vec<u64> = q.buf.iter().map(|i| i.seq).collect();
    assert_eq!(seqs, [6, 7, 8, 9, 10, 11]);
    assert_eq!(q.bytes(), 6 * w);
    // The in-place retry of the first item goes back to the head.
    lanes.finished(&first);
    lanes.requeue(first);
    assert_eq!(lanes.bytes(), 7 * w);
    assert_eq!(lanes.queue(Lane::New).low_water(), 1);
}

/// A lane out of sequence order (in-place retries at its head) keeps its items: giving
/// back the newest would leave older ones behind the point a refill reads from.
#[test]
fn a_lane_out_of_order_does_not_shed() {
    let now = Instant::now();
    let mut lanes = Lanes::default();
    for seq in 1..=6 {
        lanes.queue(Lane::New).offer(item(seq), 100);
    }
    let a = lanes.take(Lane::New, false, now).unwrap();
    let b = lanes.take(Lane::New, false, now).unwrap();
    for retried in [a, b] {
        lanes.finished(&retried);
        lanes.requeue(retried);
    }
    lanes.shed(2);
    assert_eq!(lanes.queue(Lane::New).buffered(), 6);
    assert_eq!(lanes.queue(Lane::New).low_water(), 1);
}

/// While a refill runs, a lane does not shed: the refill's range would end the overflow
/// past the items given back.
#[test]
fn a_lane_does_not_shed_while_a_refill_runs() {
    let mut q = LaneQueue::default();
    for seq in 1..=8 {
        q.offer(item(seq), 4);
    }
    for _ in 0..3 {
        q.buf.pop_front();
    }
    let range = q.refill(4).expect("due");
    q.shed(0);
    assert_eq!(q.buffered(), 1);
    q.refilled(range, (5..=8).map(item).collect(), None);
    assert_eq!(q.pending(), 5);
    assert_eq!(q.low_water(), 4);
}

/// A deleted endpoint's lane is purged only up to what the shard knows was that
/// endpoint's: not past an item written for a re-created endpoint of the same name, nor
/// into what is still unread in JetStream.
#[test]
fn a_deleted_endpoints_purge_stops_at_what_may_belong_to_its_successor() {
    let old = Some(7);
    let of = |seq, uid| Item {
        endpoint_uid: uid,
        ..item(seq)
    };
    let mut q = LaneQueue::default();
    for seq in 1..=3 {
        q.offer(of(seq, old), 10);
    }
    assert_eq!(
        q.removal_bound(old),
        4,
        "all three were the deleted endpoint's"
    );
    q.offer(of(4, Some(8)), 10);
    q.offer(of(5, old), 10);
    assert_eq!(
        q.removal_bound(old),
        4,
        "4 was written for the new endpoint"
    );
    assert_eq!(
        q.removal_bound(None),
        1,
        "no uid known: nothing buffered is purged"
    );

    let mut q = LaneQueue::default();
    for seq in 1..=5 {
        q.offer(of(seq, old), 2);
    }
    assert_eq!(
        q.removal_bound(old),
        3,
        "3..=5 are unread: their uid is unknown"
    );
}
