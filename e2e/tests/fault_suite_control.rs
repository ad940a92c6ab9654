//! The fault suite, "no accepted event is lost" — the control plane. The
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
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use herald_core::dataplane::{EndpointKey, shard_for};
use herald_core::names::LEADER_LEASE;
use herald_core::signing::{SigningKey, verify};
use herald_core::v1alpha1::{EndpointState, SigningSecret, WebhookEndpoint, WebhookEndpointStatus};
use herald_e2e::dataplane::{DataPlane, TEST_SHARDS};
use herald_e2e::faults::{
    Dispatchers, KvLog, Operators, Outcome, Published, Row, StreamSpec, account, await_delivery,
    dump_receipts, explain_lost, progress_at, publish_stream,
};
use herald_e2e::receiver::{Behavior, Receiver};
use herald_e2e::{TestContext, eventually, fault_lock, private_env};
use k8s_openapi::ByteString;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

#[path = "fault_suite_control/api_outage.rs"]
mod api_outage;
#[path = "fault_suite_control/leader.rs"]
mod leader;
#[path = "fault_suite_control/paused.rs"]
mod paused;
#[path = "fault_suite_control/signing_secret.rs"]
mod signing_secret;

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
