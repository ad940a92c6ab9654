//! a–d: dispatchers killed and scaled, NATS restarted, a cluster node killed.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatcher_kill_9_with_retries_pending_loses_nothing() {
    let _faults = fault_lock().await;
    let (count, rate, kills) = sized((9000, 300.0, 3), (30_000, 500.0, 8));
    let mut s = Scenario::new(private_env(), "kill9", 1, standard_endpoints()).await;
    s.dispatchers.start("kill9-d0");
    s.warm_up().await;
    let (publisher, progress) = s.stream(0, count, rate);
    let mut pending_at_kills = Vec::new();
    let mut before = s.counts();
    for k in 0..kills {
        progress_at(&progress, count * (k + 1) / (kills + 3)).await;
        let Some(pending) = s
            .until_delivering(&before, 50, Duration::from_secs(5))
            .await
        else {
            break;
        };
        s.dispatchers.kill("kill9-d0");
        s.dispatchers.start("kill9-d0");
        before = s.counts();
        pending_at_kills.push(pending);
        s.say(&format!(
            "kill -9 #{} after {} published, {pending} retries pending on /flaky; restarted",
            k + 1,
            progress.load(Ordering::SeqCst)
        ));
    }
    let published = publisher.await.expect("publisher");
    s.say(&format!("published {count} in {:.1?}", published.elapsed));
    s.finish(
        published,
        "a. dispatcher kill -9 + restart",
        &format!("{kills}× kill -9 of the only dispatcher, restarted at once"),
        &format!(
            "{rate}/s; retries pending on /flaky at the kills: {pending_at_kills:?}; \
             each restart waits for the lease TTL (10 s)"
        ),
        Duration::from_secs(120),
    )
    .await;
}

// ---------------------------------------------------------------------------------------
// b. nats-server restart
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b_nats_server_restart_loses_nothing() {
    let _faults = fault_lock().await;
    let (count, rate, restarts) = sized((4500, 300.0, 2), (20_000, 500.0, 6));
    let env = private_env();
    let mut s = Scenario::new(env, "natsrestart", 1, standard_endpoints()).await;
    s.dispatchers.start("natsrestart-d0");
    s.warm_up().await;
    let (publisher, progress) = s.stream(0, count, rate);
    let mut took = Vec::new();
    let mut before = s.counts();
    for k in 0..restarts {
        progress_at(&progress, count * (k + 1) / (restarts + 1)).await;
        let Some(pending) = s
            .until_delivering(&before, 50, Duration::from_secs(5))
            .await
        else {
            break;
        };
        let started = Instant::now();
        tokio::task::spawn_blocking(move || env.restart_nats())
            .await
            .expect("restart");
        took.push(format!("{:.1}", started.elapsed().as_secs_f64()));
        before = s.counts();
        s.say(&format!(
            "nats-server restarted (#{}, {pending} retries pending on /flaky) in {:.1?}",
            k + 1,
            started.elapsed()
        ));
    }
    let published = publisher.await.expect("publisher");
    s.finish(
        published,
        "b. nats-server restart",
        &format!("{restarts}× restart of the (single) nats-server, same store"),
        &format!("{rate}/s; restarts took {} s", took.join(", ")),
        Duration::from_secs(120),
    )
    .await;
}

// ---------------------------------------------------------------------------------------
// c. kill -9 of a stream leader in a 3-node cluster
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_nats_cluster_leader_kill_9_loses_nothing() {
    let _faults = fault_lock().await;
    let (count, rate) = sized((4500, 300.0), (20_000, 400.0));
    let env = private_cluster_env();
    let mut s = Scenario::new(env, "cluster", 3, standard_endpoints()).await;
    s.dispatchers.start("cluster-d0");
    s.warm_up().await;
    let (publisher, progress) = s.stream(0, count, rate);
    let mut injected = Vec::new();
    let mut elections = Vec::new();
    let mut before = s.counts();
    let victims = sized(
        vec![DELIVERIES_STREAM, EVENTS_STREAM],
        vec![
            DELIVERIES_STREAM,
            EVENTS_STREAM,
            DELIVERIES_STREAM,
            EVENTS_STREAM,
        ],
    );
    let rounds = victims.len() as u64;
    for (k, stream) in victims.into_iter().enumerate() {
        progress_at(&progress, count * (k as u64 + 1) / (rounds + 2)).await;
        let Some(pending) = s
            .until_delivering(&before, 50, Duration::from_secs(5))
            .await
        else {
            break;
        };
        let leader = eventually(
            &format!("{stream} to have a leader"),
            Duration::from_secs(30),
            || stream_leader(&s.dp.js, stream),
        )
        .await;
        let node = env
            .nats_node_index(&leader)
            .unwrap_or_else(|| panic!("{leader} is not a testenv node"));
        let killed_at = Instant::now();
        tokio::task::spawn_blocking(move || env.kill_nats_node(node))
            .await
            .expect("kill");
        let js = s.dp.js.clone();
        let killed = leader.clone();
        let back = Arc::new(AtomicBool::new(false));
        let restarted = back.clone();
        elections.push((
            stream,
            killed_at,
            tokio::spawn(async move {
                new_leader(&js, stream, &killed, &back, Duration::from_secs(60)).await
            }),
        ));
        let acked_then = progress.load(Ordering::SeqCst);
        s.say(&format!(
            "kill -9 of node {leader}, leader of {stream} ({pending} retries pending on /flaky)"
        ));
        // Down for at least 3 s and until 300 more events were accepted without it.
        eventually(
            "publishing to go on without the killed node",
            Duration::from_secs(60),
            || async {
                (progress.load(Ordering::SeqCst) >= (acked_then + 300).min(count)).then_some(())
            },
        )
        .await;
        tokio::time::sleep_until((killed_at + Duration::from_secs(3)).into()).await;
        let down = killed_at.elapsed();
        restarted.store(true, Ordering::SeqCst);
        tokio::task::spawn_blocking(move || env.start_nats_node(node))
            .await
            .expect("start");
        before = s.counts();
        s.say(&format!(
            "node {leader} back after {:.1?} down (healthy after {:.1?})",
            down,
            killed_at.elapsed()
        ));
        injected.push(format!(
            "{stream} leader {leader}, {:.0} s down",
            down.as_secs_f64()
        ));
    }
    let published = publisher.await.expect("publisher");
    let resumed = resumptions(&mut s, elections).await;
    s.finish(
        published,
        "c. NATS cluster node kill -9",
        &format!(
            "kill -9 of the node leading: {}; each restarted",
            injected.join("; ")
        ),
        &format!(
            "{rate}/s; R3 streams; dispatcher given all 3 node URLs; {}",
            resumed.join("; ")
        ),
        Duration::from_secs(120),
    )
    .await;
}

/// How long deliveries took to resume once NATS had elected a new leader for a killed
/// node's stream: Herald's own share of a node loss, which must stay within
/// [`RESUME_BOUND`] (the election itself is nats-server's, reported beside it). A
/// failure to resume in time is recorded as a stall.
async fn resumptions(
    s: &mut Scenario,
    elections: Vec<(
        &'static str,
        Instant,
        tokio::task::JoinHandle<Option<Instant>>,
    )>,
) -> Vec<String> {
    let mut lines = Vec::new();
    for (stream, killed_at, election) in elections {
        let Some(elected) = election.await.expect("leader watch") else {
            lines.push(format!("{stream}: no other node led it within 60 s"));
            continue;
        };
        let deadline = elected + RESUME_BOUND + Duration::from_secs(30);
        let mut resumed = Vec::new();
        for ep in &s.eps {
            let took = loop {
                let took = resumed_after(&s.rx.first_receipts(ep.name), elected);
                if took.is_some() || Instant::now() > deadline {
                    break took;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            match took {
                Some(took) if took <= RESUME_BOUND => {}
                _ => s.stalls.push(format!(
                    "/{} resumed {took:.1?} after {stream}'s new leader (bound {RESUME_BOUND:?})",
                    ep.name
                )),
            }
            resumed.push(took.map_or("never".into(), |t| format!("{:.1}", t.as_secs_f64())));
        }
        let line = format!(
            "{stream}: new leader {:.1} s after the kill, deliveries resumed {} s after it",
            elected.duration_since(killed_at).as_secs_f64(),
            resumed.join("/")
        );
        s.say(&line);
        lines.push(line);
    }
    lines
}

/// Herald's share of a NATS node loss: from a stream's new leader to the next delivery
/// of each endpoint (fan-out's publish ack wait of 2 s and a lane consumer's pull expiry
/// of 2 s, then recreation, with room for a debug build on a busy 2-core machine).
const RESUME_BOUND: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------
// d. scaling 1 -> 3 -> 1 with a SIGKILL among them
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d_scaling_one_three_one_with_a_kill_loses_nothing() {
    let _faults = fault_lock().await;
    let (count, rate) = sized((6000, 300.0), (24_000, 400.0));
    let mut s = Scenario::new(private_env(), "scale", 1, standard_endpoints()).await;
    let ids = ["scale-d0", "scale-d1", "scale-d2"];
    s.dispatchers.start(ids[0]);
    s.warm_up().await;
    let (publisher, progress) = s.stream(0, count, rate);
    let mut story = Vec::new();

    progress_at(&progress, count / 8).await;
    s.dispatchers.start(ids[1]);
    s.dispatchers.start(ids[2]);
    s.say("scaled 1 → 3");
    // The new replicas take their shards over once the old owner has drained them.
    let owners = eventually(
        "the new replicas to own shards",
        Duration::from_secs(30),
        || async {
            let owners = shard_owners(&s.dp.js).await;
            let spread =
                owners.values().any(|o| o != ids[0]) && owners.len() == TEST_SHARDS as usize;
            spread.then_some(owners)
        },
    )
    .await;
    story.push(format!(
        "1→3 (owners {:?})",
        owners.values().collect::<Vec<_>>()
    ));
    s.say(&format!("shard owners {owners:?}"));

    progress_at(&progress, count * 3 / 8).await;
    let before = s.counts();
    s.until_delivering(&before, 20, Duration::from_secs(3))
        .await;
    let leases = shard_leases(&s.dp.js).await;
    let owners: std::collections::BTreeMap<u32, String> =
        leases.iter().map(|(s, (o, _))| (*s, o.clone())).collect();
    // The victim: the new replica that delivers the ordered endpoint, else any endpoint.
    let victim = ["ordered", "flaky", "fresh"]
        .iter()
        .filter_map(|name| owners.get(&s.shard(name)))
        .find(|o| o.as_str() != ids[0])
        .cloned()
        .unwrap_or_else(|| ids[1].to_owned());
    let victim_shards: Vec<u32> = owners
        .iter()
        .filter(|(_, o)| **o == victim)
        .map(|(s, _)| *s)
        .collect();
    s.dispatchers.kill(&victim);
    s.dispatchers.start(&victim);
    s.say(&format!(
        "kill -9 of {victim} (shards {victim_shards:?}); restarted"
    ));
    story.push(format!(
        "kill -9 {victim} (shards {victim_shards:?}) + restart"
    ));
    // Its leases expire (TTL), then it takes its shards back: a lease of the victim with
    // a revision the dead process never wrote.
    let dead: std::collections::BTreeSet<u64> = leases
        .values()
        .filter(|(o, _)| *o == victim)
        .map(|(_, r)| *r)
        .collect();
    let back = tokio::time::timeout(Duration::from_secs(40), async {
        loop {
            let now = shard_leases(&s.dp.js).await;
            if now.values().any(|(o, r)| *o == victim && !dead.contains(r)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    s.say(&format!(
        "the restarted replica owns shards again: {}",
        back.is_ok()
    ));

    progress_at(&progress, count * 6 / 8).await;
    let other = ids[1..]
        .iter()
        .find(|id| **id != victim)
        .copied()
        .unwrap_or(ids[2]);
    let first = s.dispatchers.stop(other).await;
    let second = s.dispatchers.stop(&victim).await;
    s.say(&format!(
        "scaled 3 → 1: SIGINT {other} (exited after {first:.1?}), {victim} ({second:.1?})"
    ));
    story.push(format!(
        "3→1 by SIGINT ({other} {:.1} s, {victim} {:.1} s to drain)",
        first.as_secs_f64(),
        second.as_secs_f64()
    ));
    let published = publisher.await.expect("publisher");
    s.finish(
        published,
        "d. scale 1→3→1 + kill -9",
        &story.join("; "),
        &format!("{rate}/s"),
        Duration::from_secs(120),
    )
    .await;
}

// ---------------------------------------------------------------------------------------
// c2. a dispatcher started while the NATS cluster has no quorum
// ---------------------------------------------------------------------------------------

/// A replica started while two of the three NATS nodes are down (JetStream cannot
/// answer: no quorum) waits, not ready, instead of exiting into a crash loop, and
/// delivers once the nodes are back. (It exited with "asking the NATS server about
/// JetStream: timed out" — found by the chaos soak, a replica started during a node's
/// loss.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c2_a_dispatcher_started_without_a_quorum_waits_for_it() {
    let _faults = fault_lock().await;
    let env = private_cluster_env();
    let mut s = Scenario::new(env, "quorum", 3, standard_endpoints()).await;
    for node in [1, 2] {
        tokio::task::spawn_blocking(move || env.kill_nats_node(node))
            .await
            .expect("kill");
    }
    s.say("n1 and n2 killed; starting a dispatcher");
    s.dispatchers.start("quorum-d0");
    // Longer than a JetStream request's timeout (10 s) and the startup's first retries.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let exited = s.dispatchers.exited();
    for node in [1, 2] {
        tokio::task::spawn_blocking(move || env.start_nats_node(node))
            .await
            .expect("start");
    }
    s.say("n1 and n2 back");
    assert!(
        exited.is_empty(),
        "the dispatcher exited while NATS had no quorum: {exited:?}; log {}",
        s.dispatchers.log("quorum-d0").display()
    );
    s.warm_up().await;
    let stalls = std::mem::take(&mut s.stalls);
    s.dispatchers.stop_all().await;
    assert!(stalls.is_empty(), "{stalls:?}");
}
