//! h: the leading operator killed; the standby takes over.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h_operator_leader_kill_9_loses_nothing_and_the_standby_reconciles() {
    let _faults = fault_lock().await;
    let count = stream_of(30);
    let mut s = Scenario::new("opkill", standard_endpoints(), &["h-a", "h-b"]).await;
    let leader = eventually("a leader", Duration::from_secs(30), || s.leader()).await;
    let standby = if leader == "h-a" { "h-b" } else { "h-a" };
    let (publisher, progress) = s.stream(0, count);
    progress_at(&progress, count / 5).await;
    let before = s.counts();
    s.until_delivering(&before, 50).await;
    s.operators.kill(&leader);
    let killed = Instant::now();
    s.say(&format!("kill -9 of the leading operator {leader}"));
    // Changes right after the kill, while nobody leads: a new endpoint, and a spec
    // change of `fresh` the receiver can see (a static header).
    let late = EpSpec::new("late", json!({}));
    s.create_endpoint(&late).await;
    s.patch_endpoint(
        "fresh",
        json!({"spec": {"headers": [{"name": "x-fault", "value": "after-kill"}]}}),
    )
    .await;
    let took_over = eventually(
        "the standby to take over",
        Duration::from_secs(30),
        || async {
            let holder = s.leader().await?;
            (holder == standby).then(Instant::now)
        },
    )
    .await;
    s.say(&format!(
        "{standby} leads {:.1} s after the kill",
        took_over.duration_since(killed).as_secs_f64()
    ));
    // The new leader reconciles both changes.
    s.until_configured("late", Duration::from_secs(30)).await;
    let late_ready = Instant::now();
    s.eps.push(late);
    let header_seen = eventually(
        "a request to /fresh with the header added after the kill",
        Duration::from_secs(30),
        || async {
            s.rx.received("fresh")
                .iter()
                .find(|r| r.header("x-fault") == "after-kill")
                .map(|r| r.at)
        },
    )
    .await;
    eventually(
        "fresh's status to observe generation 2",
        Duration::from_secs(30),
        || async { (s.status("fresh").await?.observed_generation == Some(2)).then_some(()) },
    )
    .await;
    // Status is written again by the new leader: `fresh`'s last delivery is one made
    // after the takeover.
    let after_takeover_wall = jiff::Timestamp::now();
    let status_back = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if let Some(last) = s.status("fresh").await.and_then(|st| st.last_delivery)
                && last.time.0 >= after_takeover_wall
            {
                return Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let status_note = match status_back {
        Ok(at) => format!(
            "status (lastDelivery) current again {:.1} s after the kill",
            at.duration_since(killed).as_secs_f64()
        ),
        Err(_) => {
            s.fail(
                "fresh's status (lastDelivery) not written by the new leader within 20 s".into(),
            );
            "status NOT current again".into()
        }
    };
    // `late` counts every event after the first one it received (fan-out runs in stream
    // order, so every later event matches it too).
    let first_late = eventually(
        "a first event at /late",
        Duration::from_secs(30),
        || async {
            s.rx.first_receipts("late")
                .iter()
                .find_map(|f| f.data.and_then(|d| u64::try_from(d).ok()))
        },
    )
    .await;
    let published = publisher.await.expect("publisher");
    let first_late_seq = published.acked.get(&first_late).map_or(u64::MAX, |a| a.seq);
    s.expect.insert("late", Expect::After(first_late_seq));
    // Deliveries went on while nobody led: each endpoint received at least half as many
    // events as were accepted meanwhile.
    let acks = ack_times(&published);
    let mut flows = Vec::new();
    let mut stalled = Vec::new();
    for ep in ["fresh", "ordered", "flaky"] {
        let (accepted, received) = s.flow_between(&acks, ep, killed, took_over);
        flows.push(format!("{ep} {received}"));
        if received * 2 < accepted {
            stalled.push(format!(
                "{ep}: received {received} while {accepted} were accepted"
            ));
        }
    }
    let accepted_leaderless = s.flow_between(&acks, "fresh", killed, took_over).0;
    if !stalled.is_empty() {
        s.fail(format!(
            "deliveries did not go on while no operator led: {}",
            stalled.join("; ")
        ));
    }
    let withdrawn = s.withdrawals(&["fresh", "ordered", "flaky"]);
    if !withdrawn.is_empty() {
        s.fail(format!(
            "configuration withdrawn around the failover:\n{}",
            withdrawn.join("\n")
        ));
    }
    let notes = format!(
        "{RATE}/s; {leader} killed at {}; {standby} led {:.1} s later; meanwhile \
         {accepted_leaderless} events accepted, received {}; after the kill a new \
         endpoint `late` was Ready {:.1} s and a header added to `fresh` arrived {:.1} s after \
         the kill; {status_note}; `late` counted from event {first_late}",
        s.t(killed),
        took_over.duration_since(killed).as_secs_f64(),
        flows.join(", "),
        late_ready.duration_since(killed).as_secs_f64(),
        header_seen.saturating_duration_since(killed).as_secs_f64(),
    );
    s.finish(
        published,
        "h. operator leader kill -9",
        "kill -9 of the leading operator of 2 (lease 5 s, renew 1 s); a new endpoint and a spec change right after",
        &notes,
        Duration::from_secs(60),
    )
    .await;
}
