//! The seeded chaos soak: a seed draws a schedule of what users and operators do at once
//! (`herald_e2e::chaos::plan`) and this test carries it out against the real servers —
//! a 3-node NATS cluster with R3 streams, dispatcher processes (1 to 3) — while events
//! are published at a steady rate to one namespace with five endpoints (plain, ordered,
//! flaky, chaotic, toggled): dispatchers started, SIGKILLed and stopped, NATS nodes
//! SIGKILLed and brought back, endpoints paused and resumed, deleted and re-created
//! under the same name, edited, switched between ordered and not, signing keys rotated.
//!
//! Then the contract is checked over the whole run (`herald_e2e::chaos::check`): every
//! accepted event reached every endpoint that matched it while it existed (0 lost),
//! nothing reached a deleted or paused endpoint once the dispatchers could know, the
//! ordered endpoint never had two requests in flight and never saw two events out of
//! order, no retry came before its schedule, no event was dead-lettered, no dispatcher
//! exited on its own, and every dispatcher's peak memory stayed within its bound.
//!
//! The second test runs the same through the control plane (`chaos/control.rs`):
//! endpoints, replays and the signing secret are resources that two operator replicas
//! reconcile, herald-api takes a share of the events over HTTP and redelivers, and the
//! schedule also SIGKILLs operators, blacks the Kubernetes API out and redelivers. Its
//! checks count each change from when the configuration in NATS showed it.
//!
//! `HERALD_CHAOS_SEEDS` / `HERALD_CHAOS_CONTROL_SEEDS` (comma-separated; default: the
//! fixed seeds below; `none` skips that test) and `HERALD_CHAOS_SECONDS` (how long
//! things happen per seed, default 45) size the run;
//! `make soak` runs new seeds for longer. A failing run prints its seed and schedule;
//! `HERALD_CHAOS_SEEDS=<seed> cargo test -p herald-e2e --test chaos` replays the same
//! schedule. Each seed appends one line to `$HERALD_CHAOS_REPORT` (default
//! `$TMPDIR/herald-chaos-report.md`); dispatcher logs are
//! `$TMPDIR/herald-fault-chaos-<seed>-<replica>.log`.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use herald_core::dataplane::{
    BucketKey, DEADLETTER_STREAM, DeadLetter, EndpointConfig, EndpointKey, KeySet, LeaseKey,
    ReplayRequest, SHARDS_BUCKET, keyset_key,
};
use herald_e2e::chaos::{Action, GRACE, Life, Role, Shape, describe, early_retries, plan};
use herald_e2e::dataplane::{DataPlane, TEST_SECRET, TEST_SHARDS, endpoint};
use herald_e2e::faults::{
    Dispatchers, Published, Publisher, StreamSpec, account, await_delivery, publish_stream,
    publish_stream_to, try_peak_rss_kib,
};
use herald_e2e::receiver::{Behavior, Chaos, Receiver};
use herald_e2e::{TestEnv, fault_lock, private_cluster_env};
use serde_json::json;

#[path = "chaos/control.rs"]
mod control;

const DISPATCHER: &str = env!("CARGO_BIN_EXE_herald-test-dispatcher");

/// The seeds `make test` runs. Seed 800's 45 s schedule takes 14 of the 15 kinds of
/// step (all but a replay's deletion): replicas started, SIGKILLed and stopped, NATS
/// nodes SIGKILLed and back, two leases stolen, a pause, a deletion and re-creation,
/// edits, an ordered switch, a key rotation, and a replay to the ordered endpoint while
/// it is paused and a node is down.
const FIXED_SEEDS: &[u64] = &[800];
/// The seeds `make test` runs through the control plane.
const FIXED_CONTROL_SEEDS: &[u64] = &[CONTROL_SEED];
const CONTROL_SEED: u64 = 31;
/// Events per second published through herald-api in a control-plane soak (numbered
/// from [`HTTP_FIRST`]), besides [`RATE`] over NATS.
const HTTP_RATE: f64 = 20.0;
const HTTP_FIRST: u64 = 1_000_000;
/// Events per second, published for the whole schedule.
const RATE: f64 = 120.0;
/// The flaky endpoint's retry schedule (explicit: no jitter, so it can be checked).
const FLAKY_SCHEDULE: [&str; 4] = ["1s", "2s", "2s", "2s"];
/// The bound on a dispatcher's peak resident memory (a debug build).
const MEMORY_BOUND_KIB: u64 = 512 * 1024;
/// A second signing key the rotations alternate with.
const OTHER_SECRET: &str = "whsec_BwgJCgsMDQ4PEBESExQVFhcYGRobHB0e";

/// The seeds named by `var` (`none`: no seed), or `fixed`.
fn seeds(var: &str, fixed: &[u64]) -> Vec<u64> {
    match std::env::var(var) {
        Ok(list) if list.trim() == "none" => Vec::new(),
        Ok(list) if !list.trim().is_empty() => list
            .split(',')
            .map(|s| s.trim().parse().expect("seeds: numbers"))
            .collect(),
        _ => fixed.to_vec(),
    }
}

fn length() -> Duration {
    let seconds = std::env::var("HERALD_CHAOS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(45);
    Duration::from_secs(seconds)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seeded_chaos_schedule_keeps_the_delivery_contract() {
    soak_seeds(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seeded_chaos_schedule_through_the_control_plane_keeps_the_delivery_contract() {
    soak_seeds(true).await;
}

async fn soak_seeds(control: bool) {
    let (var, fixed) = if control {
        ("HERALD_CHAOS_CONTROL_SEEDS", FIXED_CONTROL_SEEDS)
    } else {
        ("HERALD_CHAOS_SEEDS", FIXED_SEEDS)
    };
    let seeds = seeds(var, fixed);
    if seeds.is_empty() {
        return;
    }
    let _faults = fault_lock().await;
    let env = private_cluster_env();
    let mut failed = Vec::new();
    for seed in seeds {
        let violations = Soak::new(env, seed, control).await.run().await;
        if !violations.is_empty() {
            failed.push(format!(
                "seed {seed} (replay: {var}={seed} HERALD_CHAOS_SECONDS={} cargo test -p \
                 herald-e2e --test chaos):\n  {}",
                length().as_secs(),
                violations.join("\n  ")
            ));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// One endpoint as the soak changes it.
struct Ep {
    role: Role,
    /// Lives so far; the last one is current.
    lives: Vec<Life>,
    ordered: bool,
    paused: bool,
    generation: i64,
    short_timeout: bool,
}

impl Ep {
    fn path(&self) -> String {
        format!("{}-{}", self.role.name(), self.lives.len() - 1)
    }

    fn behavior(&self, seed: u64) -> Behavior {
        match self.role {
            Role::Plain | Role::Toggle => Behavior::default(),
            Role::Ordered => Behavior::delayed(Duration::from_millis(3)),
            Role::Flaky => Behavior::fail_first_of_every(3, 500),
            Role::Chaotic => Behavior::chaos(Chaos {
                hang: Duration::from_secs(3),
                ..Chaos::uniform(seed, 10, 2)
            }),
        }
    }

    /// The resource's spec (without its secret and event types).
    fn spec(&self, url: String) -> serde_json::Value {
        let timeout = if self.short_timeout { "2s" } else { "2500ms" };
        let retry = match self.role {
            Role::Flaky => json!({"schedule": FLAKY_SCHEDULE}),
            _ => json!({"schedule": ["500ms", "1s", "1s", "2s", "2s", "2s"]}),
        };
        json!({
            "url": url,
            "ordered": self.ordered,
            "paused": self.paused,
            "delivery": {"timeout": timeout, "retry": retry},
        })
    }

    /// The configuration the operator would write for the spec.
    fn config(&self, ns: &str, url: String) -> EndpointConfig {
        let mut config = endpoint(ns, self.role.name(), self.spec(url));
        config.uid = format!("uid-{ns}-{}", self.path());
        config.generation = self.generation;
        config
    }
}

struct Soak {
    env: &'static TestEnv,
    seed: u64,
    dp: DataPlane,
    rx: Receiver,
    ns: String,
    eps: BTreeMap<Role, Ep>,
    dispatchers: Dispatchers,
    /// When a dispatcher or a NATS node was SIGKILLed.
    disruptions: Vec<Instant>,
    /// Peak resident memory seen per dispatcher replica, KiB.
    peaks: BTreeMap<String, u64>,
    /// Replays requested: number, endpoint role, the life it went to, the range of
    /// acknowledgements it covers, and whether it was deleted.
    replays: Vec<ReplayMade>,
    /// Per replica: when it started, and the CPU time it had used when last seen.
    cpu: BTreeMap<String, (Instant, Duration, Duration)>,
    rotated: bool,
    started: Instant,
    /// Set when the control plane carries the changes (resources, operators, herald-api).
    control: Option<control::Control>,
    redeliveries: Vec<Redelivered>,
}

impl Soak {
    async fn new(env: &'static TestEnv, seed: u64, through_control: bool) -> Self {
        let nats = env.nats().await;
        let js = async_nats::jetstream::new(nats.clone());
        herald_dispatcher::setup::ensure(
            &js,
            herald_dispatcher::setup::DEFAULT_RETENTION,
            TEST_SHARDS,
            3,
        )
        .await
        .expect("replicated JetStream layout");
        let dp = DataPlane::new(nats).await;
        let rx = Receiver::start().await;
        let label = format!("chaos-{seed}");
        let control = match through_control {
            true => Some(control::Control::start(env, &label).await),
            false => None,
        };
        let ns = match &control {
            Some(c) => c.ns().to_owned(),
            None => herald_e2e::unique_name("chaos"),
        };
        if control.is_none() {
            dp.put_keys(&ns, "signing", &[TEST_SECRET]).await;
        }
        let dispatchers = Dispatchers::new(DISPATCHER, env.nats_url(), &label)
            .with_args(&["--jetstream-replicas", "3"]);
        let mut soak = Self {
            env,
            seed,
            dp,
            rx,
            ns,
            eps: BTreeMap::new(),
            dispatchers,
            disruptions: Vec::new(),
            peaks: BTreeMap::new(),
            cpu: BTreeMap::new(),
            replays: Vec::new(),
            rotated: false,
            started: Instant::now(),
            control,
            redeliveries: Vec::new(),
        };
        for role in Role::ALL {
            let ep = Ep {
                role,
                lives: vec![Life {
                    role,
                    path: String::new(),
                    created: None,
                    deleted: None,
                    pauses: Vec::new(),
                }],
                ordered: role == Role::Ordered,
                paused: false,
                generation: 1,
                short_timeout: false,
            };
            soak.eps.insert(role, ep);
            soak.put(role, None).await;
        }
        if let Some(c) = &soak.control {
            for role in Role::ALL {
                let path = soak.eps[&role].path();
                c.until_configured(role.name(), &soak.rx.url(&path)).await;
            }
        }
        soak
    }

    /// Writes `role`'s configuration (a new life when `created` is given, or the first).
    async fn put(&mut self, role: Role, created: Option<Instant>) {
        let seed = self.seed;
        let ep = self.eps.get_mut(&role).expect("an endpoint of every role");
        if let Some(at) = created {
            ep.lives.push(Life {
                role,
                path: String::new(),
                created: Some(at),
                deleted: None,
                pauses: Vec::new(),
            });
            ep.generation = 1;
            ep.paused = false;
            ep.ordered = role == Role::Ordered;
        }
        let path = ep.path();
        ep.lives.last_mut().expect("a life").path = path.clone();
        self.rx.behave(&path, ep.behavior(seed));
        if let Some(c) = &self.control {
            c.apply(role.name(), ep.spec(self.rx.url(&path))).await;
            return;
        }
        let config = ep.config(&self.ns, self.rx.url(&path));
        let value = serde_json::to_vec(&config).expect("a configuration");
        self.write(config.key().config_key(), Some(value)).await;
    }

    /// Writes (or deletes, `None`) a key of `herald-config` as the operator does: again
    /// until it is stored (a NATS node may be down, its streams electing leaders).
    async fn write(&self, key: String, value: Option<Vec<u8>>) {
        let started = Instant::now();
        loop {
            let done = match &value {
                Some(v) => (self.dp.config.put(&key, v.clone().into()).await)
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
                None => (self.dp.config.delete(&key).await).map_err(|e| e.to_string()),
            };
            match done {
                Ok(()) => return,
                Err(error) if started.elapsed() < Duration::from_secs(60) => {
                    self.say(&format!("writing {key}: {error}; again"));
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(error) => panic!("writing {key} for 60 s: {error}"),
            }
        }
    }

    fn say(&self, what: &str) {
        println!(
            "[chaos {} +{:.1}s] {what}",
            self.seed,
            self.started.elapsed().as_secs_f64()
        );
    }

    /// Records the peak memory and the CPU time of every running replica so far.
    fn sample_memory(&mut self) {
        for id in self.dispatchers.running() {
            // A replica that exited on its own is reported by the checks.
            if let Some(peak) = self.dispatchers.pid(&id).and_then(try_peak_rss_kib) {
                let seen = self.peaks.entry(id.clone()).or_default();
                *seen = (*seen).max(peak);
            }
            if let (Some(used), Some(cpu)) = (self.dispatchers.cpu_time(&id), self.cpu.get_mut(&id))
            {
                cpu.1 = used;
                cpu.2 = cpu.0.elapsed();
            }
        }
    }

    async fn run(mut self) -> Vec<String> {
        let shape = Shape {
            length: length(),
            max_dispatchers: 3,
            nats_nodes: self.env.nats_nodes().len(),
            mean_gap: Duration::from_secs(3),
            shards: TEST_SHARDS,
            control: self.control.is_some(),
        };
        let steps = plan(self.seed, &shape);
        println!(
            "[chaos {}] namespace {}; {} steps:\n{}",
            self.seed,
            self.ns,
            steps.len(),
            describe(&steps)
        );
        self.started = Instant::now();
        let count = (RATE * shape.length.as_secs_f64()) as u64;
        let progress = Arc::new(AtomicU64::new(0));
        let publisher = publish_stream(
            self.dp.js.clone(),
            StreamSpec {
                namespace: self.ns.clone(),
                event_type: "chaos.tick".into(),
                first: 0,
                count,
                rate: RATE,
            },
            progress,
        );
        let http = self.control.as_ref().map(|c| {
            let publisher = Publisher::Http {
                base: c.api_base.clone(),
                client: c.http.clone(),
            };
            let spec = StreamSpec {
                namespace: self.ns.clone(),
                event_type: "chaos.tick".into(),
                first: HTTP_FIRST,
                count: (HTTP_RATE * shape.length.as_secs_f64()) as u64,
                rate: HTTP_RATE,
            };
            publish_stream_to(publisher, spec, Arc::new(AtomicU64::new(0)))
        });
        for step in &steps {
            tokio::time::sleep_until((self.started + step.at).into()).await;
            self.sample_memory();
            self.say(&step.action.to_string());
            self.apply(&step.action).await;
        }
        let mut published = publisher.await.expect("the publisher");
        if let Some(http) = http {
            let over_http = http.await.expect("the HTTP publisher");
            self.say(&format!(
                "{} events accepted over HTTP, {} not (last error {:?})",
                over_http.acked.len(),
                over_http.given_up.len(),
                over_http.last_error
            ));
            published.merge(over_http);
        }
        self.say(&format!(
            "{} events accepted, {} not; waiting for deliveries",
            published.acked.len(),
            published.given_up.len()
        ));
        self.check(published, steps.len()).await
    }

    async fn apply(&mut self, action: &Action) {
        let now = Instant::now();
        match action {
            Action::StartDispatcher(id) => {
                self.dispatchers.start(id);
                self.cpu
                    .insert(id.clone(), (now, Duration::ZERO, Duration::ZERO));
            }
            Action::KillDispatcher(id) => {
                self.dispatchers.kill(id);
                self.disruptions.push(now);
            }
            Action::StopDispatcher(id) => {
                let took = self.dispatchers.stop(id).await;
                self.say(&format!("{id} stopped in {took:.1?}"));
            }
            Action::KillNatsNode(node) => {
                let env = self.env;
                let node = *node;
                tokio::task::spawn_blocking(move || env.kill_nats_node(node))
                    .await
                    .expect("nats-kill");
                self.disruptions.push(now);
            }
            Action::StartNatsNode(node) => {
                let env = self.env;
                let node = *node;
                tokio::task::spawn_blocking(move || env.start_nats_node(node))
                    .await
                    .expect("nats-start");
                self.say(&format!("n{node} healthy after {:.1?}", now.elapsed()));
            }
            Action::Pause(role) | Action::Resume(role) => {
                let paused = matches!(action, Action::Pause(_));
                let ep = self.ep(*role);
                ep.paused = paused;
                ep.generation += 1;
                let life = ep.lives.last_mut().expect("a life");
                if paused {
                    life.pauses.push((now, None));
                } else if let Some(pause) = life.pauses.last_mut() {
                    pause.1 = Some(now);
                }
                self.put(*role, None).await;
            }
            Action::Delete(role) => {
                let ep = self.ep(*role);
                ep.lives.last_mut().expect("a life").deleted = Some(now);
                if let Some(c) = &self.control {
                    c.delete_endpoint(role.name()).await;
                    return;
                }
                let key = EndpointKey::new(&self.ns, role.name()).config_key();
                self.write(key, None).await;
            }
            Action::Recreate(role) => self.put(*role, Some(now)).await,
            Action::Edit(role) => {
                let ep = self.ep(*role);
                ep.short_timeout = !ep.short_timeout;
                ep.generation += 1;
                self.put(*role, None).await;
            }
            Action::SetOrdered(role, on) => {
                let ep = self.ep(*role);
                ep.ordered = *on;
                ep.generation += 1;
                self.put(*role, None).await;
            }
            Action::StealLease(shard) => {
                let key = LeaseKey::Shard(*shard).to_string();
                let (holder, put) = match self.dp.js.get_key_value(SHARDS_BUCKET).await {
                    Ok(kv) => (
                        kv.get(&key).await.map_err(|e| e.to_string()),
                        kv.put(&key, "chaos-thief".into())
                            .await
                            .map_err(|e| e.to_string()),
                    ),
                    Err(e) => (Err(e.to_string()), Err(e.to_string())),
                };
                self.say(&format!(
                    "shard {shard} was held by {:?}; stolen: {:?} ({:.1?})",
                    holder.map(|h| h.map(|h| String::from_utf8_lossy(&h).into_owned())),
                    put.map(|_| ()),
                    now.elapsed()
                ));
                // Its holder aborts the shard's attempts when it gives the lease up.
                self.disruptions.push(now + Duration::from_secs(6));
            }
            Action::Replay(role, n) => {
                let to_ms = now_ms();
                let life = self.ep(*role).lives.len() - 1;
                let made = ReplayMade {
                    n: *n,
                    role: *role,
                    life,
                    acked: (now - REPLAYED, now),
                    deleted: false,
                };
                let from_ms = to_ms - REPLAYED.as_millis() as u64;
                if let Some(c) = &self.control {
                    c.replay(&format!("r{n}"), role.name(), from_ms, to_ms)
                        .await;
                    self.replays.push(made);
                    return;
                }
                let request = ReplayRequest {
                    namespace: self.ns.clone(),
                    name: format!("r{n}"),
                    uid: format!("uid-{}-r{n}", self.ns),
                    endpoint: role.name().into(),
                    from_ms,
                    to_ms,
                    event_types: Vec::new(),
                    only_failed: false,
                    dry_run: false,
                };
                let key = BucketKey::replay(&self.ns, &request.name).to_string();
                let value = serde_json::to_vec(&request).expect("a request");
                self.write(key, Some(value)).await;
                self.replays.push(made);
            }
            Action::DeleteReplay(n) => {
                let name = format!("r{n}");
                match &self.control {
                    Some(c) => c.delete_replay(&name).await,
                    None => {
                        let key = BucketKey::replay(&self.ns, &name).to_string();
                        self.write(key, None).await;
                    }
                }
                if let Some(r) = self.replays.iter_mut().find(|r| r.n == *n) {
                    r.deleted = true;
                }
            }
            Action::RotateKeys if self.control.is_some() => {
                if let Some(c) = &mut self.control {
                    c.rotate().await;
                }
            }
            Action::RotateKeys => {
                self.rotated = !self.rotated;
                let keys = if self.rotated {
                    [OTHER_SECRET, TEST_SECRET]
                } else {
                    [TEST_SECRET, OTHER_SECRET]
                };
                let set = KeySet {
                    keys: keys.map(str::to_owned).to_vec(),
                };
                let value = serde_json::to_vec(&set).expect("a key set");
                self.write(keyset_key(&self.ns, "signing"), Some(value))
                    .await;
            }
            Action::KillOperator(id) => {
                let c = self.control.as_mut().expect("a control-plane soak");
                c.operators.kill(id);
            }
            Action::StartOperator(id) => {
                let c = self.control.as_mut().expect("a control-plane soak");
                c.operators.start(id);
            }
            Action::BlackoutApi(down) => {
                let env = self.env;
                let seconds = down.as_secs_f64();
                tokio::task::spawn_blocking(move || env.blackout_apiserver(seconds))
                    .await
                    .expect("apiserver-blackout");
            }
            Action::Redeliver(role) => self.redeliver(*role, now).await,
        }
    }

    /// Sends the latest event `role`'s endpoint received again through herald-api.
    async fn redeliver(&mut self, role: Role, now: Instant) {
        let ep = &self.eps[&role];
        let life = ep.lives.len() - 1;
        let path = ep.path();
        let Some(latest) = self
            .rx
            .exchanges(&path)
            .into_iter()
            .rev()
            .find(|x| x.data.is_some())
        else {
            self.say(&format!("/{path} has received nothing yet: no redelivery"));
            return;
        };
        let c = self.control.as_ref().expect("a control-plane soak");
        let answer = c.redeliver(role.name(), &latest.webhook_id).await;
        self.say(&format!(
            "redeliver {} (event {:?}) to {}: {answer:?}",
            latest.webhook_id,
            latest.data,
            role.name()
        ));
        self.redeliveries.push(Redelivered {
            role,
            life,
            data: latest.data.expect("a numbered event"),
            at: now,
            answer,
        });
    }

    /// Distinct events received on every path so far: progress while draining.
    fn received_in_all(&self) -> usize {
        self.eps
            .values()
            .flat_map(|e| &e.lives)
            .map(|l| self.rx.distinct_count(&l.path))
            .sum()
    }

    fn ep(&mut self, role: Role) -> &mut Ep {
        self.eps.get_mut(&role).expect("an endpoint of every role")
    }

    /// Waits for what is owed, then checks the contract; returns every violation.
    async fn check(mut self, published: Published, steps: usize) -> Vec<String> {
        if let Some(c) = &self.control {
            // Through the operator, a change counts from when NATS showed it.
            for ep in self.eps.values_mut() {
                let changes = c.changes(ep.role.name());
                ep.lives = ep.lives.iter().map(|l| l.as_configured(&changes)).collect();
            }
        }
        let lives: Vec<Life> = self.eps.values().flat_map(|e| e.lives.clone()).collect();
        let owed: Vec<(Life, Published)> = lives
            .iter()
            .filter(|l| l.deleted.is_none())
            .map(|l| (l.clone(), l.owed(&published)))
            .collect();
        // What is owed may take long to drain (an ordered endpoint sends one request at a
        // time, behind a backlog the schedule's pauses and kills built up): the wait ends
        // when everything arrived, when no endpoint received anything new for `STALL`
        // (what is still missing then is lost), or at `DRAIN_CAP`.
        let waited = Instant::now();
        let mut last_progress = (Instant::now(), self.received_in_all());
        for (life, owed) in &owed {
            loop {
                let left = DRAIN_CAP.saturating_sub(waited.elapsed());
                let complete =
                    await_delivery(owed, &self.rx, &[life.path.as_str()], left.min(STALL)).await;
                let received = self.received_in_all();
                if received > last_progress.1 {
                    last_progress = (Instant::now(), received);
                }
                if complete || last_progress.0.elapsed() >= STALL || waited.elapsed() >= DRAIN_CAP {
                    self.say(&format!(
                        "/{}: {} after {:.1?}",
                        life.path,
                        if complete { "complete" } else { "incomplete" },
                        waited.elapsed()
                    ));
                    break;
                }
            }
        }
        // An ordered endpoint's replay goes after its fresh backlog: wait for it too.
        while !self.replays_missing(&published).is_empty()
            && last_progress.0.elapsed() < STALL
            && waited.elapsed() < DRAIN_CAP
        {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let received = self.received_in_all();
            if received > last_progress.1 {
                last_progress = (Instant::now(), received);
            }
        }
        // A moment for late requests (into pauses, after deletions, duplicates).
        tokio::time::sleep(GRACE).await;
        self.sample_memory();
        let mut violations = Vec::new();
        for (id, status) in self.dispatchers.exited() {
            violations.push(format!("dispatcher {id} exited on its own: {status}"));
        }
        if let Some(c) = &mut self.control {
            for (id, status) in c.operators.exited() {
                violations.push(format!("operator {id} exited on its own: {status}"));
            }
            if let Some(status) = c.api_exited() {
                violations.push(format!("herald-api exited on its own: {status}"));
            }
        }
        violations.extend(self.redeliveries_missing());
        let mut received = Vec::new();
        for (life, owed) in &owed {
            let ordered = life.role == Role::Ordered;
            let outcome = account(owed, &self.rx, &life.path, ordered);
            received.push(format!(
                "{} {}/{}",
                life.path,
                outcome.expected - outcome.lost.len(),
                outcome.expected
            ));
            if !outcome.lost.is_empty() {
                violations.push(format!(
                    "/{}: {} of {} owed events lost, first {:?}",
                    life.path,
                    outcome.lost.len(),
                    outcome.expected,
                    &outcome.lost[..outcome.lost.len().min(10)]
                ));
            }
            if ordered && outcome.max_in_flight > 1 {
                violations.push(format!(
                    "/{}: {} requests in flight at once on an ordered endpoint",
                    life.path, outcome.max_in_flight
                ));
            }
            if ordered && outcome.reorderings > 0 {
                violations.push(format!(
                    "/{}: {} events out of order, e.g. {:?}",
                    life.path, outcome.reorderings, outcome.reordered_examples
                ));
            }
        }
        let schedule: Vec<Duration> = FLAKY_SCHEDULE.iter().map(|s| humantime_ms(s)).collect();
        for life in &lives {
            let exchanges = self.rx.exchanges(&life.path);
            violations.extend(life.unwanted(&exchanges));
            if life.role == Role::Flaky {
                violations.extend(early_retries(
                    &life.path,
                    &exchanges,
                    &schedule,
                    &self.disruptions,
                    Duration::from_millis(100),
                ));
            }
        }
        violations.extend(self.replays_missing(&published));
        for letter in self.dead_letters().await {
            violations.push(format!("dead-lettered: {letter}"));
        }
        for (id, peak) in &self.peaks {
            if *peak > MEMORY_BOUND_KIB {
                violations.push(format!(
                    "dispatcher {id} peaked at {} MiB (bound {} MiB)",
                    peak / 1024,
                    MEMORY_BOUND_KIB / 1024
                ));
            }
        }
        // A loop that spins (a stop it cannot see) burns a core.
        for (id, (_, used, alive)) in &self.cpu {
            if *alive > Duration::from_secs(10) && used.as_secs_f64() > 0.9 * alive.as_secs_f64() {
                violations.push(format!(
                    "dispatcher {id} used {used:.1?} of CPU in {alive:.1?}: a core, spinning?"
                ));
            }
        }
        self.dispatchers.stop_all().await;
        if let Some(c) = &mut self.control {
            c.cleanup().await;
        }
        let peak = self.peaks.values().max().copied().unwrap_or_default() / 1024;
        let line = format!(
            "| {}{} | {:.0} s | {steps} | {} | {} | {} MiB | {} |\n",
            self.seed,
            if self.control.is_some() {
                " (control plane)"
            } else {
                ""
            },
            length().as_secs_f64(),
            published.acked.len(),
            self.disruptions.len(),
            peak,
            if violations.is_empty() {
                "clean".to_owned()
            } else {
                format!("{} violations: {}", violations.len(), violations[0])
            }
        );
        self.say(&format!("received: {}", received.join(", ")));
        print!("{line}");
        let report = std::env::var_os("HERALD_CHAOS_REPORT")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| std::env::temp_dir().join("herald-chaos-report.md"));
        if let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&report)
        {
            let _ = file.write_all(line.as_bytes());
        }
        violations
    }

    /// Replays neither deleted nor cut short by their endpoint's deletion that have not
    /// sent every event of their range again (events within 200 ms of its bounds are
    /// not judged: the range is in the server's clock, acknowledgements in this
    /// process's).
    fn replays_missing(&self, published: &Published) -> Vec<String> {
        let mut violations = Vec::new();
        for r in self.replays.iter().filter(|r| !r.deleted) {
            let ep = &self.eps[&r.role];
            if r.life + 1 != ep.lives.len() || ep.lives[r.life].deleted.is_some() {
                continue;
            }
            let path = &ep.lives[r.life].path;
            let owed = ep.lives[r.life].owed(published);
            let margin = Duration::from_millis(200);
            let mut requests: BTreeMap<i64, usize> = BTreeMap::new();
            for x in self.rx.exchanges(path) {
                if let Some(d) = x.data {
                    *requests.entry(d).or_default() += 1;
                }
            }
            let missed: Vec<u64> = published
                .acked
                .iter()
                .filter(|(_, a)| a.at > r.acked.0 + margin && a.at + margin < r.acked.1)
                .map(|(n, _)| *n)
                .filter(|n| {
                    // Once by the replay, and once before if the life owed it.
                    let due = 1 + usize::from(owed.acked.contains_key(n));
                    requests.get(&(*n as i64)).copied().unwrap_or(0) < due
                })
                .collect();
            if !missed.is_empty() {
                violations.push(format!(
                    "/{path}: replay r{} did not send {} events again, first {:?}",
                    r.n,
                    missed.len(),
                    &missed[..missed.len().min(10)]
                ));
            }
        }
        violations
    }

    /// Redeliveries herald-api accepted whose event did not arrive again (unless the
    /// endpoint was deleted since).
    fn redeliveries_missing(&self) -> Vec<String> {
        let mut missing = Vec::new();
        for r in &self.redeliveries {
            let ep = &self.eps[&r.role];
            let life = &ep.lives[r.life];
            if life.deleted.is_some() {
                continue;
            }
            if let Err(e) = &r.answer {
                missing.push(format!(
                    "/{}: redelivering event {} refused: {e}",
                    life.path, r.data
                ));
                continue;
            }
            let again = self
                .rx
                .exchanges(&life.path)
                .iter()
                .any(|x| x.data == Some(r.data) && x.at >= r.at);
            if !again {
                missing.push(format!(
                    "/{}: event {} redelivered at +{:.1}s never arrived again",
                    life.path,
                    r.data,
                    (r.at - self.started).as_secs_f64()
                ));
            }
        }
        missing
    }

    /// Every dead letter of this soak's namespace: `reason event-id subject`.
    async fn dead_letters(&self) -> Vec<String> {
        let Ok(stream) = self.dp.js.get_stream(DEADLETTER_STREAM).await else {
            return vec!["the dead-letter stream cannot be read".into()];
        };
        let filter = DeadLetter::filter();
        let needle = format!(".{}.", self.ns);
        let mut found = Vec::new();
        let mut seq = 1;
        for _ in 0..100_000 {
            let Ok(message) = stream
                .direct_get_next_for_subject(filter.as_str(), Some(seq))
                .await
            else {
                break;
            };
            seq = message.sequence + 1;
            if let Some(letter) = DeadLetter::decode(message.subject.as_str(), &message.headers)
                && format!("{}.", letter.subject).contains(&needle)
            {
                found.push(format!(
                    "{} {} {}",
                    letter.reason, letter.event_id, letter.subject
                ));
            }
        }
        found
    }
}

/// A replay the soak requested.
struct ReplayMade {
    n: u32,
    role: Role,
    /// Index of the endpoint's life it was requested for.
    life: usize,
    /// The acknowledgements it covers (this process's clock).
    acked: (Instant, Instant),
    deleted: bool,
}

/// A redelivery the soak asked herald-api for.
struct Redelivered {
    role: Role,
    life: usize,
    /// The event's number.
    data: i64,
    at: Instant,
    answer: Result<(), String>,
}

/// How far back a replay reaches.
const REPLAYED: Duration = Duration::from_secs(10);
/// After the schedule, what is still owed and not arriving for this long is lost.
const STALL: Duration = Duration::from_secs(60);
/// The longest wait for what is owed, however slowly it arrives.
const DRAIN_CAP: Duration = Duration::from_secs(900);

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

/// `"1s"` / `"500ms"` as a duration (the forms this file writes).
fn humantime_ms(s: &str) -> Duration {
    match s.strip_suffix("ms") {
        Some(ms) => Duration::from_millis(ms.parse().expect("ms")),
        None => Duration::from_secs(s.trim_end_matches('s').parse().expect("s")),
    }
}
