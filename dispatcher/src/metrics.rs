//! Prometheus metrics. Labels are bounded: outcome classes, dead-letter reasons, shard
//! numbers — never endpoint names or error text.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::fanout::ReasonLabel;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub shard: u32,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShardLabel {
    pub shard: u32,
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

pub struct Metrics {
    pub registry: Registry,
    pub events_ingested: Counter,
    pub fanned_out: Counter,
    pub dead_letters: Family<ReasonLabel, Counter>,
    pub attempts: Family<OutcomeLabel, Counter>,
    pub dead_deliveries: Family<ShardLabel, Counter>,
    pub attempt_latency: Family<ShardLabel, Histogram, fn() -> Histogram>,
    pub in_flight: Family<ShardLabel, Gauge>,
    pub oldest_pending_seconds: Family<ShardLabel, Gauge>,
    pub open_circuits: Family<ShardLabel, Gauge>,
    pub disabled_endpoints: Family<ShardLabel, Gauge>,
    pub owned_shards: Gauge,
    pub endpoints: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("herald_dispatcher");
        let m = Self {
            events_ingested: Counter::default(),
            fanned_out: Counter::default(),
            dead_letters: Family::default(),
            attempts: Family::default(),
            dead_deliveries: Family::default(),
            attempt_latency: Family::new_with_constructor(latency_histogram),
            in_flight: Family::default(),
            oldest_pending_seconds: Family::default(),
            open_circuits: Family::default(),
            disabled_endpoints: Family::default(),
            owned_shards: Gauge::default(),
            endpoints: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register(
            "events_ingested",
            "Valid events read from the ingest stream",
            m.events_ingested.clone(),
        );
        registry.register(
            "events_fanned_out",
            "Events whose lane messages were all acknowledged",
            m.fanned_out.clone(),
        );
        registry.register(
            "dead_letters",
            "Events that cannot be delivered at all, by reason",
            m.dead_letters.clone(),
        );
        registry.register(
            "attempts",
            "Delivery attempts by shard and outcome",
            m.attempts.clone(),
        );
        registry.register(
            "dead_deliveries",
            "Deliveries given up (retry budget spent or final status)",
            m.dead_deliveries.clone(),
        );
        registry.register(
            "attempt_latency_seconds",
            "Attempt latency",
            m.attempt_latency.clone(),
        );
        registry.register("in_flight", "Attempts in flight", m.in_flight.clone());
        registry.register(
            "oldest_pending_seconds",
            "Age of the oldest pending delivery",
            m.oldest_pending_seconds.clone(),
        );
        registry.register(
            "open_circuits",
            "Endpoints whose circuit breaker is open",
            m.open_circuits.clone(),
        );
        registry.register(
            "disabled_endpoints",
            "Endpoints disabled after sustained failure or 410 Gone",
            m.disabled_endpoints.clone(),
        );
        registry.register(
            "owned_shards",
            "Shards this replica delivers for",
            m.owned_shards.clone(),
        );
        registry.register(
            "endpoints",
            "Endpoint configurations this replica knows",
            m.endpoints.clone(),
        );
        Self { registry, ..m }
    }
}

impl Metrics {
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}
