//! The delivery contract under faults, each in an environment of its own: a dispatcher
//! killed with SIGKILL mid-stream loses nothing; replicas scaling up and down hand shards
//! over without loss and without two replicas delivering for one endpoint at once; each
//! replica indexes only the endpoints its shards and partitions need.

use std::collections::{BTreeSet, HashMap};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use futures::StreamExt;
use herald_core::dataplane::{
    DELIVERIES_STREAM, EndpointConfig, LeaseKey, SHARDS_BUCKET, event_subject, partition_of,
};
use herald_e2e::dataplane::{DataPlane, TEST_SECRET, TEST_SHARDS, endpoint};
use herald_e2e::faults::cpu_time;
use herald_e2e::receiver::{Behavior, Receiver};
use herald_e2e::{eventually, fault_lock, private_env, stop};
use serde_json::json;

fn spawn_dispatcher(id: &str) -> Child {
    spawn_dispatcher_on(id, "127.0.0.1:0")
}

/// A dispatcher process serving `/readyz` on `listen`.
fn spawn_dispatcher_on(id: &str, listen: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_herald-test-dispatcher"))
        .args([
            "--nats-url",
            private_env().nats_url(),
            "--replica-id",
            id,
            "--shards",
            "4",
            "--allow-network",
            "127.0.0.0/8",
            "--allow-http",
            "--listen",
            listen,
            "--health-interval",
            "1s",
            "--grace",
            "5s",
        ])
        .stdin(Stdio::null())
        .stdout(log(id, "out"))
        .stderr(log(id, "err"))
        .spawn()
        .expect("starting a dispatcher process")
}

/// The process's log, kept in the temp dir for when a test fails.
fn log(id: &str, stream: &str) -> Stdio {
    let path = std::env::temp_dir().join(format!("herald-test-dispatcher-{id}.{stream}.log"));
    std::fs::File::create(path).map_or_else(|_| Stdio::null(), Stdio::from)
}

fn received_data(rx: &Receiver, path: &str) -> BTreeSet<i64> {
    rx.received(path)
        .iter()
        .map(|r| r.json()["data"].as_i64().unwrap())
        .collect()
}

#[tokio::test]
async fn kill_9_mid_stream_then_restart_delivers_every_event() {
    let _faults = fault_lock().await;
    let dp = DataPlane::new(private_env().nats().await).await;
    let rx = Receiver::start().await;
    let ns = herald_e2e::unique_name("kill");
    dp.put_keys(&ns, "signing", &[TEST_SECRET]).await;
    rx.behave("hook", Behavior::delayed(Duration::from_millis(20)));
    let config = endpoint(
        &ns,
        "hook",
        json!({"url": rx.url("hook"), "delivery": {"maxInFlight": 4}}),
    );
    dp.put_endpoint(&config).await;

    let mut first = spawn_dispatcher("kill-a");
    for i in 0..100 {
        dp.publish(&ns, "a", json!(i)).await;
    }
    eventually(
        "some deliveries before the kill",
        Duration::from_secs(30),
        || {
            let n = rx.received("hook").len();
            async move { (n >= 20).then_some(()) }
        },
    )
    .await;
    first.kill().expect("SIGKILL");
    let _ = first.wait();
    // Accepted while no dispatcher runs.
    for i in 100..200 {
        dp.publish(&ns, "a", json!(i)).await;
    }
    let second = spawn_dispatcher("kill-b");
    let all: BTreeSet<i64> = (0..200).collect();
    let mut waited = 0;
    while received_data(&rx, "hook") != all {
        waited += 1;
        if waited > 900 {
            let got = received_data(&rx, "hook");
            let missing: Vec<_> = all.difference(&got).take(20).collect();
            panic!(
                "after 90 s, {} of 200 received; missing e.g. {missing:?}",
                got.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let duplicates = rx.received("hook").len() - 200;
    println!("kill -9: 200 events delivered, {duplicates} duplicates (at-least-once)");
    stop(second).await;
}

#[tokio::test]
async fn scaling_replicas_hands_shards_over_without_loss_or_overlap() {
    let _faults = fault_lock().await;
    let dp = DataPlane::new(private_env().nats().await).await;
    let rx = Receiver::start().await;
    let ns = herald_e2e::unique_name("scale");
    dp.put_keys(&ns, "signing", &[TEST_SECRET]).await;
    // Ordered: one request at a time; two replicas delivering at once would show as two
    // concurrent requests on the receiver.
    let mut paths = Vec::new();
    for i in 0..6 {
        let path = format!("ep{i}");
        rx.behave(&path, Behavior::delayed(Duration::from_millis(30)));
        let config = endpoint(&ns, &path, json!({"url": rx.url(&path), "ordered": true}));
        dp.put_endpoint(&config).await;
        paths.push(path);
    }
    let a = spawn_dispatcher("scale-a");
    for i in 0..40 {
        dp.publish(&ns, "a", json!(i)).await;
    }
    // Scale up while delivering, then down: shards move twice.
    let b = spawn_dispatcher("scale-b");
    for i in 40..60 {
        dp.publish(&ns, "a", json!(i)).await;
    }
    stop(a).await;
    for i in 60..80 {
        dp.publish(&ns, "a", json!(i)).await;
    }
    let all: BTreeSet<i64> = (0..80).collect();
    for path in &paths {
        eventually(
            &format!("all 80 events on /{path}"),
            Duration::from_secs(90),
            || {
                let done = received_data(&rx, path) == all;
                async move { done.then_some(()) }
            },
        )
        .await;
        assert_eq!(
            rx.max_in_flight(path),
            1,
            "/{path} had two deliveries in flight at once"
        );
        let order: Vec<i64> = rx
            .received(path)
            .iter()
            .map(|r| r.json()["data"].as_i64().unwrap())
            .collect();
        let mut first_seen = Vec::new();
        for d in order {
            if !first_seen.contains(&d) {
                first_seen.push(d);
            }
        }
        assert_eq!(
            first_seen,
            (0..80).collect::<Vec<_>>(),
            "/{path} out of order"
        );
    }
    stop(b).await;
}

/// SIGKILL, then wait for the process to be gone.
fn kill_9(mut child: Child) {
    child.kill().expect("SIGKILL");
    let _ = child.wait();
}

/// State that must outlive a dispatcher: an endpoint disabled by 410 Gone stays disabled
/// through a SIGKILL and restart (nothing is sent to it), and retries waiting as
/// JetStream schedules still count as its backlog for the new process.
#[tokio::test]
async fn disabled_state_and_scheduled_backlog_survive_a_kill_9() {
    let _faults = fault_lock().await;
    let dp = DataPlane::new(private_env().nats().await).await;
    let rx = Receiver::start().await;
    let ns = herald_e2e::unique_name("lasting");
    dp.put_keys(&ns, "signing", &[TEST_SECRET]).await;
    rx.behave("gone", Behavior::statuses(&[410]));
    rx.behave("later", Behavior::statuses(&[500]));
    let gone = endpoint(
        &ns,
        "gone",
        json!({"url": rx.url("gone"), "eventTypes": ["g"]}),
    );
    // Retries far enough out that they still wait when the new process starts.
    let later = endpoint(
        &ns,
        "later",
        json!({"url": rx.url("later"), "eventTypes": ["l"],
               "delivery": {"retry": {"schedule": ["25s"]}}}),
    );
    dp.put_endpoint(&gone).await;
    dp.put_endpoint(&later).await;
    let first = spawn_dispatcher("lasting-a");
    dp.publish(&ns, "g", json!(0)).await;
    for i in 0..5 {
        dp.publish(&ns, "l", json!(i)).await;
    }
    let health = |name: &'static str,
                  check: fn(&herald_core::dataplane::EndpointHealth) -> bool| {
        let (dp, ns) = (dp.clone(), ns.clone());
        async move {
            eventually(&format!("{name}'s health"), Duration::from_secs(30), || {
                let (dp, ns) = (dp.clone(), ns.clone());
                async move { dp.health(&ns, name).await.filter(check) }
            })
            .await
        }
    };
    health("gone", |h| h.disabled_reason.is_some()).await;
    health("later", |h| h.backlog == Some(5)).await;
    assert_eq!(rx.received("later").len(), 5, "one failed attempt each");
    kill_9(first);

    // Forget what the killed process reported, so what follows is the new one's.
    for name in ["gone", "later"] {
        let key = herald_core::dataplane::EndpointKey::new(&ns, name).config_key();
        dp.health.delete(key).await.expect("deleting health");
    }
    rx.behave("gone", Behavior::statuses(&[200]));
    let second = spawn_dispatcher("lasting-b");
    dp.publish(&ns, "g", json!(1)).await;
    let restored = health("gone", |h| h.uid.starts_with("uid-")).await;
    assert!(
        restored.disabled_reason.is_some(),
        "a restart re-enabled a disabled endpoint: {restored:?}"
    );
    let later_health = health("later", |h| h.backlog.is_some()).await;
    assert_eq!(
        later_health.backlog,
        Some(5),
        "the retries waiting as schedules are the new process's backlog"
    );
    assert!(later_health.oldest_pending_ms.is_some());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        rx.received("gone").len(),
        1,
        "nothing is sent to a disabled endpoint after a restart"
    );
    stop(second).await;
}

/// `/readyz` of a dispatcher: `Some((ready, body))` once it answers.
async fn readyz(http: &reqwest::Client, port: u16) -> Option<(bool, String)> {
    let response = http
        .get(format!("http://127.0.0.1:{port}/readyz"))
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?;
    let ready = response.status().is_success();
    Some((ready, response.text().await.ok()?))
}

/// The shard leases held in `herald-shards`.
async fn held_leases(dp: &DataPlane) -> Option<BTreeSet<String>> {
    let shards = dp.js.get_key_value(SHARDS_BUCKET).await.ok()?;
    let mut keys = shards.keys().await.ok()?;
    let mut held = BTreeSet::new();
    while let Some(key) = keys.next().await {
        let key = key.ok()?;
        if let Some(LeaseKey::Shard(_)) = LeaseKey::parse(&key) {
            held.insert(key);
        }
    }
    Some(held)
}

/// A shard that cannot run (here: its lanes' stream is gone, so its consumer cannot be
/// created) is not kept alive on paper: its lease is given up, `/readyz` names `shards`,
/// and it is tried again with back-off; once the stream is back it runs again and
/// delivers what was accepted meanwhile.
#[tokio::test]
async fn a_shard_that_cannot_run_gives_its_lease_up_and_recovers() {
    let _faults = fault_lock().await;
    let dp = DataPlane::new(private_env().nats().await).await;
    let rx = Receiver::start().await;
    let ns = herald_e2e::unique_name("shardfail");
    dp.put_keys(&ns, "signing", &[TEST_SECRET]).await;
    dp.put_endpoint(&endpoint(&ns, "hook", json!({"url": rx.url("hook")})))
        .await;
    herald_dispatcher::install_crypto_provider();
    let http = reqwest::Client::new();
    let port = herald_e2e::free_port();
    let child = spawn_dispatcher_on("shardfail", &format!("127.0.0.1:{port}"));
    let within = Duration::from_secs(60);
    eventually("the dispatcher ready", within, || async {
        readyz(&http, port).await.filter(|(ready, _)| *ready)
    })
    .await;
    dp.publish(&ns, "a", json!(0)).await;
    eventually("the first event delivered", within, || {
        let n = rx.received("hook").len();
        async move { (n >= 1).then_some(()) }
    })
    .await;

    dp.js
        .delete_stream(DELIVERIES_STREAM)
        .await
        .expect("deleting the lanes' stream");
    // Accepted while no shard can run: must not be lost.
    dp.js
        .publish(
            event_subject(&ns, "a"),
            json!({"type": "a", "data": 1}).to_string().into(),
        )
        .await
        .expect("publish")
        .await
        .expect("publish ack");
    let body = eventually("/readyz naming shards", within, || async {
        readyz(&http, port)
            .await
            .filter(|(ready, body)| !ready && body.contains("shards"))
            .map(|(_, body)| body)
    })
    .await;
    println!("while the lanes' stream is gone: /readyz says {body:?}");
    eventually("every shard lease given up", within, || async {
        held_leases(&dp).await.filter(BTreeSet::is_empty)
    })
    .await;

    herald_dispatcher::setup::ensure(
        &dp.js,
        herald_dispatcher::setup::DEFAULT_RETENTION,
        herald_e2e::dataplane::TEST_SHARDS,
        1,
    )
    .await
    .expect("recreating the layout");
    eventually("the dispatcher ready again", within, || async {
        readyz(&http, port).await.filter(|(ready, _)| *ready)
    })
    .await;
    eventually("the event accepted meanwhile delivered", within, || {
        let got = received_data(&rx, "hook");
        async move { got.contains(&1).then_some(()) }
    })
    .await;
    assert_eq!(held_leases(&dp).await.map(|l| l.len()), Some(4));
    stop(child).await;
}

/// A replica whose shard leases are taken by another writer (its renewals fail, as
/// behind a partition from the bucket's leader) gives the shards up and stops their
/// loops — it does not keep dispatching without a lease, spinning on a stop signal whose
/// sender is gone — and takes them again once the taken entries expire, delivering what
/// was accepted meanwhile. (The lease loop aborts a lost shard's task and the shard
/// loop also ends on a dropped stop sender; either alone keeps this test green.)
#[tokio::test]
async fn a_replica_whose_leases_are_taken_stops_those_shards_without_spinning() {
    let _faults = fault_lock().await;
    let dp = DataPlane::new(private_env().nats().await).await;
    let rx = Receiver::start().await;
    let ns = herald_e2e::unique_name("taken");
    dp.put_keys(&ns, "signing", &[TEST_SECRET]).await;
    dp.put_endpoint(&endpoint(&ns, "hook", json!({"url": rx.url("hook")})))
        .await;
    let child = spawn_dispatcher("taken");
    let pid = child.id();
    let within = Duration::from_secs(60);
    dp.publish(&ns, "a", json!(0)).await;
    eventually("the first event delivered", within, || {
        let n = rx.received("hook").len();
        async move { (n >= 1).then_some(()) }
    })
    .await;

    let shards = dp
        .js
        .get_key_value(SHARDS_BUCKET)
        .await
        .expect("herald-shards");
    for shard in 0..TEST_SHARDS {
        shards
            .put(LeaseKey::Shard(shard).to_string(), "thief".into())
            .await
            .expect("taking a lease");
    }
    // The replica notices at its next renewal (every 2 s) and stops the shards.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = cpu_time(pid).expect("the replica's CPU time");
    let watched = std::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let used = cpu_time(pid).expect("the replica's CPU time") - before;
    let share = used.as_secs_f64() / watched.elapsed().as_secs_f64();
    println!("without its leases the replica used {used:?} of CPU in 5 s ({share:.2} of a core)");
    assert!(
        share < 0.5,
        "the replica used {share:.2} of a core without its leases: a loop spinning"
    );
    dp.publish(&ns, "a", json!(1)).await;
    eventually("the event accepted meanwhile delivered", within, || {
        let got = received_data(&rx, "hook");
        async move { got.contains(&1).then_some(()) }
    })
    .await;
    stop(child).await;
}

/// Issue 12's "each replica holds only the configuration its shards and partitions
/// need": two replicas of a four-shard installation each index exactly the endpoints of
/// their two shards (they deliver to them) and of their two partitions' namespaces (they
/// match their events) — not every endpoint; events still reach every endpoint across
/// replicas (matched by the partition's owner, delivered by the shard's); when one
/// replica stops, the other reads the rest before its new shards start and delivers to
/// every endpoint.
#[tokio::test]
async fn each_replica_indexes_only_what_its_shards_and_partitions_need() {
    let _faults = fault_lock().await;
    let dp = DataPlane::new(private_env().nats().await).await;
    let rx = Receiver::start().await;
    let prefix = herald_e2e::unique_name("scope");
    let mut paths = Vec::new();
    for t in 0..8 {
        let ns = format!("{prefix}-{t}");
        dp.put_keys(&ns, "signing", &[TEST_SECRET]).await;
        for i in 0..10 {
            let (name, path) = (format!("hook-{i}"), format!("{ns}-hook-{i}"));
            dp.put_endpoint(&endpoint(&ns, &name, json!({"url": rx.url(&path)})))
                .await;
            paths.push((ns.clone(), path));
        }
    }
    // Every endpoint in the bucket (earlier tests' too): its namespace and shard.
    let all = endpoints_in_bucket(&dp).await;
    let part_of = |owned: &BTreeSet<u32>| {
        all.iter()
            .filter(|(ns, shard)| {
                owned.contains(shard) || owned.contains(&partition_of(ns, TEST_SHARDS))
            })
            .count()
    };
    let (port_a, port_b) = (herald_e2e::free_port(), herald_e2e::free_port());
    let a = spawn_dispatcher_on("scope-a", &format!("127.0.0.1:{port_a}"));
    let b = spawn_dispatcher_on("scope-b", &format!("127.0.0.1:{port_b}"));
    let within = Duration::from_secs(90);
    let (held_a, held_b) = eventually("two shards each, each index its part", within, || async {
        let owners = lease_owners(&dp).await?;
        let (shards_a, shards_b) = (owners.get("scope-a")?, owners.get("scope-b")?);
        if shards_a.len() != 2 || shards_b.len() != 2 {
            return None;
        }
        let held_a = endpoints_gauge(port_a).await?;
        let held_b = endpoints_gauge(port_b).await?;
        (held_a == part_of(shards_a) && held_b == part_of(shards_b)).then_some((held_a, held_b))
    })
    .await;
    println!(
        "two replicas, four shards: {held_a} and {held_b} of {} endpoints indexed",
        all.len()
    );
    assert!(
        held_a < all.len() && held_b < all.len(),
        "a replica holds every endpoint"
    );

    let received = |n: usize| {
        paths
            .iter()
            .filter(|(_, path)| received_data(&rx, path).len() < n)
            .count()
    };
    for t in 0..8 {
        dp.publish(&format!("{prefix}-{t}"), "order.created", json!(0))
            .await;
    }
    eventually("the first event at every endpoint", within, || {
        let missing = received(1);
        async move { (missing == 0).then_some(()) }
    })
    .await;

    stop(b).await;
    eventually(
        "scope-a holds every shard and every endpoint",
        within,
        || async {
            let owners = lease_owners(&dp).await?;
            let all_shards = owners.get("scope-a")?.len() == 4;
            (all_shards && endpoints_gauge(port_a).await? == all.len()).then_some(())
        },
    )
    .await;
    for t in 0..8 {
        dp.publish(&format!("{prefix}-{t}"), "order.created", json!(1))
            .await;
    }
    eventually("the second event at every endpoint", within, || {
        let missing = received(2);
        async move { (missing == 0).then_some(()) }
    })
    .await;
    stop(a).await;
}

/// Every endpoint configuration in `herald-config`: its namespace and shard.
async fn endpoints_in_bucket(dp: &DataPlane) -> Vec<(String, u32)> {
    let mut keys = dp.config.keys().await.expect("listing the config bucket");
    let mut found = Vec::new();
    while let Some(key) = keys.next().await {
        let key = key.expect("a key");
        if !key.starts_with("ep.") {
            continue;
        }
        let Some(value) = dp.config.get(&key).await.expect("reading a config") else {
            continue;
        };
        let config: EndpointConfig = serde_json::from_slice(&value).expect("a config");
        found.push((config.namespace, config.shard));
    }
    found
}

/// Which shards each replica holds the lease of.
async fn lease_owners(dp: &DataPlane) -> Option<HashMap<String, BTreeSet<u32>>> {
    let shards = dp.js.get_key_value(SHARDS_BUCKET).await.ok()?;
    let mut owners: HashMap<String, BTreeSet<u32>> = HashMap::new();
    for shard in 0..TEST_SHARDS {
        if let Some(holder) = shards.get(LeaseKey::Shard(shard).to_string()).await.ok()? {
            let holder = String::from_utf8_lossy(&holder).into_owned();
            owners.entry(holder).or_default().insert(shard);
        }
    }
    Some(owners)
}

/// `herald_dispatcher_endpoints` of the dispatcher serving metrics on `port`.
async fn endpoints_gauge(port: u16) -> Option<usize> {
    let metrics = herald_e2e::scrape_metrics(port).await?;
    metrics
        .lines()
        .find_map(|line| line.strip_prefix("herald_dispatcher_endpoints "))?
        .trim()
        .parse()
        .ok()
}

/// The configuration watch's consumer is a single replica on one NATS node; when it
/// vanishes (its node lost — the chaos soak's seed 800 lost a re-created endpoint's
/// first events that way) the client only notices after two missed idle heartbeats,
/// 10 s. Here the consumer is deleted on the server, which the client is not told
/// either, and an endpoint created right after must get every event published from
/// [`VISIBLE`] on: the dispatcher sees the bucket has more than its watch delivered and
/// watches again from there.
#[tokio::test]
async fn a_config_watch_that_lost_its_consumer_sees_a_new_endpoint_within_seconds() {
    const VISIBLE: Duration = Duration::from_secs(3);
    let _faults = fault_lock().await;
    let dp = DataPlane::new(private_env().nats().await).await;
    let rx = Receiver::start().await;
    let ns = herald_e2e::unique_name("silent");
    dp.put_keys(&ns, "signing", &[TEST_SECRET]).await;
    dp.put_endpoint(&endpoint(&ns, "first", json!({"url": rx.url("first")})))
        .await;
    let dispatcher = spawn_dispatcher("silent");
    eventually(
        "the first endpoint delivering",
        Duration::from_secs(60),
        || async {
            dp.publish(&ns, "a", json!(-1)).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            (!rx.received("first").is_empty()).then_some(())
        },
    )
    .await;

    let names = delete_config_consumers(&dp).await;
    let written = std::time::Instant::now();
    dp.put_endpoint(&endpoint(&ns, "second", json!({"url": rx.url("second")})))
        .await;
    let mut published = Vec::new();
    for i in 0..80 {
        dp.publish(&ns, "a", json!(i)).await;
        published.push((i, written.elapsed()));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let owed: BTreeSet<i64> = published
        .iter()
        .filter(|(_, at)| *at >= VISIBLE)
        .map(|(i, _)| *i)
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut got = received_data(&rx, "second");
    while !owed.is_subset(&got) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        got = received_data(&rx, "second");
    }
    let first = published
        .iter()
        .find(|(i, _)| got.contains(i))
        .map(|(_, at)| *at);
    stop(dispatcher).await;
    let missing: Vec<_> = owed.difference(&got).collect();
    assert!(
        missing.is_empty(),
        "events published {VISIBLE:?} or more after the endpoint was written never reached \
         it: {missing:?} (its first event was published {first:?} after; consumers deleted: \
         {names:?}; log herald-test-dispatcher-silent.*.log)"
    );
    println!("the new endpoint's first event was published {first:?} after it was written");
}

/// Deletes every consumer of the `herald-config` stream (the dispatcher's watches of it):
/// what the loss of the NATS node holding them does, without an election. Their names.
async fn delete_config_consumers(dp: &DataPlane) -> Vec<String> {
    let stream = format!("KV_{}", herald_core::dataplane::CONFIG_BUCKET);
    let stream = dp.js.get_stream(&stream).await.expect("the config stream");
    let names: Vec<String> = stream
        .consumer_names()
        .filter_map(|name| async move { name.ok() })
        .collect()
        .await;
    assert!(!names.is_empty(), "the dispatcher's watches have consumers");
    for name in &names {
        stream
            .delete_consumer(name)
            .await
            .expect("deleting a consumer");
    }
    names
}

/// The replay requests' watch, when its consumer is lost (its NATS node gone), is
/// watched again within a second or so: a replay requested meanwhile starts at once,
/// not after the client's missed heartbeats (10 s).
#[tokio::test]
async fn a_replay_watch_that_lost_its_consumer_starts_a_new_replay_within_seconds() {
    const STARTS_WITHIN: Duration = Duration::from_secs(4);
    let _faults = fault_lock().await;
    let dp = DataPlane::new(private_env().nats().await).await;
    let rx = Receiver::start().await;
    let ns = herald_e2e::unique_name("silent-replay");
    dp.put_keys(&ns, "signing", &[TEST_SECRET]).await;
    dp.put_endpoint(&endpoint(&ns, "hook", json!({"url": rx.url("hook")})))
        .await;
    let dispatcher = spawn_dispatcher("silent-replay");
    let from_ms = jiff::Timestamp::now().as_millisecond() as u64;
    eventually(
        "the endpoint delivering",
        Duration::from_secs(60),
        || async {
            dp.publish(&ns, "a", json!(0)).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            (!rx.received("hook").is_empty()).then_some(())
        },
    )
    .await;
    // Let the replay watch catch up with the bucket before its consumer goes.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = rx.received("hook").len();
    let to_ms = jiff::Timestamp::now().as_millisecond() as u64 + 1;

    let names = delete_config_consumers(&dp).await;
    let request = herald_core::dataplane::ReplayRequest {
        namespace: ns.clone(),
        name: "again".into(),
        uid: "uid-silent-replay".into(),
        endpoint: "hook".into(),
        from_ms,
        to_ms,
        event_types: Vec::new(),
        only_failed: false,
        dry_run: false,
    };
    let key = herald_core::dataplane::BucketKey::replay(&ns, "again").to_string();
    let written = std::time::Instant::now();
    dp.config
        .put(key.as_str(), serde_json::to_vec(&request).unwrap().into())
        .await
        .expect("writing the replay request");
    let deadline = written + Duration::from_secs(30);
    while rx.received("hook").len() <= before && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let started = written.elapsed();
    stop(dispatcher).await;
    assert!(
        rx.received("hook").len() > before,
        "the replay never started (consumers deleted: {names:?})"
    );
    println!("the replay's first request came {started:?} after it was requested");
    assert!(
        started < STARTS_WITHIN,
        "the replay started {started:?} after it was requested, not within \
         {STARTS_WITHIN:?} (consumers deleted: {names:?}; log herald-test-dispatcher-silent-replay.*.log)"
    );
}
