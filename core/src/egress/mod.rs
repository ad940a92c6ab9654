//! Which way a delivery leaves the cluster: directly, or through one of the HTTP proxies
//! the platform configured (`--egress-proxy`, `--egress-proxy-named`). Both binaries take
//! the same flags: the dispatcher connects through the proxies, the operator refuses an
//! endpoint whose `spec.delivery.proxy` the dispatcher would refuse (a condition, not an
//! attempt log full of refusals). Proxies are
//! operator-trusted configuration, so their own addresses are not checked against the
//! address policy; an endpoint may only pick one by name ([`EgressProxy`]), never give an
//! address, so a tenant cannot route through a host of its choosing. Pure: the flags,
//! the proxy set they describe and the routing decision.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::v1alpha1::EgressProxy;
use base64::Engine;
use ipnet::IpNet;

/// The name of the dispatcher-wide proxy (`--egress-proxy`) among the named ones.
pub const DEFAULT_PROXY: &str = "default";

/// Egress flags.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct EgressArgs {
    /// HTTP proxy every delivery goes through unless its endpoint picks another
    /// (`http://host:port`); unset, deliveries connect directly. Named `default`.
    #[arg(long = "egress-proxy", env = "HERALD_EGRESS_PROXY")]
    pub proxy: Option<String>,
    /// More proxies endpoints may pick by name (`spec.delivery.proxy.name`), as
    /// comma-separated `NAME=http://host:port`.
    #[arg(
        long = "egress-proxy-named",
        env = "HERALD_EGRESS_PROXIES",
        value_delimiter = ','
    )]
    pub named: Vec<String>,
    /// Targets the default proxy is not used for (comma-separated): a host name (also
    /// matching its subdomains), `.domain` (subdomains only), or an IP network such as
    /// `10.0.0.0/8` (matching URLs whose host is an address in it).
    #[arg(
        long = "egress-no-proxy",
        env = "HERALD_EGRESS_NO_PROXY",
        value_delimiter = ','
    )]
    pub no_proxy: Vec<String>,
    /// Let endpoints bypass the default proxy with `spec.delivery.proxy.direct: true`.
    #[arg(long = "egress-allow-direct", env = "HERALD_EGRESS_ALLOW_DIRECT")]
    pub allow_direct: bool,
    /// Directory of proxy credentials: the file named after a proxy (`default` for
    /// `--egress-proxy`) holds `user:password`, sent as Basic `Proxy-Authorization` on
    /// CONNECT. Credentials are never accepted in a proxy URL.
    #[arg(
        long = "egress-proxy-credentials",
        env = "HERALD_EGRESS_PROXY_CREDENTIALS"
    )]
    pub credentials: Option<PathBuf>,
}

/// A proxy the platform allows.
#[derive(Clone, PartialEq, Eq)]
pub struct ProxyDef {
    pub name: String,
    pub host: String,
    pub port: u16,
    /// The `Proxy-Authorization` value; never printed.
    authorization: Option<String>,
}

impl ProxyDef {
    /// The `Proxy-Authorization` value to send on CONNECT, if the proxy has credentials.
    pub fn authorization(&self) -> Option<&str> {
        self.authorization.as_deref()
    }
}

impl std::fmt::Debug for ProxyDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")?;
        if self.authorization.is_some() {
            f.write_str(" with credentials")?;
        }
        Ok(())
    }
}

/// How errors and logs name a proxy: its name and address, never its credentials.
impl std::fmt::Display for ProxyDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "{:?} ([{}]:{})", self.name, self.host, self.port)
        } else {
            write!(f, "{:?} ({}:{})", self.name, self.host, self.port)
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error("egress proxy {name:?}: {problem}")]
    Proxy { name: String, problem: String },
    #[error("--egress-proxy-named {0:?}: expected NAME=http://host:port")]
    Named(String),
    #[error("egress proxy name {0:?} is used twice")]
    Duplicate(String),
    #[error("--egress-no-proxy {0:?}: expected a host name, .domain or an IP network")]
    NoProxy(String),
    #[error("reading the credentials of egress proxy {name:?} from {path}: {source}")]
    Credentials {
        name: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The proxies a dispatcher knows and how it picks one.
#[derive(Debug, Clone, Default)]
pub struct Egress {
    pub proxies: BTreeMap<String, ProxyDef>,
    /// Whether `--egress-proxy` is set (it is then `proxies["default"]`).
    pub has_default: bool,
    no_proxy: Vec<NoProxy>,
    allow_direct: bool,
}

#[derive(Debug, Clone)]
enum NoProxy {
    Host(String),
    Subdomains(String),
    Network(IpNet),
}

/// Which way one delivery goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route<'a> {
    Direct,
    Proxy(&'a ProxyDef),
    /// The endpoint picked a way the platform does not allow; the text says why.
    Refused(String),
}

impl EgressArgs {
    /// The proxy set these flags describe; reads the credentials files.
    pub fn egress(&self) -> Result<Egress, EgressError> {
        let Self {
            proxy,
            named,
            no_proxy,
            allow_direct,
            credentials,
        } = self;
        let mut proxies = BTreeMap::new();
        let default = proxy.iter().map(|url| (DEFAULT_PROXY, url.as_str()));
        let named = named.iter().filter(|n| !n.trim().is_empty()).map(|entry| {
            entry
                .split_once('=')
                .map(|(name, url)| (name.trim(), url.trim()))
                .ok_or_else(|| EgressError::Named(entry.clone()))
        });
        for pair in default.map(Ok).chain(named) {
            let (name, url) = pair?;
            let mut def = parse_proxy(name, url)?;
            if let Some(dir) = credentials {
                def.authorization = read_credentials(dir, name)?;
            }
            if proxies.insert(name.to_owned(), def).is_some() {
                return Err(EgressError::Duplicate(name.to_owned()));
            }
        }
        let no_proxy = no_proxy
            .iter()
            .map(|s| s.trim())
            .filter(|s| !s.is_empty())
            .map(parse_no_proxy)
            .collect::<Result<_, _>>()?;
        Ok(Egress {
            proxies,
            has_default: proxy.is_some(),
            no_proxy,
            allow_direct: *allow_direct,
        })
    }
}

fn parse_proxy(name: &str, raw: &str) -> Result<ProxyDef, EgressError> {
    let problem = |problem: &str| EgressError::Proxy {
        name: name.to_owned(),
        problem: problem.to_owned(),
    };
    let valid_name = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if !valid_name {
        return Err(problem(
            "a name is lower-case letters, digits and '-' (at most 63)",
        ));
    }
    // Not printed: a URL with credentials in it would be.
    let url = url::Url::parse(raw).map_err(|_| problem("not a valid URL"))?;
    if url.scheme() != "http" {
        return Err(problem(
            "the URL must be http://host:port (CONNECT over plain HTTP)",
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(problem(
            "credentials in the URL are refused; put user:password in the --egress-proxy-credentials directory",
        ));
    }
    if !matches!(url.path(), "" | "/") || url.query().is_some() {
        return Err(problem("the URL must be http://host:port, no path"));
    }
    let host = match url.host() {
        Some(url::Host::Ipv6(ip)) => ip.to_string(),
        Some(host) => host.to_string(),
        None => return Err(problem("the URL has no host")),
    };
    Ok(ProxyDef {
        name: name.to_owned(),
        host,
        port: url.port_or_known_default().unwrap_or(80),
        authorization: None,
    })
}

/// `Basic base64(user:password)` from `<dir>/<name>`, or nothing when there is no file.
fn read_credentials(dir: &Path, name: &str) -> Result<Option<String>, EgressError> {
    let path = dir.join(name);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let pair = text.trim_end_matches(['\r', '\n']);
            Ok((!pair.is_empty()).then(|| {
                format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(pair)
                )
            }))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(EgressError::Credentials {
            name: name.to_owned(),
            path,
            source,
        }),
    }
}

fn parse_no_proxy(entry: &str) -> Result<NoProxy, EgressError> {
    if let Ok(net) = entry.parse::<IpNet>() {
        return Ok(NoProxy::Network(net));
    }
    if let Ok(ip) = entry.parse::<std::net::IpAddr>() {
        return Ok(NoProxy::Network(IpNet::from(ip)));
    }
    let host = entry.to_ascii_lowercase();
    let (sub, name) = match host.strip_prefix('.') {
        Some(rest) => (true, rest.to_owned()),
        None => (false, host),
    };
    let valid = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    match (valid, sub) {
        (false, _) => Err(EgressError::NoProxy(entry.to_owned())),
        (true, true) => Ok(NoProxy::Subdomains(name)),
        (true, false) => Ok(NoProxy::Host(name)),
    }
}

impl NoProxy {
    fn matches(&self, host: &str) -> bool {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        match self {
            Self::Network(net) => host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| net.contains(&ip)),
            Self::Host(name) => {
                host.eq_ignore_ascii_case(name)
                    || host.to_ascii_lowercase().ends_with(&format!(".{name}"))
            }
            Self::Subdomains(name) => host.to_ascii_lowercase().ends_with(&format!(".{name}")),
        }
    }
}

impl Egress {
    /// The way a delivery to `host` goes, given the endpoint's choice: its named proxy
    /// (only one the platform allows), direct (only where the platform allows it or has no
    /// default proxy), or else the default proxy unless `--egress-no-proxy` matches.
    pub fn route(&self, choice: Option<&EgressProxy>, host: &str) -> Route<'_> {
        if let Err(why) = self.check(choice) {
            return Route::Refused(why);
        }
        match choice {
            Some(EgressProxy {
                name: Some(name), ..
            }) => self.proxies.get(name).map_or(Route::Direct, Route::Proxy),
            Some(EgressProxy { direct: true, .. }) => Route::Direct,
            _ => match self.proxies.get(DEFAULT_PROXY) {
                Some(proxy)
                    if self.has_default && !self.no_proxy.iter().any(|e| e.matches(host)) =>
                {
                    Route::Proxy(proxy)
                }
                _ => Route::Direct,
            },
        }
    }

    /// Whether an endpoint's choice is one the platform allows: a configured proxy's
    /// name, or direct where there is no default proxy or direct egress is allowed. The
    /// error is the message for the tenant, naming the field and what is allowed.
    pub fn check(&self, choice: Option<&EgressProxy>) -> Result<(), String> {
        match choice {
            Some(EgressProxy {
                name: Some(name), ..
            }) if !self.proxies.contains_key(name) => {
                let allowed: Vec<&str> = self.proxies.keys().map(String::as_str).collect();
                Err(if allowed.is_empty() {
                    format!(
                        "spec.delivery.proxy.name {name:?} is not a proxy this platform allows: it has no egress proxies"
                    )
                } else {
                    format!(
                        "spec.delivery.proxy.name {name:?} is not a proxy this platform allows (allowed: {})",
                        allowed.join(", ")
                    )
                })
            }
            Some(EgressProxy {
                name: None,
                direct: true,
            }) if self.has_default && !self.allow_direct => Err(
                "spec.delivery.proxy.direct is not allowed: this platform sends deliveries through its egress proxy".to_owned(),
            ),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests;
