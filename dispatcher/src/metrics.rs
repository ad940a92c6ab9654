//! Prometheus metrics; `docs/metrics.md` is the reference and `e2e/tests/metrics.rs`
//! checks that every metric it lists is exposed and moves.
//!
//! Labels are bounded: tenant namespaces, outcome and status classes, dead-letter
//! reasons, shard numbers — never endpoint names (except the ten-endpoint board of
//! [`PendingBoard`]) or error text.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use herald_core::dataplane::{AttemptOutcome, EndpointKey};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::index::Index;

/// How many endpoints the per-endpoint pending-age gauge exports per replica.
pub const WORST_ENDPOINTS: usize = 10;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AttemptLabel {
    pub namespace: String,
    pub outcome: &'static str,
    pub code_class: &'static str,
}

impl AttemptLabel {
    pub fn new(namespace: &str, outcome: AttemptOutcome, status: Option<u16>) -> Self {
        Self {
            namespace: namespace.to_owned(),
            outcome: outcome.as_str(),
            code_class: code_class(status),
        }
    }
}

/// The status class of a response: 429 apart from the other 4xx, `none` without one.
pub fn code_class(status: Option<u16>) -> &'static str {
    match status {
        None => "none",
        Some(429) => "429",
        Some(200..=299) => "2xx",
        Some(300..=399) => "3xx",
        Some(400..=499) => "4xx",
        Some(500..=599) => "5xx",
        Some(_) => "other",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NamespaceLabel {
    pub namespace: String,
}

impl NamespaceLabel {
    pub fn new(namespace: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
        }
    }
}

/// Label set of the fan-out lag: an ingest partition, or `none`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartitionLabel {
    pub partition: String,
}

/// Label set of the dead-letter counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

/// Label set of the egress proxy error counter: a proxy's name (the platform's
/// configuration, so a handful) and what went wrong.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProxyErrorLabel {
    pub proxy: String,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShardLabel {
    pub shard: u32,
}

/// How a delivery ended: `delivered` or `dead`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// From 0.5 ms to 4.4 minutes: the delivery SLI spans a fast path and a backlog.
fn first_attempt_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 20))
}

/// From 1 ms to 65 s, past the longest endpoint timeout.
fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

fn depth_histogram() -> Histogram {
    Histogram::new([1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0])
}

pub struct Metrics {
    pub registry: Registry,
    pub events_ingested: Counter,
    pub fanned_out: Counter,
    pub fanout_latency: Histogram,
    pub fanout_pending: Family<PartitionLabel, Gauge>,
    pub dead_letters: Family<ReasonLabel, Counter>,
    pub proxy_errors: Family<ProxyErrorLabel, Counter>,
    pub first_attempt_latency: Histograms<NamespaceLabel>,
    pub attempt_duration: Histograms<NamespaceLabel>,
    pub attempts: Family<AttemptLabel, Counter>,
    pub delivery_attempts: Histograms<ResultLabel>,
    pub dead_deliveries: Family<NamespaceLabel, Counter>,
    pub in_flight: Family<ShardLabel, Gauge>,
    pub open_circuits: Family<ShardLabel, Gauge>,
    pub disabled_endpoints: Family<ShardLabel, Gauge>,
    pub endpoint_states: Family<ShardLabel, Gauge>,
    pub lane_buffer_bytes: Gauge,
    pub shards: Gauge,
    pub owned_shards: Gauge,
    pub pending: Arc<PendingBoard>,
}

impl Metrics {
    /// The metrics of one dispatcher; `index` answers the endpoint count at scrape time.
    pub fn new(index: Index) -> Self {
        let m = Self {
            registry: Registry::default(),
            events_ingested: Counter::default(),
            fanned_out: Counter::default(),
            fanout_latency: first_attempt_histogram(),
            fanout_pending: Family::default(),
            dead_letters: Family::default(),
            proxy_errors: Family::default(),
            first_attempt_latency: Family::new_with_constructor(first_attempt_histogram),
            attempt_duration: Family::new_with_constructor(duration_histogram),
            attempts: Family::default(),
            delivery_attempts: Family::new_with_constructor(depth_histogram),
            dead_deliveries: Family::default(),
            in_flight: Family::default(),
            open_circuits: Family::default(),
            disabled_endpoints: Family::default(),
            endpoint_states: Family::default(),
            lane_buffer_bytes: Gauge::default(),
            shards: Gauge::default(),
            owned_shards: Gauge::default(),
            pending: Arc::default(),
        };
        let mut registry = Registry::with_prefix("herald_dispatcher");
        m.register(&mut registry);
        registry.register_collector(Box::new(m.pending.clone()));
        registry.register_collector(Box::new(EndpointCount(index)));
        Self { registry, ..m }
    }

    fn register(&self, r: &mut Registry) {
        let help = "From the event accepted by JetStream to the start of its first attempt at an endpoint (the delivery SLI)";
        let first = self.first_attempt_latency.clone();
        r.register("first_attempt_latency_seconds", help, first);
        let help = "One attempt: request sent to response read or timeout";
        let duration = self.attempt_duration.clone();
        r.register("attempt_duration_seconds", help, duration);
        let help = "Delivery attempts by tenant namespace, outcome and response status class";
        r.register("attempts", help, self.attempts.clone());
        let help = "Attempts a delivery took when it ended (retry depth), by result";
        r.register("delivery_attempts", help, self.delivery_attempts.clone());
        let help = "Deliveries given up (retry budget spent or a final status)";
        r.register("dead_deliveries", help, self.dead_deliveries.clone());
        r.register("in_flight", "Attempts in flight", self.in_flight.clone());
        let help = "Endpoints whose circuit breaker is open or half-open";
        r.register("open_circuits", help, self.open_circuits.clone());
        let help = "Endpoints disabled after sustained failure or 410 Gone";
        r.register("disabled_endpoints", help, self.disabled_endpoints.clone());
        let help = "Endpoints whose delivery state this shard holds: those with work, recent traffic or state that must outlive them (a drained, quiet endpoint's is released)";
        r.register("endpoint_states", help, self.endpoint_states.clone());
        let help = "Bytes the lanes of this dispatcher buffer (bodies plus a fixed cost an item); beyond their base caps lanes buffer only while this is under --lane-buffer-bytes; refreshed once a second";
        r.register("lane_buffer_bytes", help, self.lane_buffer_bytes.clone());
        r.register("shards", "Shards configured", self.shards.clone());
        let help = "Shards this replica holds the lease of and delivers for";
        r.register("owned_shards", help, self.owned_shards.clone());
        let help = "Valid events read from the ingest stream";
        r.register("events_ingested", help, self.events_ingested.clone());
        let help = "Events whose lane messages were all acknowledged";
        r.register("events_fanned_out", help, self.fanned_out.clone());
        let help = "From the event accepted to its lane messages acknowledged";
        let latency = self.fanout_latency.clone();
        r.register("fanout_latency_seconds", help, latency);
        let help = "Events in the ingest stream not yet fanned out (pending and unacknowledged), by ingest partition this replica fans out";
        r.register("fanout_pending_events", help, self.fanout_pending.clone());
        let help = "Events that cannot be delivered at all, by reason";
        r.register("dead_letters", help, self.dead_letters.clone());
        let help = "Failures of an egress proxy itself, by proxy and reason (unreachable, timeout, auth, refused, invalid)";
        r.register("egress_proxy_errors", help, self.proxy_errors.clone());
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// `herald_dispatcher_endpoints`, read from the index at scrape time.
#[derive(Clone)]
struct EndpointCount(Index);

impl std::fmt::Debug for EndpointCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EndpointCount")
    }
}

impl Collector for EndpointCount {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let help = "Endpoint configurations this replica holds: those of its shards and of its partitions' namespaces";
        let gauge = ConstGauge::new(self.0.endpoint_count() as i64);
        let metric = encoder.encode_descriptor("endpoints", help, None, MetricType::Gauge)?;
        gauge.encode(metric)
    }
}

/// Work not yet finished for one tenant on one shard.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TenantPending {
    /// Queued, in flight and waiting for a scheduled retry.
    pub backlog: u64,
    pub scheduled: u64,
    /// Publish time (Unix ms) of the oldest unfinished delivery.
    pub oldest_ms: Option<u64>,
}

impl TenantPending {
    pub fn add(&mut self, backlog: u64, scheduled: u64, oldest_ms: Option<u64>) {
        self.backlog += backlog;
        self.scheduled += scheduled;
        self.oldest_ms = match (self.oldest_ms, oldest_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
}

/// One shard's pending work, written by its housekeeping once a second.
#[derive(Clone, Debug, Default)]
pub struct ShardPending {
    pub tenants: HashMap<String, TenantPending>,
    /// The endpoints with the oldest pending work, oldest first, at most
    /// [`WORST_ENDPOINTS`].
    pub worst: Vec<(EndpointKey, u64)>,
}

impl ShardPending {
    /// Keeps `key` among the worst endpoints if its oldest pending work is old enough.
    pub fn consider(&mut self, key: &EndpointKey, oldest_ms: u64) {
        if self.worst.len() == WORST_ENDPOINTS
            && self.worst.last().is_some_and(|(_, o)| *o <= oldest_ms)
        {
            return;
        }
        let at = self.worst.partition_point(|(_, o)| *o <= oldest_ms);
        self.worst.insert(at, (key.clone(), oldest_ms));
        self.worst.truncate(WORST_ENDPOINTS);
    }
}

/// The pending work of every shard this replica runs, summed per tenant at scrape time,
/// so that a tenant's series disappear once its work is done and a shard given up takes
/// its numbers along.
#[derive(Debug, Default)]
pub struct PendingBoard {
    shards: Mutex<HashMap<u32, ShardPending>>,
}

impl PendingBoard {
    pub fn set(&self, shard: u32, pending: ShardPending) {
        self.lock().insert(shard, pending);
    }

    pub fn remove(&self, shard: u32) {
        self.lock().remove(&shard);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, ShardPending>> {
        self.shards
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Per tenant, summed over shards; and the replica's worst endpoints.
    pub fn totals(&self) -> Totals {
        let shards = self.lock();
        let mut tenants: HashMap<String, TenantPending> = HashMap::new();
        let mut worst = ShardPending::default();
        for shard in shards.values() {
            for (namespace, p) in &shard.tenants {
                let total = tenants.entry(namespace.clone()).or_default();
                total.add(p.backlog, p.scheduled, p.oldest_ms);
            }
            for (key, oldest) in &shard.worst {
                worst.consider(key, *oldest);
            }
        }
        let mut tenants: Vec<_> = tenants.into_iter().collect();
        tenants.sort_by(|a, b| a.0.cmp(&b.0));
        Totals {
            tenants,
            worst: worst.worst,
        }
    }
}

/// What [`PendingBoard::totals`] sums up.
pub struct Totals {
    /// Per tenant namespace, sorted.
    pub tenants: Vec<(String, TenantPending)>,
    /// The endpoints with the oldest pending work and its publish time, oldest first.
    pub worst: Vec<(EndpointKey, u64)>,
}

/// Encodes one gauge family with a series per tenant.
fn tenant_gauge(
    encoder: &mut DescriptorEncoder,
    (name, help): (&str, &str),
    tenants: &[(String, TenantPending)],
    value: impl Fn(&TenantPending) -> f64,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (namespace, p) in tenants {
        let label = NamespaceLabel::new(namespace);
        ConstGauge::new(value(p)).encode(family.encode_family(&label)?)?;
    }
    Ok(())
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabel {
    namespace: String,
    endpoint: String,
}

impl Collector for PendingBoard {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let now_ms = herald_core::clock::now_ms();
        let age =
            |oldest: Option<u64>| oldest.map_or(0.0, |o| now_ms.saturating_sub(o) as f64 / 1e3);
        let Totals { tenants, worst } = self.totals();
        let help =
            "Deliveries not yet finished: queued, in flight and waiting for a scheduled retry";
        tenant_gauge(&mut encoder, ("backlog_deliveries", help), &tenants, |p| {
            p.backlog as f64
        })?;
        let help = "Deliveries waiting for a scheduled retry";
        tenant_gauge(&mut encoder, ("scheduled_retries", help), &tenants, |p| {
            p.scheduled as f64
        })?;
        let help = "Age of the oldest delivery not yet finished, scheduled retries included";
        let name = "oldest_pending_age_seconds";
        tenant_gauge(&mut encoder, (name, help), &tenants, |p| age(p.oldest_ms))?;
        let help =
            "Age of the oldest pending delivery of the ten endpoints with the oldest pending work";
        let name = "endpoint_oldest_pending_age_seconds";
        let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for (key, oldest) in &worst {
            let label = EndpointLabel {
                namespace: key.namespace().to_owned(),
                endpoint: key.name(),
            };
            ConstGauge::new(age(Some(*oldest))).encode(family.encode_family(&label)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_classes_keep_429_apart() {
        let classes: Vec<_> = [None, Some(200), Some(301), Some(404), Some(429), Some(503)]
            .into_iter()
            .map(code_class)
            .collect();
        assert_eq!(classes, ["none", "2xx", "3xx", "4xx", "429", "5xx"]);
    }

    #[test]
    fn the_board_sums_tenants_over_shards_and_keeps_the_ten_oldest_endpoints() {
        let board = PendingBoard::default();
        for shard in 0..3u32 {
            let mut pending = ShardPending::default();
            for i in 0..8u64 {
                let key =
                    EndpointKey::new(if i % 2 == 0 { "a" } else { "b" }, &format!("e{shard}-{i}"));
                let oldest = 1_000 + u64::from(shard) * 100 + i;
                pending
                    .tenants
                    .entry(key.namespace().to_owned())
                    .or_default()
                    .add(2, 1, Some(oldest));
                pending.consider(&key, oldest);
            }
            board.set(shard, pending);
        }
        let Totals { tenants, worst } = board.totals();
        let a = TenantPending {
            backlog: 24,
            scheduled: 12,
            oldest_ms: Some(1_000),
        };
        let b = TenantPending {
            backlog: 24,
            scheduled: 12,
            oldest_ms: Some(1_001),
        };
        assert_eq!(tenants, vec![("a".to_owned(), a), ("b".to_owned(), b)]);
        let oldest: Vec<u64> = worst.iter().map(|(_, o)| *o).collect();
        assert_eq!(
            oldest,
            [
                1_000, 1_001, 1_002, 1_003, 1_004, 1_005, 1_006, 1_007, 1_100, 1_101
            ]
        );

        board.remove(0);
        let Totals { tenants, worst } = board.totals();
        assert_eq!(tenants[0].1.backlog, 16);
        assert_eq!(worst[0].1, 1_100);
    }
}
