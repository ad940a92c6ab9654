//! The fault suite, "no accepted event is lost" (the data plane): a numbered
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
//!   each endpoint must deliver again within 10 s of its stream's new leader (the
//!   election itself, nats-server's, is reported beside it);
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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use herald_core::dataplane::{BucketKey, DELIVERIES_STREAM, EVENTS_STREAM, EndpointKey, shard_for};
use herald_e2e::dataplane::{DataPlane, TEST_SECRET, TEST_SHARDS, endpoint};
use herald_e2e::faults::{
    Dispatchers, LaneTap, Outcome, Published, Row, StreamSpec, account, await_delivery,
    dump_receipts, explain_lost, misordered_ranges, new_leader, pending_retries, progress_at,
    publish_stream, resumed_after, shard_leases, shard_owners, stream_leader,
};
use herald_e2e::receiver::{Answer, Behavior, Chaos, Fault, Receiver};
use herald_e2e::{TestEnv, eventually, fault_lock, private_cluster_env, private_env};
use serde_json::{Value, json};

#[path = "fault_suite/processes.rs"]
mod processes;
#[path = "fault_suite/receivers.rs"]
mod receivers;

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
            "[{} +{:.1}s {}] {what}",
            self.label,
            self.started.elapsed().as_secs_f64(),
            jiff::Timestamp::now().strftime("%H:%M:%S%.3f")
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
        // Written for every run: where a slow delivery's time went is read from them.
        let dumps: Vec<_> = self
            .eps
            .iter()
            .map(|ep| dump_receipts(self.label, &published, &self.rx, ep.name, self.started))
            .collect();
        if !failures.is_empty() {
            for (ep, file) in self.eps.iter().zip(&dumps) {
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
