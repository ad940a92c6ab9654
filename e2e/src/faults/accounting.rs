//! What each endpoint's receiver got against what was accepted: lost, duplicates,
//! reorderings, delays, and evidence about lost events.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use herald_core::dataplane::{
    DELIVERIES_STREAM, EVENTS_STREAM, EndpointKey, Lane, LaneMessage, attempt_log, event_id,
};

use super::Published;
use crate::receiver::Receiver;

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
            if let Ok(queued) = LaneMessage::decode(Some(&message.headers)) {
                in_lanes
                    .entry(queued.event_id.to_owned())
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
            attempt_log::decode_as(payload)
                .filter_map(Result::ok)
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
            let subject = key.lane_filter(Lane::New);
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
