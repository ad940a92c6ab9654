//! A replay under way outlives the dispatcher carrying it out: its progress (cursor and
//! counts in `herald-health`) is what the next owner of the endpoint's shard resumes
//! from, and what was enqueued waits in the endpoint's lane. In an environment of its
//! own, with dispatcher processes killed by SIGKILL.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use herald_core::dataplane::{BucketKey, ReplayProgress, ReplayRequest};
use herald_e2e::dataplane::{DataPlane, TEST_SECRET, endpoint};
use herald_e2e::faults::{Dispatchers, peak_rss_kib};
use herald_e2e::receiver::Receiver;
use herald_e2e::{eventually, fault_lock, private_env, unique_name};
use serde_json::json;

const EVENTS: i64 = 120;
const WAIT: Duration = Duration::from_secs(120);

fn now_ms() -> u64 {
    jiff::Timestamp::now().as_millisecond() as u64
}

/// How many requests each `webhook-id` got.
fn per_id(rx: &Receiver) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for r in rx.received("hook") {
        *out.entry(r.header("webhook-id").to_owned()).or_default() += 1;
    }
    out
}

/// SIGKILL of the dispatcher in the middle of a replay: the next one resumes it from the
/// saved cursor, every event of the range is delivered again with its original
/// `webhook-id`, and the progress counts each event once (matched, enqueued and
/// delivered all equal to the range), however many were sent twice around the kill.
#[tokio::test]
async fn a_replay_whose_dispatcher_is_killed_is_finished_by_the_next_one() {
    let _faults = fault_lock().await;
    let env = private_env();
    let dp = DataPlane::new(env.nats().await).await;
    let rx = Receiver::start().await;
    let ns = unique_name("replay-kill");
    dp.put_keys(&ns, "signing", &[TEST_SECRET]).await;
    // 40 requests/s, one at a time: the replay takes 3 s, long enough to be killed in.
    let config = endpoint(
        &ns,
        "hook",
        json!({"url": rx.url("hook"),
               "delivery": {"maxInFlight": 1, "rateLimit": {"perSecond": 40, "burst": 1}}}),
    );
    dp.put_endpoint(&config).await;
    let mut dispatchers = Dispatchers::new(
        env!("CARGO_BIN_EXE_herald-test-dispatcher"),
        env.nats_url(),
        "replay-kill",
    );
    dispatchers.start("a");

    let from_ms = now_ms();
    for i in 0..EVENTS {
        dp.publish(&ns, "a", json!(i)).await;
    }
    let originals = eventually("every event delivered once", WAIT, || async {
        let ids = per_id(&rx);
        (ids.len() == EVENTS as usize).then_some(ids)
    })
    .await;
    let originals: BTreeSet<String> = originals.into_keys().collect();
    let to_ms = now_ms() + 1;
    let first_round = rx.received("hook").len();

    // What the operator writes for a valid WebhookReplay.
    let request = ReplayRequest {
        namespace: ns.clone(),
        name: "again".into(),
        uid: "uid-replay-again".into(),
        endpoint: "hook".into(),
        from_ms,
        to_ms,
        event_types: Vec::new(),
        only_failed: false,
        dry_run: false,
    };
    let key = BucketKey::replay(&ns, "again").to_string();
    dp.config
        .put(key.as_str(), serde_json::to_vec(&request).unwrap().into())
        .await
        .expect("writing the replay request");
    eventually("the replay under way", WAIT, || async {
        (rx.received("hook").len() >= first_round + 20).then_some(())
    })
    .await;
    dispatchers.kill("a");
    let before_kill = rx.received("hook").len() - first_round;
    assert!(
        before_kill < EVENTS as usize,
        "killed mid-replay, not after it: {before_kill} replayed"
    );

    dispatchers.start("b");
    eventually("every event of the range delivered again", WAIT, || async {
        let ids = per_id(&rx);
        ids.values().all(|n| *n >= 2).then_some(())
    })
    .await;
    let ids = per_id(&rx);
    assert_eq!(
        ids.keys().cloned().collect::<BTreeSet<_>>(),
        originals,
        "the replay reuses the original webhook-ids and sends no other"
    );
    let progress = eventually("the replay's progress finished", WAIT, || async {
        let value = dp.health.get(key.as_str()).await.ok()??;
        let progress: ReplayProgress = serde_json::from_slice(&value).ok()?;
        progress.finished(false).then_some(progress)
    })
    .await;
    let n = EVENTS as u64;
    assert_eq!(progress.uid, request.uid);
    assert_eq!(
        (
            progress.matched,
            progress.enqueued,
            progress.delivered,
            progress.failed
        ),
        (n, n, n, 0),
        "each event counted once: {progress:?}"
    );
    let sent_twice: usize = ids.values().map(|n| n - 2).sum();
    println!(
        "replay killed after {before_kill} of {EVENTS}: every event delivered again, {sent_twice} sent a third time around the kill"
    );
    dispatchers.stop_all().await;
}

/// Records of failed deliveries written into the log beside the real ones.
const LOG_RECORDS: usize = 100_000;
/// Growth of the dispatcher's peak memory allowed while the replay runs, MiB: read
/// buffers that do not grow with the log and one state per event of about 110 bytes
/// (measured, debug build: +48 MiB over 25,000 records, +56 and +63 MiB over 100,000) —
/// not the records (100 MiB of them; holding them took the peak up by 119 MiB for
/// 60,000, about 200 MiB for this log).
const REPLAY_BOUND_MIB: u64 = 80;

/// A tenant's dry-run `onlyFailed` replay of an endpoint whose attempt log holds
/// 100,000 failed deliveries with a 1 KiB response each (a busy endpoint's weeks): the
/// dispatcher that owns the shard folds the log into one state per event, so its peak
/// memory grows by less than [`REPLAY_BOUND_MIB`] (it held every record before, and the
/// replay moved with the shard: one tenant's replay took replica after replica down),
/// and the replay counts exactly the failed events of the range that are in the store.
#[tokio::test]
async fn an_only_failed_replay_of_a_long_log_is_bounded_in_memory() {
    use herald_core::dataplane::{AttemptRecord, DeliveryState, attempt_log};
    use herald_e2e::dataplane::failed_record;
    use herald_e2e::receiver::Behavior;

    let _faults = fault_lock().await;
    let env = private_env();
    let dp = DataPlane::new(env.nats().await).await;
    let rx = Receiver::start().await;
    // Every third request answered 400, final: 0, 3, 6 and 9 of ten fail for good.
    rx.behave("hook", Behavior::fail_first_of_every(3, 400));
    let ns = unique_name("replay-long");
    dp.put_keys(&ns, "signing", &[TEST_SECRET]).await;
    let config = endpoint(
        &ns,
        "hook",
        json!({"url": rx.url("hook"), "delivery": {"finalStatusCodes": [400]}}),
    );
    dp.put_endpoint(&config).await;
    let mut dispatchers = Dispatchers::new(
        env!("CARGO_BIN_EXE_herald-test-dispatcher"),
        env.nats_url(),
        "replay-long",
    );
    dispatchers.start("a");
    let from_ms = now_ms();
    for i in 0..10 {
        dp.publish(&ns, "a", json!(i)).await;
    }
    let dead = eventually("every event attempted", WAIT, || async {
        let attempts = dp.attempts(&ns, "hook").await;
        let count = |state: &str| attempts.iter().filter(|a| a["state"] == state).count();
        (count("dead") == 4 && count("succeeded") == 6).then_some(4u64)
    })
    .await;

    // The rest of the log: failed deliveries of events no longer stored.
    let day = 86_400_000;
    let first_ms = now_ms() - 20 * day;
    let records: Vec<AttemptRecord> = (0..LOG_RECORDS as u64)
        .map(|i| {
            failed_record(
                herald_core::dataplane::event_id(
                    first_ms + i * (20 * day / LOG_RECORDS as u64),
                    1_000_000_000 + i,
                ),
                first_ms,
                DeliveryState::Dead,
                "a",
            )
        })
        .collect();
    let subject = config.key().attempts_subject();
    for batch in attempt_log::encode(&records) {
        dp.js
            .publish(subject.clone(), batch.into())
            .await
            .expect("publish")
            .await
            .expect("the log's batch stored");
    }
    drop(records);

    let pid = dispatchers.pid("a").expect("the dispatcher runs");
    let before = peak_rss_kib(pid);
    let request = ReplayRequest {
        namespace: ns.clone(),
        name: "failed".into(),
        uid: "uid-replay-failed".into(),
        endpoint: "hook".into(),
        from_ms,
        to_ms: now_ms() + 1,
        event_types: Vec::new(),
        only_failed: true,
        dry_run: true,
    };
    let key = BucketKey::replay(&ns, "failed").to_string();
    let started = std::time::Instant::now();
    dp.config
        .put(key.as_str(), serde_json::to_vec(&request).unwrap().into())
        .await
        .expect("writing the replay request");
    let progress = eventually("the dry run finished", WAIT, || async {
        let value = dp.health.get(key.as_str()).await.ok()??;
        let progress: ReplayProgress = serde_json::from_slice(&value).ok()?;
        progress.finished(true).then_some(progress)
    })
    .await;
    let took = started.elapsed();
    let grew_mib = peak_rss_kib(pid).saturating_sub(before) / 1024;
    println!(
        "only-failed dry run over {LOG_RECORDS} records of 1 KiB: {took:?}, the dispatcher's \
         peak memory grew by {grew_mib} MiB (from {} MiB)",
        before / 1024
    );
    assert_eq!(
        (progress.matched, progress.enqueued),
        (dead, 0),
        "the failed events of the range, none sent: {progress:?}"
    );
    assert!(
        grew_mib < REPLAY_BOUND_MIB,
        "the dispatcher's peak memory grew by {grew_mib} MiB over a replay of {LOG_RECORDS} records"
    );
    assert!(
        dispatchers.exited().is_empty(),
        "the dispatcher survived the replay"
    );
    dispatchers.stop_all().await;
}
