//! A three-node JetStream cluster (`testenv run --nats-cluster 3`, every node its own
//! nats-server process) loses no acknowledged message when the stream leader is killed
//! with a real SIGKILL in the middle of a steady stream of publishes and started again a
//! few seconds later: R3 replication, publish acks, `Nats-Msg-Id` deduplication of
//! retried publishes and the catch-up of the restarted node, against real servers. Only
//! async-nats is used; no Herald code.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream::context::PublishError;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, stream};
use herald_e2e::{TestEnv, eventually, private_cluster_env, unique_name};
use serde_json::{Value, json};

/// Messages published, numbered 0..MESSAGES.
const MESSAGES: u64 = 3000;
/// One publish every 5 ms: 200 messages per second, about 15 s without faults.
const PUBLISH_INTERVAL: Duration = Duration::from_millis(5);
/// The stream leader is killed once this many messages are acknowledged.
const KILL_AFTER_ACKS: u64 = 1000;
/// The killed node stays down until this many more messages were acknowledged without
/// it (by a newly elected leader and the one remaining replica), and at least
/// MIN_OUTAGE.
const ACKS_WHILE_DOWN: u64 = 300;
const MIN_OUTAGE: Duration = Duration::from_secs(3);
/// How long one message may take to be acknowledged, retries included.
const MESSAGE_DEADLINE: Duration = Duration::from_secs(60);
/// How long one publish attempt waits for its ack before it is retried.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);

/// What the publisher saw.
#[derive(Default)]
struct Published {
    /// message number -> stream sequence, for every acknowledged message.
    acked: BTreeMap<u64, u64>,
    /// Attempts whose ack failed or timed out (each followed by a retry).
    failed_attempts: u64,
    /// Acks of retries that the stream reported as duplicates (an earlier attempt had
    /// been stored after all; deduplicated by `Nats-Msg-Id`).
    duplicate_acks: u64,
    /// The longest time between two consecutive acks.
    longest_gap: Duration,
    last_error: Option<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r3_stream_loses_no_acked_message_when_the_leader_is_sigkilled() {
    let started = Instant::now();
    let env: &'static TestEnv = private_cluster_env();
    assert_eq!(env.nats_nodes().len(), 3, "nodes: {:?}", env.nats_nodes());
    eprintln!(
        "cluster environment ready in {:.1?}: {:?}",
        started.elapsed(),
        env.nats_nodes()
    );
    let client = env.nats().await;
    let js = jetstream::new(client.clone());
    let name = unique_name("CLUSTER").replace('-', "_");
    let subject = format!("cluster.{name}");
    js.create_stream(stream::Config {
        name: name.clone(),
        subjects: vec![subject.clone()],
        storage: stream::StorageType::File,
        num_replicas: 3,
        // Far longer than the test: every retry of an already stored message is dropped.
        duplicate_window: Duration::from_secs(600),
        ..Default::default()
    })
    .await
    .expect("creating the R3 stream");
    let (leader, _) = eventually(
        "the stream to have a leader and 2 current replicas",
        Duration::from_secs(30),
        || stream_cluster(&js, &name),
    )
    .await;
    eprintln!("stream {name}: R3, leader {leader}");

    let progress = Arc::new(AtomicU64::new(0)); // acknowledged messages so far
    let publisher = tokio::spawn(publish_all(js.clone(), subject, progress.clone()));

    // Mid-stream: SIGKILL the node that leads the stream right now.
    eventually(
        "the first acknowledged messages",
        Duration::from_secs(60),
        || async { (progress.load(Ordering::SeqCst) >= KILL_AFTER_ACKS).then_some(()) },
    )
    .await;
    let (leader, _) = eventually("the stream leader", Duration::from_secs(10), || {
        stream_cluster(&js, &name)
    })
    .await;
    let victim = env
        .nats_node_index(&leader)
        .unwrap_or_else(|| panic!("stream leader {leader:?} is not a testenv node"));
    let killed_at = Instant::now();
    let acked_at_kill = progress.load(Ordering::SeqCst);
    tokio::task::spawn_blocking(move || env.kill_nats_node(victim))
        .await
        .unwrap();
    eprintln!("SIGKILLed the stream leader {leader} (node {victim}) after {acked_at_kill} acks");

    // Publishing goes on without it: a new leader is elected among the other two.
    eventually(
        "acks from the two remaining nodes",
        Duration::from_secs(60),
        || async {
            (progress.load(Ordering::SeqCst) >= acked_at_kill + ACKS_WHILE_DOWN).then_some(())
        },
    )
    .await;
    let first_acks_after_kill = killed_at.elapsed();
    // The outage has a minimum length on purpose (a fault, not a wait for a condition).
    tokio::time::sleep_until((killed_at + MIN_OUTAGE).into()).await;
    let acked_at_restart = progress.load(Ordering::SeqCst);
    tokio::task::spawn_blocking(move || env.start_nats_node(victim))
        .await
        .unwrap();
    eprintln!(
        "node {victim} started again after {:.1?} down; {} messages were acked meanwhile \
         ({ACKS_WHILE_DOWN} of them within {first_acks_after_kill:.1?} of the kill)",
        killed_at.elapsed(),
        acked_at_restart - acked_at_kill,
    );

    let published = publisher.await.expect("the publisher panicked");
    assert_eq!(
        published.acked.len() as u64,
        MESSAGES,
        "every message is acknowledged in the end (retries included)"
    );

    // The restarted node rejoined: the stream has its 3 members, all current.
    let victim_name = format!("n{victim}");
    eventually(
        "the restarted node to be a current replica of the stream again",
        Duration::from_secs(60),
        || async {
            let (leader, replicas) = stream_cluster(&js, &name).await?;
            let members: BTreeSet<String> = replicas.into_iter().chain([leader]).collect();
            (members.len() == 3 && members.contains(&victim_name)).then_some(())
        },
    )
    .await;

    // ... and caught up: make it the stream leader, which then answers every read below
    // from its own store.
    eventually(
        "the restarted node to become the stream leader",
        Duration::from_secs(60),
        || async {
            let (leader, _) = stream_cluster(&js, &name).await?;
            if leader == victim_name {
                return Some(());
            }
            let _: Result<Value, _> = js
                .request(
                    format!("STREAM.LEADER.STEPDOWN.{name}"),
                    &json!({"placement": {"preferred": victim_name}}),
                )
                .await;
            None
        },
    )
    .await;

    // Every acknowledged message is in the stream, at the sequence its ack named.
    let stream = js.get_stream(&name).await.expect("stream");
    let state = stream.get_info().await.expect("stream info").state;
    let mut stored: BTreeMap<u64, u64> = BTreeMap::new(); // message number -> sequence
    let mut duplicates_stored = 0;
    for seq in state.first_sequence..=state.last_sequence {
        let message = eventually("a stored message", Duration::from_secs(10), || async {
            stream.get_raw_message(seq).await.ok()
        })
        .await;
        let number: u64 = std::str::from_utf8(&message.payload)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("seq {seq}: unexpected payload {:?}", message.payload));
        if stored.insert(number, seq).is_some() {
            duplicates_stored += 1;
        }
    }
    let lost: Vec<u64> = published
        .acked
        .keys()
        .filter(|n| !stored.contains_key(n))
        .copied()
        .collect();
    let moved: Vec<(u64, u64, Option<u64>)> = published
        .acked
        .iter()
        .filter(|&(n, seq)| stored.get(n).is_some_and(|s| s != seq))
        .map(|(&n, &seq)| (n, seq, stored.get(&n).copied()))
        .take(10)
        .collect();

    eprintln!(
        "published {MESSAGES}, acknowledged {}, stored {} (sequences {}..={}), lost {}, \
         duplicates stored {duplicates_stored}; failed publish attempts {} (retried), \
         duplicate acks {}, longest gap between acks {:.1?}, last error {:?}; total {:.1?}",
        published.acked.len(),
        state.messages,
        state.first_sequence,
        state.last_sequence,
        lost.len(),
        published.failed_attempts,
        published.duplicate_acks,
        published.longest_gap,
        published.last_error,
        started.elapsed(),
    );
    assert!(
        lost.is_empty(),
        "{} acknowledged messages are not in the stream: {:?}",
        lost.len(),
        &lost[..lost.len().min(20)]
    );
    assert!(
        moved.is_empty(),
        "acknowledged at one sequence, stored at another: {moved:?}"
    );
    assert_eq!(
        duplicates_stored, 0,
        "retries with the same Nats-Msg-Id were stored twice"
    );
    assert_eq!(state.messages, MESSAGES);
    let _ = js.delete_stream(&name).await;
}

/// Publishes messages 0..MESSAGES at a steady rate, each with `Nats-Msg-Id` = its number,
/// retrying a message until it is acknowledged.
async fn publish_all(
    js: jetstream::Context,
    subject: String,
    progress: Arc<AtomicU64>,
) -> Published {
    let mut out = Published::default();
    let mut tick = tokio::time::interval(PUBLISH_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_ack = Instant::now();
    for n in 0..MESSAGES {
        tick.tick().await;
        let deadline = Instant::now() + MESSAGE_DEADLINE;
        loop {
            let attempt = async {
                js.send_publish(
                    subject.clone(),
                    PublishMessage::build()
                        .payload(n.to_string().into())
                        .message_id(format!("msg-{n}")),
                )
                .await?
                .await
            };
            let error = match tokio::time::timeout(ATTEMPT_TIMEOUT, attempt).await {
                Ok(Ok(ack)) => {
                    out.duplicate_acks += u64::from(ack.duplicate);
                    out.acked.insert(n, ack.sequence);
                    out.longest_gap = out.longest_gap.max(last_ack.elapsed());
                    last_ack = Instant::now();
                    progress.store(n + 1, Ordering::SeqCst);
                    break;
                }
                Ok(Err(e)) => {
                    let e: PublishError = e;
                    e.to_string()
                }
                Err(_) => format!("no ack within {ATTEMPT_TIMEOUT:?}"),
            };
            out.failed_attempts += 1;
            assert!(
                Instant::now() < deadline,
                "message {n} not acknowledged within {MESSAGE_DEADLINE:?}: {error}"
            );
            out.last_error = Some(error);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    out
}

/// The stream's leader and the names of its current replicas, once it has a leader and
/// two current replicas.
async fn stream_cluster(js: &jetstream::Context, name: &str) -> Option<(String, Vec<String>)> {
    let info = js.get_stream(name).await.ok()?.get_info().await.ok()?;
    let cluster = info.cluster?;
    let leader = cluster.leader?;
    let replicas: Vec<String> = cluster
        .replicas
        .iter()
        .filter(|r| r.current && !r.offline)
        .map(|r| r.name.clone())
        .collect();
    (replicas.len() == 2).then_some((leader, replicas))
}
