//! What the attempt log keeps of a request and its response: the request's headers with
//! the signature and credentials redacted, the response's headers (bounded) and the first
//! kilobyte of its body, with the request's secrets and the endpoint's
//! `redactResponseFields` replaced before it is cut.

use bytes::Bytes;
use herald_core::dataplane::{MAX_RESPONSE_HEADER_BYTES, MAX_RESPONSE_HEADERS};
use herald_core::v1alpha1::Header;

/// Bytes of the response body kept in the attempt log.
pub const SNIPPET_BYTES: usize = 1024;
/// Bytes of a response body read at most; the rest is not read (the connection closes).
pub(crate) const MAX_BODY_READ: usize = 64 * 1024;
/// Bytes read beyond the snippet before redacting, so a secret that starts inside the
/// snippet is whole when it is looked for (a header value is at most 4 KiB).
const REDACT_LOOKAHEAD: usize = 4096 + 64;
use herald_core::redact::REDACTED;
/// The snippet of a response that cannot be redacted field by field.
pub(crate) const NOT_KEPT: &str =
    "[response not kept: not complete JSON and redactResponseFields is set]";

/// A response body read chunk by chunk: `Ok(None)` at its end, `Err(())` when it broke
/// off (an error, or the attempt's time ran out).
pub(crate) trait Chunks {
    async fn next_chunk(&mut self) -> Result<Option<Bytes>, ()>;
}

/// Reads what the attempt log keeps of a response. Without fields to redact only the
/// snippet and the look-ahead are kept in memory; with them the whole body read (at most
/// [`MAX_BODY_READ`]) is, since JSON can only be redacted once it is parsed whole.
pub(crate) async fn read_snippet(
    mut response: impl Chunks,
    fields: &[String],
    secrets: &[&str],
) -> String {
    let keep = if fields.is_empty() {
        SNIPPET_BYTES + REDACT_LOOKAHEAD
    } else {
        MAX_BODY_READ
    };
    let mut body = Vec::new();
    let mut read = 0;
    let complete = loop {
        match response.next_chunk().await {
            Ok(Some(chunk)) => {
                read += chunk.len();
                if body.len() < keep {
                    let take = (keep - body.len()).min(chunk.len());
                    body.extend_from_slice(&chunk[..take]);
                }
                if read > MAX_BODY_READ {
                    break false;
                }
            }
            Ok(None) => break true,
            Err(()) => break false,
        }
    };
    snippet(&body, complete, fields, secrets)
}

/// The attempt log's snippet of a response body: with `fields`, the body's JSON with
/// the value at each pointer replaced (or a note saying the body was not kept, when it
/// is not one complete JSON document: anything kept raw could hold those fields); then
/// the secrets replaced and the text cut to [`SNIPPET_BYTES`].
fn snippet(body: &[u8], complete: bool, fields: &[String], secrets: &[&str]) -> String {
    if fields.is_empty() || body.trim_ascii().is_empty() {
        return redact(&String::from_utf8_lossy(body), secrets);
    }
    let parsed = complete
        .then(|| serde_json::from_slice::<serde_json::Value>(body).ok())
        .flatten();
    let Some(mut json) = parsed else {
        return NOT_KEPT.to_owned();
    };
    herald_core::redact::json_fields(&mut json, fields);
    redact(&json.to_string(), secrets)
}

/// Header names whose values are credentials: a receiver that echoes the request back
/// (many test and debugging receivers do) must not put them into the attempt log.
fn is_sensitive(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["authorization", "cookie"].contains(&name.as_str())
        || [
            "auth",
            "token",
            "secret",
            "key",
            "pass",
            "session",
            "credential",
            "signature",
        ]
        .iter()
        .any(|word| name.contains(word))
}

/// The values of this request that must not appear in its attempt record: the signature
/// (each `v1,` or `v1a,` part and its base64), the values of headers taken from Secrets
/// and those of custom headers whose names say they are credentials.
pub(crate) fn secrets<'a>(headers: &'a [Header], signature: &'a str) -> Vec<&'a str> {
    let mut secrets: Vec<&str> = headers
        .iter()
        .filter(|h| h.is_secret() || is_sensitive(&h.name))
        .map(|h| h.value.trim())
        .collect();
    for part in signature.split(' ') {
        secrets.push(part);
        secrets.extend(part.split_once(',').map(|(_, b64)| b64));
    }
    secrets.retain(|s| !s.is_empty());
    // Longest first, so a value that contains another is replaced whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets
}

/// The request's headers as the attempt log keeps them: the signature cut to its
/// versions (`v1,[redacted] v1a,[redacted]`), the values of headers from Secrets and of
/// credential-like names replaced.
pub(crate) fn request_headers<'a>(
    sent: impl Iterator<Item = (&'a str, String)>,
    custom: &[Header],
) -> Vec<(String, String)> {
    sent.map(|(name, value)| {
        let value = if name.eq_ignore_ascii_case("webhook-signature") {
            value
                .split(' ')
                .filter_map(|entry| {
                    entry
                        .split_once(',')
                        .map(|(version, _)| format!("{version},{REDACTED}"))
                })
                .collect::<Vec<_>>()
                .join(" ")
        } else if custom
            .iter()
            .any(|h| h.name.eq_ignore_ascii_case(name) && (h.is_secret() || is_sensitive(name)))
        {
            REDACTED.to_owned()
        } else {
            value
        };
        (name.to_owned(), value)
    })
    .collect()
}

/// The response's headers as the attempt log keeps them: the first
/// [`MAX_RESPONSE_HEADERS`], at most [`MAX_RESPONSE_HEADER_BYTES`] together, the values
/// of `set-cookie` and credential-like names replaced, and the request's `secrets`
/// (a receiver echoing them in a header) too.
pub(crate) fn response_headers(
    headers: &hyper::HeaderMap,
    secrets: &[&str],
) -> Vec<(String, String)> {
    let mut kept = Vec::new();
    let mut bytes = 0;
    for (name, value) in headers.iter().take(MAX_RESPONSE_HEADERS) {
        let name = name.as_str();
        let value = if name == "set-cookie" || is_sensitive(name) {
            REDACTED.to_owned()
        } else {
            redact(&String::from_utf8_lossy(value.as_bytes()), secrets)
        };
        bytes += name.len() + value.len();
        if bytes > MAX_RESPONSE_HEADER_BYTES {
            break;
        }
        kept.push((name.to_owned(), value));
    }
    kept
}

/// `text` with every secret replaced, cut to [`SNIPPET_BYTES`] at a character boundary.
pub(crate) fn redact(text: &str, secrets: &[&str]) -> String {
    let mut text = text.to_owned();
    for secret in secrets {
        if text.contains(secret) {
            text = text.replace(secret, REDACTED);
        }
    }
    if text.len() > SNIPPET_BYTES {
        let mut end = SNIPPET_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted_before_the_snippet_is_cut() {
        let headers = [
            Header::literal("Authorization", "Bearer abc123"),
            Header::literal("X-Api-Key", "k-9"),
            Header::literal("X-Tenant", "shop"),
            // From a Secret: redacted whatever its name.
            Header {
                value_from: Some(
                    serde_json::from_value(
                        serde_json::json!({"secretKeyRef": {"name": "s", "key": "k"}}),
                    )
                    .unwrap(),
                ),
                ..Header::literal("X-Route", "from-a-secret")
            },
        ];
        let signature = "v1,AAAA/bbbb= v1,CCCC+dddd=";
        let secrets = secrets(&headers, signature);
        for s in [
            "Bearer abc123",
            "k-9",
            "v1,AAAA/bbbb=",
            "AAAA/bbbb=",
            "CCCC+dddd=",
            "from-a-secret",
        ] {
            assert!(secrets.contains(&s), "{s} is not redacted: {secrets:?}");
        }
        assert!(!secrets.contains(&"shop"));
        let echoed = r#"{"authorization":"Bearer abc123","x-tenant":"shop","sig":"v1,AAAA/bbbb= v1,CCCC+dddd="}"#;
        assert_eq!(
            redact(echoed, &secrets),
            r#"{"authorization":"[redacted]","x-tenant":"shop","sig":"[redacted] [redacted]"}"#
        );
        // A secret across the snippet's end is replaced whole, not cut in two.
        let padded = format!("{}Bearer abc123 and more", "p".repeat(SNIPPET_BYTES - 5));
        let snippet = redact(&padded, &secrets);
        assert_eq!(snippet.len(), SNIPPET_BYTES);
        assert!(snippet.ends_with("p[reda"), "{snippet}");
        // Cut at a character boundary.
        assert_eq!(redact(&"é".repeat(SNIPPET_BYTES), &[]).len(), SNIPPET_BYTES);
    }

    #[test]
    fn response_headers_are_bounded_and_credentials_redacted() {
        let mut headers = hyper::HeaderMap::new();
        headers.insert("set-cookie", "session=abc".parse().unwrap());
        headers.insert("x-api-key", "k-9".parse().unwrap());
        headers.insert("x-echo", "Bearer abc123 seen".parse().unwrap());
        headers.insert("content-type", "text/plain".parse().unwrap());
        let kept = response_headers(&headers, &["Bearer abc123"]);
        let value = |name: &str| {
            kept.iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(value("set-cookie"), Some(REDACTED));
        assert_eq!(value("x-api-key"), Some(REDACTED));
        assert_eq!(value("x-echo"), Some("[redacted] seen"));
        assert_eq!(value("content-type"), Some("text/plain"));
        let mut many = hyper::HeaderMap::new();
        for i in 0..40 {
            let name = hyper::header::HeaderName::from_bytes(format!("x-h{i}").as_bytes()).unwrap();
            many.insert(name, "v".repeat(100).parse().unwrap());
        }
        let kept = response_headers(&many, &[]);
        let bytes: usize = kept.iter().map(|(n, v)| n.len() + v.len()).sum();
        assert!(
            kept.len() <= MAX_RESPONSE_HEADERS && bytes <= MAX_RESPONSE_HEADER_BYTES,
            "{} headers, {bytes} bytes",
            kept.len()
        );
        assert!(!kept.is_empty());
    }

    fn fields(pointers: &[&str]) -> Vec<String> {
        pointers.iter().map(|p| (*p).to_owned()).collect()
    }

    /// The value at each pointer is redacted wherever it is (nested objects, array
    /// elements, escaped names, whole sub-documents); the rest of the body is kept;
    /// pointers that match nothing change nothing.
    #[test]
    fn configured_json_fields_are_redacted_from_the_snippet() {
        let body = br#"{"token":"t-123","user":{"email":"a@example.com","name":"Ann"},
            "items":[{"secret":"s-0","id":1},{"secret":"s-1","id":2}],
            "a/b":"slash","nested":{"deep":{"x":1}},"ok":true}"#;
        let redacted = snippet(
            body,
            true,
            &fields(&[
                "/token",
                "/user/email",
                "/items/1/secret",
                "/a~1b",
                "/nested",
                "/missing",
                "/user/email/deeper",
                "/items/7/secret",
            ]),
            &[],
        );
        let json: serde_json::Value = serde_json::from_str(&redacted).expect(&redacted);
        assert_eq!(
            json,
            serde_json::json!({
                "token": "[redacted]",
                "user": {"email": "[redacted]", "name": "Ann"},
                "items": [{"secret": "s-0", "id": 1}, {"secret": "[redacted]", "id": 2}],
                "a/b": "[redacted]",
                "nested": "[redacted]",
                "ok": true
            })
        );
        // Without fields, the body is kept as it came (cut, secrets redacted).
        let raw = snippet(body, true, &[], &[]);
        assert_eq!(raw.as_bytes(), &body[..]);
    }

    /// Field redaction comes first, then the secrets, then the cut: a large response
    /// whose redacted JSON is long still ends up within the snippet size, without the
    /// configured fields or the request's secrets.
    #[test]
    fn field_redaction_runs_before_the_secrets_and_the_cut() {
        let filler = "x".repeat(4 * SNIPPET_BYTES);
        let body = serde_json::json!({
            "token": "t-123",
            "echo": "Bearer abc123",
            "filler": filler,
        })
        .to_string();
        let redacted = snippet(
            body.as_bytes(),
            true,
            &fields(&["/token"]),
            &["Bearer abc123"],
        );
        assert!(redacted.len() <= SNIPPET_BYTES);
        assert!(
            redacted.starts_with(r#"{"echo":"[redacted]","filler":"xxx"#),
            "{redacted}"
        );
        assert!(!redacted.contains("t-123"), "{redacted}");
    }

    /// With fields configured, a body that is not one complete JSON document is not kept:
    /// not JSON, JSON followed by more, truncated JSON, a body cut at the read limit.
    #[test]
    fn a_body_that_is_not_complete_json_is_not_kept_when_fields_are_set() {
        let with = fields(&["/token"]);
        for (body, complete) in [
            (&b"token=t-123"[..], true),
            (&b"<html>t-123</html>"[..], true),
            (&br#"{"token":"t-123"} {"token":"t-456"}"#[..], true),
            (&br#"{"token":"t-123","more":"#[..], true),
            (&br#"{"token":"t-123"}"#[..], false),
            (&[0xff, 0xfe, b'{', b'}'][..], true),
        ] {
            assert_eq!(
                snippet(body, complete, &with, &[]),
                NOT_KEPT,
                "{}",
                String::from_utf8_lossy(body)
            );
            // Without fields, such bodies are kept as before.
            assert_ne!(snippet(body, complete, &[], &[]), NOT_KEPT);
        }
        // An empty body has nothing to hide.
        assert_eq!(snippet(b"", true, &with, &[]), "");
        assert_eq!(snippet(b" \n", true, &with, &[]), " \n");
        // A JSON scalar is complete JSON: kept, nothing matched.
        assert_eq!(snippet(b" 42 ", true, &with, &[]), "42");
    }
}
