//! The harness of the fault suite (`e2e/tests/fault_suite.rs` and
//! `e2e/tests/fault_suite_control.rs`, issue 10 "No accepted event is lost"): dispatcher
//! and operator processes to SIGKILL, stop and restart ([`Dispatchers`], [`Operators`]), a numbered event stream published at a steady rate that remembers
//! which events JetStream acknowledged and when ([`publish_stream`]), the accounting of
//! what each endpoint's receiver got against that ([`account`]), evidence about lost
//! events from the streams and the attempt log ([`explain_lost`]), and the report row
//! ([`Row`]), and a record of every change of some KV keys as this process saw it
//! ([`KvLog`]).
//!
//! Every wait here is a poll with a deadline; every loop is bounded.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, message::PublishMessage};
use herald_core::dataplane::{
    DELIVERIES_STREAM, EVENT_ID_HEADER, EVENTS_STREAM, EndpointKey, LANE_PREFIX, Lane,
    SHARDS_BUCKET, event_id, event_subject,
};
use serde_json::json;

use crate::receiver::Receiver;

// ---------------------------------------------------------------------------------------
// Dispatcher and operator processes
// ---------------------------------------------------------------------------------------

/// Processes of one program started by a scenario, by id (`--replica-id` of a
/// dispatcher, `--identity` of an operator). Each one's stdout and stderr go to one log
/// file in the temp dir, appended across restarts. Dropping the set SIGKILLs whatever
/// still runs. [`Dispatchers`] and [`Operators`] are this with their program's flags.
pub struct Processes {
    bin: PathBuf,
    args: Vec<String>,
    label: String,
    /// The flag that gives a process its id.
    id_flag: &'static str,
    /// The signal of a graceful stop.
    stop_signal: &'static str,
    running: BTreeMap<String, Child>,
    logs: BTreeMap<String, PathBuf>,
}

impl Processes {
    /// The log file of process `id`.
    pub fn log(&self, id: &str) -> PathBuf {
        std::env::temp_dir().join(format!("herald-fault-{}-{id}.log", self.label))
    }

    /// Starts process `id` (again).
    pub fn start(&mut self, id: &str) {
        assert!(!self.running.contains_key(id), "replica {id} already runs");
        let path = self.log(id);
        let fresh = !self.logs.contains_key(id);
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(!fresh)
            .truncate(fresh)
            .open(&path)
            .expect("opening a process log");
        let _ = writeln!(
            file,
            "==== fault suite: starting replica {id} at {}",
            jiff::Timestamp::now()
        );
        let child = Command::new(&self.bin)
            .args(&self.args)
            .args([self.id_flag, id])
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log handle"))
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.bin.display()));
        self.logs.insert(id.to_owned(), path);
        self.running.insert(id.to_owned(), child);
    }

    /// SIGKILLs process `id` (a crash: nothing is flushed, no lease is released) and
    /// reaps it.
    pub fn kill(&mut self, id: &str) {
        let mut child = self
            .running
            .remove(id)
            .unwrap_or_else(|| panic!("replica {id} is not running"));
        let _ = child.kill();
        let _ = child.wait();
        self.note(id, "SIGKILLed");
    }

    /// The graceful stop signal (SIGINT for a dispatcher, SIGTERM for an operator) to
    /// process `id`, then waits (at most 30 s, then SIGKILL) for it to exit. Returns how
    /// long it took.
    pub async fn stop(&mut self, id: &str) -> Duration {
        let Some(mut child) = self.running.remove(id) else {
            return Duration::ZERO;
        };
        let started = Instant::now();
        let _ = Command::new("kill")
            .args([&format!("-{}", self.stop_signal), &child.id().to_string()])
            .status();
        let deadline = started + Duration::from_secs(30);
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                self.note(id, "did not stop within 30 s of the stop signal; SIGKILLed");
                return started.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.note(id, &format!("stopped (SIG{})", self.stop_signal));
        started.elapsed()
    }

    /// Stops every running process gracefully.
    pub async fn stop_all(&mut self) {
        let ids: Vec<String> = self.running.keys().cloned().collect();
        for id in ids {
            self.stop(&id).await;
        }
    }

    /// The process id of process `id`, while it runs.
    pub fn pid(&self, id: &str) -> Option<u32> {
        self.running.get(id).map(Child::id)
    }

    /// CPU time (user and system) process `id` has used so far, while it runs.
    pub fn cpu_time(&self, id: &str) -> Option<Duration> {
        cpu_time(self.pid(id)?)
    }

    /// The processes running now.
    pub fn running(&self) -> Vec<String> {
        self.running.keys().cloned().collect()
    }

    /// Processes that exited on their own (a crash the test did not cause), with status.
    pub fn exited(&mut self) -> Vec<(String, String)> {
        self.running
            .iter_mut()
            .filter_map(|(id, child)| match child.try_wait() {
                Ok(Some(status)) => Some((id.clone(), status.to_string())),
                _ => None,
            })
            .collect()
    }

    /// Log lines of every process that contain one of `needles` (at most `max` per
    /// process), for the evidence of a failure.
    pub fn grep(&self, needles: &[&str], max: usize) -> Vec<String> {
        let mut out = Vec::new();
        for (id, path) in &self.logs {
            let Ok(text) = std::fs::read_to_string(path) else {
                continue;
            };
            out.extend(
                text.lines()
                    .filter(|l| needles.iter().any(|n| l.contains(n)))
                    .take(max)
                    .map(|l| format!("[{id}] {l}")),
            );
        }
        out
    }

    /// Every log file so far.
    pub fn log_files(&self) -> Vec<PathBuf> {
        self.logs.values().cloned().collect()
    }

    fn note(&self, id: &str, what: &str) {
        if let Ok(mut file) = std::fs::OpenOptions::new().append(true).open(self.log(id)) {
            let _ = writeln!(
                file,
                "==== fault suite: replica {id} {what} at {}",
                jiff::Timestamp::now()
            );
        }
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        for child in self.running.values_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// CPU time (user and system) process `pid` has used so far, from `/proc/<pid>/stat`
/// (Linux; clock ticks taken as the usual 100 per second).
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces; fields after it are plain.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 (utime) and 15 (stime) of the whole line are 12 and 13 after ")".
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

/// Dispatcher processes (`herald-test-dispatcher`) of one scenario, by replica id (see
/// [`Processes`]; a graceful stop is SIGINT).
pub struct Dispatchers(Processes);

impl Dispatchers {
    /// Replicas of `bin` (pass `env!("CARGO_BIN_EXE_herald-test-dispatcher")`) against
    /// `nats_url` (a comma-separated list in a cluster), with the test flags: 4 shards,
    /// loopback allowed, health every second, a 5 s grace period. `label` names the logs.
    pub fn new(bin: impl Into<PathBuf>, nats_url: &str, label: &str) -> Self {
        let args = [
            "--nats-url",
            nats_url,
            "--shards",
            &crate::dataplane::TEST_SHARDS.to_string(),
            "--allow-network",
            "127.0.0.0/8",
            "--allow-http",
            "--listen",
            "127.0.0.1:0",
            "--health-interval",
            "1s",
            "--grace",
            "5s",
        ]
        .map(str::to_owned)
        .to_vec();
        Self(Processes {
            bin: bin.into(),
            args,
            label: label.to_owned(),
            id_flag: "--replica-id",
            stop_signal: "INT",
            running: BTreeMap::new(),
            logs: BTreeMap::new(),
        })
    }

    /// Adds flags (e.g. `--jetstream-replicas 3`) for every replica started from now on.
    pub fn with_args(mut self, args: &[&str]) -> Self {
        self.0.args.extend(args.iter().map(|a| (*a).to_owned()));
        self
    }
}

impl std::ops::Deref for Dispatchers {
    type Target = Processes;

    fn deref(&self) -> &Processes {
        &self.0
    }
}

impl std::ops::DerefMut for Dispatchers {
    fn deref_mut(&mut self) -> &mut Processes {
        &mut self.0
    }
}

/// Operator processes (`herald-test-operator`) of one scenario, by identity (see
/// [`Processes`]; a graceful stop is SIGTERM, which releases the Lease).
pub struct Operators(Processes);

impl Operators {
    /// Replicas of `bin` (pass `env!("CARGO_BIN_EXE_herald-test-operator")`) against
    /// `env`, reconciling only `namespace` and electing their leader with a Lease there,
    /// with the test flags: 4 shards (as the test dispatchers), loopback and `http`
    /// allowed, status at most every second, a 5 s Lease renewed every second. `label`
    /// names the logs.
    pub fn new(
        bin: impl Into<PathBuf>,
        env: &crate::TestEnv,
        namespace: &str,
        label: &str,
    ) -> Self {
        let kubeconfig = env.kubeconfig().display().to_string();
        let args = [
            "--nats-url",
            env.nats_url(),
            "--shards",
            &crate::dataplane::TEST_SHARDS.to_string(),
            "--namespace",
            namespace,
            "--lease-namespace",
            namespace,
            "--kubeconfig",
            &kubeconfig,
            "--listen",
            "127.0.0.1:0",
            "--allow-network",
            "127.0.0.0/8",
            "--allow-http",
            "--status-interval",
            "1s",
            "--lease-duration",
            "5s",
            "--lease-renew",
            "1s",
        ]
        .map(str::to_owned)
        .to_vec();
        Self(Processes {
            bin: bin.into(),
            args,
            label: label.to_owned(),
            id_flag: "--identity",
            stop_signal: "TERM",
            running: BTreeMap::new(),
            logs: BTreeMap::new(),
        })
    }

    /// Adds flags for every replica started from now on (a later flag wins).
    pub fn with_args(mut self, args: &[&str]) -> Self {
        self.0.args.extend(args.iter().map(|a| (*a).to_owned()));
        self
    }
}

impl std::ops::Deref for Operators {
    type Target = Processes;

    fn deref(&self) -> &Processes {
        &self.0
    }
}

impl std::ops::DerefMut for Operators {
    fn deref_mut(&mut self) -> &mut Processes {
        &mut self.0
    }
}

// ---------------------------------------------------------------------------------------
// The event stream
// ---------------------------------------------------------------------------------------

/// An event JetStream acknowledged.
#[derive(Debug, Clone, Copy)]
pub struct Accepted {
    /// Its sequence in `HERALD_EVENTS`.
    pub seq: u64,
    /// When the acknowledgement arrived.
    pub at: Instant,
}

/// What the publisher of a stream saw.
#[derive(Debug, Default)]
pub struct Published {
    /// Event number (its `data`) -> its acknowledgement.
    pub acked: BTreeMap<u64, Accepted>,
    /// Events never acknowledged within the per-event deadline (not accepted: they do
    /// not count as lost if missing).
    pub given_up: Vec<u64>,
    /// Publish attempts that failed or timed out (each retried with the same
    /// `Nats-Msg-Id`).
    pub failed_attempts: u64,
    /// Acks that JetStream flagged as duplicates (an earlier attempt was stored).
    pub duplicate_acks: u64,
    pub last_error: Option<String>,
    /// From the first publish to the last ack.
    pub elapsed: Duration,
}

impl Published {
    /// Adds what another publisher of the same scenario saw.
    pub fn merge(&mut self, other: Published) {
        self.acked.extend(other.acked);
        self.given_up.extend(other.given_up);
        self.failed_attempts += other.failed_attempts;
        self.duplicate_acks += other.duplicate_acks;
        self.last_error = other.last_error.or(self.last_error.take());
        self.elapsed += other.elapsed;
    }

    /// The acknowledged events ordered by stream sequence (the publish order).
    pub fn in_publish_order(&self) -> Vec<u64> {
        let mut by_seq: Vec<(u64, u64)> = self.acked.iter().map(|(n, a)| (a.seq, *n)).collect();
        by_seq.sort_unstable();
        by_seq.into_iter().map(|(_, n)| n).collect()
    }
}

/// The event stream of a scenario.
#[derive(Debug, Clone)]
pub struct StreamSpec {
    pub namespace: String,
    pub event_type: String,
    /// Events numbered `first..first + count`; an event's `data` is its number.
    pub first: u64,
    pub count: u64,
    /// Events per second.
    pub rate: f64,
}

/// How long one event may take to be acknowledged, retries included, before it is given
/// up (and then not counted as accepted).
const EVENT_DEADLINE: Duration = Duration::from_secs(60);
/// How long one publish attempt waits for its ack.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);

/// Publishes the stream in the background, one event at a time at a steady rate (a
/// stall — a fault — delays the rest rather than bursting it), each with `Nats-Msg-Id`
/// `<namespace>-<n>` so a retried publish is stored once. `progress` counts events done
/// (acknowledged or given up).
pub fn publish_stream(
    js: jetstream::Context,
    spec: StreamSpec,
    progress: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<Published> {
    tokio::spawn(async move {
        let mut out = Published::default();
        let subject = event_subject(&spec.namespace, &spec.event_type);
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / spec.rate.max(0.1)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let started = Instant::now();
        for n in spec.first..spec.first + spec.count {
            tick.tick().await;
            let body = serde_json::to_vec(&json!({"type": spec.event_type, "data": n}))
                .expect("event JSON");
            let deadline = Instant::now() + EVENT_DEADLINE;
            loop {
                let attempt = async {
                    js.send_publish(
                        subject.clone(),
                        PublishMessage::build()
                            .payload(body.clone().into())
                            .message_id(format!("{}-{n}", spec.namespace)),
                    )
                    .await?
                    .await
                };
                let error = match tokio::time::timeout(ATTEMPT_TIMEOUT, attempt).await {
                    Ok(Ok(ack)) => {
                        out.duplicate_acks += u64::from(ack.duplicate);
                        out.acked.insert(
                            n,
                            Accepted {
                                seq: ack.sequence,
                                at: Instant::now(),
                            },
                        );
                        break;
                    }
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => format!("no ack within {ATTEMPT_TIMEOUT:?}"),
                };
                out.failed_attempts += 1;
                out.last_error = Some(error);
                if Instant::now() > deadline {
                    out.given_up.push(n);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            progress.store(n + 1 - spec.first, Ordering::SeqCst);
        }
        out.elapsed = started.elapsed();
        out
    })
}

// ---------------------------------------------------------------------------------------
// Accounting
// ---------------------------------------------------------------------------------------

/// What one endpoint received, against what was accepted.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub path: String,
    pub ordered: bool,
    /// Accepted events (every one matches the endpoint).
    pub expected: usize,
    /// Accepted events never received, by number.
    pub lost: Vec<u64>,
    /// Requests for an event after it had been answered with a success: the
    /// duplicates of at-least-once delivery (a receiver deduplicates them).
    pub duplicates: usize,
    /// Requests beyond the first per `webhook-id`: retries after failures and
    /// duplicates.
    pub beyond_first: usize,
    /// Event numbers received under more than one `webhook-id` (the event was stored
    /// twice, or ids are not stable).
    pub ids_per_event_violations: Vec<u64>,
    /// Events whose first receipt came after that of a later-published event.
    pub reorderings: usize,
    /// The first few reorderings: (event, first received after event).
    pub reordered_examples: Vec<(u64, u64)>,
    pub max_in_flight: usize,
    /// From publish-acknowledged to first receipt.
    pub longest_delay: Duration,
    pub p99_delay: Duration,
    pub requests: usize,
}

impl Outcome {
    /// One line for the test output: received, requests, duplicates, order, delays.
    pub fn summary(&self) -> String {
        format!(
            "/{}: {} of {} accepted events received, {} requests ({} beyond the first), {} \
             duplicates after a success, max in flight {}, {} reorderings, longest delay \
             {:.2} s, p99 {:.2} s",
            self.path,
            self.expected - self.lost.len(),
            self.expected,
            self.requests,
            self.beyond_first,
            self.duplicates,
            self.max_in_flight,
            self.reorderings,
            self.longest_delay.as_secs_f64(),
            self.p99_delay.as_secs_f64()
        )
    }
}

/// Accounts for `path` of `rx` against `published`.
pub fn account(published: &Published, rx: &Receiver, path: &str, ordered: bool) -> Outcome {
    let firsts = rx.first_receipts(path);
    let mut ids: HashMap<u64, BTreeSet<&str>> = HashMap::new();
    let mut first_at: HashMap<u64, Instant> = HashMap::new();
    for f in &firsts {
        if let Some(d) = f.data.and_then(|d| u64::try_from(d).ok()) {
            ids.entry(d).or_default().insert(&f.webhook_id);
            first_at.entry(d).or_insert(f.at);
        }
    }
    let lost: Vec<u64> = published
        .acked
        .keys()
        .filter(|n| !first_at.contains_key(n))
        .copied()
        .collect();
    let mut delays: Vec<Duration> = published
        .acked
        .iter()
        .filter_map(|(n, a)| first_at.get(n).map(|at| at.saturating_duration_since(a.at)))
        .collect();
    delays.sort_unstable();
    let p99_delay = delays
        .get((delays.len() * 99 / 100).min(delays.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default();
    // Order of first receipt against the publish order (stream sequence).
    let mut reorderings = 0;
    let mut reordered_examples = Vec::new();
    let mut newest: Option<(u64, u64)> = None; // (seq, event)
    let mut seen = BTreeSet::new();
    for f in &firsts {
        let Some(d) = f.data.and_then(|d| u64::try_from(d).ok()) else {
            continue;
        };
        if !seen.insert(d) {
            continue;
        }
        let Some(accepted) = published.acked.get(&d) else {
            continue;
        };
        match newest {
            Some((seq, after)) if accepted.seq < seq => {
                reorderings += 1;
                if reordered_examples.len() < 10 {
                    reordered_examples.push((d, after));
                }
            }
            _ => newest = Some((accepted.seq, d)),
        }
    }
    let requests = rx.request_count(path);
    Outcome {
        path: path.to_owned(),
        ordered,
        expected: published.acked.len(),
        lost,
        duplicates: rx.duplicate_count(path),
        beyond_first: requests.saturating_sub(firsts.len()),
        ids_per_event_violations: ids
            .iter()
            .filter(|(_, set)| set.len() > 1)
            .map(|(d, _)| *d)
            .collect(),
        reorderings,
        reordered_examples,
        max_in_flight: rx.max_in_flight(path),
        longest_delay: delays.last().copied().unwrap_or_default(),
        p99_delay,
        requests,
    }
}

/// Polls until every accepted event reached every one of `paths`, or `timeout`.
/// Returns whether they all did (the caller reports, then asserts).
pub async fn await_delivery(
    published: &Published,
    rx: &Receiver,
    paths: &[&str],
    timeout: Duration,
) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        let done = paths.iter().all(|path| {
            rx.distinct_count(path) >= published.acked.len()
                && account_lost_only(published, rx, path) == 0
        });
        if done {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn account_lost_only(published: &Published, rx: &Receiver, path: &str) -> usize {
    let got: BTreeSet<u64> = rx
        .first_receipts(path)
        .iter()
        .filter_map(|f| f.data.and_then(|d| u64::try_from(d).ok()))
        .collect();
    published.acked.keys().filter(|n| !got.contains(n)).count()
}

/// Events of `path` that were answered with a failure and have had no success since:
/// retries pending right now.
pub fn pending_retries(rx: &Receiver, path: &str) -> usize {
    use crate::receiver::{Answer, Fault};
    let mut state: HashMap<String, bool> = HashMap::new(); // webhook-id -> failed last
    for e in rx.exchanges(path) {
        let failed = match e.answer {
            Answer::Status(s) => !(200..300).contains(&s),
            Answer::Fault(f) => f != Fault::SlowBody,
        };
        let entry = state.entry(e.webhook_id).or_insert(failed);
        // Once succeeded, an event is done even if a duplicate fails later.
        *entry = *entry && failed;
    }
    state.values().filter(|failed| **failed).count()
}

// ---------------------------------------------------------------------------------------
// Evidence
// ---------------------------------------------------------------------------------------

/// What the streams and the attempt log say about some lost events of one endpoint: the
/// event in `HERALD_EVENTS` (and its `webhook-id`), its messages in the endpoint's lanes,
/// a pending retry schedule, its attempt records. At most `max` events.
pub async fn explain_lost(
    js: &jetstream::Context,
    namespace: &str,
    name: &str,
    shard: u32,
    published: &Published,
    lost: &[u64],
    max: usize,
) -> String {
    let mut out = String::new();
    let key = EndpointKey::new(namespace, name);
    let Ok(events) = js.get_stream(EVENTS_STREAM).await else {
        return "HERALD_EVENTS unreadable".into();
    };
    let Ok(deliveries) = js.get_stream(DELIVERIES_STREAM).await else {
        return "HERALD_DELIVERIES unreadable".into();
    };
    // The lanes' messages by event id (bounded scan).
    let mut in_lanes: HashMap<String, Vec<String>> = HashMap::new();
    for lane in [Lane::New, Lane::Retry] {
        let subject = key.lane_subject(shard, lane);
        let mut seq = 1;
        for _ in 0..50_000 {
            let Ok(message) = deliveries
                .direct_get_next_for_subject(subject.as_str(), Some(seq))
                .await
            else {
                break;
            };
            seq = message.sequence + 1;
            if let Some(id) = message.headers.get(EVENT_ID_HEADER) {
                in_lanes
                    .entry(id.as_str().to_owned())
                    .or_default()
                    .push(format!("{}@{}", lane.token(), message.sequence));
            }
        }
    }
    let records = crate::dataplane::read_all(
        js,
        herald_core::dataplane::ATTEMPTS_STREAM,
        &key.attempts_subject(),
    )
    .await;
    let records: Vec<serde_json::Value> = records
        .iter()
        .flat_map(|payload| {
            payload
                .split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
                .filter_map(|l| serde_json::from_slice(l).ok())
                .collect::<Vec<_>>()
        })
        .collect();
    for n in lost.iter().take(max) {
        let Some(accepted) = published.acked.get(n) else {
            continue;
        };
        let stored = events.get_raw_message(accepted.seq).await;
        let id = match &stored {
            Ok(message) => {
                let ms = (message.time.unix_timestamp_nanos() / 1_000_000).max(0) as u64;
                event_id(ms, accepted.seq)
            }
            Err(error) => {
                let _ = writeln!(
                    out,
                    "event {n} (seq {}): not readable from HERALD_EVENTS: {error}",
                    accepted.seq
                );
                continue;
            }
        };
        let schedule = deliveries
            .direct_get_last_for_subject(key.schedule_subject(shard, &id))
            .await
            .map(|m| format!("schedule pending at seq {}", m.sequence))
            .unwrap_or_else(|_| "no schedule".into());
        let attempts: Vec<String> = records
            .iter()
            .filter(|r| r["eventId"] == id.as_str())
            .map(|r| {
                format!(
                    "#{} {} {}{}",
                    r["attempt"],
                    r["outcome"].as_str().unwrap_or("?"),
                    r["state"].as_str().unwrap_or("?"),
                    r.get("deadReason")
                        .map(|d| format!(" ({d})"))
                        .unwrap_or_default()
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "event {n} (seq {}, {id}): lanes {:?}; {schedule}; attempts {:?}",
            accepted.seq,
            in_lanes.get(&id).cloned().unwrap_or_default(),
            attempts,
        );
    }
    if let Ok(info) = deliveries.get_info().await {
        let _ = writeln!(
            out,
            "HERALD_DELIVERIES: {} messages, seq {}..={}",
            info.state.messages, info.state.first_sequence, info.state.last_sequence
        );
    }
    let fanout = events
        .get_consumer::<jetstream::consumer::pull::Config>("herald-fanout")
        .await;
    if let Ok(mut consumer) = fanout
        && let Ok(info) = consumer.info().await
    {
        let _ = writeln!(
            out,
            "herald-fanout: ack floor {}, delivered {}, pending {}, ack pending {}, redelivered {}",
            info.ack_floor.stream_sequence,
            info.delivered.stream_sequence,
            info.num_pending,
            info.num_ack_pending,
            info.num_redelivered
        );
    }
    out
}

/// Watches the lane publishes of some endpoints with a plain NATS subscription (it sees
/// every publish, also the ones JetStream drops as duplicates), so a misordering can be
/// placed: in fan-out (the lane already holds it) or in the shard (it does not).
#[derive(Clone, Default)]
pub struct LaneTap {
    /// endpoint name -> event numbers in order of their first lane publish.
    firsts: Arc<std::sync::Mutex<HashMap<String, FirstPublishes>>>,
}

/// The events seen on one lane, and the order of their first publish.
type FirstPublishes = (BTreeSet<u64>, Vec<u64>);

impl LaneTap {
    /// Taps the fresh lanes of `names` in `namespace` until the client is gone.
    pub async fn start(nats: &async_nats::Client, namespace: &str, names: &[&str]) -> Self {
        use futures::StreamExt;
        let tap = Self::default();
        for name in names {
            let key = EndpointKey::new(namespace, name);
            // herald.q.<shard>.<ns>.<name>.new, any shard.
            let subject = format!("{LANE_PREFIX}.*.{key}.{}", Lane::New.token());
            let mut sub = nats.subscribe(subject).await.expect("lane tap");
            let firsts = tap.firsts.clone();
            let name = (*name).to_owned();
            tokio::spawn(async move {
                while let Some(message) = sub.next().await {
                    let Some(data) = serde_json::from_slice::<serde_json::Value>(&message.payload)
                        .ok()
                        .and_then(|v| v.get("data").and_then(serde_json::Value::as_u64))
                    else {
                        continue;
                    };
                    let mut firsts = firsts.lock().unwrap();
                    let (seen, order) = firsts.entry(name.clone()).or_default();
                    if seen.insert(data) {
                        order.push(data);
                    }
                }
            });
        }
        tap
    }

    /// Event numbers of `name` in the order of their first lane publish.
    pub fn order(&self, name: &str) -> Vec<u64> {
        self.firsts
            .lock()
            .unwrap()
            .get(name)
            .map(|(_, o)| o.clone())
            .unwrap_or_default()
    }
}

/// Events of `order` that come after a later-published one (by stream sequence in
/// `published`), compressed into ranges of event numbers.
pub fn misordered_ranges(published: &Published, order: &[u64]) -> Vec<(u64, u64)> {
    let mut late = Vec::new();
    let mut newest = 0;
    for n in order {
        let Some(a) = published.acked.get(n) else {
            continue;
        };
        if a.seq < newest {
            late.push(*n);
        } else {
            newest = a.seq;
        }
    }
    late.sort_unstable();
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for n in late {
        match ranges.last_mut() {
            Some((_, end)) if *end + 1 == n => *end = n,
            _ => ranges.push((n, n)),
        }
    }
    ranges
}

/// Writes `path`'s first receipts as CSV (`arrival,event,seq,acked_ms,first_ms,delay_ms`,
/// times relative to `zero`) to the temp dir, for a failure's evidence. Returns the file.
pub fn dump_receipts(
    label: &str,
    published: &Published,
    rx: &Receiver,
    path: &str,
    zero: Instant,
) -> PathBuf {
    let file = std::env::temp_dir().join(format!("herald-fault-{label}-{path}.receipts.csv"));
    let mut text = String::from("arrival,event,seq,acked_ms,first_ms,delay_ms\n");
    for (i, f) in rx.first_receipts(path).iter().enumerate() {
        let n = f.data.and_then(|d| u64::try_from(d).ok());
        let accepted = n.and_then(|n| published.acked.get(&n));
        let ms = |at: Instant| at.saturating_duration_since(zero).as_millis();
        let _ = writeln!(
            text,
            "{i},{},{},{},{},{}",
            n.map_or_else(String::new, |n| n.to_string()),
            accepted.map_or_else(String::new, |a| a.seq.to_string()),
            accepted.map_or_else(String::new, |a| ms(a.at).to_string()),
            ms(f.at),
            accepted.map_or_else(String::new, |a| f
                .at
                .saturating_duration_since(a.at)
                .as_millis()
                .to_string()),
        );
    }
    let _ = std::fs::write(&file, text);
    file
}

/// The server name (`n0`, `n1`, ...) that leads `stream`, if it has a leader.
pub async fn stream_leader(js: &jetstream::Context, stream: &str) -> Option<String> {
    js.get_stream(stream)
        .await
        .ok()?
        .get_info()
        .await
        .ok()?
        .cluster?
        .leader
}

/// Shard -> replica id of its lease holder, from `herald-shards`.
pub async fn shard_owners(js: &jetstream::Context) -> BTreeMap<u32, String> {
    shard_leases(js)
        .await
        .into_iter()
        .map(|(shard, (owner, _))| (shard, owner))
        .collect()
}

/// Shard -> (replica id of its lease holder, the lease's revision). A lease that is
/// renewed or taken again gets a new revision; one of a dead holder keeps its revision
/// until it expires.
pub async fn shard_leases(js: &jetstream::Context) -> BTreeMap<u32, (String, u64)> {
    let mut owners = BTreeMap::new();
    let Ok(kv) = js.get_key_value(SHARDS_BUCKET).await else {
        return owners;
    };
    for shard in 0..crate::dataplane::TEST_SHARDS {
        if let Ok(Some(entry)) = kv.entry(format!("shard.{shard}")).await
            && entry.operation == jetstream::kv::Operation::Put
        {
            owners.insert(
                shard,
                (
                    String::from_utf8_lossy(&entry.value).into_owned(),
                    entry.revision,
                ),
            );
        }
    }
    owners
}

// ---------------------------------------------------------------------------------------
// Watching the buckets
// ---------------------------------------------------------------------------------------

/// One change of a KV key, as a watch saw it.
#[derive(Debug, Clone)]
pub struct KvChange {
    /// When this process saw it.
    pub at: Instant,
    pub key: String,
    pub revision: u64,
    /// The value (JSON) of a put; `None` for a delete or purge.
    pub value: Option<serde_json::Value>,
}

/// Every change of the keys of a KV bucket that match a filter (e.g. `ep.<ns>.>`), from
/// their values when the watch started on, with the moment this process saw each one:
/// when a configuration was held, paused or withdrawn, or when a dispatcher reported a
/// state, and evidence of what the control plane wrote during a fault.
#[derive(Clone, Default)]
pub struct KvLog {
    changes: Arc<std::sync::Mutex<Vec<KvChange>>>,
}

impl KvLog {
    /// Watches `filter` in `store` until the runtime ends; returns once the watch runs.
    pub async fn start(store: &jetstream::kv::Store, filter: &str) -> Self {
        use futures::StreamExt;
        let log = Self::default();
        let mut watch = store
            .watch_with_history(filter)
            .await
            .expect("watching a KV bucket");
        let changes = log.changes.clone();
        tokio::spawn(async move {
            while let Some(entry) = watch.next().await {
                let Ok(entry) = entry else {
                    continue;
                };
                let value = (entry.operation == jetstream::kv::Operation::Put).then(|| {
                    serde_json::from_slice(&entry.value).unwrap_or(serde_json::Value::Null)
                });
                changes.lock().unwrap().push(KvChange {
                    at: Instant::now(),
                    key: entry.key,
                    revision: entry.revision,
                    value,
                });
            }
        });
        log
    }

    /// Every change seen so far, in order.
    pub fn changes(&self) -> Vec<KvChange> {
        self.changes.lock().unwrap().clone()
    }

    /// The changes of `key`, in order.
    pub fn of(&self, key: &str) -> Vec<KvChange> {
        self.changes
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.key == key)
            .cloned()
            .collect()
    }

    /// The first change of `key` seen at or after `since` that satisfies `check` (given
    /// the value, `None` when deleted).
    pub fn first_since(
        &self,
        key: &str,
        since: Instant,
        check: impl Fn(Option<&serde_json::Value>) -> bool,
    ) -> Option<KvChange> {
        self.changes
            .lock()
            .unwrap()
            .iter()
            .find(|c| c.key == key && c.at >= since && check(c.value.as_ref()))
            .cloned()
    }

    /// The changes of `key` rendered one per line, times relative to `zero`, values cut
    /// to `width` characters: evidence for a report.
    pub fn render(&self, key: &str, zero: Instant, width: usize) -> String {
        let mut out = String::new();
        for c in self.of(key) {
            let value = c.value.map_or_else(
                || "DELETED".to_owned(),
                |v| v.to_string().chars().take(width).collect(),
            );
            let _ = writeln!(
                out,
                "  +{:.2}s rev {} {value}",
                c.at.saturating_duration_since(zero).as_secs_f64(),
                c.revision
            );
        }
        out
    }
}

// ---------------------------------------------------------------------------------------
// The report
// ---------------------------------------------------------------------------------------

/// One scenario's numbers: a row of the table in `docs/reliability.md`.
#[derive(Debug, Clone, Default)]
pub struct Row {
    pub fault: String,
    pub events: usize,
    pub endpoints: usize,
    pub injected: String,
    pub lost: usize,
    pub duplicates: usize,
    /// The most requests in flight at once on the ordered endpoint(s).
    pub max_in_flight_ordered: usize,
    pub reorderings: usize,
    pub longest_delay: Duration,
    pub notes: String,
}

/// The table header, written before the first row of a new report file.
pub const REPORT_HEADER: &str = "| fault | events | endpoints | faults injected | lost | duplicates | max in flight (ordered) | reorderings (ordered) | longest delay | notes |\n|---|---|---|---|---|---|---|---|---|---|\n";

impl Row {
    /// The row from the outcomes of a scenario's endpoints.
    pub fn from_outcomes(fault: &str, events: usize, injected: &str, outcomes: &[Outcome]) -> Self {
        Self {
            fault: fault.to_owned(),
            events,
            endpoints: outcomes.len(),
            injected: injected.to_owned(),
            lost: outcomes.iter().map(|o| o.lost.len()).sum(),
            duplicates: outcomes.iter().map(|o| o.duplicates).sum(),
            max_in_flight_ordered: outcomes
                .iter()
                .filter(|o| o.ordered)
                .map(|o| o.max_in_flight)
                .max()
                .unwrap_or(0),
            reorderings: outcomes
                .iter()
                .filter(|o| o.ordered)
                .map(|o| o.reorderings)
                .sum(),
            longest_delay: outcomes
                .iter()
                .map(|o| o.longest_delay)
                .max()
                .unwrap_or_default(),
            notes: String::new(),
        }
    }

    pub fn markdown(&self) -> String {
        format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.2} s | {} |",
            self.fault,
            self.events,
            self.endpoints,
            self.injected,
            self.lost,
            self.duplicates,
            self.max_in_flight_ordered,
            self.reorderings,
            self.longest_delay.as_secs_f64(),
            self.notes.replace('|', "/"),
        )
    }

    /// Prints the row and appends it to the report ([`report_path`]).
    pub fn record(&self) {
        let row = self.markdown();
        println!("{REPORT_HEADER}{row}");
        let path = report_path();
        let new = std::fs::metadata(&path).map_or(true, |m| m.len() == 0);
        match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
        {
            Ok(mut file) => {
                if new {
                    let _ = file.write_all(REPORT_HEADER.as_bytes());
                }
                let _ = writeln!(file, "{row}");
            }
            Err(error) => eprintln!("cannot append to {}: {error}", path.display()),
        }
    }
}

/// `$HERALD_FAULT_REPORT`, else `$TMPDIR/herald-fault-report.md`.
pub fn report_path() -> PathBuf {
    std::env::var_os("HERALD_FAULT_REPORT")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("herald-fault-report.md"))
}
