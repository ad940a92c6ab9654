//! Observing NATS during a scenario: stream leaders, shard leases, and every change
//! of some KV keys.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

use async_nats::jetstream;
use herald_core::dataplane::SHARDS_BUCKET;

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

/// Polls `stream`'s leader every 100 ms from now until a node other than `killed`
/// leads it, or any node does once `back` is set (the killed node restarted, and may
/// lead again); the moment that was first seen, or `None` if not within `within`. Each
/// poll waits 1 s at most: a stream without a leader does not answer its info request.
pub async fn new_leader(
    js: &jetstream::Context,
    stream: &str,
    killed: &str,
    back: &std::sync::atomic::AtomicBool,
    within: std::time::Duration,
) -> Option<Instant> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let poll =
            tokio::time::timeout(std::time::Duration::from_secs(1), stream_leader(js, stream));
        if let Ok(Some(leader)) = poll.await
            && (leader != killed || back.load(std::sync::atomic::Ordering::SeqCst))
        {
            return Some(Instant::now());
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    None
}

/// How long after `at` the first of `receipts` (first receipts, in arrival order) came:
/// when deliveries resumed after a moment such as a new stream leader.
pub fn resumed_after(
    receipts: &[crate::receiver::FirstReceipt],
    at: Instant,
) -> Option<std::time::Duration> {
    receipts
        .iter()
        .find(|r| r.at >= at)
        .map(|r| r.at.duration_since(at))
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
        if let Ok(Some(entry)) = kv
            .entry(herald_core::dataplane::LeaseKey::Shard(shard).to_string())
            .await
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
