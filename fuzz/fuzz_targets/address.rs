//! `herald_core::ssrf`: the URL and address policy.
//!
//! Compared against classifications made independently of `ssrf.rs`:
//! - every address of an obvious internal class (by `std`'s own `is_loopback`,
//!   `is_private`, ... and the CGNAT and cloud-metadata ranges) is refused;
//! - every address that `std`'s `is_global` (the IANA special-purpose registries, still
//!   unstable, hence `feature(ip)`) calls not global is refused, IPv4-mapped IPv6 judged as
//!   the IPv4 address it maps;
//! - an allowlisted address passes, a refused one is refused with `classify`'s class;
//! - an accepted URL has an allowed scheme, no credentials and, when its host is an IP
//!   literal in any of the notations URL parsing accepts, an allowed address; it is
//!   accepted again when checked in its normalized form.
#![no_main]
#![feature(ip)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use arbitrary::Arbitrary;
use herald_core::ssrf::{AddressPolicy, Forbidden, classify};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    address: Address,
    /// An allowlisted network: an address and a prefix length.
    allow: Option<(Address, u8)>,
    allow_http: bool,
    url: String,
    /// A URL built around an address literal, with an optional written-out prefix.
    url_host: Option<(Address, String, String)>,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Address {
    V4([u8; 4]),
    V6([u8; 16]),
    /// IPv4-mapped IPv6 (`::ffff:a.b.c.d`), which the policy judges as the IPv4 address.
    Mapped([u8; 4]),
}

impl Address {
    fn ip(self) -> IpAddr {
        match self {
            Self::V4(o) => IpAddr::V4(Ipv4Addr::from(o)),
            Self::V6(o) => IpAddr::V6(Ipv6Addr::from(o)),
            Self::Mapped(o) => IpAddr::V6(Ipv4Addr::from(o).to_ipv6_mapped()),
        }
    }
}

/// The internal classes every policy refuses, from `std` and the ranges' definitions.
fn obviously_internal(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            let checks = [
                (v4.is_unspecified() || a == 0, "this network"),
                (v4.is_loopback(), "loopback"),
                (v4.is_private(), "private"),
                (v4.is_link_local(), "link-local"),
                (v4.is_multicast(), "multicast"),
                (v4.is_broadcast(), "broadcast"),
                (v4.is_documentation(), "documentation"),
                (a == 100 && (b & 0xc0) == 64, "CGNAT 100.64.0.0/10"),
                (a >= 240, "reserved 240.0.0.0/4"),
                (v4 == Ipv4Addr::new(168, 63, 129, 16), "Azure wire server"),
                (v4 == Ipv4Addr::new(100, 100, 100, 200), "Alibaba metadata"),
            ];
            checks
                .into_iter()
                .find(|(hit, _)| *hit)
                .map(|(_, what)| what)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return obviously_internal(IpAddr::V4(v4));
            }
            let s = v6.segments();
            let checks = [
                (v6.is_unspecified(), "unspecified"),
                (v6.is_loopback(), "loopback"),
                (v6.is_multicast(), "multicast"),
                (v6.is_unique_local(), "unique local fc00::/7"),
                (v6.is_unicast_link_local(), "link-local fe80::/10"),
                ((s[0] & 0xffc0) == 0xfec0, "site-local fec0::/10"),
                (
                    s[0] == 0x2001 && s[1] == 0x0db8,
                    "documentation 2001:db8::/32",
                ),
                (s[0] == 0x2002, "6to4 2002::/16"),
                (s[0] == 0x2001 && s[1] == 0, "Teredo 2001::/32"),
                (s[..6] == [0x64, 0xff9b, 0, 0, 0, 0], "NAT64 64:ff9b::/96"),
                (s[..6] == [0; 6], "IPv4-compatible ::/96"),
            ];
            checks
                .into_iter()
                .find(|(hit, _)| *hit)
                .map(|(_, what)| what)
        }
    }
}

fn refused(policy: &AddressPolicy, ip: IpAddr) -> bool {
    matches!(policy.check_ip(ip), Err(Forbidden::Address { .. }))
}

fuzz_target!(|input: Input| {
    let ip = input.address.ip();
    let default = AddressPolicy::default();
    let judged = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    };

    if let Some(what) = obviously_internal(ip) {
        assert!(refused(&default, ip), "{ip} ({what}) allowed");
    }
    if !judged.is_global() {
        assert!(refused(&default, ip), "{ip} is not global, yet allowed");
    }
    match default.check_ip(ip) {
        Ok(()) => assert_eq!(classify(ip), None),
        Err(Forbidden::Address { ip: shown, class }) => {
            assert_eq!(Some(class), classify(ip));
            assert_eq!(shown, judged);
        }
        Err(other) => panic!("check_ip refused {ip} with {other:?}"),
    }

    // The allowlist opens exactly its network.
    if let Some((net_address, len)) = input.allow {
        let net_ip = net_address.ip();
        let max = if net_ip.is_ipv4() { 32 } else { 128 };
        let net = ipnet::IpNet::new(net_ip, len % (max + 1)).expect("a valid prefix");
        let policy = AddressPolicy {
            allow: vec![net],
            allow_http: input.allow_http,
        };
        let expect_refused = classify(judged).is_some() && !net.contains(&judged);
        assert_eq!(
            refused(&policy, ip),
            expect_refused,
            "{ip} with allow {net}"
        );
    }

    // URLs.
    let policy = AddressPolicy {
        allow: Vec::new(),
        allow_http: input.allow_http,
    };
    let mut urls = vec![input.url.clone()];
    if let Some((address, prefix, suffix)) = &input.url_host {
        let host = match address.ip() {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => format!("[{v6}]"),
        };
        urls.push(format!("https://{host}{suffix}"));
        urls.push(format!("{prefix}{host}{suffix}"));
        // The decimal, hexadecimal and octal forms URL parsing also reads as IPv4.
        if let IpAddr::V4(v4) = address.ip() {
            let n = u32::from(v4);
            urls.push(format!("https://{n}{suffix}"));
            urls.push(format!("https://0x{n:x}{suffix}"));
            urls.push(format!("https://0{n:o}{suffix}"));
            let [a, b, ..] = v4.octets();
            urls.push(format!("https://{a}.{}/", n & 0x00ff_ffff));
            urls.push(format!("https://0x{a:x}.0{b:o}.{}/", n & 0xffff));
        }
    }
    for raw in &urls {
        let Ok(url) = policy.check_url(raw) else {
            continue;
        };
        match url.scheme() {
            "https" => {}
            "http" => assert!(input.allow_http, "{raw}: http without allow_http"),
            other => panic!("{raw}: scheme {other}"),
        }
        assert!(
            url.username().is_empty() && url.password().is_none(),
            "{raw}"
        );
        match url.host().expect("an accepted URL has a host") {
            url::Host::Ipv4(v4) => assert!(!refused(&policy, IpAddr::V4(v4)), "{raw}"),
            url::Host::Ipv6(v6) => assert!(!refused(&policy, IpAddr::V6(v6)), "{raw}"),
            // URL parsing reads `a.b.c.d.` (one final dot) as an address; anything it
            // leaves a name goes through DNS, and the dispatcher checks what that
            // resolves to at connect time (so `1.2.3.4..` is a name, fine here).
            url::Host::Domain(domain) => {
                let bare = domain.strip_suffix('.').unwrap_or(domain);
                assert!(
                    bare.parse::<IpAddr>().is_err(),
                    "{raw}: IP literal {domain:?} taken for a name"
                );
            }
        }
        assert_eq!(policy.check_url(url.as_str()).as_ref(), Ok(&url), "{raw}");
    }
});
