//! The dispatcher's settings (flags with environment fallbacks). Durations are Go
//! durations (`30s`, `720h`) like every duration in Herald.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use herald_core::duration::parse_std;
use herald_core::flags::{AddressPolicyArgs, NatsArgs};

/// Herald's dispatcher: delivers events from NATS JetStream to webhook endpoints.
#[derive(Parser, Debug, Clone)]
#[command(version, about, args_override_self = true)]
pub struct Config {
    #[command(flatten)]
    pub nats: NatsArgs,
    /// This replica's identity; the StatefulSet pod name is a good one.
    #[arg(long, env = "HERALD_REPLICA_ID", default_value = "dispatcher-0")]
    pub replica_id: String,
    /// Number of shards endpoints are spread over; fixed at install time, the same in the
    /// operator.
    #[arg(long, env = "HERALD_SHARDS", default_value_t = 16)]
    pub shards: u32,
    /// How long events (and lanes, attempt records and dead letters) are kept.
    #[arg(long, env = "HERALD_RETENTION", default_value = "720h", value_parser = parse_std)]
    pub retention: Duration,
    /// Largest event accepted, in bytes.
    #[arg(long, env = "HERALD_MAX_EVENT_BYTES", default_value_t = herald_core::envelope::DEFAULT_MAX_EVENT_BYTES)]
    pub max_event_bytes: usize,
    #[command(flatten)]
    pub limits: Limits,
    /// Shortest time between two health reports of one endpoint.
    #[arg(long, env = "HERALD_HEALTH_INTERVAL", default_value = "10s", value_parser = parse_std)]
    pub health_interval: Duration,
    /// How long an endpoint must be quiet, with nothing queued, scheduled or in flight and
    /// nothing that must outlive it (disabled, failing, an open circuit, `Retry-After`),
    /// before its delivery state is released: what goes is its success and latency
    /// windows and its adaptive limit, which start again with its next event.
    #[arg(long, env = "HERALD_RELEASE_IDLE_AFTER", default_value = "2m", value_parser = parse_std)]
    pub release_idle_after: Duration,
    /// Idle connections kept per receiver host (and per egress proxy). Below the attempts
    /// in flight to one host, connections are opened and closed per delivery.
    #[arg(long, env = "HERALD_HTTP_IDLE_PER_HOST", default_value_t = crate::http::DEFAULT_IDLE_PER_HOST)]
    pub http_idle_per_host: usize,
    /// Bytes all lanes of this dispatcher may buffer before they keep to their base caps
    /// (twice an endpoint's `maxInFlight`, at most 64 items a lane). Beyond its base cap
    /// only a delivering endpoint's lane buffers: a backlog within the budget is read
    /// from JetStream once instead of twice.
    #[arg(long, env = "HERALD_LANE_BUFFER_BYTES", default_value_t = crate::budget::DEFAULT_LANE_BUFFER_BYTES)]
    pub lane_buffer_bytes: usize,
    /// How long in-flight attempts get to finish at shutdown or handover.
    #[arg(long, env = "HERALD_GRACE", default_value = "20s", value_parser = parse_std)]
    pub grace: Duration,
    #[command(flatten)]
    pub destinations: AddressPolicyArgs,
    #[command(flatten)]
    pub egress: crate::http::EgressArgs,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "HERALD_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// Log as JSON lines.
    #[arg(long, env = "HERALD_JSON_LOGS")]
    pub json_logs: bool,
}

/// How attempts share a dispatcher (docs/architecture.md, "Fairness"): each bound
/// applies whatever the endpoints' own `maxInFlight`.
#[derive(clap::Args, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most attempts in flight per shard.
    #[arg(
        id = "max_in_flight_per_shard",
        long = "max-in-flight-per-shard",
        env = "HERALD_MAX_IN_FLIGHT_PER_SHARD",
        default_value_t = 1024
    )]
    pub per_shard: usize,
    /// Most attempts in flight in this dispatcher, across all its shards.
    #[arg(
        long = "max-in-flight",
        env = "HERALD_MAX_IN_FLIGHT",
        default_value_t = 4096
    )]
    pub per_dispatcher: usize,
    /// Most attempts of one tenant (namespace) in flight per shard, unless the tenant's
    /// namespace says otherwise.
    #[arg(
        long = "tenant-max-in-flight",
        env = "HERALD_TENANT_MAX_IN_FLIGHT",
        default_value_t = 256
    )]
    pub per_tenant: usize,
    /// Most attempts one endpoint may hold, whatever its `maxInFlight`: slow endpoints
    /// cannot take a shard's slots from the others.
    #[arg(
        long = "endpoint-max-in-flight",
        env = "HERALD_ENDPOINT_MAX_IN_FLIGHT",
        default_value_t = 128
    )]
    pub per_endpoint: usize,
}

impl Config {
    /// Settings for tests: loopback allowed, fast health reports, given NATS URL.
    #[cfg(any(test, feature = "testing"))]
    pub fn for_tests(nats_url: &str, replica_id: &str) -> Self {
        let mut config = Self::parse_from(["herald-dispatcher"]);
        config.nats.nats_url = nats_url.to_owned();
        config.replica_id = replica_id.to_owned();
        config.shards = 4;
        config.destinations = AddressPolicyArgs::loopback_for_tests();
        config.health_interval = Duration::from_secs(1);
        config.grace = Duration::from_secs(2);
        config.listen = "127.0.0.1:0".parse().expect("valid address");
        config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_go_durations() {
        let config = Config::try_parse_from(["x"]).unwrap();
        assert_eq!(config.retention, Duration::from_secs(30 * 24 * 3600));
        assert_eq!(config.grace, Duration::from_secs(20));
        let config =
            Config::try_parse_from(["x", "--retention", "2h", "--grace", "1m30s"]).unwrap();
        assert_eq!(config.retention, Duration::from_secs(7200));
        assert_eq!(config.grace, Duration::from_secs(90));
        assert!(Config::try_parse_from(["x", "--grace", "20"]).is_err());
    }
}
