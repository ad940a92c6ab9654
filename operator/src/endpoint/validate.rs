//! Validation of a `WebhookEndpoint` beyond what the CRD schema can check.
//!
//! Contract: [`lookup`] is the only IO (DNS); everything else is pure:
//! [`check_spec`] (patterns, URL form, IP-literal hosts), [`check_proxy`] (the egress
//! proxy is one the platform allows), [`check_addresses`] (every
//! address the host resolved to), [`check_secret`] (the dereferenced `SigningSecret`),
//! and [`endpoint`], which combines them in the order a tenant should fix things. Each
//! failure is an [`Invalid`] with a reason from `herald_core::names::reason` and a
//! message a tenant can act on.

use std::net::IpAddr;
use std::time::Duration;

use herald_core::egress::Egress;
use herald_core::names::{condition, reason};
use herald_core::pattern::Pattern;
use herald_core::ssrf::AddressPolicy;
use herald_core::v1alpha1::{SigningSecret, WebhookEndpointSpec};

use crate::conditions;

/// How often an unresolvable host is retried.
pub const UNRESOLVABLE_RETRY: Duration = Duration::from_secs(60);
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why an endpoint cannot be delivered to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    pub reason: &'static str,
    pub message: String,
    /// Check again after this long even without a change (the cause is outside
    /// Kubernetes, e.g. DNS).
    pub retry: Option<Duration>,
}

impl Invalid {
    pub fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
            retry: None,
        }
    }
}

/// Pure checks of the spec: every pattern compiles, the URL is allowed by its form.
pub fn check_spec(spec: &WebhookEndpointSpec, policy: &AddressPolicy) -> Result<url::Url, Invalid> {
    for (i, pattern) in spec.event_types.iter().enumerate() {
        if let Err(e) = pattern.parse::<Pattern>() {
            return Err(Invalid::new(
                reason::INVALID_SPEC,
                format!("spec.eventTypes[{i}] {pattern:?} is not a valid pattern: {e}"),
            ));
        }
    }
    policy
        .check_url(&spec.url)
        .map_err(|e| Invalid::new(reason::URL_FORBIDDEN, format!("spec.url: {e}")))
}

/// The endpoint's egress proxy choice is one the dispatchers allow (the same flags).
pub fn check_proxy(spec: &WebhookEndpointSpec, egress: &Egress) -> Result<(), Invalid> {
    egress
        .check(spec.delivery.proxy.as_ref())
        .map_err(|message| Invalid::new(reason::PROXY_NOT_ALLOWED, message))
}

/// What the host of an endpoint URL resolved to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    Addresses(Vec<IpAddr>),
    /// The lookup failed or timed out; the detail is for the tenant.
    Failed(String),
}

/// Resolves the URL's host; `None` when the host is an IP literal (nothing to look up).
pub async fn lookup(url: &url::Url) -> Option<Lookup> {
    let Some(url::Host::Domain(host)) = url.host() else {
        return None;
    };
    let port = url.port_or_known_default().unwrap_or(443);
    let found = tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((host, port))).await;
    Some(match found {
        Ok(Ok(addrs)) => Lookup::Addresses(addrs.map(|a| a.ip()).collect()),
        Ok(Err(e)) => Lookup::Failed(e.to_string()),
        Err(_) => Lookup::Failed("timed out".into()),
    })
}

/// Checks every address the URL's host resolved to. A resolution failure is not a
/// refusal: it is reported as `UrlUnresolvable` and retried, since the name may simply
/// not exist yet.
pub fn check_addresses(
    url: &url::Url,
    lookup: Option<&Lookup>,
    policy: &AddressPolicy,
) -> Result<(), Invalid> {
    let Some(lookup) = lookup else {
        return Ok(());
    };
    let host = url.host_str().unwrap_or_default();
    let unresolvable = |detail: &str| Invalid {
        reason: reason::URL_UNRESOLVABLE,
        message: format!(
            "spec.url: host {host} does not resolve ({detail}); Herald retries every {}s",
            UNRESOLVABLE_RETRY.as_secs()
        ),
        retry: Some(UNRESOLVABLE_RETRY),
    };
    let addrs = match lookup {
        Lookup::Failed(detail) => return Err(unresolvable(detail)),
        Lookup::Addresses(addrs) if addrs.is_empty() => return Err(unresolvable("no addresses")),
        Lookup::Addresses(addrs) => addrs,
    };
    for addr in addrs {
        policy.check_ip(*addr).map_err(|e| {
            Invalid::new(
                reason::URL_FORBIDDEN,
                format!("spec.url: host {host} resolves to {e}"),
            )
        })?;
    }
    Ok(())
}

/// [`lookup`] then [`check_addresses`].
pub async fn resolve(url: &url::Url, policy: &AddressPolicy) -> Result<(), Invalid> {
    check_addresses(url, lookup(url).await.as_ref(), policy)
}

/// The whole validation of an endpoint, given what was dereferenced: `url` is the
/// outcome of [`check_spec`]. The URL first: a forbidden destination is the problem to
/// report even while the secret is still being created.
pub fn endpoint(
    url: &Result<url::Url, Invalid>,
    lookup: Option<&Lookup>,
    policy: &AddressPolicy,
    secret_name: &str,
    secret: Option<&SigningSecret>,
) -> Result<(), Invalid> {
    let url = url.as_ref().map_err(Clone::clone)?;
    check_addresses(url, lookup, policy)?;
    check_secret(secret_name, secret)
}

/// The referenced `SigningSecret` must exist and have an active key.
pub fn check_secret(name: &str, secret: Option<&SigningSecret>) -> Result<(), Invalid> {
    let Some(secret) = secret else {
        return Err(Invalid::new(
            reason::SECRET_NOT_FOUND,
            format!(
                "SigningSecret {name} (spec.secretRef) does not exist in this namespace; create it and Herald generates its key"
            ),
        ));
    };
    let status = secret.status.clone().unwrap_or_default();
    if status.active_key_id.is_none() || !conditions::is_true(&status.conditions, condition::READY)
    {
        let why = conditions::find(&status.conditions, condition::READY)
            .map(|c| format!(": {}", c.message))
            .unwrap_or_default();
        return Err(Invalid::new(
            reason::SECRET_NOT_READY,
            format!("SigningSecret {name} has no usable key yet{why}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_core::v1alpha1::{LocalRef, SigningSecretSpec};

    fn spec(url: &str, types: &[&str]) -> WebhookEndpointSpec {
        serde_json::from_value(serde_json::json!({
            "url": url,
            "eventTypes": types,
            "secretRef": LocalRef::new("s"),
        }))
        .unwrap()
    }

    #[test]
    fn internal_addresses_are_refused_naming_the_class() {
        let policy = AddressPolicy::default();
        for (url, class) in [
            ("https://169.254.169.254/", "cloud metadata"),
            ("https://10.0.0.1/", "private-network"),
            ("https://[::1]/", "loopback"),
        ] {
            let err = check_spec(&spec(url, &["a"]), &policy).unwrap_err();
            assert_eq!(err.reason, reason::URL_FORBIDDEN);
            assert!(err.message.contains(class), "{url}: {}", err.message);
        }
        assert!(check_spec(&spec("https://hooks.example.com/", &["order.*"]), &policy).is_ok());
        let http = check_spec(&spec("http://hooks.example.com/", &["a"]), &policy).unwrap_err();
        assert!(http.message.contains("https"), "{}", http.message);
    }

    /// The egress proxy an endpoint picks must be one the platform configured (the flags
    /// the dispatchers take too); direct only where it is allowed.
    #[test]
    fn only_a_proxy_the_platform_allows_is_accepted() {
        use clap::Parser;
        #[derive(Parser)]
        struct Flags {
            #[command(flatten)]
            egress: herald_core::egress::EgressArgs,
        }
        let egress = |args: &[&str]| {
            Flags::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
                .unwrap()
                .egress
                .egress()
                .unwrap()
        };
        let with = |proxy: serde_json::Value| {
            let mut spec = spec("https://hooks.example.com/", &["a"]);
            spec.delivery.proxy = serde_json::from_value(proxy).unwrap();
            spec
        };
        let none = egress(&[]);
        let platform = egress(&[
            "--egress-proxy",
            "http://squid:3128",
            "--egress-proxy-named",
            "eu=http://eu:3128",
        ]);
        assert_eq!(check_proxy(&with(serde_json::Value::Null), &none), Ok(()));
        assert_eq!(
            check_proxy(&with(serde_json::json!({"direct": true})), &none),
            Ok(())
        );
        assert_eq!(
            check_proxy(&with(serde_json::json!({"name": "eu"})), &platform),
            Ok(())
        );
        for (proxy, egress, says) in [
            (
                serde_json::json!({"name": "eu"}),
                &none,
                "it has no egress proxies",
            ),
            (
                serde_json::json!({"name": "us"}),
                &platform,
                "(allowed: default, eu)",
            ),
            (
                serde_json::json!({"direct": true}),
                &platform,
                "direct is not allowed",
            ),
        ] {
            let err = check_proxy(&with(proxy.clone()), egress).unwrap_err();
            assert_eq!(err.reason, reason::PROXY_NOT_ALLOWED, "{proxy}");
            assert!(
                err.message.contains("spec.delivery.proxy"),
                "{}",
                err.message
            );
            assert!(err.message.contains(says), "{proxy}: {}", err.message);
        }
    }

    #[test]
    fn bad_patterns_name_the_entry() {
        let err = check_spec(
            &spec("https://h.example/", &["a", "b..c"]),
            &AddressPolicy::default(),
        )
        .unwrap_err();
        assert_eq!(err.reason, reason::INVALID_SPEC);
        assert!(err.message.contains("eventTypes[1]"), "{}", err.message);
    }

    #[test]
    fn the_url_is_reported_before_the_secret() {
        let policy = AddressPolicy::default();
        let url = url::Url::parse("https://hooks.example.com/").unwrap();
        let private = Lookup::Addresses(vec!["10.1.2.3".parse().unwrap()]);
        let err = endpoint(&Ok(url.clone()), Some(&private), &policy, "s", None).unwrap_err();
        assert_eq!(err.reason, reason::URL_FORBIDDEN);
        let failed = Lookup::Failed("NXDOMAIN".into());
        let err = endpoint(&Ok(url.clone()), Some(&failed), &policy, "s", None).unwrap_err();
        assert_eq!(err.reason, reason::URL_UNRESOLVABLE);
        assert_eq!(err.retry, Some(UNRESOLVABLE_RETRY));
        let public = Lookup::Addresses(vec!["93.184.215.14".parse().unwrap()]);
        let err = endpoint(&Ok(url), Some(&public), &policy, "s", None).unwrap_err();
        assert_eq!(err.reason, reason::SECRET_NOT_FOUND);
    }

    #[test]
    fn secrets_must_exist_and_be_ready() {
        assert_eq!(
            check_secret("s", None).unwrap_err().reason,
            reason::SECRET_NOT_FOUND
        );
        let s = SigningSecret::new(
            "s",
            SigningSecretSpec {
                secret_name: None,
                algorithm: None,
                rotation: Default::default(),
            },
        );
        assert_eq!(
            check_secret("s", Some(&s)).unwrap_err().reason,
            reason::SECRET_NOT_READY
        );
    }

    #[tokio::test]
    async fn names_resolving_to_loopback_are_refused() {
        let url = url::Url::parse("https://localhost/").unwrap();
        let err = resolve(&url, &AddressPolicy::default()).await.unwrap_err();
        assert_eq!(err.reason, reason::URL_FORBIDDEN);
        assert!(err.message.contains("loopback"), "{}", err.message);
        assert!(
            resolve(&url, &AddressPolicy::loopback_for_tests())
                .await
                .is_ok()
        );
        let nowhere = url::Url::parse("https://does-not-exist.invalid/").unwrap();
        assert_eq!(
            check_addresses(
                &nowhere,
                Some(&Lookup::Addresses(vec![])),
                &AddressPolicy::default()
            )
            .unwrap_err()
            .reason,
            reason::URL_UNRESOLVABLE
        );
        assert_eq!(
            resolve(&nowhere, &AddressPolicy::default())
                .await
                .unwrap_err()
                .reason,
            reason::URL_UNRESOLVABLE
        );
    }
}
