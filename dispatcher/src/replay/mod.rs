//! Carrying out `WebhookReplay`s (docs/architecture.md, "Replay"): the owner of an
//! endpoint's shard reads the replay's range of the event store, queues the events the
//! replay selects on the endpoint's retry lane again ([`scan`]), follows their attempts
//! in the endpoint's attempt log until each reached a final state ([`tally`]), and
//! reports its progress under `replay.<ns>.<name>` in the health bucket — the only
//! writer of that key — where the operator turns it into the resource's status and a
//! new owner of the shard resumes from its cursor.
//!
//! A dry run only counts. A deleted request stops its worker at once, its progress is
//! deleted with it, and the shards skip its items not attempted yet ([`Live`]).

use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::kv;
use futures::StreamExt;
use herald_core::dataplane::{
    BucketKey, DeliveryState, EndpointKey, Newest, ReplayProgress, ReplayRequest, shard_for,
};
use herald_core::pattern::Pattern;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::context::Shared;
use crate::index::Endpoint;
use crate::silence::Silence;
use crate::supervise::Owned;

pub mod live;
mod scan;
mod tally;

pub use live::Live;

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

/// The states of a delivery `onlyFailed` replays: its newest record says retrying or
/// dead.
pub const FAILED: [DeliveryState; 2] = [DeliveryState::Retrying, DeliveryState::Dead];

/// Pure: whether `event_id`'s newest attempt record says its delivery failed, for
/// `onlyFailed`.
pub fn failed(newest: &Newest, event_id: &str) -> bool {
    newest
        .state(event_id)
        .is_some_and(|state| FAILED.contains(&state))
}

/// How often the replay requests' watch looks for having fallen silent ([`Silence`]).
const REPLAY_PROBE: Duration = Duration::from_secs(1);

/// Follows the replay requests in `herald-config` and carries out those of endpoints on
/// `shard` until `stop`.
pub async fn run(shared: Shared, shard: u32, mut stop: watch::Receiver<bool>) {
    // One entry per request seen (replays are few and deleted by their owners); the task
    // says whether the replay was this shard's.
    // Dropped with this task however it ends (aborted with its shard too): each worker
    // is aborted then, and never outlives the replay's deletion to write its progress
    // back.
    let mut workers: HashMap<String, (String, Owned<bool>)> = HashMap::new();
    let live = shared.replays.clone();
    let watch = async {
        let config = &shared.layout.config;
        let filter = &BucketKey::replay_filter();
        // The newest revision delivered: a watch that falls silent (its consumer's node
        // lost) is started again from the next one.
        let mut seen = 0;
        loop {
            let watched = if seen == 0 {
                config.watch_with_history(filter).await
            } else {
                config.watch_from_revision(filter, seen + 1).await
            };
            let mut entries = match watched {
                Ok(entries) => entries,
                Err(error) => {
                    tracing::warn!(shard, %error, "watching replay requests");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            // Every second, not every half (as the configuration watch): one such watch
            // runs per shard, and a replay starting a second later harms nobody.
            let mut probe = tokio::time::interval(REPLAY_PROBE);
            probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut silence = Silence::default();
            loop {
                let entry = tokio::select! {
                    entry = entries.next() => entry,
                    _ = probe.tick() => {
                        if let Some(stored) = silence.check(config, filter, seen).await {
                            tracing::warn!(
                                shard,
                                seen,
                                stored,
                                "the replay requests' watch fell silent; watching again from where it stopped"
                            );
                            break;
                        }
                        continue;
                    }
                };
                let Some(Ok(entry)) = entry else { break };
                seen = entry.revision;
                if entry.operation != kv::Operation::Put {
                    live.delete(&entry.key);
                    if entry.delta == 0 {
                        live.mark_loaded();
                    }
                    if let Some((_, task)) = workers.remove(&entry.key) {
                        withdraw(&shared, shard, &entry.key, task.release()).await;
                    }
                    continue;
                }
                let request = serde_json::from_slice::<ReplayRequest>(&entry.value);
                if let Ok(request) = &request {
                    live.put(&entry.key, &request.uid);
                }
                if entry.delta == 0 {
                    live.mark_loaded();
                }
                let Ok(request) = request else {
                    tracing::warn!(replay = entry.key, "ignoring a malformed replay request");
                    continue;
                };
                if workers
                    .get(&entry.key)
                    .is_some_and(|(uid, _)| *uid == request.uid)
                {
                    continue;
                }
                let uid = request.uid.clone();
                let task = tokio::spawn(work(shared.clone(), shard, entry.key.clone(), request));
                // A request replaced (a new uid): the old worker is aborted as it drops.
                workers.insert(entry.key, (uid, Owned::new(task)));
            }
        }
    };
    tokio::select! {
        () = watch => {}
        _ = stop.wait_for(|stop| *stop) => {}
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

/// One replay, from where its progress says to the end. Returns whether it was this
/// shard's.
async fn work(shared: Shared, shard: u32, key: String, request: ReplayRequest) -> bool {
    // The shard is the endpoint's name's (the index holds only this replica's).
    if shard_for(
        &request.namespace,
        &request.endpoint,
        shared.settings.shards,
    ) != shard
    {
        return false;
    }
    let endpoint_key = EndpointKey::new(&request.namespace, &request.endpoint);
    let endpoint = loop {
        match shared.index.endpoint(&endpoint_key) {
            Some(ep) => break ep,
            None => tokio::time::sleep(CONFIG_WAIT).await,
        }
    };
    let types: Vec<Pattern> = request
        .event_types
        .iter()
        .filter_map(|t| t.parse().ok())
        .collect();
    let replay = Replay {
        shared: &shared,
        key: &key,
        request: &request,
        endpoint: &endpoint,
        types: &types,
    };
    loop {
        match replay.carry_out().await {
            Ok(()) => return true,
            Err(error) => {
                tracing::warn!(replay = key, %error, "replay interrupted; resuming");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// One replay being carried out.
struct Replay<'a> {
    shared: &'a Shared,
    key: &'a str,
    request: &'a ReplayRequest,
    endpoint: &'a Endpoint,
    types: &'a [Pattern],
}

impl Replay<'_> {
    async fn carry_out(&self) -> Result<(), async_nats::Error> {
        debug_assert!(BucketKey::parse(self.key).is_some());
        let mut progress = self.read_progress().await?;
        if !progress.done {
            self.scan(&mut progress).await?;
        }
        if !progress.finished(self.request.dry_run) {
            self.tally(&mut progress).await?;
        }
        tracing::info!(
            replay = self.key,
            matched = progress.matched,
            delivered = progress.delivered,
            failed = progress.failed,
            "replay finished"
        );
        Ok(())
    }

    /// The progress saved for this replay, or a fresh one when there is none (or it is
    /// another replay's of the same name). A read that fails is an error, not "no
    /// progress": starting over would send everything up to the cursor again.
    async fn read_progress(&self) -> Result<ReplayProgress, async_nats::Error> {
        let uid = &self.request.uid;
        let saved = self.shared.layout.health.get(self.key).await?;
        Ok(saved
            .and_then(|v| serde_json::from_slice::<ReplayProgress>(&v).ok())
            .filter(|p| p.uid == *uid)
            .unwrap_or_else(|| ReplayProgress {
                uid: uid.clone(),
                ..Default::default()
            }))
    }

    async fn write_progress(&self, progress: &ReplayProgress) -> Result<(), async_nats::Error> {
        let value = serde_json::to_vec(progress)?;
        self.shared
            .layout
            .health
            .put(self.key, value.into())
            .await?;
        Ok(())
    }
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
        let record = |id: &str, state: DeliveryState| -> herald_core::dataplane::AttemptRecord {
            serde_json::from_value(serde_json::json!({
                "eventId": id, "attempt": 1, "timeMs": 1,
                "outcome": herald_core::dataplane::AttemptOutcome::Success,
                "latencyMs": 1, "state": state,
            }))
            .unwrap()
        };
        let records = [
            record("a", DeliveryState::Retrying),
            record("a", DeliveryState::Succeeded),
            record("b", DeliveryState::Retrying),
            record("c", DeliveryState::Retrying),
            record("c", DeliveryState::Dead),
            record("d", DeliveryState::Succeeded),
        ];
        let mut newest = Newest::default();
        for (seq, r) in records.iter().enumerate() {
            newest.add(seq as u64, r);
        }
        let ids: Vec<&str> = ["a", "b", "c", "d", "e"]
            .into_iter()
            .filter(|id| failed(&newest, id))
            .collect();
        assert_eq!(ids, ["b", "c"]);
    }
}
