//! Prometheus metrics. Labels are bounded: outcome classes, dead-letter reasons, shard
//! numbers — never endpoint names or error text.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub shard: u32,
    pub outcome: &'static str,
}

/// Label set of the dead-letter counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
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
        let mut registry = Registry::with_prefix("herald_dispatcher");
        m.register(&mut registry);
        Self { registry, ..m }
    }
}

impl Metrics {
    fn register(&self, r: &mut Registry) {
        let help = "Valid events read from the ingest stream";
        r.register("events_ingested", help, self.events_ingested.clone());
        let help = "Events whose lane messages were all acknowledged";
        r.register("events_fanned_out", help, self.fanned_out.clone());
        let help = "Events that cannot be delivered at all, by reason";
        r.register("dead_letters", help, self.dead_letters.clone());
        let help = "Delivery attempts by shard and outcome";
        r.register("attempts", help, self.attempts.clone());
        let help = "Deliveries given up (retry budget spent or final status)";
        r.register("dead_deliveries", help, self.dead_deliveries.clone());
        let help = "Attempt latency";
        r.register(
            "attempt_latency_seconds",
            help,
            self.attempt_latency.clone(),
        );
        r.register("in_flight", "Attempts in flight", self.in_flight.clone());
        let help = "Age of the oldest pending delivery";
        r.register(
            "oldest_pending_seconds",
            help,
            self.oldest_pending_seconds.clone(),
        );
        let help = "Endpoints whose circuit breaker is open";
        r.register("open_circuits", help, self.open_circuits.clone());
        let help = "Endpoints disabled after sustained failure or 410 Gone";
        r.register("disabled_endpoints", help, self.disabled_endpoints.clone());
        let help = "Shards this replica delivers for";
        r.register("owned_shards", help, self.owned_shards.clone());
        let help = "Endpoint configurations this replica knows";
        r.register("endpoints", help, self.endpoints.clone());
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
