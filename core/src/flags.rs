//! Command-line flags both binaries share (clap argument groups, flattened into each
//! binary's own settings), so the NATS connection and the destination policy are set
//! the same way everywhere.

use clap::Args;
use ipnet::IpNet;

use crate::ssrf::AddressPolicy;

/// How to reach NATS JetStream and how many replicas Herald's streams get.
#[derive(Args, Clone, Debug)]
pub struct NatsArgs {
    /// NATS server URL(s), comma-separated.
    #[arg(long, env = "HERALD_NATS_URL", default_value = "nats://127.0.0.1:4222")]
    pub nats_url: String,

    /// JetStream replicas of every stream and bucket Herald creates (1 on a single
    /// server, 3 in a production cluster). Existing streams are raised to this, never
    /// lowered.
    #[arg(long = "jetstream-replicas", env = "HERALD_JETSTREAM_REPLICAS", default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(1..=5))]
    pub replicas: u8,
}

/// Which destinations webhook URLs may use beyond the public internet over https.
#[derive(Args, Clone, Debug, Default)]
pub struct AddressPolicyArgs {
    /// Networks endpoint URLs may point at although they are loopback, private or
    /// link-local (comma-separated CIDRs, e.g. `10.20.0.0/16`).
    #[arg(
        long = "allow-network",
        env = "HERALD_ALLOW_NETWORKS",
        value_delimiter = ','
    )]
    pub allow_networks: Vec<IpNet>,

    /// Allow plain `http://` endpoint URLs.
    #[arg(long, env = "HERALD_ALLOW_HTTP")]
    pub allow_http: bool,
}

impl AddressPolicyArgs {
    /// The policy these flags describe.
    pub fn policy(&self) -> AddressPolicy {
        AddressPolicy {
            allow: self.allow_networks.clone(),
            allow_http: self.allow_http,
        }
    }

    /// Loopback allowed over http: what the tests run with.
    pub fn loopback_for_tests() -> Self {
        Self {
            allow_networks: AddressPolicy::loopback_for_tests().allow,
            allow_http: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Both {
        #[command(flatten)]
        nats: NatsArgs,
        #[command(flatten)]
        policy: AddressPolicyArgs,
    }

    #[test]
    fn flags_parse_with_their_defaults() {
        let both = Both::try_parse_from(["x"]).unwrap();
        assert_eq!(both.nats.replicas, 1);
        assert!(!both.policy.allow_http);
        let both = Both::try_parse_from([
            "x",
            "--jetstream-replicas",
            "3",
            "--allow-network",
            "10.0.0.0/8,127.0.0.0/8",
            "--allow-http",
        ])
        .unwrap();
        assert_eq!(both.nats.replicas, 3);
        assert_eq!(both.policy.policy().allow.len(), 2);
        assert!(Both::try_parse_from(["x", "--jetstream-replicas", "0"]).is_err());
        assert!(Both::try_parse_from(["x", "--allow-network", "nope"]).is_err());
    }
}
