//! j: an endpoint paused, another deleted, mid-stream.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn j_nothing_is_delivered_to_a_paused_or_deleted_endpoint() {
    let _faults = fault_lock().await;
    const PAUSED: Duration = Duration::from_secs(8);
    let count = stream_of(30);
    let eps = vec![
        EpSpec::new("fresh", json!({})),
        EpSpec::new("ordered", json!({"ordered": true})),
        flaky("pausable"),
        flaky("doomed"),
    ];
    let mut s = Scenario::new("pausedelete", eps, &["j-a"]).await;
    let (publisher, progress) = s.stream(0, count);
    progress_at(&progress, count / 6).await;
    let before = s.counts();
    s.until_delivering(&before, 50).await;

    // Pause.
    // Taken before the request: the watch may report the change before the API answers.
    let pause = Instant::now();
    s.patch_endpoint("pausable", json!({"spec": {"paused": true}}))
        .await;
    let health_key = s.key("pausable");
    let known = eventually(
        "the dispatcher to report pausable Paused",
        Duration::from_secs(15),
        || async {
            s.health
                .first_since(&health_key, pause, |v| {
                    v.is_some_and(|v| v["state"] == json!("Paused"))
                })
                .map(|c| c.at)
        },
    )
    .await;
    s.say(&format!(
        "pausable paused; the dispatcher reported it {:.2} s later",
        known.duration_since(pause).as_secs_f64()
    ));
    let state = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if s.status("pausable").await.and_then(|st| st.state) == Some(EndpointState::Paused) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    if state.is_err() {
        s.fail(
            "pausable's status.state is not Paused 10 s after the dispatcher reported it".into(),
        );
    }
    tokio::time::sleep_until((known + PAUSED).into()).await;
    // Before the request: once it is sent, the dispatcher may resume before it answers.
    let unpause = Instant::now();
    s.patch_endpoint("pausable", json!({"spec": {"paused": false}}))
        .await;
    s.say("pausable unpaused");
    let sent = s.requests_between("pausable", known, unpause);
    if !sent.is_empty() {
        s.fail(format!(
            "pausable: {} requests started after the dispatcher reported it Paused (first at {}, reported at {})",
            sent.len(),
            s.t(sent[0]),
            s.t(known)
        ));
    }
    // The backlog the dispatcher reported last while paused.
    let backlog_at_unpause = s
        .health
        .of(&health_key)
        .iter()
        .rev()
        .find(|c| c.at < unpause)
        .and_then(|c| c.value.as_ref()?["backlog"].as_u64())
        .unwrap_or(0);

    // Delete.
    progress_at(&progress, count * 3 / 5).await;
    let doomed_before = s.got("doomed");
    let deleted = Instant::now();
    s.ctx
        .api::<WebhookEndpoint>()
        .delete("doomed", &DeleteParams::default())
        .await
        .expect("deleting doomed");
    s.expect.insert("doomed", Expect::Nothing);
    let doomed_key = s.key("doomed");
    let gone = eventually(
        "doomed's configuration withdrawn",
        Duration::from_secs(15),
        || async {
            s.config
                .first_since(&doomed_key, deleted, |v| v.is_none())
                .map(|c| c.at)
        },
    )
    .await;
    s.say(&format!(
        "doomed deleted; its configuration gone {:.2} s later",
        gone.duration_since(deleted).as_secs_f64()
    ));
    eventually(
        "the doomed object gone",
        Duration::from_secs(15),
        || async {
            tokio::time::timeout(API_CALL, s.ctx.api::<WebhookEndpoint>().get_opt("doomed"))
                .await
                .ok()?
                .ok()?
                .is_none()
                .then_some(())
        },
    )
    .await;
    let published = publisher.await.expect("publisher");
    let end = Instant::now();
    let after_gone = s.requests_between("doomed", gone + ACT_WITHIN, end);
    if !after_gone.is_empty() {
        s.fail(format!(
            "doomed: {} requests more than {ACT_WITHIN:?} after its configuration was gone (first at {}, gone at {})",
            after_gone.len(),
            s.t(after_gone[0]),
            s.t(gone)
        ));
    }
    let last_doomed = s.rx.exchanges("doomed").last().map(|e| e.at);
    let notes = format!(
        "{RATE}/s; `pausable` paused at {} (reported Paused {:.2} s later, 0 requests after), \
         unpaused {:.0} s later (backlog reported {backlog_at_unpause}); `doomed` deleted at \
         {}, configuration gone {:.2} s later, last request {} ({} received in all, {} before \
         the delete, not counted); {:.0} s of stream after it was gone",
        s.t(pause),
        known.duration_since(pause).as_secs_f64(),
        unpause.duration_since(known).as_secs_f64(),
        s.t(deleted),
        gone.duration_since(deleted).as_secs_f64(),
        last_doomed.map_or_else(|| "none".into(), |at| s.t(at)),
        s.got("doomed"),
        doomed_before,
        end.duration_since(gone).as_secs_f64(),
    );
    s.finish(
        published,
        "j. endpoint paused, another deleted",
        "spec.paused set for 8 s mid-stream on one endpoint; another endpoint deleted mid-stream",
        &notes,
        Duration::from_secs(60),
    )
    .await;
}
