//! A replay under way outlives the dispatcher carrying it out: its progress (cursor and
//! counts in `herald-health`) is what the next owner of the endpoint's shard resumes
//! from, and what was enqueued waits in the endpoint's lane. In an environment of its
//! own, with dispatcher processes killed by SIGKILL.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use herald_core::dataplane::{BucketKey, ReplayProgress, ReplayRequest};
use herald_e2e::dataplane::{DataPlane, TEST_SECRET, endpoint};
use herald_e2e::faults::Dispatchers;
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
