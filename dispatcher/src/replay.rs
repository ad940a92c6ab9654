//! Carrying out `WebhookReplay`s (docs/architecture.md, "Replay"): the owner of an
//! endpoint's shard reads the replay's range of the event store and reports its
//! progress under `replay.<ns>.<name>` in the health bucket, where the operator turns
//! it into the resource's status and a new owner of the shard resumes from its cursor.
//!
//! Built so far: dry runs — the events in the range that the endpoint and the replay's
//! types select (with `onlyFailed`, only those whose newest attempt record for the
//! endpoint says retrying or dead) are counted (`matched`), nothing is sent. Other
//! requests are left alone (their status says so) until re-enqueueing is built.
//! A deleted request stops its worker at once, and its progress is deleted with it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use async_nats::jetstream::kv;
use futures::StreamExt;
use herald_core::dataplane::{
    ATTEMPTS_STREAM, AttemptRecord, BucketKey, DeliveryState, EVENTS_PREFIX, EndpointKey,
    ReplayProgress, ReplayRequest, event_id, parse_event_subject,
};
use herald_core::pattern::Pattern;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::index::Endpoint;
use crate::shard::Shared;

/// How often a running replay's progress is written (and at the end).
const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);
/// How long a worker waits for its endpoint's configuration before looking again.
const CONFIG_WAIT: Duration = Duration::from_secs(1);

/// Pure: whether an event of `event_type` published at `published_ms` is one the replay
/// selects: in its range, taken by the endpoint, and of one of its types (if any).
pub fn selects(
    request: &ReplayRequest,
    endpoint: &Endpoint,
    types: &[Pattern],
    event_type: &str,
    published_ms: u64,
) -> bool {
    (request.from_ms..request.to_ms).contains(&published_ms)
        && endpoint.matches(event_type)
        && (types.is_empty() || types.iter().any(|p| p.matches(event_type)))
}

/// Pure: the events whose newest attempt record (in log order) says the delivery failed
/// — retrying or dead — for `onlyFailed`.
pub fn failed_events(records: impl IntoIterator<Item = AttemptRecord>) -> HashSet<Arc<str>> {
    let mut newest = HashMap::new();
    for record in records {
        newest.insert(record.event_id, record.state);
    }
    newest
        .into_iter()
        .filter(|(_, state)| matches!(state, DeliveryState::Retrying | DeliveryState::Dead))
        .map(|(id, _)| id)
        .collect()
}

/// Follows the replay requests in `herald-config` and carries out those of endpoints on
/// `shard` until `stop`.
pub async fn run(shared: Shared, shard: u32, mut stop: watch::Receiver<bool>) {
    // One entry per request seen (replays are few and deleted by their owners); the task
    // says whether the replay was this shard's.
    let mut workers: HashMap<String, (String, JoinHandle<bool>)> = HashMap::new();
    let watch = async {
        loop {
            let mut entries = match shared.layout.config.watch_with_history("replay.>").await {
                Ok(entries) => entries,
                Err(error) => {
                    tracing::warn!(shard, %error, "watching replay requests");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            while let Some(entry) = entries.next().await {
                let Ok(entry) = entry else { break };
                if entry.operation != kv::Operation::Put {
                    if let Some((_, task)) = workers.remove(&entry.key) {
                        withdraw(&shared, shard, &entry.key, task).await;
                    }
                    continue;
                }
                let Ok(request) = serde_json::from_slice::<ReplayRequest>(&entry.value) else {
                    tracing::warn!(replay = entry.key, "ignoring a malformed replay request");
                    continue;
                };
                if !request.carried_out()
                    || workers
                        .get(&entry.key)
                        .is_some_and(|(uid, _)| *uid == request.uid)
                {
                    continue;
                }
                let uid = request.uid.clone();
                let task = tokio::spawn(work(shared.clone(), shard, entry.key.clone(), request));
                if let Some((_, old)) = workers.insert(entry.key, (uid, task)) {
                    old.abort();
                }
            }
        }
    };
    tokio::select! {
        () = watch => {}
        _ = stop.wait_for(|stop| *stop) => {}
    }
    for (_, (_, task)) in workers {
        task.abort();
    }
}

/// The replay's request is gone: stop its worker and, if the replay was this shard's
/// (or might have been), delete its progress.
async fn withdraw(shared: &Shared, shard: u32, key: &str, task: JoinHandle<bool>) {
    let ours = if task.is_finished() {
        task.await.unwrap_or(true)
    } else {
        task.abort();
        true
    };
    if !ours {
        return;
    }
    tracing::info!(shard, replay = key, "replay withdrawn; stopped");
    if let Err(error) = shared.layout.health.delete(key).await {
        tracing::warn!(replay = key, %error, "deleting a withdrawn replay's progress");
    }
}

/// One replay, from where its progress says to the end of its range. Returns whether it
/// was this shard's.
async fn work(shared: Shared, shard: u32, key: String, request: ReplayRequest) -> bool {
    let endpoint_key = EndpointKey::new(&request.namespace, &request.endpoint);
    let endpoint = loop {
        match shared.index.endpoint(&endpoint_key) {
            Some(ep) if ep.config.shard != shard => return false,
            Some(ep) => break ep,
            None => tokio::time::sleep(CONFIG_WAIT).await,
        }
    };
    let types: Vec<Pattern> = request
        .event_types
        .iter()
        .filter_map(|t| t.parse().ok())
        .collect();
    loop {
        match scan(&shared, &key, &request, &endpoint, &types).await {
            Ok(()) => return true,
            Err(error) => {
                tracing::warn!(replay = key, %error, "replay interrupted; resuming");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

async fn read_progress(health: &kv::Store, key: &str, uid: &str) -> ReplayProgress {
    let saved = health.get(key).await.ok().flatten();
    saved
        .and_then(|v| serde_json::from_slice::<ReplayProgress>(&v).ok())
        .filter(|p| p.uid == uid)
        .unwrap_or_else(|| ReplayProgress {
            uid: uid.to_owned(),
            ..Default::default()
        })
}

async fn write_progress(
    health: &kv::Store,
    key: &str,
    progress: &ReplayProgress,
) -> Result<(), async_nats::Error> {
    let value = serde_json::to_vec(progress)?;
    health.put(key, value.into()).await?;
    Ok(())
}

/// Where to start reading: after the cursor, or at `from` by publish time.
fn start(request: &ReplayRequest, progress: &ReplayProgress) -> DeliverPolicy {
    if progress.cursor > 0 {
        return DeliverPolicy::ByStartSequence {
            start_sequence: progress.cursor + 1,
        };
    }
    by_start_time(request.from_ms)
}

fn by_start_time(ms: u64) -> DeliverPolicy {
    let from = jiff::Timestamp::from_millisecond(ms as i64).unwrap_or_default();
    // async-nats takes a `time` value; its serde form is RFC 3339, which jiff prints.
    serde_json::from_value(serde_json::json!({
        "deliver_policy": "by_start_time",
        "opt_start_time": from.to_string(),
    }))
    .unwrap_or(DeliverPolicy::All)
}

/// The events of the range whose delivery to the endpoint failed, from its attempt log
/// (attempts of events published at or after `from` are all logged after it).
async fn failed_in_log(
    shared: &Shared,
    request: &ReplayRequest,
) -> Result<HashSet<Arc<str>>, async_nats::Error> {
    let key = EndpointKey::new(&request.namespace, &request.endpoint);
    let stream = shared.layout.js.get_stream(ATTEMPTS_STREAM).await?;
    let mut consumer = stream
        .create_consumer(pull::OrderedConfig {
            filter_subject: key.attempts_subject(),
            deliver_policy: by_start_time(request.from_ms),
            ..Default::default()
        })
        .await?;
    let mut remaining = consumer.info().await?.num_pending;
    let mut messages = consumer.messages().await?;
    let mut records = Vec::new();
    while remaining > 0 {
        let Some(message) = messages.next().await else {
            break;
        };
        let message = message?;
        remaining = message.info()?.pending;
        // A message is a batch of records, one JSON document a line.
        records.extend(
            message
                .payload
                .split(|b| *b == b'\n')
                .filter_map(|line| serde_json::from_slice::<AttemptRecord>(line).ok()),
        );
    }
    Ok(failed_events(records))
}

async fn scan(
    shared: &Shared,
    key: &str,
    request: &ReplayRequest,
    endpoint: &Endpoint,
    types: &[Pattern],
) -> Result<(), async_nats::Error> {
    let health = &shared.layout.health;
    debug_assert!(BucketKey::parse(key).is_some());
    let mut progress = read_progress(health, key, &request.uid).await;
    if progress.done {
        return Ok(());
    }
    let failed = if request.only_failed {
        Some(failed_in_log(shared, request).await?)
    } else {
        None
    };
    let mut consumer = shared
        .layout
        .events
        .create_consumer(pull::OrderedConfig {
            filter_subject: format!("{EVENTS_PREFIX}.{}.>", request.namespace),
            deliver_policy: start(request, &progress),
            ..Default::default()
        })
        .await?;
    let mut remaining = consumer.info().await?.num_pending;
    let mut messages = consumer.messages().await?;
    let mut last_write = tokio::time::Instant::now();
    while remaining > 0 {
        let Some(message) = messages.next().await else {
            break;
        };
        let message = message?;
        let info = message.info()?;
        remaining = info.pending;
        let published_ms = (info.published.unix_timestamp_nanos() / 1_000_000).max(0) as u64;
        if published_ms >= request.to_ms {
            break;
        }
        let event_type = parse_event_subject(message.subject.as_str()).map(|(_, ty)| ty);
        let failed_here = || {
            failed.as_ref().is_none_or(|failed| {
                failed.contains(event_id(published_ms, info.stream_sequence).as_str())
            })
        };
        if event_type.is_some_and(|ty| selects(request, endpoint, types, ty, published_ms))
            && failed_here()
        {
            progress.matched += 1;
        }
        progress.cursor = info.stream_sequence;
        if last_write.elapsed() >= PROGRESS_INTERVAL {
            write_progress(health, key, &progress).await?;
            last_write = tokio::time::Instant::now();
        }
    }
    progress.done = true;
    write_progress(health, key, &progress).await?;
    tracing::info!(replay = key, matched = progress.matched, "replay done");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_core::dataplane::EndpointConfig;

    fn request(types: &[&str]) -> ReplayRequest {
        ReplayRequest {
            namespace: "shop".into(),
            name: "again".into(),
            uid: "u".into(),
            endpoint: "orders".into(),
            from_ms: 1_000,
            to_ms: 2_000,
            event_types: types.iter().map(|t| (*t).to_owned()).collect(),
            only_failed: false,
            dry_run: true,
        }
    }

    fn endpoint(types: &[&str]) -> Endpoint {
        let config: EndpointConfig = serde_json::from_value(serde_json::json!({
            "namespace": "shop", "name": "orders", "uid": "e", "generation": 1,
            "url": "https://example.com/hook", "eventTypes": types, "secret": "keys",
            "shard": 0, "delivery": {},
        }))
        .unwrap();
        Endpoint::compile_for_test(config)
    }

    #[test]
    fn a_replay_selects_the_endpoints_types_its_own_and_its_range() {
        let ep = endpoint(&["order.*", "invoice.paid"]);
        let all = request(&[]);
        let orders: Vec<Pattern> = vec!["order.created".parse().unwrap()];
        let cases = [
            (&all, &[][..], "order.created", 1_000, true),
            (&all, &[][..], "invoice.paid", 1_999, true),
            (&all, &[][..], "user.created", 1_500, false),
            (&all, &[][..], "order.created", 999, false),
            (&all, &[][..], "order.created", 2_000, false),
            (&all, &orders[..], "order.created", 1_500, true),
            (&all, &orders[..], "order.deleted", 1_500, false),
            (&all, &orders[..], "invoice.paid", 1_500, false),
        ];
        for (request, types, ty, at, want) in cases {
            assert_eq!(selects(request, &ep, types, ty, at), want, "{ty} at {at}");
        }
    }

    #[test]
    fn only_dry_runs_are_carried_out_so_far() {
        let mut r = request(&[]);
        assert!(r.carried_out());
        r.only_failed = true;
        assert!(r.carried_out());
        r.dry_run = false;
        assert!(!r.carried_out());
    }

    #[test]
    fn a_replay_starts_at_from_by_time_or_resumes_after_its_cursor() {
        let r = request(&[]);
        let mut progress = ReplayProgress::default();
        let DeliverPolicy::ByStartTime { start_time } = start(&r, &progress) else {
            panic!("by start time, not from the stream's beginning");
        };
        assert_eq!(start_time.unix_timestamp_nanos(), 1_000 * 1_000_000);
        progress.cursor = 41;
        assert_eq!(
            start(&r, &progress),
            DeliverPolicy::ByStartSequence { start_sequence: 42 }
        );
    }

    #[test]
    fn failed_means_the_newest_record_says_retrying_or_dead() {
        let record = |id: &str, state: DeliveryState| -> AttemptRecord {
            serde_json::from_value(serde_json::json!({
                "eventId": id, "attempt": 1, "timeMs": 1,
                "outcome": herald_core::dataplane::AttemptOutcome::Success,
                "latencyMs": 1, "state": state,
            }))
            .unwrap()
        };
        let failed = failed_events([
            record("a", DeliveryState::Retrying),
            record("a", DeliveryState::Succeeded),
            record("b", DeliveryState::Retrying),
            record("c", DeliveryState::Retrying),
            record("c", DeliveryState::Dead),
            record("d", DeliveryState::Succeeded),
        ]);
        let mut ids: Vec<&str> = failed.iter().map(|id| &**id).collect();
        ids.sort_unstable();
        assert_eq!(ids, ["b", "c"]);
    }
}
