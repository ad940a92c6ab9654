//! i: a SigningSecret's Secret broken for a while: its endpoints are held.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i_a_broken_signing_secret_holds_and_loses_nothing() {
    let _faults = fault_lock().await;
    const BROKEN: Duration = Duration::from_secs(20);
    let count = stream_of(36);
    let eps = vec![
        EpSpec::new("fresh", json!({})),
        EpSpec::new("ordered", json!({"ordered": true})),
        flaky("flaky"),
        EpSpec::new("other", json!({})).secret("other"),
    ];
    let held_names = ["fresh", "ordered", "flaky"];
    let mut s = Scenario::new("secretbroken", eps, &["i-a"]).await;
    let secrets = s.ctx.api::<Secret>();
    let good = secrets
        .get(SIGNING)
        .await
        .expect("the generated Secret")
        .data
        .expect("data")["current"]
        .clone();
    let good_key = good.clone();
    let good_config = s
        .config
        .of(&s.key("fresh"))
        .last()
        .and_then(|c| c.value.clone());
    let (publisher, progress) = s.stream(0, count);
    progress_at(&progress, count / 5).await;
    let before = s.counts();
    s.until_delivering(&before, 50).await;
    let set_current = |value: ByteString| json!({"data": {"current": value}});
    // Taken before the request: the operator may act before the API answers the test.
    let broken = Instant::now();
    secrets
        .patch(
            SIGNING,
            &PatchParams::default(),
            &Patch::Merge(set_current(ByteString(b"whsec_not!base64".to_vec()))),
        )
        .await
        .expect("breaking the Secret");
    s.say("Secret `signing` broken (data.current is not a key)");
    // Held: the entry stays, with `held` set.
    let mut held_at = BTreeMap::new();
    for name in held_names {
        let key = s.key(name);
        let seen = eventually(
            &format!("{name}'s configuration held"),
            Duration::from_secs(15),
            || async {
                s.config
                    .first_since(&key, broken, |v| v.is_some_and(|v| !v["held"].is_null()))
            },
        )
        .await;
        held_at.insert(name, seen.at);
    }
    let held = s
        .config
        .of(&s.key("fresh"))
        .last()
        .and_then(|c| c.value.clone());
    let ready = eventually(
        "fresh Ready=False saying events keep queueing",
        Duration::from_secs(15),
        || async {
            let ready = s.condition("fresh", "Ready").await?;
            (ready.status == "False").then_some(ready)
        },
    )
    .await;
    s.say(&format!(
        "held after {:.1} s; Ready: {} {}: {}",
        held_at
            .values()
            .max()
            .unwrap()
            .duration_since(broken)
            .as_secs_f64(),
        ready.status,
        ready.reason,
        ready.message
    ));
    for name in held_names {
        let Some(ready) = s.condition(name, "Ready").await else {
            s.fail(format!("{name} has no Ready condition while held"));
            continue;
        };
        if ready.status != "False"
            || ready.reason != "SecretNotReady"
            || !ready.message.contains("events keep queueing")
        {
            s.fail(format!(
                "{name}'s Ready condition does not say it is held and events keep queueing: {} {}: {}",
                ready.status, ready.reason, ready.message
            ));
        }
    }
    // The SigningSecret says what is wrong, naming the data key, never the value.
    let secret_ready = eventually(
        "the SigningSecret Ready=False",
        Duration::from_secs(15),
        || async {
            let obj = tokio::time::timeout(API_CALL, s.ctx.api::<SigningSecret>().get(SIGNING))
                .await
                .ok()?
                .ok()?;
            let ready = obj
                .status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Ready")?;
            (ready.status == "False").then_some(ready)
        },
    )
    .await;
    if secret_ready.reason != "InvalidSpec"
        || !secret_ready.message.contains("current")
        || secret_ready.message.contains("not!base64")
    {
        s.fail(format!(
            "the SigningSecret's Ready condition: {}: {}",
            secret_ready.reason, secret_ready.message
        ));
    }
    match (&held, &good_config) {
        (Some(held), Some(good))
            if held["url"] != good["url"] || held["generation"] != good["generation"] =>
        {
            s.fail(format!(
                "the held entry is not the last good one: {held} vs {good}"
            ));
        }
        (Some(_), Some(_)) => {}
        _ => s.fail(format!(
            "fresh has no configuration entry while held:\n{}",
            s.config.render(&s.key("fresh"), s.started, 200)
        )),
    }
    tokio::time::sleep_until((broken + BROKEN).into()).await;
    let fixed = Instant::now();
    secrets
        .patch(
            SIGNING,
            &PatchParams::default(),
            &Patch::Merge(set_current(good)),
        )
        .await
        .expect("fixing the Secret");
    s.say("Secret `signing` fixed (the original key back)");
    let mut released = Vec::new();
    for name in held_names {
        let key = s.key(name);
        let seen = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                if let Some(c) = s
                    .config
                    .first_since(&key, fixed, |v| v.is_some_and(|v| v["held"].is_null()))
                {
                    return c.at;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        match seen {
            Ok(at) => released.push(at.duration_since(fixed)),
            Err(_) => s.fail(format!(
                "{name}: still held 20 s after the Secret was fixed:\n{}",
                s.config.render(&key, s.started, 200)
            )),
        }
    }
    let ready_again = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if s.condition("fresh", "Ready")
                .await
                .is_some_and(|c| c.status == "True")
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    if ready_again.is_err() {
        s.fail("fresh not Ready again 20 s after the Secret was fixed".into());
    }
    let published = publisher.await.expect("publisher");

    // Nothing was sent to a held endpoint, from ACT_WITHIN after the hold was published
    // until the fix.
    for name in held_names {
        let from = held_at[name] + ACT_WITHIN;
        let sent = s.requests_between(name, from, fixed);
        if !sent.is_empty() {
            s.fail(format!(
                "{name}: {} requests started while held (first at {}, hold published at {})",
                sent.len(),
                s.t(sent[0]),
                s.t(held_at[name])
            ));
        }
    }
    // The endpoint with the other secret went on: it received at least half as many
    // events as were accepted during the hold.
    let acks = ack_times(&published);
    let (accepted_held, other_received) = s.flow_between(&acks, "other", broken, fixed);
    if other_received * 2 < accepted_held {
        s.fail(format!(
            "other (another SigningSecret) was held up too: it received {other_received} while \
             {accepted_held} events were accepted during the hold"
        ));
    }
    let withdrawn = s.withdrawals(&["fresh", "ordered", "flaky", "other"]);
    if !withdrawn.is_empty() {
        s.fail(format!(
            "configuration withdrawn instead of held:\n{}",
            withdrawn.join("\n")
        ));
    }
    // Every request to the held endpoints, before and after the hold, is signed with the
    // original key (the typo never became a key, and no new one was generated): checked
    // once their backlog arrived.
    await_delivery(&published, &s.rx, &held_names, Duration::from_secs(60)).await;
    let key =
        SigningKey::from_whsec(&String::from_utf8_lossy(&good_key.0)).expect("the original key");
    let now = jiff::Timestamp::now().as_second();
    let mut unverified = 0;
    let mut checked = 0;
    for name in held_names {
        for r in s.rx.received(name) {
            checked += 1;
            let ok = verify(
                std::slice::from_ref(&key),
                r.header("webhook-id"),
                r.header("webhook-timestamp"),
                r.header("webhook-signature"),
                &r.body,
                now,
                600,
            );
            unverified += usize::from(ok.is_err());
        }
    }
    if unverified > 0 {
        s.fail(format!(
            "{unverified} of {checked} requests to the held endpoints do not verify with the original key"
        ));
    }
    let keyset = s
        .keys
        .render(&format!("key.{}.{SIGNING}", s.ns()), s.started, 80);
    s.say(&format!("KeySet of `signing`:\n{keyset}"));
    let last_held_request = held_names
        .iter()
        .filter_map(|n| {
            s.rx.exchanges(n)
                .iter()
                .filter(|e| e.at < fixed)
                .map(|e| e.at)
                .next_back()
        })
        .max();
    let notes = format!(
        "{RATE}/s; broken at {}, held {:.1} s later (last request to a held endpoint {}); fixed at \
         {}, released {:.1} s later; all {checked} requests to them verify with the original key; while held Ready=False {} saying events keep queueing; \
         {accepted_held} events accepted during the hold; `other` (another secret) received \
         {other_received} meanwhile",
        s.t(broken),
        held_at
            .values()
            .max()
            .unwrap()
            .duration_since(broken)
            .as_secs_f64(),
        last_held_request.map_or_else(|| "none".into(), |at| s.t(at)),
        s.t(fixed),
        released
            .iter()
            .max()
            .copied()
            .unwrap_or_default()
            .as_secs_f64(),
        ready.reason,
    );
    s.finish(
        published,
        "i. SigningSecret broken for 20 s",
        "the Secret's data.current set to an invalid key for 20 s mid-stream, then restored",
        &notes,
        Duration::from_secs(60),
    )
    .await;
}
