//! Which destinations a webhook URL may point at.
//!
//! Endpoint URLs are untrusted tenant input. Without a check, a tenant could make Herald
//! POST into the cluster's own network or a cloud metadata service. The same policy runs
//! in the operator (on the URL and the addresses its host resolves to, for a condition a
//! person can act on) and in the dispatcher (on the resolved address at connect time,
//! which is what actually protects against DNS rebinding).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// The platform's policy, set in the operator's and dispatcher's configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AddressPolicy {
    /// Networks allowed even though they are in a refused class (e.g. `10.20.0.0/16` for
    /// in-cluster receivers, `127.0.0.0/8` for tests).
    #[serde(default)]
    pub allow: Vec<IpNet>,
    /// Allow plain `http://` URLs. Off by default: webhooks carry data worth encrypting.
    #[serde(default)]
    pub allow_http: bool,
}

/// Why an address is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressClass {
    Unspecified,
    Loopback,
    Private,
    SharedCgnat,
    LinkLocal,
    UniqueLocal,
    CloudMetadata,
    Multicast,
    Broadcast,
    Reserved,
    /// IPv4 192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24; IPv6 2001:db8::/32, 3fff::/20.
    Documentation,
    /// IPv4 198.18.0.0/15, IPv6 2001:2::/48.
    Benchmarking,
    /// IPv6 that embeds or reaches an IPv4 address: IPv4-compatible `::a.b.c.d`, 6to4
    /// `2002::/16`, Teredo `2001::/32`, NAT64 `64:ff9b::/96` and `64:ff9b:1::/48`.
    Ipv4Embedded,
    /// IPv6 site-local `fec0::/10` (deprecated, still routed inside some networks).
    SiteLocal,
}

impl fmt::Display for AddressClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Unspecified => "an unspecified address",
            Self::Loopback => "a loopback address",
            Self::Private => "a private-network address",
            Self::SharedCgnat => "a carrier-grade NAT (shared) address",
            Self::LinkLocal => "a link-local address",
            Self::UniqueLocal => "an IPv6 unique-local address",
            Self::CloudMetadata => "a cloud metadata service address",
            Self::Multicast => "a multicast address",
            Self::Broadcast => "the broadcast address",
            Self::Reserved => "a reserved address",
            Self::Documentation => "a documentation-only address",
            Self::Benchmarking => "a benchmarking-network address",
            Self::Ipv4Embedded => {
                "an IPv6 address that embeds or reaches an IPv4 one (IPv4-compatible, 6to4, Teredo or NAT64); use the IPv4 address itself"
            }
            Self::SiteLocal => "an IPv6 site-local address",
        })
    }
}

/// A refused URL or address, with a message a tenant can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Forbidden {
    #[error("url is not a valid absolute URL: {0}")]
    BadUrl(String),
    #[error("url scheme {0:?} is not allowed; use https")]
    Scheme(String),
    #[error("url has no host")]
    NoHost,
    #[error("url must not contain credentials (user:password@); use a header or the signature")]
    Credentials,
    #[error(
        "{ip} is {class}; the platform does not allow webhook deliveries there (ask the platform team to allowlist the network if this is intended)"
    )]
    Address { ip: IpAddr, class: AddressClass },
}

const METADATA_V4: [Ipv4Addr; 3] = [
    Ipv4Addr::new(169, 254, 169, 254), // AWS, GCP, Azure, OpenStack...
    Ipv4Addr::new(168, 63, 129, 16),   // Azure wire server (a public address)
    Ipv4Addr::new(100, 100, 100, 200), // Alibaba Cloud
];
const METADATA_V6: [Ipv6Addr; 1] = [Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254)];

/// The class that makes `ip` refused, if any.
pub fn classify(ip: IpAddr) -> Option<AddressClass> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => classify_v4(v4),
            None => classify_v6(v6),
        },
    }
}

fn classify_v4(ip: Ipv4Addr) -> Option<AddressClass> {
    let [a, b, ..] = ip.octets();
    Some(if METADATA_V4.contains(&ip) {
        AddressClass::CloudMetadata
    } else if ip.is_unspecified() || a == 0 {
        AddressClass::Unspecified
    } else if ip.is_loopback() {
        AddressClass::Loopback
    } else if ip.is_private() {
        AddressClass::Private
    } else if a == 100 && (64..128).contains(&b) {
        AddressClass::SharedCgnat
    } else if ip.is_link_local() {
        AddressClass::LinkLocal
    } else if ip.is_broadcast() {
        AddressClass::Broadcast
    } else if ip.is_multicast() {
        AddressClass::Multicast
    } else if in_v4(ip, [192, 0, 2, 0], 24)
        || in_v4(ip, [198, 51, 100, 0], 24)
        || in_v4(ip, [203, 0, 113, 0], 24)
    {
        AddressClass::Documentation
    } else if in_v4(ip, [198, 18, 0, 0], 15) {
        AddressClass::Benchmarking
    } else if a >= 240
        // IETF protocol assignments; the deprecated 6to4 relay anycast.
        || in_v4(ip, [192, 0, 0, 0], 24)
        || in_v4(ip, [192, 88, 99, 0], 24)
    {
        AddressClass::Reserved
    } else {
        return None;
    })
}

/// Whether `ip` is in `net`/`len`.
fn in_v4(ip: Ipv4Addr, net: [u8; 4], len: u32) -> bool {
    let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
    u32::from(ip) & mask == u32::from(Ipv4Addr::from(net)) & mask
}

/// Whether `ip` is in `net`/`len`.
fn in_v6(ip: Ipv6Addr, net: Ipv6Addr, len: u32) -> bool {
    let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
    u128::from(ip) & mask == u128::from(net) & mask
}

fn classify_v6(ip: Ipv6Addr) -> Option<AddressClass> {
    let v6 = |text: &str| text.parse::<Ipv6Addr>().expect("a literal network");
    Some(if METADATA_V6.contains(&ip) {
        AddressClass::CloudMetadata
    } else if ip.is_unspecified() {
        AddressClass::Unspecified
    } else if ip.is_loopback() {
        AddressClass::Loopback
    } else if ip.is_unique_local() {
        AddressClass::UniqueLocal
    } else if ip.is_unicast_link_local() {
        AddressClass::LinkLocal
    } else if in_v6(ip, v6("fec0::"), 10) {
        AddressClass::SiteLocal
    } else if ip.is_multicast() {
        AddressClass::Multicast
    } else if in_v6(ip, Ipv6Addr::UNSPECIFIED, 96)
        || in_v6(ip, v6("2002::"), 16)
        || in_v6(ip, v6("2001::"), 32)
        || in_v6(ip, v6("64:ff9b::"), 96)
        || in_v6(ip, v6("64:ff9b:1::"), 48)
    {
        // Each can reach an IPv4 address, private ones included.
        AddressClass::Ipv4Embedded
    } else if in_v6(ip, v6("2001:db8::"), 32) || in_v6(ip, v6("3fff::"), 20) {
        AddressClass::Documentation
    } else if in_v6(ip, v6("2001:2::"), 48) {
        AddressClass::Benchmarking
    } else if in_v6(ip, v6("2001::"), 23) // IETF protocol assignments
        || in_v6(ip, v6("100::"), 64) // discard-only
        || in_v6(ip, v6("5f00::"), 16)
    // SRv6 segment identifiers
    {
        AddressClass::Reserved
    } else {
        return None;
    })
}

impl AddressPolicy {
    /// A policy that allows everything on 127.0.0.0/8 and ::1 over http: for tests.
    pub fn loopback_for_tests() -> Self {
        Self {
            allow: vec!["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()],
            allow_http: true,
        }
    }

    /// Checks one resolved address.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), Forbidden> {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        match classify(ip) {
            Some(class) if !self.allow.iter().any(|net| net.contains(&ip)) => {
                Err(Forbidden::Address { ip, class })
            }
            _ => Ok(()),
        }
    }

    /// Checks the URL's form (scheme, host, no credentials) and, when its host is an IP
    /// literal, the address. Host names are checked on their resolved addresses.
    pub fn check_url(&self, raw: &str) -> Result<url::Url, Forbidden> {
        let url = url::Url::parse(raw).map_err(|e| Forbidden::BadUrl(e.to_string()))?;
        match url.scheme() {
            "https" => {}
            "http" if self.allow_http => {}
            other => return Err(Forbidden::Scheme(other.to_owned())),
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(Forbidden::Credentials);
        }
        self.check_host(url.host().ok_or(Forbidden::NoHost)?)?;
        Ok(url)
    }

    /// Checks a URL's host when it is an IP literal (which never goes through DNS, so
    /// the connect-time check on resolved addresses does not see it). Names pass here
    /// and are checked on what they resolve to.
    pub fn check_host(&self, host: url::Host<&str>) -> Result<(), Forbidden> {
        match host {
            url::Host::Ipv4(ip) => self.check_ip(IpAddr::V4(ip)),
            url::Host::Ipv6(ip) => self.check_ip(IpAddr::V6(ip)),
            url::Host::Domain(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(policy: &AddressPolicy, ip: &str) -> Option<AddressClass> {
        match policy.check_ip(ip.parse().unwrap()) {
            Err(Forbidden::Address { class, .. }) => Some(class),
            _ => None,
        }
    }

    #[test]
    fn refuses_internal_addresses_by_class() {
        let p = AddressPolicy::default();
        assert_eq!(
            refused(&p, "169.254.169.254"),
            Some(AddressClass::CloudMetadata)
        );
        assert_eq!(refused(&p, "10.0.0.1"), Some(AddressClass::Private));
        assert_eq!(refused(&p, "172.16.5.4"), Some(AddressClass::Private));
        assert_eq!(refused(&p, "192.168.1.1"), Some(AddressClass::Private));
        assert_eq!(refused(&p, "127.0.0.1"), Some(AddressClass::Loopback));
        assert_eq!(refused(&p, "0.0.0.0"), Some(AddressClass::Unspecified));
        assert_eq!(refused(&p, "100.64.1.1"), Some(AddressClass::SharedCgnat));
        assert_eq!(refused(&p, "169.254.1.1"), Some(AddressClass::LinkLocal));
        assert_eq!(refused(&p, "::1"), Some(AddressClass::Loopback));
        assert_eq!(refused(&p, "fd12::1"), Some(AddressClass::UniqueLocal));
        assert_eq!(refused(&p, "fe80::1"), Some(AddressClass::LinkLocal));
        assert_eq!(
            refused(&p, "fd00:ec2::254"),
            Some(AddressClass::CloudMetadata)
        );
        assert_eq!(refused(&p, "::ffff:10.1.2.3"), Some(AddressClass::Private));
        assert_eq!(
            refused(&p, "64:ff9b::a00:1"),
            Some(AddressClass::Ipv4Embedded)
        );
        assert_eq!(refused(&p, "93.184.216.34"), None);
        assert_eq!(refused(&p, "2606:2800:220:1::1"), None);
    }

    /// The special-purpose ranges of the IANA registries that are not globally
    /// reachable, and the IPv6 forms that reach an IPv4 address.
    #[test]
    fn refuses_every_special_purpose_range() {
        let p = AddressPolicy::default();
        for (ip, class) in [
            ("::10.0.0.1", AddressClass::Ipv4Embedded), // IPv4-compatible
            ("::8.8.8.8", AddressClass::Ipv4Embedded),
            ("2002:a00:1::1", AddressClass::Ipv4Embedded), // 6to4 of 10.0.0.1
            (
                "2001:0:4136:e378:8000:63bf:3fff:fdd2",
                AddressClass::Ipv4Embedded,
            ), // Teredo
            ("64:ff9b:1::a00:1", AddressClass::Ipv4Embedded), // local-use NAT64
            ("fec0::1", AddressClass::SiteLocal),
            ("feff::1", AddressClass::SiteLocal),
            ("198.18.0.1", AddressClass::Benchmarking),
            ("198.19.255.254", AddressClass::Benchmarking),
            ("2001:2::1", AddressClass::Benchmarking),
            ("192.0.2.10", AddressClass::Documentation),
            ("198.51.100.7", AddressClass::Documentation),
            ("203.0.113.99", AddressClass::Documentation),
            ("2001:db8::1", AddressClass::Documentation),
            ("3fff::1", AddressClass::Documentation),
            ("192.0.0.9", AddressClass::Reserved),
            ("192.88.99.1", AddressClass::Reserved),
            ("100::1", AddressClass::Reserved),
            ("2001:10::1", AddressClass::Reserved), // ORCHID, in 2001::/23
            ("5f00::1", AddressClass::Reserved),
            ("fc00::1", AddressClass::UniqueLocal),
            ("ff02::1", AddressClass::Multicast),
            ("224.0.0.1", AddressClass::Multicast),
        ] {
            assert_eq!(refused(&p, ip), Some(class), "{ip}");
        }
        // Neighbours of those ranges stay allowed.
        for ip in [
            "198.17.255.255",
            "198.20.0.0",
            "192.0.3.1",
            "2003::1",
            "2001:200::1",
            "fe00::1",
        ] {
            assert_eq!(refused(&p, ip), None, "{ip}");
        }
        // The IPv4-compatible address of an allowlisted network is still refused: it is
        // not the address the platform allowed.
        let allow = AddressPolicy {
            allow: vec!["10.0.0.0/8".parse().unwrap()],
            allow_http: false,
        };
        assert_eq!(refused(&allow, "10.0.0.1"), None);
        assert_eq!(
            refused(&allow, "::10.0.0.1"),
            Some(AddressClass::Ipv4Embedded)
        );
    }

    #[test]
    fn the_allowlist_opens_a_network() {
        let p = AddressPolicy {
            allow: vec!["10.20.0.0/16".parse().unwrap()],
            allow_http: false,
        };
        assert_eq!(refused(&p, "10.20.3.4"), None);
        assert_eq!(refused(&p, "10.21.3.4"), Some(AddressClass::Private));
        assert_eq!(
            refused(&AddressPolicy::loopback_for_tests(), "127.0.0.1"),
            None
        );
    }

    #[test]
    fn checks_url_form_and_ip_literals() {
        let p = AddressPolicy::default();
        assert!(p.check_url("https://hooks.example.com/x").is_ok());
        assert_eq!(
            p.check_url("http://hooks.example.com/x"),
            Err(Forbidden::Scheme("http".into()))
        );
        assert_eq!(
            p.check_url("https://u:p@example.com/"),
            Err(Forbidden::Credentials)
        );
        assert!(matches!(
            p.check_url("https://[::1]:8443/"),
            Err(Forbidden::Address {
                class: AddressClass::Loopback,
                ..
            })
        ));
        let msg = p
            .check_url("https://169.254.169.254/latest")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("cloud metadata"), "{msg}");
    }
}
