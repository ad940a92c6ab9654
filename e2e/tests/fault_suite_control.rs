//! The fault suite of issue 10, "No accepted event is lost" — the control plane. The
//! data-plane scenarios a-f live in `fault_suite.rs`; these have the same shape, with
//! endpoints that are real `WebhookEndpoint` and `SigningSecret` resources reconciled by
//! real operator processes (`herald-test-operator`) against the test environment's
//! kube-apiserver, and a dispatcher process (`herald-test-dispatcher`) delivering. A
//! numbered stream of events (`data` = its number) is published at a steady rate to the
//! tenant namespace while one control-plane fault is injected:
//!
//! - g: the Kubernetes API unreachable for 30 s mid-stream: deliveries go on (events
//!   accepted during the blackout arrive during it), the configuration in NATS is left
//!   alone, and status catches up once the API is back;
//! - h: `kill -9` of the leading operator (of two, Lease 5 s): the standby takes over;
//!   deliveries go on meanwhile; changes made right after the kill (a new endpoint, a
//!   spec change of another) are reconciled by the new leader;
//! - i: the `SigningSecret`'s Kubernetes Secret broken (`data.current` invalid) for 20 s:
//!   its endpoints are held (`Ready=False`, `SecretNotReady`, "events keep queueing";
//!   their `ep.<ns>.<name>` entry stays, with `held` set), nothing is sent to them while
//!   held, an endpoint with another secret goes on, and after the fix everything
//!   arrives;
//! - j: `spec.paused` set mid-stream: once the dispatcher reports the endpoint `Paused`
//!   in `herald-health`, no request to it starts until it is unpaused, then its backlog
//!   arrives; then another endpoint is deleted mid-stream: from 2 s after its
//!   configuration entry is gone, no request reaches it.
//!
//! After each: every accepted event reached every (remaining) endpoint at least once —
//! 0 lost is the only pass — and the ordered endpoint saw its first receipts in publish
//! order, one request at a time. Each scenario appends one markdown row to
//! `$HERALD_FAULT_REPORT` (default `$TMPDIR/herald-fault-report.md`) and prints it.
//! Process logs: `$TMPDIR/herald-fault-<scenario>-<id>.log`.
//!
//! Every operator and dispatcher against one NATS runs with the same shard count
//! ([`TEST_SHARDS`]); each scenario has its own namespace, operators scoped to it and
//! their Lease in it, in this process's private environment, one scenario at a time
//! ([`fault_lock`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use herald_core::dataplane::{EndpointKey, shard_for};
use herald_core::names::LEADER_LEASE;
use herald_core::signing::{SigningKey, verify};
use herald_core::v1alpha1::{EndpointState, SigningSecret, WebhookEndpoint, WebhookEndpointStatus};
use herald_e2e::dataplane::{DataPlane, TEST_SHARDS};
use herald_e2e::faults::{
    Dispatchers, KvLog, Operators, Outcome, Published, Row, StreamSpec, account, await_delivery,
    dump_receipts, explain_lost, publish_stream,
};
use herald_e2e::receiver::{Behavior, Receiver};
use herald_e2e::{TestContext, eventually, fault_lock, private_env};
use k8s_openapi::ByteString;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const DISPATCHER: &str = env!("CARGO_BIN_EXE_herald-test-dispatcher");
const OPERATOR: &str = env!("CARGO_BIN_EXE_herald-test-operator");
const EVENT_TYPE: &str = "fault.tick";
/// The `SigningSecret` of the scenarios' endpoints.
const SIGNING: &str = "signing";
/// Events per second of every scenario's stream (three or four endpoints each, a debug
/// build, on a 2-core machine shared with the API server, NATS and the receiver).
const RATE: f64 = 150.0;
/// Every single API call of the test is bounded by this (the API is sometimes away).
const API_CALL: Duration = Duration::from_secs(2);
/// How long the dispatcher may take to act on a configuration change it was sent (a
/// hold, a deletion): requests that start later than this after the change count as
/// violations.
const ACT_WITHIN: Duration = Duration::from_secs(2);

/// One endpoint of a scenario: its name (= the receiver path), its spec without `url`,
/// `eventTypes` and `secretRef`, its `SigningSecret`, how its receiver answers.
struct EpSpec {
    name: &'static str,
    spec: Value,
    secret: &'static str,
    behavior: Behavior,
}

impl EpSpec {
    fn new(name: &'static str, spec: Value) -> Self {
        Self {
            name,
            spec,
            secret: SIGNING,
            behavior: Behavior::default(),
        }
    }

    fn secret(mut self, secret: &'static str) -> Self {
        self.secret = secret;
        self
    }

    fn behave(mut self, behavior: Behavior) -> Self {
        self.behavior = behavior;
        self
    }

    fn ordered(&self) -> bool {
        self.spec["ordered"] == json!(true)
    }
}

/// `fresh` (unordered), `ordered` and `flaky` (the first attempt of every third event
/// answers 500; retries after 1 s and 2 s), as in the data-plane scenarios.
fn standard_endpoints() -> Vec<EpSpec> {
    vec![
        EpSpec::new("fresh", json!({})),
        EpSpec::new("ordered", json!({"ordered": true})),
        flaky("flaky"),
    ]
}

/// An endpoint whose receiver fails the first attempt of every third event (500), with
/// retries after 1 s and 2 s: retries are always pending.
fn flaky(name: &'static str) -> EpSpec {
    EpSpec::new(
        name,
        json!({"delivery": {"retry": {"schedule": ["1s", "2s"]}}}),
    )
    .behave(Behavior::fail_first_of_every(3, 500))
}

/// What an endpoint is expected to have received at the end.
enum Expect {
    /// Every accepted event.
    All,
    /// Every accepted event after this stream sequence (an endpoint created mid-stream).
    After(u64),
    /// Nothing is counted (a deleted endpoint).
    Nothing,
}

/// One scenario: a namespace with its resources, operators, a dispatcher, a receiver,
/// and the record of what the control plane wrote to NATS.
struct Scenario {
    label: &'static str,
    ctx: TestContext,
    dp: DataPlane,
    rx: Receiver,
    eps: Vec<EpSpec>,
    expect: BTreeMap<&'static str, Expect>,
    operators: Operators,
    dispatchers: Dispatchers,
    /// `ep.<ns>.*` in `herald-config` (and the scenario's `key.<ns>.*`).
    config: KvLog,
    keys: KvLog,
    /// `ep.<ns>.*` in `herald-health`.
    health: KvLog,
    /// Broken promises found on the way (reported, asserted at the end).
    failures: Vec<String>,
    started: Instant,
}

impl Scenario {
    /// A fresh namespace; operators `operator_ids` started; the `SigningSecret`s and
    /// `WebhookEndpoint`s of `eps` created and Ready, their configuration in NATS; a
    /// dispatcher delivering (warmed up).
    async fn new(label: &'static str, eps: Vec<EpSpec>, operator_ids: &[&str]) -> Self {
        let started = Instant::now();
        let env = private_env();
        let ctx = TestContext::new_in(env, label).await;
        let ns = ctx.namespace.clone();
        let dp = DataPlane::new(ctx.nats.clone()).await;
        let rx = Receiver::start().await;
        let config = KvLog::start(&dp.config, &format!("ep.{ns}.>")).await;
        let keys = KvLog::start(&dp.config, &format!("key.{ns}.>")).await;
        let health = KvLog::start(&dp.health, &format!("ep.{ns}.>")).await;
        let mut operators = Operators::new(OPERATOR, env, &ns, label);
        for id in operator_ids {
            operators.start(id);
        }
        let dispatchers = Dispatchers::new(DISPATCHER, env.nats_url(), label);
        let expect = eps.iter().map(|e| (e.name, Expect::All)).collect();
        let mut s = Self {
            label,
            ctx,
            dp,
            rx,
            eps: Vec::new(),
            expect,
            operators,
            dispatchers,
            config,
            keys,
            health,
            failures: Vec::new(),
            started,
        };
        let mut secrets: Vec<&str> = eps.iter().map(|e| e.secret).collect();
        secrets.sort_unstable();
        secrets.dedup();
        for secret in secrets {
            s.create_secret(secret).await;
        }
        for ep in &eps {
            s.create_endpoint(ep).await;
        }
        for ep in &eps {
            s.until_configured(ep.name, Duration::from_secs(60)).await;
        }
        s.eps = eps;
        println!(
            "[{label}] namespace {ns}; endpoints (name, shard) {:?}",
            s.eps
                .iter()
                .map(|e| (e.name, shard_for(&ns, e.name, TEST_SHARDS)))
                .collect::<Vec<_>>()
        );
        s.dispatchers.start(&format!("{label}-d0"));
        s.warm_up().await;
        s
    }

    fn ns(&self) -> &str {
        &self.ctx.namespace
    }

    fn key(&self, name: &str) -> String {
        EndpointKey::new(self.ns(), name).config_key()
    }

    fn shard(&self, name: &str) -> u32 {
        shard_for(self.ns(), name, TEST_SHARDS)
    }

    /// Prints what happens, with the time since the scenario began.
    fn say(&self, what: &str) {
        println!(
            "[{} +{:.1}s] {what}",
            self.label,
            self.started.elapsed().as_secs_f64()
        );
    }

    /// Seconds since the scenario began, for notes and evidence.
    fn t(&self, at: Instant) -> String {
        format!(
            "+{:.1}s",
            at.saturating_duration_since(self.started).as_secs_f64()
        )
    }

    fn fail(&mut self, what: String) {
        self.say(&format!("FAILURE: {what}"));
        self.failures.push(what);
    }

    async fn create_secret(&self, name: &str) {
        let obj: SigningSecret = serde_json::from_value(json!({
            "apiVersion": "herald.dev/v1alpha1", "kind": "SigningSecret",
            "metadata": {"name": name}, "spec": {}
        }))
        .expect("SigningSecret");
        self.ctx
            .api::<SigningSecret>()
            .create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("creating SigningSecret {name}: {e}"));
    }

    async fn create_endpoint(&self, ep: &EpSpec) {
        self.rx.behave(ep.name, ep.behavior.clone());
        let mut spec = json!({
            "url": self.rx.url(ep.name),
            "eventTypes": ["fault.*"],
            "secretRef": {"name": ep.secret},
        });
        if let (Value::Object(spec), Value::Object(extra)) = (&mut spec, ep.spec.clone()) {
            spec.extend(extra);
        }
        let obj: WebhookEndpoint = serde_json::from_value(json!({
            "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookEndpoint",
            "metadata": {"name": ep.name}, "spec": spec
        }))
        .expect("WebhookEndpoint");
        self.ctx
            .api::<WebhookEndpoint>()
            .create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("creating WebhookEndpoint {}: {e}", ep.name));
    }

    /// Waits until `name` is Ready and its configuration is in `herald-config`, not held.
    async fn until_configured(&self, name: &str, timeout: Duration) {
        let key = self.key(name);
        eventually(
            &format!("endpoint {name} Ready with its configuration in NATS"),
            timeout,
            || async {
                let ready = self.condition(name, "Ready").await?;
                let config = self.config.of(&key).last()?.value.clone()?;
                (ready.status == "True" && config["held"].is_null()).then_some(())
            },
        )
        .await;
    }

    async fn object(&self, name: &str) -> Option<WebhookEndpoint> {
        tokio::time::timeout(API_CALL, self.ctx.api::<WebhookEndpoint>().get_opt(name))
            .await
            .ok()?
            .ok()?
    }

    async fn status(&self, name: &str) -> Option<WebhookEndpointStatus> {
        self.object(name).await?.status
    }

    async fn condition(&self, name: &str, type_: &str) -> Option<Condition> {
        self.status(name)
            .await?
            .conditions
            .into_iter()
            .find(|c| c.type_ == type_)
    }

    /// The identity holding the operators' Lease.
    async fn leader(&self) -> Option<String> {
        let lease = tokio::time::timeout(API_CALL, self.ctx.api::<Lease>().get_opt(LEADER_LEASE))
            .await
            .ok()?
            .ok()??;
        lease.spec?.holder_identity.filter(|h| !h.is_empty())
    }

    async fn patch_endpoint(&self, name: &str, patch: Value) {
        self.ctx
            .api::<WebhookEndpoint>()
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .unwrap_or_else(|e| panic!("patching WebhookEndpoint {name}: {e}"));
    }

    fn got(&self, name: &str) -> usize {
        self.rx.distinct_count(name)
    }

    fn counts(&self) -> Vec<usize> {
        self.eps.iter().map(|e| self.got(e.name)).collect()
    }

    /// Publishes events `first..first + count` at [`RATE`] in the background.
    fn stream(
        &self,
        first: u64,
        count: u64,
    ) -> (tokio::task::JoinHandle<Published>, Arc<AtomicU64>) {
        let progress = Arc::new(AtomicU64::new(0));
        let handle = publish_stream(
            self.dp.js.clone(),
            StreamSpec {
                namespace: self.ns().to_owned(),
                event_type: EVENT_TYPE.into(),
                first,
                count,
                rate: RATE,
            },
            progress.clone(),
        );
        (handle, progress)
    }

    /// Publishes one event outside the stream (its `data` is not a number, so the
    /// accounting ignores it) and waits until every endpoint got it.
    async fn warm_up(&mut self) {
        let started = Instant::now();
        self.dp
            .publish(self.ns(), EVENT_TYPE, json!("warm-up"))
            .await;
        let names: Vec<&str> = self.eps.iter().map(|e| e.name).collect();
        let deadline = started + Duration::from_secs(60);
        while !names.iter().all(|n| self.got(n) >= 1) {
            if Instant::now() > deadline {
                self.fail("the warm-up event did not arrive within 60 s".into());
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.say(&format!("warmed up in {:.1?}", started.elapsed()));
    }

    /// Waits (at most 30 s) until every endpoint received `more` events beyond `before`.
    async fn until_delivering(&mut self, before: &[usize], more: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self
            .eps
            .iter()
            .zip(before)
            .all(|(e, b)| self.got(e.name) >= b + more)
        {
            if Instant::now() > deadline {
                let counts = self.counts();
                self.fail(format!(
                    "deliveries did not go on within 30 s (received {counts:?}, before {before:?})"
                ));
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Events accepted in `[from, until)` that `name` first received at or after `by`
    /// (or never): deliveries that did not go on while something was down.
    fn late_between(
        &self,
        acks: &BTreeMap<u64, Instant>,
        name: &str,
        from: Instant,
        until: Instant,
        by: Instant,
    ) -> (usize, Vec<u64>) {
        let firsts: BTreeMap<u64, Instant> = self
            .rx
            .first_receipts(name)
            .iter()
            .filter_map(|f| Some((u64::try_from(f.data?).ok()?, f.at)))
            .collect();
        let window: Vec<u64> = acks
            .iter()
            .filter(|(_, at)| **at >= from && **at < until)
            .map(|(n, _)| *n)
            .collect();
        let late = window
            .iter()
            .filter(|n| firsts.get(n).is_none_or(|at| *at >= by))
            .copied()
            .collect();
        (window.len(), late)
    }

    /// Of the events accepted in `[from, until)`, how many; and how many events (any)
    /// `name` first received in that time: whether deliveries went on meanwhile.
    fn flow_between(
        &self,
        acks: &BTreeMap<u64, Instant>,
        name: &str,
        from: Instant,
        until: Instant,
    ) -> (usize, usize) {
        let accepted = acks
            .values()
            .filter(|at| **at >= from && **at < until)
            .count();
        let received = self
            .rx
            .first_receipts(name)
            .iter()
            .filter(|f| f.data.is_some() && f.at >= from && f.at < until)
            .count();
        (accepted, received)
    }

    /// Requests to `name` that started in `(from, until)`.
    fn requests_between(&self, name: &str, from: Instant, until: Instant) -> Vec<Instant> {
        self.rx
            .exchanges(name)
            .iter()
            .filter(|e| e.at > from && e.at < until)
            .map(|e| e.at)
            .collect()
    }

    /// Any withdrawal (delete) of a configuration entry of `names` seen after the set-up.
    fn withdrawals(&self, names: &[&str]) -> Vec<String> {
        names
            .iter()
            .filter(|n| {
                self.config
                    .first_since(&self.key(n), self.started, |v| v.is_none())
                    .is_some()
            })
            .map(|n| {
                format!(
                    "{n}:\n{}",
                    self.config.render(&self.key(n), self.started, 160)
                )
            })
            .collect()
    }

    /// Waits for every accepted event to arrive where it should (at most `timeout`),
    /// accounts, records the report row, gathers evidence for any failure, cleans up
    /// (resources deleted while the operators run, so their finalizers go), and then
    /// asserts the delivery contract and what the scenario found on the way.
    async fn finish(
        mut self,
        published: Published,
        fault: &str,
        injected: &str,
        notes: &str,
        timeout: Duration,
    ) -> Row {
        let counted: Vec<(&'static str, bool, Published)> = self
            .eps
            .iter()
            .filter_map(|e| {
                let acked = match self.expect.get(e.name)? {
                    Expect::All => published.acked.clone(),
                    Expect::After(seq) => published
                        .acked
                        .iter()
                        .filter(|(_, a)| a.seq > *seq)
                        .map(|(n, a)| (*n, *a))
                        .collect(),
                    Expect::Nothing => return None,
                };
                Some((
                    e.name,
                    e.ordered(),
                    Published {
                        acked,
                        ..Default::default()
                    },
                ))
            })
            .collect();
        let timeout = if self.failures.is_empty() {
            timeout
        } else {
            timeout.min(Duration::from_secs(30))
        };
        let deadline = Instant::now() + timeout;
        let mut complete = true;
        for (name, _, expected) in &counted {
            let left = deadline.saturating_duration_since(Instant::now());
            complete &= await_delivery(expected, &self.rx, &[name], left).await;
        }
        // A moment for late duplicates to show.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let outcomes: Vec<Outcome> = counted
            .iter()
            .map(|(name, ordered, expected)| account(expected, &self.rx, name, *ordered))
            .collect();
        let mut row = Row::from_outcomes(fault, published.acked.len(), injected, &outcomes);
        let mut notes = notes.to_owned();
        for failure in &self.failures {
            let first_line = failure.lines().next().unwrap_or_default();
            notes.push_str(&format!("; FAILED: {first_line}"));
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
            "; {} requests beyond the first (retries and duplicates); p99 delay {:.2} s; {:.0} s in all; load average {}",
            outcomes.iter().map(|o| o.beyond_first).sum::<usize>(),
            outcomes
                .iter()
                .map(|o| o.p99_delay)
                .max()
                .unwrap_or_default()
                .as_secs_f64(),
            self.started.elapsed().as_secs_f64(),
            load_average()
        ));
        row.notes = notes.trim_start_matches("; ").to_owned();
        row.record();

        let mut failures = std::mem::take(&mut self.failures);
        if !complete {
            failures.push(format!(
                "not every accepted event arrived within {timeout:?}"
            ));
        }
        for o in &outcomes {
            println!("[{}] {}", self.label, o.summary());
            if !o.lost.is_empty() {
                let evidence = explain_lost(
                    &self.dp.js,
                    self.ns(),
                    &o.path,
                    self.shard(&o.path),
                    &published,
                    &o.lost,
                    8,
                )
                .await;
                failures.push(format!(
                    "/{}: {} accepted events LOST, e.g. {:?}\n{evidence}configuration entry:\n{}",
                    o.path,
                    o.lost.len(),
                    &o.lost[..o.lost.len().min(20)],
                    self.config.render(&self.key(&o.path), self.started, 200)
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
                failures.push(format!(
                    "/{}: {} events first received after a later one, e.g. (event, after) {:?}",
                    o.path, o.reorderings, o.reordered_examples
                ));
            }
            if o.ordered && o.max_in_flight > 1 {
                failures.push(format!(
                    "/{}: {} requests in flight at once on an ordered endpoint",
                    o.path, o.max_in_flight
                ));
            }
        }
        let crashed: Vec<(String, String)> = self
            .dispatchers
            .exited()
            .into_iter()
            .chain(self.operators.exited())
            .collect();
        if !crashed.is_empty() {
            failures.push(format!("processes exited on their own: {crashed:?}"));
        }
        // The first receipts, always (cheap; for comparing runs), named on a failure.
        let files: Vec<_> = counted
            .iter()
            .map(|(name, _, expected)| {
                dump_receipts(self.label, expected, &self.rx, name, self.started)
            })
            .collect();
        if !failures.is_empty() {
            println!("[{}] first receipts: {files:?}", self.label);
            let lines = self
                .dispatchers
                .grep(&["WARN", "ERROR", "panicked"], 30)
                .into_iter()
                .chain(self.operators.grep(&["WARN", "ERROR", "panicked"], 30))
                .collect::<Vec<_>>();
            println!(
                "[{}] warnings and errors:\n{}\nlogs: {:?} {:?}",
                self.label,
                lines.join("\n"),
                self.dispatchers.log_files(),
                self.operators.log_files()
            );
        }
        self.dispatchers.stop_all().await;
        let label = self.label;
        self.cleanup().await;
        assert!(
            failures.is_empty(),
            "[{label}] the delivery contract was broken:\n{}",
            failures.join("\n")
        );
        row
    }

    /// Deletes the scenario's resources while the operators run (their finalizers
    /// withdraw the configuration), waits at most 30 s for them to go, stops the
    /// operators and deletes the namespace.
    async fn cleanup(mut self) {
        let endpoints = self.ctx.api::<WebhookEndpoint>();
        let secrets = self.ctx.api::<SigningSecret>();
        let (dp, lp) = (DeleteParams::default(), Default::default());
        let _ = endpoints.delete_collection(&dp, &lp).await;
        let _ = secrets.delete_collection(&dp, &lp).await;
        let gone = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let lp = kube::api::ListParams::default().limit(1);
                let left = endpoints.list_metadata(&lp).await.map(|l| l.items.len());
                let left2 = secrets.list_metadata(&lp).await.map(|l| l.items.len());
                if matches!((left, left2), (Ok(0), Ok(0))) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
        .await;
        if gone.is_err() {
            self.say("cleanup: resources not gone within 30 s (finalizers?)");
        }
        self.operators.stop_all().await;
        self.ctx.cleanup().await;
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

/// The number of events a stream of `seconds` at [`RATE`] has.
fn stream_of(seconds: u64) -> u64 {
    (RATE * seconds as f64) as u64
}

/// The load average of the machine (1, 5, 15 minutes), for the notes.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// Event number -> when JetStream acknowledged it.
fn ack_times(published: &Published) -> BTreeMap<u64, Instant> {
    published.acked.iter().map(|(n, a)| (*n, a.at)).collect()
}

// ---------------------------------------------------------------------------------------
// g. the Kubernetes API unreachable for 30 s
// ---------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------
// h. kill -9 of the leading operator
// ---------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------
// i. a broken SigningSecret: held, not deleted
// ---------------------------------------------------------------------------------------

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
    secrets
        .patch(
            SIGNING,
            &PatchParams::default(),
            &Patch::Merge(set_current(ByteString(b"whsec_not!base64".to_vec()))),
        )
        .await
        .expect("breaking the Secret");
    let broken = Instant::now();
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
    secrets
        .patch(
            SIGNING,
            &PatchParams::default(),
            &Patch::Merge(set_current(good)),
        )
        .await
        .expect("fixing the Secret");
    let fixed = Instant::now();
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

// ---------------------------------------------------------------------------------------
// j. paused and deleted endpoints
// ---------------------------------------------------------------------------------------

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
    s.patch_endpoint("pausable", json!({"spec": {"paused": true}}))
        .await;
    let pause = Instant::now();
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
    s.patch_endpoint("pausable", json!({"spec": {"paused": false}}))
        .await;
    let unpause = Instant::now();
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
    s.ctx
        .api::<WebhookEndpoint>()
        .delete("doomed", &DeleteParams::default())
        .await
        .expect("deleting doomed");
    let deleted = Instant::now();
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
