//! The dispatcher's settings (flags with environment fallbacks).

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use herald_core::ssrf::AddressPolicy;
use ipnet::IpNet;

/// Herald's dispatcher: delivers events from NATS JetStream to webhook endpoints.
#[derive(Parser, Debug, Clone)]
#[command(version, about)]
pub struct Config {
    /// NATS server URL.
    #[arg(long, env = "HERALD_NATS_URL", default_value = "nats://127.0.0.1:4222")]
    pub nats_url: String,
    /// This replica's identity; the StatefulSet pod name is a good one.
    #[arg(long, env = "HERALD_REPLICA_ID", default_value = "dispatcher-0")]
    pub replica_id: String,
    /// Number of shards endpoints are spread over; fixed at install time, the same in the
    /// operator.
    #[arg(long, env = "HERALD_SHARDS", default_value_t = 16)]
    pub shards: u32,
    /// How long events (and attempt records and dead letters) are kept, in seconds.
    #[arg(long, env = "HERALD_RETENTION_SECONDS", default_value_t = 30 * 24 * 3600)]
    pub retention_seconds: u64,
    /// Largest event accepted, in bytes.
    #[arg(long, env = "HERALD_MAX_EVENT_BYTES", default_value_t = crate::envelope::DEFAULT_MAX_EVENT_BYTES)]
    pub max_event_bytes: usize,
    /// Most attempts in flight per shard.
    #[arg(long, env = "HERALD_MAX_IN_FLIGHT_PER_SHARD", default_value_t = 1024)]
    pub max_in_flight_per_shard: usize,
    /// Shortest time between two health reports of one endpoint (Go duration).
    #[arg(long, env = "HERALD_HEALTH_INTERVAL", default_value = "10s", value_parser = herald_core::duration::parse_std)]
    pub health_interval: Duration,
    /// Seconds in-flight attempts get to finish at shutdown.
    #[arg(long, env = "HERALD_GRACE_SECONDS", default_value_t = 20.0)]
    pub grace_seconds: f64,
    /// Networks webhook URLs may reach although they are private, loopback, link-local...
    /// (comma-separated CIDRs).
    #[arg(
        long = "allow-network",
        env = "HERALD_ALLOW_NETWORKS",
        value_delimiter = ','
    )]
    pub allow_networks: Vec<IpNet>,
    /// Allow plain-http webhook URLs.
    #[arg(long, env = "HERALD_ALLOW_HTTP")]
    pub allow_http: bool,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "HERALD_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// Log as JSON lines.
    #[arg(long, env = "HERALD_JSON_LOGS")]
    pub json_logs: bool,
}

impl Config {
    pub fn policy(&self) -> AddressPolicy {
        AddressPolicy {
            allow: self.allow_networks.clone(),
            allow_http: self.allow_http,
        }
    }

    pub fn retention(&self) -> Duration {
        Duration::from_secs(self.retention_seconds)
    }

    /// Settings for tests: loopback allowed, fast health reports, given NATS URL.
    pub fn for_tests(nats_url: &str, replica_id: &str) -> Self {
        let mut config = Self::parse_from(["herald-dispatcher"]);
        config.nats_url = nats_url.to_owned();
        config.replica_id = replica_id.to_owned();
        config.shards = 4;
        config.allow_networks = AddressPolicy::loopback_for_tests().allow;
        config.allow_http = true;
        config.health_interval = Duration::from_secs(1);
        config.grace_seconds = 2.0;
        config.listen = "127.0.0.1:0".parse().expect("valid address");
        config
    }
}
