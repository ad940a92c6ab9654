//! The fault suite of issue 10, "No accepted event is lost" (the data plane): a numbered
//! stream of events (`data` = its number) is published at a steady rate to one tenant
//! namespace with three endpoints — `fresh` (unordered, healthy), `ordered`
//! (`ordered: true`) and `flaky` (the first attempt of every third event answers 500,
//! retry schedule `["1s", "2s"]`, so retries are always pending) — while one fault at a
//! time is injected:
//!
//! - a: `kill -9` of the dispatcher process and a restart, three times mid-stream;
//! - b: nats-server restarts (single node);
//! - c: `kill -9` of the node of a 3-node JetStream cluster that leads
//!   `HERALD_DELIVERIES`, later of the one that leads `HERALD_EVENTS`, each brought back;
//! - d: dispatchers scaled 1 → 3 → 1 (graceful SIGINT), one of them SIGKILLed and
//!   restarted in between;
//! - e: receivers answering at random (seeded) with 500, hangs past the timeout,
//!   connection resets, slow bodies and 429 with `Retry-After`;
//! - f: a receiver's `Retry-After` outlives the dispatcher: after a `kill -9` (f1) and
//!   after a graceful restart (f2) nothing is sent to the endpoint before it is over.
//!
//! After each: every acknowledged event reached every endpoint at least once (0 lost is
//! the only pass), the ordered endpoint saw its first receipts in publish order and
//! never two requests at once; duplicates (requests for an event after the endpoint had
//! answered it with a 2xx; retries after failures are reported apart) and the longest
//! delay from publish-ack to first receipt are measured. Each scenario appends one markdown row to `$HERALD_FAULT_REPORT`
//! (default `$TMPDIR/herald-fault-report.md`) and prints it. Dispatcher logs:
//! `$TMPDIR/herald-fault-<scenario>-<replica>.log` (`RUST_LOG=info,herald_dispatcher=debug`
//! for more).
//!
//! Soak mode: `HERALD_SOAK=1` runs every scenario longer (more events, a higher rate,
//! more repetitions of each fault): about 15-20 minutes instead of about 4.
//!
//! Scale: the reference run is 6,000 events at 600/s. A dispatcher killed with
//! SIGKILL keeps its shard leases until their TTL (10 s) runs out, so every kill stops
//! delivery for about 10 s; three kills therefore need a stream of 30 s or more, and
//! scenario a publishes 9,000 events at 300/s (the 2-core machine also runs NATS, the
//! receiver and a debug-build dispatcher). The `Retry-After` of f1 is 20 s, not 5 s:
//! with 5 s the lease TTL alone would keep the restarted dispatcher away for longer,
//! and the check would prove nothing; f2 (graceful restart, leases released at once)
//! checks 5 s.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use herald_core::dataplane::{BucketKey, DELIVERIES_STREAM, EVENTS_STREAM, EndpointKey, shard_for};
use herald_e2e::dataplane::{DataPlane, TEST_SECRET, TEST_SHARDS, endpoint};
use herald_e2e::faults::{
    Dispatchers, LaneTap, Outcome, Published, Row, StreamSpec, account, await_delivery,
    dump_receipts, explain_lost, misordered_ranges, pending_retries, publish_stream, shard_leases,
    shard_owners, stream_leader,
};
use herald_e2e::receiver::{Answer, Behavior, Chaos, Fault, Receiver};
use herald_e2e::{TestEnv, eventually, fault_lock, private_cluster_env, private_env};
use serde_json::{Value, json};

const DISPATCHER: &str = env!("CARGO_BIN_EXE_herald-test-dispatcher");
const EVENT_TYPE: &str = "fault.tick";

fn soak() -> bool {
    std::env::var("HERALD_SOAK").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// `normal`, or `soak` in soak mode.
fn sized<T>(normal: T, soak_value: T) -> T {
    if soak() { soak_value } else { normal }
}

/// One endpoint of a scenario: its name (= the receiver path), its spec without `url`,
/// how its receiver answers.
struct EpSpec {
    name: &'static str,
    spec: Value,
    behavior: Behavior,
}

impl EpSpec {
    fn new(name: &'static str, spec: Value, behavior: Behavior) -> Self {
        Self {
            name,
            spec,
            behavior,
        }
    }

    fn ordered(&self) -> bool {
        self.spec["ordered"] == json!(true)
    }
}

/// The three endpoints of scenarios a-d.
fn standard_endpoints() -> Vec<EpSpec> {
    vec![
        EpSpec::new("fresh", json!({}), Behavior::default()),
        EpSpec::new("ordered", json!({"ordered": true}), Behavior::default()),
        EpSpec::new(
            "flaky",
            json!({"delivery": {"retry": {"schedule": ["1s", "2s"]}}}),
            Behavior::fail_first_of_every(3, 500),
        ),
    ]
}

/// One scenario: a namespace with its endpoints and receiver, its dispatchers.
struct Scenario {
    label: &'static str,
    dp: DataPlane,
    rx: Receiver,
    ns: String,
    eps: Vec<EpSpec>,
    dispatchers: Dispatchers,
    tap: LaneTap,
    /// Faults after which deliveries did not resume in time.
    stalls: Vec<String>,
    started: Instant,
}

impl Scenario {
    /// A fresh namespace whose endpoints sit on distinct shards (so a fault that hits one
    /// replica's shards hits one endpoint, not all), their keys and configurations
    /// written before any dispatcher runs. `replicas`: JetStream replicas of the layout.
    async fn new(
        env: &'static TestEnv,
        label: &'static str,
        replicas: u8,
        eps: Vec<EpSpec>,
    ) -> Self {
        let started = Instant::now();
        let nats = env.nats().await;
        if replicas > 1 {
            // Create the layout replicated before DataPlane::new would create it with one.
            let js = async_nats::jetstream::new(nats.clone());
            herald_dispatcher::setup::ensure(
                &js,
                herald_dispatcher::setup::DEFAULT_RETENTION,
                herald_e2e::dataplane::TEST_SHARDS,
                usize::from(replicas),
            )
            .await
            .expect("replicated JetStream layout");
        }
        let dp = DataPlane::new(nats.clone()).await;
        let rx = Receiver::start().await;
        let mut ns = herald_e2e::unique_name(label);
        for _ in 0..64 {
            let shards: std::collections::BTreeSet<u32> = eps
                .iter()
                .map(|e| shard_for(&ns, e.name, TEST_SHARDS))
                .collect();
            if shards.len() == eps.len().min(TEST_SHARDS as usize) {
                break;
            }
            ns = herald_e2e::unique_name(label);
        }
        dp.put_keys(&ns, "signing", &[TEST_SECRET]).await;
        for ep in &eps {
            rx.behave(ep.name, ep.behavior.clone());
            let mut spec = ep.spec.clone();
            spec["url"] = json!(rx.url(ep.name));
            dp.put_endpoint(&endpoint(&ns, ep.name, spec)).await;
        }
        let names: Vec<&str> = eps.iter().map(|e| e.name).collect();
        let tap = LaneTap::start(&nats, &ns, &names).await;
        let mut dispatchers = Dispatchers::new(DISPATCHER, env.nats_url(), label);
        if replicas > 1 {
            dispatchers = dispatchers.with_args(&["--jetstream-replicas", &replicas.to_string()]);
        }
        println!(
            "[{label}] namespace {ns}; endpoints {:?}",
            eps.iter()
                .map(|e| (e.name, shard_for(&ns, e.name, TEST_SHARDS)))
                .collect::<Vec<_>>()
        );
        Self {
            label,
            dp,
            rx,
            ns,
            eps,
            dispatchers,
            tap,
            stalls: Vec::new(),
            started,
        }
    }

    fn shard(&self, name: &str) -> u32 {
        shard_for(&self.ns, name, TEST_SHARDS)
    }

    /// Publishes events `first..first + count` at `rate` per second in the background.
    fn stream(
        &self,
        first: u64,
        count: u64,
        rate: f64,
    ) -> (tokio::task::JoinHandle<Published>, Arc<AtomicU64>) {
        let progress = Arc::new(AtomicU64::new(0));
        let handle = publish_stream(
            self.dp.js.clone(),
            StreamSpec {
                namespace: self.ns.clone(),
                event_type: EVENT_TYPE.into(),
                first,
                count,
                rate,
            },
            progress.clone(),
        );
        (handle, progress)
    }

    /// Prints what happens, with the time since the scenario began.
    fn say(&self, what: &str) {
        println!(
            "[{} +{:.1}s] {what}",
            self.label,
            self.started.elapsed().as_secs_f64()
        );
    }

    /// Distinct events received on `path` so far.
    fn got(&self, path: &str) -> usize {
        self.rx.distinct_count(path)
    }

    /// Waits (at most 60 s) until every endpoint received `more` new events beyond
    /// `before` (the dispatcher delivers), then, for at most `retries_for`, until the flaky
    /// endpoint has retries pending. Returns the pending retries then; `None` (and the
    /// stall is noted as a failure) when deliveries did not resume.
    async fn until_delivering(
        &mut self,
        before: &[usize],
        more: usize,
        retries_for: Duration,
    ) -> Option<usize> {
        let names: Vec<&str> = self.eps.iter().map(|e| e.name).collect();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !names
            .iter()
            .zip(before)
            .all(|(n, b)| self.got(n) >= b + more)
        {
            if Instant::now() > deadline {
                let stall = format!(
                    "deliveries did not resume within 60 s (received {:?}, before {before:?})",
                    self.counts()
                );
                self.say(&stall);
                self.stalls.push(stall);
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let deadline = Instant::now() + retries_for;
        loop {
            let pending = if names.contains(&"flaky") {
                pending_retries(&self.rx, "flaky")
            } else {
                0
            };
            if pending > 0 || Instant::now() >= deadline {
                return Some(pending);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Publishes one event that is not part of the stream (`data` is not a number, so
    /// the accounting ignores it) and waits until every endpoint got it: the scenario
    /// starts with its dispatchers delivering, not with the fan-out pin or the unacked
    /// pulls a previous scenario's stopped dispatcher left behind.
    async fn warm_up(&mut self) {
        let started = Instant::now();
        self.dp
            .publish(&self.ns, EVENT_TYPE, json!("warm-up"))
            .await;
        let names: Vec<&str> = self.eps.iter().map(|e| e.name).collect();
        let deadline = started + Duration::from_secs(60);
        while !names.iter().all(|n| self.got(n) >= 1) {
            if Instant::now() > deadline {
                let stall = "the warm-up event did not arrive within 60 s".to_owned();
                self.say(&stall);
                self.stalls.push(stall);
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.say(&format!("warmed up in {:.1?}", started.elapsed()));
    }

    fn counts(&self) -> Vec<usize> {
        self.eps.iter().map(|e| self.got(e.name)).collect()
    }

    /// Waits for every accepted event to arrive everywhere (at most `timeout`), accounts,
    /// records the report row, gathers evidence for any failure, cleans up, and then
    /// asserts the delivery contract.
    async fn finish(
        mut self,
        published: Published,
        fault: &str,
        injected: &str,
        notes: &str,
        timeout: Duration,
    ) -> Row {
        let names: Vec<&str> = self.eps.iter().map(|e| e.name).collect();
        // Stalled already: do not wait the full time for what is stuck.
        let timeout = if self.stalls.is_empty() {
            timeout
        } else {
            timeout.min(Duration::from_secs(30))
        };
        let complete = await_delivery(&published, &self.rx, &names, timeout).await;
        // A moment for late duplicates (re-deliveries of work not yet purged) to show.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let outcomes: Vec<Outcome> = self
            .eps
            .iter()
            .map(|e| account(&published, &self.rx, e.name, e.ordered()))
            .collect();
        let crashed = self.dispatchers.exited();
        let mut row = Row::from_outcomes(fault, published.acked.len(), injected, &outcomes);
        let mut notes = notes.to_owned();
        for stall in &self.stalls {
            notes.push_str(&format!("; STALL: {stall}"));
        }
        if !published.given_up.is_empty() {
            notes.push_str(&format!(
                "; {} publishes never acknowledged (not accepted)",
                published.given_up.len()
            ));
        }
        if published.failed_attempts > 0 {
            notes.push_str(&format!(
                "; {} publish attempts retried",
                published.failed_attempts
            ));
        }
        notes.push_str(&format!(
            "; {} requests beyond the first (retries and duplicates)",
            outcomes.iter().map(|o| o.beyond_first).sum::<usize>()
        ));
        notes.push_str(&format!(
            "; p99 delay {:.2} s; {:.0} s in all",
            outcomes
                .iter()
                .map(|o| o.p99_delay)
                .max()
                .unwrap_or_default()
                .as_secs_f64(),
            self.started.elapsed().as_secs_f64()
        ));
        // The attempt log, once the dispatchers have flushed it: a success the receiver
        // answered should have its `succeeded` record (reported, not asserted here).
        self.dispatchers.stop_all().await;
        let mut unrecorded = 0;
        let mut answered = 0;
        for ep in &self.eps {
            let recorded: std::collections::HashSet<String> = self
                .dp
                .attempts(&self.ns, ep.name)
                .await
                .iter()
                .filter(|r| r["state"] == "succeeded")
                .filter_map(|r| r["eventId"].as_str().map(str::to_owned))
                .collect();
            let succeeded = self.rx.succeeded_ids(ep.name);
            answered += succeeded.len();
            unrecorded += succeeded.difference(&recorded).count();
        }
        notes.push_str(&format!(
            "; attempt log: {unrecorded} of {answered} successful deliveries without a `succeeded` record"
        ));
        row.notes = notes.trim_start_matches("; ").to_owned();
        row.record();

        let mut failures = self.stalls.clone();
        if !complete {
            failures.push(format!(
                "not every accepted event arrived within {timeout:?}"
            ));
        }
        for (o, ep) in outcomes.iter().zip(&self.eps) {
            println!("[{}] {}", self.label, o.summary());
            if !o.lost.is_empty() {
                let evidence = explain_lost(
                    &self.dp.js,
                    &self.ns,
                    ep.name,
                    self.shard(ep.name),
                    &published,
                    &o.lost,
                    8,
                )
                .await;
                failures.push(format!(
                    "/{}: {} accepted events LOST, e.g. {:?}\n{evidence}",
                    o.path,
                    o.lost.len(),
                    &o.lost[..o.lost.len().min(20)]
                ));
            }
            if !o.ids_per_event_violations.is_empty() {
                failures.push(format!(
                    "/{}: events received under two webhook-ids: {:?}",
                    o.path,
                    &o.ids_per_event_violations[..o.ids_per_event_violations.len().min(20)]
                ));
            }
            if o.ordered && o.reorderings > 0 {
                let received: Vec<u64> = self
                    .rx
                    .first_receipts(ep.name)
                    .iter()
                    .filter_map(|f| f.data.and_then(|d| u64::try_from(d).ok()))
                    .collect();
                let lane = self.tap.order(ep.name);
                failures.push(format!(
                    "/{}: {} events first received after a later one, e.g. (event, after) {:?}\n\
                     late events as received: {:?}\n\
                     late events in the order of their first publish to the lane (fan-out): {:?}",
                    o.path,
                    o.reorderings,
                    o.reordered_examples,
                    misordered_ranges(&published, &received),
                    misordered_ranges(&published, &lane),
                ));
            }
            if o.ordered && o.max_in_flight > 1 {
                failures.push(format!(
                    "/{}: {} requests in flight at once on an ordered endpoint",
                    o.path, o.max_in_flight
                ));
            }
        }
        if !crashed.is_empty() {
            failures.push(format!("dispatchers exited on their own: {crashed:?}"));
        }
        if !failures.is_empty() {
            for ep in &self.eps {
                let file = dump_receipts(self.label, &published, &self.rx, ep.name, self.started);
                println!(
                    "[{}] first receipts of /{}: {}",
                    self.label,
                    ep.name,
                    file.display()
                );
            }
            let lines = self.dispatchers.grep(&["WARN", "ERROR", "panicked"], 40);
            println!(
                "[{}] dispatcher warnings and errors:\n{}\nlogs: {:?}",
                self.label,
                lines.join("\n"),
                self.dispatchers.log_files()
            );
        }
        for ep in &self.eps {
            self.dp.delete_endpoint(&self.ns, ep.name).await;
        }
        assert!(
            failures.is_empty(),
            "[{}] the delivery contract was broken:\n{}",
            self.label,
            failures.join("\n")
        );
        row
    }
}

/// Waits until the publisher has done `n` events.
async fn progress_at(progress: &AtomicU64, n: u64) {
    eventually(
        &format!("{n} events published"),
        Duration::from_secs(120),
        || async move { (progress.load(Ordering::SeqCst) >= n).then_some(()) },
    )
    .await;
}

// ---------------------------------------------------------------------------------------
// a. kill -9 of the dispatcher, with retries pending
// ---------------------------------------------------------------------------------------

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
    s.finish(
        published,
        "c. NATS cluster node kill -9",
        &format!(
            "kill -9 of the node leading: {}; each restarted",
            injected.join("; ")
        ),
        &format!("{rate}/s; R3 streams; dispatcher given all 3 node URLs"),
        Duration::from_secs(120),
    )
    .await;
}

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
// e. receivers failing at random
// ---------------------------------------------------------------------------------------

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
