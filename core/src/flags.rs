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

/// Why NATS could not be reached. Never contains the URL: it may carry credentials.
#[derive(Debug, thiserror::Error)]
pub enum NatsConnectError {
    #[error(
        "entry {position} of --nats-url (HERALD_NATS_URL) is not a NATS URL such as nats://host:4222"
    )]
    Url { position: usize },
    #[error("--nats-url (HERALD_NATS_URL) is empty")]
    Empty,
    #[error("connecting to NATS: {0}")]
    Connect(#[source] async_nats::ConnectError),
}

impl NatsArgs {
    /// The servers of `--nats-url`, a comma-separated list (async-nats takes one URL per
    /// address, so the list is split here, once for both binaries).
    pub fn server_addrs(&self) -> Result<Vec<async_nats::ServerAddr>, NatsConnectError> {
        let addrs = self
            .nats_url
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .enumerate()
            .map(|(i, url)| {
                url.parse::<async_nats::ServerAddr>()
                    .map_err(|_| NatsConnectError::Url { position: i + 1 })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if addrs.is_empty() {
            return Err(NatsConnectError::Empty);
        }
        Ok(addrs)
    }

    /// Connects as `name`, retrying the initial connection (NATS may start after
    /// Herald, or be restarting) and reconnecting for ever.
    pub async fn connect(&self, name: &str) -> Result<async_nats::Client, NatsConnectError> {
        async_nats::ConnectOptions::new()
            .name(name)
            .retry_on_initial_connect()
            .connect(self.server_addrs()?)
            .await
            .map_err(NatsConnectError::Connect)
    }
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

    #[test]
    fn nats_urls_are_a_comma_separated_list_and_errors_hide_them() {
        let parse = |url: &str| Both::try_parse_from(["x", "--nats-url", url]).unwrap().nats;
        let three = parse("nats://127.0.0.1:4222, nats://127.0.0.1:4223,nats://127.0.0.1:4224");
        assert_eq!(three.server_addrs().unwrap().len(), 3);
        let bad = parse("nats://u:secret@127.0.0.1:4222,nats://[::1:4223");
        let error = bad.server_addrs().unwrap_err().to_string();
        assert!(error.contains("entry 2"), "{error}");
        assert!(!error.contains("secret"), "{error}");
        assert!(parse(" , ").server_addrs().is_err());
    }
}
