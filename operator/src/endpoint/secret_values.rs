//! What an endpoint takes from Secrets: header values (`spec.headers[].valueFrom`, the
//! credential a receiver demands beyond the signature — a bearer token, basic auth, an API
//! key — kept out of the resource and of git) and its TLS material (`spec.tls`: a client
//! certificate for mutual TLS, a CA for the receiver).
//!
//! Contract: [`resolve`] is the only IO — a GET of each Secret the endpoint names, with
//! the operator's identity, at each reconcile of an endpoint that names any (no watch on
//! every Secret of the cluster: those reconciles come again every
//! [`crate::Config::header_secret_refresh`], which is how a changed Secret reaches the
//! deliveries). [`value_of`] and [`tls_material`] are pure. Values never reach status,
//! Events or logs: a problem names the field, the Secret and the key, and what is wrong,
//! never the value.

use std::collections::BTreeMap;
use std::sync::Arc;

use herald_core::dataplane::TlsMaterial;
use herald_core::names::reason;
use herald_core::v1alpha1::{EndpointTls, Header, WebhookEndpointSpec};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::validate::Invalid;

/// Longest value a header may have, the same bound as the CRD's for `value`.
pub const MAX_VALUE_BYTES: usize = 4096;

/// Whether the endpoint takes anything from Secrets.
pub fn uses_secrets(spec: &WebhookEndpointSpec) -> bool {
    spec.headers.iter().any(Header::is_secret) || spec.tls.is_some()
}

/// What the endpoint's Secrets resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The headers, each `valueFrom` resolved into `value`.
    pub headers: Vec<Header>,
    pub tls: Option<Arc<TlsMaterial>>,
}

/// Reads the Secrets `spec` names (each once) and resolves what it takes from them.
/// Nothing is read when it names none.
pub async fn resolve(api: &Api<Secret>, spec: &WebhookEndpointSpec) -> Result<Resolved, Invalid> {
    let mut names: Vec<&str> = spec
        .headers
        .iter()
        .filter_map(|h| h.value_from.as_ref())
        .map(|from| from.secret_key_ref.name.as_str())
        .collect();
    if let Some(tls) = &spec.tls {
        names.extend(
            tls.client_certificate
                .iter()
                .map(|c| c.secret_name.as_str()),
        );
        names.extend(tls.ca.iter().map(|c| c.name.as_str()));
    }
    let mut secrets: BTreeMap<&str, Option<Secret>> = BTreeMap::new();
    for name in names {
        if !secrets.contains_key(name) {
            let secret = api.get_opt(name).await.map_err(|e| read_failed(name, &e))?;
            secrets.insert(name, secret);
        }
    }
    let lookup = |name: &str| secrets.get(name).and_then(Option::as_ref);
    let headers = spec
        .headers
        .iter()
        .map(|header| match &header.value_from {
            None => Ok(header.clone()),
            Some(from) => Ok(Header {
                value: value_of(header, lookup(&from.secret_key_ref.name))?,
                ..header.clone()
            }),
        })
        .collect::<Result<_, _>>()?;
    let tls = match &spec.tls {
        Some(tls) => Some(Arc::new(tls_material(tls, lookup)?)),
        None => None,
    };
    Ok(Resolved { headers, tls })
}

/// The TLS material of `tls` from the Secrets `secret` finds, each part checked: the
/// certificates parse, the key is a private key.
pub fn tls_material<'a>(
    tls: &EndpointTls,
    secret: impl Fn(&str) -> Option<&'a Secret>,
) -> Result<TlsMaterial, Invalid> {
    let text = |field: &str, name: &str, key: &str| -> Result<String, Invalid> {
        let what = format!("spec.tls.{field} (Secret {name}, key {key})");
        let not_found =
            |why: String| Invalid::new(reason::TLS_SECRET_NOT_FOUND, format!("{what}: {why}"));
        let secret = secret(name)
            .ok_or_else(|| not_found("the Secret does not exist in this namespace".into()))?;
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .ok_or_else(|| not_found(format!("the Secret has no key {key}")))?;
        String::from_utf8(bytes.0.clone()).map_err(|_| {
            Invalid::new(
                reason::TLS_SECRET_INVALID,
                format!("{what}: is not PEM text"),
            )
        })
    };
    let invalid = |field: &str, name: &str, key: &str, problem: &str| {
        Invalid::new(
            reason::TLS_SECRET_INVALID,
            format!("spec.tls.{field} (Secret {name}, key {key}): {problem}"),
        )
    };
    let certificates = |pem: &str| -> Result<usize, String> {
        let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("is not PEM certificates ({e})"))?;
        if certs.is_empty() {
            return Err("holds no PEM certificate".into());
        }
        Ok(certs.len())
    };
    let mut material = TlsMaterial {
        client_cert: None,
        client_key: None,
        ca: None,
    };
    if let Some(client) = &tls.client_certificate {
        let name = &client.secret_name;
        let cert = text("clientCertificate", name, "tls.crt")?;
        certificates(&cert).map_err(|p| invalid("clientCertificate", name, "tls.crt", &p))?;
        let key = text("clientCertificate", name, "tls.key")?;
        // The key's parse error could quote it: not passed on.
        PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(|_| {
            invalid(
                "clientCertificate",
                name,
                "tls.key",
                "is not a PEM private key (PKCS#8, PKCS#1 or SEC1)",
            )
        })?;
        material.client_cert = Some(cert);
        material.client_key = Some(key);
    }
    if let Some(ca) = &tls.ca {
        let pem = text("ca", &ca.name, &ca.key)?;
        certificates(&pem).map_err(|p| invalid("ca", &ca.name, &ca.key, &p))?;
        material.ca = Some(pem);
    }
    Ok(material)
}

/// The value of `header` from its `secret` (`None`: the Secret does not exist), checked
/// the way the CRD checks a literal value.
pub fn value_of(header: &Header, secret: Option<&Secret>) -> Result<String, Invalid> {
    let Some(from) = &header.value_from else {
        return Ok(header.value.clone());
    };
    let (secret_name, key) = (&from.secret_key_ref.name, &from.secret_key_ref.key);
    let what = format!(
        "header {} (spec.headers, valueFrom.secretKeyRef {secret_name}/{key})",
        header.name
    );
    let Some(secret) = secret else {
        return Err(Invalid::new(
            reason::HEADER_SECRET_NOT_FOUND,
            format!("{what}: Secret {secret_name} does not exist in this namespace"),
        ));
    };
    let Some(bytes) = secret.data.as_ref().and_then(|d| d.get(key.as_str())) else {
        return Err(Invalid::new(
            reason::HEADER_SECRET_NOT_FOUND,
            format!("{what}: Secret {secret_name} has no key {key}"),
        ));
    };
    let bad = |problem: &str| {
        Err(Invalid::new(
            reason::HEADER_SECRET_INVALID,
            format!("{what}: the value {problem}"),
        ))
    };
    let Ok(text) = std::str::from_utf8(&bytes.0) else {
        return bad("is not UTF-8 text");
    };
    // A trailing newline is what `kubectl create secret --from-file` of an edited file
    // gives; it is never part of a header value.
    let text = text.strip_suffix('\n').unwrap_or(text);
    let text = text.strip_suffix('\r').unwrap_or(text);
    if text.is_empty() {
        return bad("is empty");
    }
    if text.len() > MAX_VALUE_BYTES {
        return bad(&format!(
            "has {} bytes; at most {MAX_VALUE_BYTES}",
            text.len()
        ));
    }
    if text.chars().any(|c| c.is_control() && c != '\t') {
        return bad(
            "contains a control character (CR, LF, NUL...): it would split or corrupt the request",
        );
    }
    Ok(text.to_owned())
}

/// A GET that failed: forbidden is the platform team's to grant; anything else is
/// reported and retried with the reconcile.
fn read_failed(name: &str, error: &kube::Error) -> Invalid {
    match error {
        kube::Error::Api(status) if status.is_forbidden() => Invalid::new(
            reason::SECRET_FORBIDDEN,
            format!(
                "Herald may not read Secret {name} (spec.headers valueFrom or spec.tls): its operator has no rights on Secrets in this namespace; ask the platform team to grant them (see the chart's operator.tenantNamespaces)"
            ),
        ),
        other => Invalid {
            retry: Some(std::time::Duration::from_secs(10)),
            ..Invalid::new(
                reason::HEADER_SECRET_NOT_FOUND,
                format!("reading Secret {name} failed: {other}"),
            )
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn header(name: &str, secret: &str, key: &str) -> Header {
        serde_json::from_value(serde_json::json!({
            "name": name,
            "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}
        }))
        .unwrap()
    }

    fn secret(data: &[(&str, &[u8])]) -> Secret {
        Secret {
            data: Some(
                data.iter()
                    .map(|(k, v)| ((*k).to_owned(), ByteString(v.to_vec())))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn a_value_comes_from_its_key_without_a_trailing_newline() {
        let h = header("Authorization", "auth", "token");
        let s = secret(&[("token", b"Bearer t0k3n\n")]);
        assert_eq!(value_of(&h, Some(&s)).unwrap(), "Bearer t0k3n");
        let literal = Header::literal("X-Tenant", "shop");
        assert_eq!(value_of(&literal, None).unwrap(), "shop");
    }

    fn tls_secret(files: &[(&str, &str)]) -> Secret {
        let data: Vec<(&str, &[u8])> = files
            .iter()
            .map(|(k, f)| (*k, std::fs::read(fixture(f)).unwrap().leak() as &[u8]))
            .collect();
        secret(&data)
    }

    fn fixture(name: &str) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../e2e/tls")
            .join(name)
    }

    #[test]
    fn tls_material_is_read_and_checked_naming_field_secret_and_key() {
        let tls: EndpointTls = serde_json::from_value(serde_json::json!({
            "clientCertificate": {"secretName": "client"},
            "ca": {"name": "ca", "key": "ca.crt"}
        }))
        .unwrap();
        let client = tls_secret(&[("tls.crt", "client.pem"), ("tls.key", "client.key")]);
        let ca = tls_secret(&[("ca.crt", "ca.pem")]);
        let both = |name: &str| match name {
            "client" => Some(&client),
            "ca" => Some(&ca),
            _ => None,
        };
        let material = tls_material(&tls, both).unwrap();
        assert!(
            material
                .client_key
                .as_deref()
                .unwrap()
                .contains("PRIVATE KEY")
        );
        assert!(
            !format!("{material:?}").contains("PRIVATE"),
            "Debug shows the key"
        );
        let missing = tls_material(&tls, |name| (name == "client").then_some(&client)).unwrap_err();
        assert_eq!(missing.reason, reason::TLS_SECRET_NOT_FOUND);
        assert!(
            missing
                .message
                .contains("spec.tls.ca (Secret ca, key ca.crt)"),
            "{}",
            missing.message
        );
        // A certificate where the key should be: refused, and the message quotes neither.
        let swapped = tls_secret(&[("tls.crt", "client.pem"), ("tls.key", "client.pem")]);
        let bad = tls_material(&tls, |name| match name {
            "client" => Some(&swapped),
            _ => Some(&ca),
        })
        .unwrap_err();
        assert_eq!(bad.reason, reason::TLS_SECRET_INVALID);
        assert!(
            bad.message.contains("tls.key") && !bad.message.contains("BEGIN"),
            "{}",
            bad.message
        );
        let garbage = secret(&[("ca.crt", b"not a certificate")]);
        let bad = tls_material(&tls, |name| match name {
            "client" => Some(&client),
            _ => Some(&garbage),
        })
        .unwrap_err();
        assert!(
            bad.message.contains("no PEM certificate"),
            "{}",
            bad.message
        );
    }

    #[test]
    fn problems_name_the_header_secret_and_key_never_the_value() {
        let h = header("Authorization", "auth", "token");
        let missing = value_of(&h, None).unwrap_err();
        assert_eq!(missing.reason, reason::HEADER_SECRET_NOT_FOUND);
        assert!(
            missing.message.contains("Authorization") && missing.message.contains("auth/token"),
            "{}",
            missing.message
        );
        let no_key = value_of(&h, Some(&secret(&[("other", b"x")]))).unwrap_err();
        assert!(
            no_key.message.contains("has no key token"),
            "{}",
            no_key.message
        );
        for (value, problem) in [
            (
                &b"Bearer secret-1\r\nX-Injected: 1"[..],
                "control character",
            ),
            (&b""[..], "is empty"),
            (&[0xff, 0xfe][..], "UTF-8"),
        ] {
            let bad = value_of(&h, Some(&secret(&[("token", value)]))).unwrap_err();
            assert_eq!(bad.reason, reason::HEADER_SECRET_INVALID);
            assert!(bad.message.contains(problem), "{}", bad.message);
            assert!(!bad.message.contains("secret-1"), "{}", bad.message);
        }
        let long = vec![b'a'; MAX_VALUE_BYTES + 1];
        let bad = value_of(&h, Some(&secret(&[("token", &long)]))).unwrap_err();
        assert!(bad.message.contains("4097 bytes"), "{}", bad.message);
    }

    #[test]
    fn debug_output_hides_a_resolved_value() {
        let h = Header {
            value: "Bearer t0k3n".into(),
            ..header("Authorization", "auth", "token")
        };
        let printed = format!("{h:?}");
        assert!(!printed.contains("t0k3n"), "{printed}");
        assert!(printed.contains("auth"), "{printed}");
    }
}
