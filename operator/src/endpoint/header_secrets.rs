//! Header values from Secrets (`spec.headers[].valueFrom.secretKeyRef`): the credential a
//! receiver demands beyond the signature (a bearer token, basic auth, an API key) kept out
//! of the resource and of git.
//!
//! Contract: [`resolve`] is the only IO — a GET of each Secret an endpoint's headers
//! name, with the operator's identity, at each reconcile of an endpoint that has such
//! headers (no watch on every Secret of the cluster: those reconciles come again every
//! [`crate::Config::header_secret_refresh`], which is how a changed Secret reaches the
//! deliveries). [`value_of`] is pure. Values never reach status, Events or logs: a problem
//! names the header, the Secret and the key, and what is wrong, never the value.

use std::collections::BTreeMap;

use herald_core::names::reason;
use herald_core::v1alpha1::Header;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;

use super::validate::Invalid;

/// Longest value a header may have, the same bound as the CRD's for `value`.
pub const MAX_VALUE_BYTES: usize = 4096;

/// Whether any header takes its value from a Secret.
pub fn uses_secrets(headers: &[Header]) -> bool {
    headers.iter().any(Header::is_secret)
}

/// The headers with every `valueFrom` resolved into `value`. `Ok` unchanged when none
/// uses a Secret (no request at all).
pub async fn resolve(api: &Api<Secret>, headers: &[Header]) -> Result<Vec<Header>, Invalid> {
    let mut secrets: BTreeMap<&str, Option<Secret>> = BTreeMap::new();
    for header in headers {
        let Some(from) = &header.value_from else {
            continue;
        };
        let name = from.secret_key_ref.name.as_str();
        if secrets.contains_key(name) {
            continue;
        }
        let secret = api.get_opt(name).await.map_err(|e| read_failed(name, &e))?;
        secrets.insert(name, secret);
    }
    headers
        .iter()
        .map(|header| match &header.value_from {
            None => Ok(header.clone()),
            Some(from) => {
                let secret = secrets
                    .get(from.secret_key_ref.name.as_str())
                    .and_then(Option::as_ref);
                Ok(Header {
                    value: value_of(header, secret)?,
                    ..header.clone()
                })
            }
        })
        .collect()
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
                "Herald may not read Secret {name} (spec.headers valueFrom): its operator has no rights on Secrets in this namespace; ask the platform team to grant them (see the chart's operator.tenantNamespaces)"
            ),
        ),
        other => Invalid {
            retry: Some(std::time::Duration::from_secs(10)),
            ..Invalid::new(
                reason::HEADER_SECRET_NOT_FOUND,
                format!("reading Secret {name} (spec.headers valueFrom) failed: {other}"),
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
        assert!(uses_secrets(&[literal.clone(), h]));
        assert!(!uses_secrets(&[literal]));
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
