//! Validation of a `WebhookEndpoint` beyond what the CRD schema can check.
//!
//! Contract: [`check_spec`] is pure (patterns, URL form, IP-literal hosts); [`resolve`]
//! resolves the host and checks every address; [`check_secret`] is pure over the
//! dereferenced `SigningSecret`. Each failure is an [`Invalid`] with a reason from
//! `herald_core::names::reason` and a message a tenant can act on.

use std::time::Duration;

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
    fn new(reason: &'static str, message: impl Into<String>) -> Self {
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

/// Resolves the URL's host (when it is a name) and checks every address it resolves to.
/// A resolution failure is not a refusal: it is reported as `UrlUnresolvable` and
/// retried, since the name may simply not exist yet.
pub async fn resolve(url: &url::Url, policy: &AddressPolicy) -> Result<(), Invalid> {
    let Some(url::Host::Domain(host)) = url.host() else {
        return Ok(());
    };
    let port = url.port_or_known_default().unwrap_or(443);
    let unresolvable = |detail: String| Invalid {
        reason: reason::URL_UNRESOLVABLE,
        message: format!(
            "spec.url: host {host} does not resolve ({detail}); Herald retries every {}s",
            UNRESOLVABLE_RETRY.as_secs()
        ),
        retry: Some(UNRESOLVABLE_RETRY),
    };
    let addrs =
        match tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((host, port))).await {
            Ok(Ok(addrs)) => addrs.collect::<Vec<_>>(),
            Ok(Err(e)) => return Err(unresolvable(e.to_string())),
            Err(_) => return Err(unresolvable("timed out".into())),
        };
    if addrs.is_empty() {
        return Err(unresolvable("no addresses".into()));
    }
    for addr in addrs {
        policy.check_ip(addr.ip()).map_err(|e| {
            Invalid::new(
                reason::URL_FORBIDDEN,
                format!("spec.url: host {host} resolves to {e}"),
            )
        })?;
    }
    Ok(())
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
    fn secrets_must_exist_and_be_ready() {
        assert_eq!(
            check_secret("s", None).unwrap_err().reason,
            reason::SECRET_NOT_FOUND
        );
        let s = SigningSecret::new(
            "s",
            SigningSecretSpec {
                secret_name: None,
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
            resolve(&nowhere, &AddressPolicy::default())
                .await
                .unwrap_err()
                .reason,
            reason::URL_UNRESOLVABLE
        );
    }
}
