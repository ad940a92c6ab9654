//! The operator's configuration: command-line flags with environment fallbacks.
//!
//! Contract: every setting the operator reads comes from [`Config`]; nothing else looks
//! at the environment. Tests build one with [`Config::try_parse_from`](clap::Parser).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use herald_core::flags::{AddressPolicyArgs, NatsArgs};

/// `herald-operator run`: reconcile Herald's resources.
#[derive(Parser, Clone, Debug)]
// A later flag wins over an earlier one: tests append overrides to a base command line.
#[command(about, args_override_self = true)]
pub struct Config {
    #[command(flatten)]
    pub nats: NatsArgs,

    /// Number of dispatcher shards endpoints are spread over; the same in the dispatchers.
    /// Fixed at install: the first start records it in NATS, and a later start with
    /// another count is refused (every endpoint's queue is keyed by its shard).
    #[arg(long, env = "HERALD_SHARDS", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub shards: u32,

    #[command(flatten)]
    pub destinations: AddressPolicyArgs,

    /// The dispatchers' egress proxies (the same flags as theirs), so an endpoint whose
    /// `spec.delivery.proxy` they would refuse is reported `Ready=False` instead.
    #[command(flatten)]
    pub egress: herald_core::egress::EgressArgs,

    /// Shortest time between two health-driven status writes of one endpoint.
    #[arg(long, env = "HERALD_STATUS_INTERVAL", default_value = "10s", value_parser = herald_core::duration::parse_std)]
    pub status_interval: Duration,

    /// Shortest time between two status writes of one endpoint when only its gauges moved
    /// (last delivery, backlog, oldest pending, p95 latency, concurrency limit) and nothing
    /// a user acts on did (state, conditions, circuit, success rate, last outcome). At
    /// scale, these refreshes are most of the status writes: see docs/scale.md.
    #[arg(long, env = "HERALD_STATUS_REFRESH", default_value = "5m", value_parser = herald_core::duration::parse_std)]
    pub status_refresh: Duration,

    /// How often an endpoint whose headers take their values from Secrets
    /// (`valueFrom.secretKeyRef`) reads those Secrets again: a changed value reaches the
    /// deliveries within this. Herald does not watch Secrets it does not own.
    #[arg(long, env = "HERALD_HEADER_SECRET_REFRESH", default_value = "30s", value_parser = herald_core::duration::parse_std)]
    pub header_secret_refresh: Duration,

    /// How often the served Namespaces' annotations are read (tenant policies, required
    /// endpoint verification): a changed annotation takes effect within this.
    #[arg(long, env = "HERALD_NAMESPACE_REFRESH", default_value = "30s", value_parser = herald_core::duration::parse_std)]
    pub namespace_refresh: Duration,

    /// Address of `/metrics`, `/healthz` and `/readyz` (port 0: any free port).
    #[arg(long, env = "HERALD_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,

    /// Name of the coordination.k8s.io Lease the replicas elect a leader with.
    #[arg(long, env = "HERALD_LEASE_NAME", default_value = herald_core::names::LEADER_LEASE)]
    pub lease_name: String,

    /// Namespace of the Lease (usually the operator's own, from the downward API).
    #[arg(long, env = "POD_NAMESPACE", default_value = "herald-system")]
    pub lease_namespace: String,

    /// This replica's identity in the Lease; default: the pod name, else a random one.
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,

    /// How long a Lease stays valid without renewal: the longest failover time.
    #[arg(long, env = "HERALD_LEASE_DURATION", default_value = "15s", value_parser = herald_core::duration::parse_std)]
    pub lease_duration: Duration,

    /// How often the leader renews (and a standby retries to acquire) the Lease.
    #[arg(long, env = "HERALD_LEASE_RENEW", default_value = "5s", value_parser = herald_core::duration::parse_std)]
    pub lease_renew: Duration,

    /// Reconcile only these namespaces, comma-separated or repeated (default: all
    /// namespaces). With a list the operator needs no cluster-wide rights: it watches each
    /// namespace on its own, Secrets included.
    #[arg(
        long = "namespace",
        env = "HERALD_WATCH_NAMESPACE",
        value_delimiter = ','
    )]
    pub namespaces: Vec<String>,

    /// Without `--namespace`: also watch, in every namespace, the Secrets Herald generated
    /// (label `app.kubernetes.io/managed-by=herald`), so a hand-edited key is picked up at
    /// once. Needs list and watch of Secrets cluster-wide; without it the operator reads
    /// only the Secrets SigningSecrets name, by name, and picks up hand edits within 5
    /// minutes.
    #[arg(long, env = "HERALD_WATCH_SECRETS_CLUSTER_WIDE")]
    pub watch_secrets_cluster_wide: bool,

    /// Kubeconfig to use instead of the in-cluster or `$KUBECONFIG` one.
    #[arg(long, env = "HERALD_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Log as JSON lines.
    #[arg(long, env = "HERALD_JSON_LOGS")]
    pub json_logs: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_ones() {
        let config = Config::try_parse_from(["herald-operator"]).unwrap();
        assert_eq!(config.shards, 16);
        assert_eq!(config.status_interval, Duration::from_secs(10));
        assert_eq!(config.status_refresh, Duration::from_secs(300));
        assert_eq!(config.lease_duration, Duration::from_secs(15));
        assert_eq!(config.lease_renew, Duration::from_secs(5));
        assert_eq!(config.listen.port(), 8080);
        assert!(!config.destinations.allow_http);
        assert!(config.namespaces.is_empty(), "all namespaces");
        assert!(!config.watch_secrets_cluster_wide);
        let later_wins =
            Config::try_parse_from(["x", "--listen", "127.0.0.1:0", "--listen", "127.0.0.1:9"])
                .unwrap();
        assert_eq!(later_wins.listen.port(), 9);
    }

    #[test]
    fn allowlists_parse_as_cidrs() {
        let config = Config::try_parse_from([
            "herald-operator",
            "--allow-network",
            "10.0.0.0/8,127.0.0.0/8",
            "--status-interval",
            "2s",
        ])
        .unwrap();
        assert_eq!(config.destinations.policy().allow.len(), 2);
        assert_eq!(config.status_interval, Duration::from_secs(2));
        assert!(Config::try_parse_from(["x", "--allow-network", "nope"]).is_err());
    }

    #[test]
    fn namespaces_are_a_list() {
        let config = Config::try_parse_from(["x", "--namespace", "a,b"]).unwrap();
        assert_eq!(config.namespaces, ["a", "b"]);
        // A list flag appends: repeating it adds namespaces.
        let more = Config::try_parse_from(["x", "--namespace", "a,b", "--namespace", "c"]).unwrap();
        assert_eq!(more.namespaces, ["a", "b", "c"]);
    }
}
