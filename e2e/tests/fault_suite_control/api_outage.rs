//! g: the Kubernetes API unreachable mid-stream.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g_api_server_blackout_loses_nothing_and_status_catches_up() {
    let _faults = fault_lock().await;
    const BLACKOUT: Duration = Duration::from_secs(30);
    let count = stream_of(45); // 7.5 s before the blackout, 7.5 s after.
    let env = private_env();
    let mut s = Scenario::new("apiblackout", standard_endpoints(), &["g-a"]).await;
    // Status shows the data plane before the fault.
    for ep in ["fresh", "ordered", "flaky"] {
        eventually(
            &format!("{ep} status with a last delivery"),
            Duration::from_secs(30),
            || async {
                let status = s.status(ep).await?;
                status.last_delivery.is_some().then_some(())
            },
        )
        .await;
    }
    let (publisher, progress) = s.stream(0, count);
    progress_at(&progress, count / 6).await;
    let before = s.counts();
    s.until_delivering(&before, 50).await;
    tokio::task::spawn_blocking(move || env.blackout_apiserver(BLACKOUT.as_secs_f64()))
        .await
        .expect("blackout");
    let dark = Instant::now();
    let dark_wall = jiff::Timestamp::now();
    s.say("API server blackout begins (30 s)");
    if s.object("fresh").await.is_some() {
        s.fail("the API server was reachable during the blackout: the test proves nothing".into());
    }
    let cpu_at_dark = (
        s.operators.cpu_time("g-a"),
        s.dispatchers.cpu_time("apiblackout-d0"),
    );
    // Back: the first answer of the API.
    let back = eventually("the API server back", Duration::from_secs(60), || async {
        s.object("fresh").await.map(|_| Instant::now())
    })
    .await;
    let back_wall = jiff::Timestamp::now();
    let cpu = |at_dark: Option<Duration>, now: Option<Duration>| match (at_dark, now) {
        (Some(a), Some(b)) => format!("{:.1} s", b.saturating_sub(a).as_secs_f64()),
        _ => "?".to_owned(),
    };
    let cpu_dark = format!(
        "CPU during the blackout: operator {}, dispatcher {}",
        cpu(cpu_at_dark.0, s.operators.cpu_time("g-a")),
        cpu(cpu_at_dark.1, s.dispatchers.cpu_time("apiblackout-d0")),
    );
    s.say(&format!(
        "API server answers again ({:.1} s after the blackout began)",
        back.duration_since(dark).as_secs_f64()
    ));
    // Status catches up: every endpoint's last delivery is one made after the API
    // returned (written from the dispatcher's health by the operator leading again).
    let mut caught_up = Vec::new();
    for ep in ["fresh", "ordered", "flaky"] {
        let done = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                if let Some(last) = s.status(ep).await.and_then(|st| st.last_delivery)
                    && last.time.0 >= back_wall
                {
                    return Instant::now();
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        match done {
            Ok(at) => caught_up.push(at.duration_since(back)),
            Err(_) => {
                let status = s.status(ep).await;
                s.fail(format!(
                    "{ep}: status did not catch up within 30 s of the API's return: lastDelivery {:?}",
                    status.and_then(|st| st.last_delivery)
                ));
            }
        }
    }
    let catch_up = caught_up.iter().max().copied().unwrap_or_default();
    s.say(&format!(
        "status caught up {catch_up:.1?} after the API returned"
    ));
    let leader_back = eventually("a leader again", Duration::from_secs(30), || s.leader()).await;

    let published = publisher.await.expect("publisher");
    // Deliveries went on during the blackout: each endpoint received at least half as
    // many events as were accepted meanwhile (a rate, robust to a backlog the loaded
    // machine may build), and every event accepted in its first half arrived before it
    // ended.
    let acks = ack_times(&published);
    let mut flows = Vec::new();
    let mut broken = Vec::new();
    for ep in ["fresh", "ordered", "flaky"] {
        let (accepted, received) = s.flow_between(&acks, ep, dark, back);
        let (n, late) = s.late_between(&acks, ep, dark, dark + BLACKOUT / 2, back);
        let (all, late_all) = s.late_between(&acks, ep, dark, back, back);
        flows.push(format!(
            "{ep} received {received} (of {accepted} accepted), {} of {all} delivered before it ended",
            all - late_all.len()
        ));
        if received * 2 < accepted {
            broken.push(format!(
                "{ep}: received {received} while {accepted} were accepted"
            ));
        }
        if !late.is_empty() {
            broken.push(format!(
                "{ep}: {} of the {n} events accepted in the first 15 s arrived after it, e.g. {:?}",
                late.len(),
                &late[..late.len().min(10)]
            ));
        }
    }
    if !broken.is_empty() {
        s.fail(format!(
            "deliveries did not go on during the blackout: {}",
            broken.join("; ")
        ));
    }
    // The configuration in NATS was left alone.
    let touched: Vec<String> = ["fresh", "ordered", "flaky"]
        .iter()
        .filter(|n| {
            let changes = s.config.of(&s.key(n));
            changes.iter().any(|c| c.value != changes[0].value)
        })
        .map(|n| format!("{n}:\n{}", s.config.render(&s.key(n), s.started, 200)))
        .collect();
    if !touched.is_empty() {
        s.fail(format!(
            "configuration entries changed around the blackout:\n{}",
            touched.join("\n")
        ));
    }
    let notes = format!(
        "{RATE}/s; blackout began {} ({dark_wall}); API answered {:.1} s later; during it {}; \
         {cpu_dark}; status (lastDelivery) caught up {:.1} s after the API returned; leader \
         after: {leader_back}",
        s.t(dark),
        back.duration_since(dark).as_secs_f64(),
        flows.join(", "),
        catch_up.as_secs_f64(),
    );
    s.finish(
        published,
        "g. Kubernetes API unreachable",
        "30 s API server blackout mid-stream (connections cut, new ones refused); operator lease 5 s",
        &notes,
        Duration::from_secs(60),
    )
    .await;
}
