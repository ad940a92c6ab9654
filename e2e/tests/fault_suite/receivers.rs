//! e–f: receivers that fail at random, and a receiver's Retry-After across a restart.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e_random_receiver_failures_lose_nothing() {
    let _faults = fault_lock().await;
    let (count, rate) = sized((1500, 100.0), (10_000, 200.0));
    let chaos = |seed: u64, permille: u32| Chaos {
        hang: Duration::from_millis(2500),
        slow_body: Duration::from_millis(400),
        ..Chaos::uniform(seed, permille, 4)
    };
    // Retries at least as many as the faults one event can meet (4), quick ones; the
    // circuit breaker probes every second so an unlucky streak costs little.
    let delivery = |retry: &str| {
        json!({
            "timeout": "1s",
            "retry": {"schedule": vec![retry; 8]},
            "circuitBreaker": {"probeInterval": "1s"},
        })
    };
    let eps = vec![
        EpSpec::new(
            "fresh",
            json!({"delivery": delivery("1s")}),
            Behavior::chaos(chaos(1, 20)),
        ),
        EpSpec::new(
            "ordered",
            json!({"ordered": true, "delivery": delivery("200ms")}),
            Behavior::chaos(chaos(2, 8)),
        ),
        EpSpec::new(
            "capped",
            json!({"delivery": with_field(delivery("1s"), "maxInFlight", json!(4))}),
            Behavior::chaos(chaos(3, 20)),
        ),
    ];
    let mut s = Scenario::new(private_env(), "chaos", 1, eps).await;
    s.dispatchers.start("chaos-d0");
    s.warm_up().await;
    let (publisher, _progress) = s.stream(0, count, rate);
    let published = publisher.await.expect("publisher");
    s.say("published; waiting for the endpoints to catch up");
    let names: Vec<&'static str> = s.eps.iter().map(|e| e.name).collect();
    await_delivery(&published, &s.rx, &names, Duration::from_secs(240)).await;
    let mut answered = std::collections::BTreeMap::<String, usize>::new();
    for name in &names {
        for e in s.rx.exchanges(name) {
            let kind = match e.answer {
                Answer::Status(200) => continue,
                Answer::Status(code) => code.to_string(),
                Answer::Fault(Fault::Status(code)) => code.to_string(),
                Answer::Fault(Fault::Hang) => "hang".into(),
                Answer::Fault(Fault::Reset) => "reset".into(),
                Answer::Fault(Fault::SlowBody) => "slow body".into(),
                Answer::Fault(Fault::RetryAfter(_)) => "429".into(),
            };
            *answered.entry(kind).or_default() += 1;
        }
    }
    let injected = answered
        .iter()
        .map(|(k, n)| format!("{n} {k}"))
        .collect::<Vec<_>>()
        .join(", ");
    s.finish(
        published,
        "e. random receiver failures",
        &format!("seeded chaos on all 3 receivers: {injected}"),
        &format!(
            "{rate}/s; timeout 1 s, hang 2.5 s, Retry-After 1 s, at most 4 faults per event; \
             ordered endpoint retries in place after 200 ms"
        ),
        Duration::from_secs(30),
    )
    .await;
}

/// `object` with `field` set to `value`.
fn with_field(mut object: Value, field: &str, value: Value) -> Value {
    object[field] = value;
    object
}

// ---------------------------------------------------------------------------------------
// f. Retry-After across a restart
// ---------------------------------------------------------------------------------------

/// The endpoint `paced` answers its first request 429 with `Retry-After: retry_after`,
/// then 200. Once the dispatcher has saved the pause, it is restarted (`kill -9`, or
/// SIGINT when `graceful`) while more events arrive; nothing may reach `paced` before the
/// pause is over. Returns the time from the 429 to the next request.
async fn retry_after_across_restart(label: &'static str, retry_after: u64, graceful: bool) {
    let eps = vec![
        EpSpec::new("fresh", json!({}), Behavior::default()),
        EpSpec::new(
            "paced",
            json!({"delivery": {"maxInFlight": 1, "retry": {"schedule": ["1s", "1s", "1s"]}}}),
            Behavior::statuses(&[429, 200]).with_header("retry-after", &retry_after.to_string()),
        ),
    ];
    let mut s = Scenario::new(private_env(), label, 1, eps).await;
    let id = format!("{label}-d0");
    s.dispatchers.start(&id);
    let (first, _) = s.stream(0, 1, 10.0);
    let mut published = first.await.expect("publisher");
    let t429 = eventually("the 429", Duration::from_secs(30), || async {
        s.rx.exchanges("paced")
            .into_iter()
            .find(|e| e.answer == Answer::Status(429))
            .map(|e| e.at)
    })
    .await;
    let key = BucketKey::Lasting {
        shard: s.shard("paced"),
        key: EndpointKey::new(&s.ns, "paced"),
    }
    .to_string();
    let saved = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Ok(Some(value)) = s.dp.health.get(&key).await
                && let Ok(state) = serde_json::from_slice::<Value>(&value)
                && state.get("retryAfterUntilMs").is_some()
            {
                return state;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let saved_after = t429.elapsed();
    let how = if graceful {
        let took = s.dispatchers.stop(&id).await;
        format!("SIGINT (stopped in {:.1} s)", took.as_secs_f64())
    } else {
        s.dispatchers.kill(&id);
        "kill -9".to_owned()
    };
    s.say(&format!(
        "429 answered; saved state {}; {how} {:.0} ms after the 429",
        saved
            .as_ref()
            .map_or_else(|_| "NOT FOUND within 10 s".to_owned(), |v| v.to_string()),
        saved_after.as_millis()
    ));
    // Events accepted while the pause lasts, delivered only after it.
    let (more, _) = s.stream(1, 10, 20.0);
    s.dispatchers.start(&id);
    published.merge(more.await.expect("publisher"));
    let next = eventually(
        "a request to /paced after the 429",
        Duration::from_secs(retry_after + 60),
        || async {
            s.rx.exchanges("paced")
                .into_iter()
                .find(|e| e.at > t429)
                .map(|e| e.at)
        },
    )
    .await;
    let gap = next.duration_since(t429);
    s.say(&format!("next request {:.2?} after the 429", gap));
    let honoured = gap + Duration::from_millis(100) >= Duration::from_secs(retry_after);
    let fault = format!(
        "f. Retry-After {retry_after} s across {}",
        if graceful {
            "a graceful restart"
        } else {
            "kill -9"
        }
    );
    let notes = format!(
        "429→next request {:.2} s (Retry-After {retry_after} s){}; pause saved {:.0} ms after the 429",
        gap.as_secs_f64(),
        if honoured { "" } else { " — TOO EARLY" },
        saved_after.as_millis()
    );
    s.finish(
        published,
        &fault,
        &format!(
            "{how} of the dispatcher right after the 429 was saved; 10 events during the pause"
        ),
        &notes,
        Duration::from_secs(retry_after + 60),
    )
    .await;
    assert!(
        saved.is_ok(),
        "the dispatcher did not save the Retry-After under {key} within 10 s"
    );
    assert!(
        honoured,
        "the restarted dispatcher sent to /paced {gap:.2?} after a 429 with Retry-After: {retry_after}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f1_retry_after_outlives_a_kill_9() {
    let _faults = fault_lock().await;
    // Longer than the lease TTL (10 s) that keeps a restarted dispatcher away anyway.
    retry_after_across_restart("ra-kill", 20, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f2_retry_after_outlives_a_graceful_restart() {
    let _faults = fault_lock().await;
    retry_after_across_restart("ra-stop", 5, true).await;
}
