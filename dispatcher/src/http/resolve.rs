//! The SSRF check at connect time: every new connection resolves the host name again and
//! keeps only the addresses the platform's [`AddressPolicy`] allows, so a name that
//! resolves (or is rebound) to an internal address can never be connected to. Both paths
//! call [`vetted`] for every new connection: the direct one connects to an address it
//! returns (`super::connect`), the proxied one asks the proxy for a tunnel to one.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use herald_core::ssrf::{AddressPolicy, Forbidden};

/// Answers a host name's addresses: the system resolver in production; tests inject one
/// that answers differently from call to call (DNS rebinding).
pub(crate) type Lookup = Arc<
    dyn Fn(String) -> futures::future::BoxFuture<'static, std::io::Result<Vec<SocketAddr>>>
        + Send
        + Sync,
>;

pub(crate) fn system_lookup() -> Lookup {
    Arc::new(|host: String| {
        Box::pin(async move { Ok(tokio::net::lookup_host((host.as_str(), 0)).await?.collect()) })
    })
}

/// Why a host has no address to connect to.
#[derive(Debug, thiserror::Error)]
pub(crate) enum VetError {
    #[error(transparent)]
    Forbidden(#[from] Forbidden),
    #[error("resolving {host}")]
    Lookup {
        host: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{host} has no address")]
    NoAddress { host: String },
}

/// The vetted addresses of a connector's destination `dst`, and its port: what both
/// connectors (direct, and through a proxy's tunnel) try in order. A refusal by the
/// policy is returned unwrapped, so the attempt is classified as refused by it.
pub(crate) async fn destination(
    policy: &AddressPolicy,
    lookup: &Lookup,
    dst: &hyper::Uri,
) -> Result<(Vec<IpAddr>, u16), Box<dyn std::error::Error + Send + Sync>> {
    let host = dst.host().ok_or("the URL has no host")?;
    let default_port = if dst.scheme_str() == Some("https") {
        443
    } else {
        80
    };
    let port = dst.port_u16().unwrap_or(default_port);
    match vetted(policy, lookup, host).await {
        Ok(addrs) => Ok((addrs, port)),
        Err(VetError::Forbidden(forbidden)) => Err(forbidden.into()),
        Err(other) => Err(other.into()),
    }
}

/// The addresses of `host` (a name or an IP literal, IPv6 with or without brackets) the
/// policy allows, in the resolver's order, never empty: what a proxied connection may ask
/// its proxy to tunnel to.
pub(crate) async fn vetted(
    policy: &AddressPolicy,
    lookup: &Lookup,
    host: &str,
) -> Result<Vec<IpAddr>, VetError> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let addrs = match bare.parse::<IpAddr>() {
        Ok(ip) => {
            policy.check_ip(ip)?;
            vec![ip]
        }
        Err(_) => {
            let resolved = lookup(bare.to_owned())
                .await
                .map_err(|source| VetError::Lookup {
                    host: bare.to_owned(),
                    source,
                })?;
            let allowed = allowed_addresses(policy, resolved)?;
            allowed.into_iter().map(|addr| addr.ip()).collect()
        }
    };
    if addrs.is_empty() {
        return Err(VetError::NoAddress {
            host: bare.to_owned(),
        });
    }
    Ok(addrs)
}

/// The addresses of a name the policy allows, in the resolver's order. A name with some
/// refused addresses is connected to through the others only; one with nothing but
/// refused addresses is refused, naming why.
pub(crate) fn allowed_addresses(
    policy: &AddressPolicy,
    resolved: Vec<SocketAddr>,
) -> Result<Vec<SocketAddr>, Forbidden> {
    let mut refused = None;
    let allowed: Vec<SocketAddr> = resolved
        .into_iter()
        .filter(|addr| match policy.check_ip(addr.ip()) {
            Ok(()) => true,
            Err(e) => {
                refused = Some(e);
                false
            }
        })
        .collect();
    match (allowed.is_empty(), refused) {
        (true, Some(forbidden)) => Err(forbidden),
        _ => Ok(allowed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_allowed_addresses_of_a_name_are_kept() {
        let policy = AddressPolicy::default();
        let addrs = |ips: &[&str]| -> Vec<SocketAddr> {
            ips.iter()
                .map(|ip| SocketAddr::new(ip.parse().unwrap(), 0))
                .collect()
        };
        assert_eq!(
            allowed_addresses(
                &policy,
                addrs(&["10.0.0.1", "8.8.8.8", "169.254.169.254", "1.1.1.1"])
            ),
            Ok(addrs(&["8.8.8.8", "1.1.1.1"]))
        );
        let refused = allowed_addresses(&policy, addrs(&["10.0.0.1", "::ffff:127.0.0.1"]))
            .unwrap_err()
            .to_string();
        assert!(refused.contains("loopback"), "{refused}");
        let allowlisted = AddressPolicy {
            allow: vec!["10.20.0.0/16".parse().unwrap()],
            allow_http: false,
        };
        assert_eq!(
            allowed_addresses(&allowlisted, addrs(&["10.20.3.4", "10.21.0.1"])),
            Ok(addrs(&["10.20.3.4"]))
        );
        assert_eq!(allowed_addresses(&policy, Vec::new()), Ok(Vec::new()));
    }

    /// What a proxied connection asks for: IP literals checked as they are (with or
    /// without brackets), names resolved and filtered, nothing left refused with the
    /// reason.
    #[tokio::test]
    async fn vetted_addresses_are_what_the_policy_allows() {
        let policy = AddressPolicy::default();
        let lookup: Lookup = Arc::new(|host: String| {
            Box::pin(async move {
                Ok(match host.as_str() {
                    "mixed.test" => {
                        vec!["10.0.0.1:0".parse().unwrap(), "8.8.8.8:0".parse().unwrap()]
                    }
                    "internal.test" => vec!["169.254.169.254:0".parse().unwrap()],
                    _ => Vec::new(),
                })
            })
        });
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(
            vetted(&policy, &lookup, "mixed.test").await.unwrap(),
            vec![ip("8.8.8.8")]
        );
        assert_eq!(
            vetted(&policy, &lookup, "[2606:4700::1111]").await.unwrap(),
            vec![ip("2606:4700::1111")]
        );
        for (host, says) in [
            ("internal.test", "metadata"),
            ("[::1]", "loopback"),
            ("10.1.2.3", "private"),
            ("nothing.test", "no address"),
        ] {
            let error = vetted(&policy, &lookup, host)
                .await
                .unwrap_err()
                .to_string();
            assert!(error.contains(says), "{host}: {error}");
        }
    }
}
