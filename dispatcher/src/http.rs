//! One delivery attempt over HTTP: the Standard Webhooks request, the SSRF check on the
//! resolved address at connect time, and the classification of what came back into a
//! `crate::attempt::AttemptResult` (what follows from it is decided there, purely).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use herald_core::signing::{self, SigningKey};
use herald_core::ssrf::{AddressPolicy, Forbidden};
use herald_core::v1alpha1::Header;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::attempt::AttemptResult;
use crate::retry::parse_retry_after;
use herald_core::dataplane::AttemptOutcome as Outcome;

/// Bytes of the response body kept in the attempt log.
pub const SNIPPET_BYTES: usize = 1024;
/// Bytes of a response body read at most; the rest is not read (the connection closes).
const MAX_BODY_READ: usize = 64 * 1024;
/// Bytes read beyond the snippet before redacting, so a secret that starts inside the
/// snippet is whole when it is looked for (a header value is at most 4 KiB).
const REDACT_LOOKAHEAD: usize = 4096 + 64;
/// What a redacted value becomes in the attempt log.
const REDACTED: &str = "[redacted]";
/// The snippet of a response that cannot be redacted field by field.
const NOT_KEPT: &str = "[response not kept: not complete JSON and redactResponseFields is set]";

/// Answers a host name's addresses: the system resolver in production; tests inject one
/// that answers differently from call to call (DNS rebinding).
type Lookup = Arc<
    dyn Fn(String) -> futures::future::BoxFuture<'static, std::io::Result<Vec<SocketAddr>>>
        + Send
        + Sync,
>;

fn system_lookup() -> Lookup {
    Arc::new(|host: String| {
        Box::pin(async move { Ok(tokio::net::lookup_host((host.as_str(), 0)).await?.collect()) })
    })
}

/// A resolver that drops every address the policy refuses, so a host name that resolves
/// (or is rebound) to an internal address can never be connected to. It runs for every
/// new connection, after any check made earlier (the operator's, or a previous attempt's),
/// so what is checked is what is connected to.
struct PolicyResolver {
    policy: Arc<AddressPolicy>,
    lookup: Lookup,
}

impl Resolve for PolicyResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        let lookup = (self.lookup)(name.as_str().to_owned());
        Box::pin(async move {
            let allowed = allowed_addresses(&policy, lookup.await?)?;
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

/// The addresses of a name the policy allows, in the resolver's order. A name with some
/// refused addresses is connected to through the others only; one with nothing but
/// refused addresses is refused, naming why.
fn allowed_addresses(
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

/// Builds the shared HTTP client: pooled connections, no redirects, no proxies, the
/// policy-checking resolver. Needs a process-wide rustls crypto provider (`main`
/// installs one; see [`crate::install_crypto_provider`]).
pub fn client(policy: Arc<AddressPolicy>) -> reqwest::Result<reqwest::Client> {
    client_with_lookup(policy, system_lookup())
}

fn client_with_lookup(
    policy: Arc<AddressPolicy>,
    lookup: Lookup,
) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .connect_timeout(Duration::from_secs(5))
        .pool_idle_timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(64)
        .tcp_nodelay(true)
        .user_agent(concat!("Herald/", env!("CARGO_PKG_VERSION")))
        .dns_resolver(PolicyResolver { policy, lookup })
        .build()
}

/// One request to send.
pub struct Attempt<'a> {
    pub url: &'a str,
    pub event_id: &'a str,
    pub body: Bytes,
    pub keys: &'a [SigningKey],
    pub headers: &'a [Header],
    pub timeout: Duration,
    /// JSON Pointers into the response body whose values the attempt log must not keep
    /// (`spec.delivery.redactResponseFields`).
    pub redact_fields: &'a [String],
}

/// Sends one attempt. Never panics and never takes longer than `timeout` (plus the time
/// to read at most 64 KiB of a response that already arrived).
pub async fn send(
    client: &reqwest::Client,
    policy: &AddressPolicy,
    attempt: Attempt<'_>,
) -> AttemptResult {
    let started = Instant::now();
    let fail = |outcome: Outcome, snippet: String| {
        AttemptResult::failed(outcome, started.elapsed(), snippet)
    };
    // The operator validated the URL; it is checked again against this dispatcher's own
    // policy (scheme, credentials, an IP-literal host, which never reaches the resolver's
    // check), so a configuration written by anything else cannot send where the platform
    // does not allow.
    let url = match policy.check_url(attempt.url) {
        Ok(url) => url,
        Err(Forbidden::BadUrl(error)) => {
            return fail(Outcome::RequestError, format!("invalid url: {error}"));
        }
        Err(forbidden) => return fail(Outcome::AddressForbidden, forbidden.to_string()),
    };
    let now = jiff::Timestamp::now().as_second();
    let signature = signing::sign(attempt.keys, attempt.event_id, now, &attempt.body);
    let mut request = client
        .post(url)
        .timeout(attempt.timeout)
        .header("content-type", "application/json")
        .header("webhook-id", attempt.event_id)
        .header("webhook-timestamp", now.to_string())
        .header("webhook-signature", signature.as_str());
    for header in attempt.headers {
        request = request.header(header.name.as_str(), header.value.as_str());
    }
    let response = match request.body(attempt.body).send().await {
        Ok(response) => response,
        Err(e) => {
            let outcome = classify_error(&e);
            return fail(outcome, error_chain(outcome, &e));
        }
    };
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| parse_retry_after(v, now));
    let latency = started.elapsed();
    let secrets = secrets(attempt.headers, &signature);
    let snippet = read_snippet(response, attempt.redact_fields, &secrets).await;
    AttemptResult {
        outcome: Outcome::of_status(status),
        status: Some(status),
        latency,
        snippet,
        retry_after,
    }
}

/// Reads what the attempt log keeps of a response. Without fields to redact only the
/// snippet and the look-ahead are kept in memory; with them the whole body read (at most
/// [`MAX_BODY_READ`]) is, since JSON can only be redacted once it is parsed whole.
async fn read_snippet(
    mut response: reqwest::Response,
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
        match response.chunk().await {
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
            Err(_) => break false,
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
    for field in fields {
        if let Some(value) = json.pointer_mut(field) {
            *value = serde_json::Value::String(REDACTED.to_owned());
        }
    }
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
/// (each `v1,` part and its base64) and the values of sensitive custom headers.
fn secrets<'a>(headers: &'a [Header], signature: &'a str) -> Vec<&'a str> {
    let mut secrets: Vec<&str> = headers
        .iter()
        .filter(|h| is_sensitive(&h.name))
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

/// `text` with every secret replaced, cut to [`SNIPPET_BYTES`] at a character boundary.
fn redact(text: &str, secrets: &[&str]) -> String {
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

fn classify_error(e: &reqwest::Error) -> Outcome {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.downcast_ref::<Forbidden>().is_some() {
            return Outcome::AddressForbidden;
        }
        source = err.source();
    }
    if e.is_timeout() {
        Outcome::Timeout
    } else if e.is_connect() {
        Outcome::ConnectError
    } else {
        Outcome::RequestError
    }
}

/// The error and its causes on one line (no URL: it may carry a tenant's query secrets).
fn error_chain(outcome: Outcome, e: &reqwest::Error) -> String {
    let mut text = outcome.as_str().to_owned();
    let mut source = std::error::Error::source(e);
    while let Some(err) = source {
        text.push_str(": ");
        text.push_str(&err.to_string());
        source = err.source();
    }
    redact(&text, &[])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Refused before any connection: the policy is checked on the URL itself.
    #[tokio::test]
    async fn a_url_the_policy_refuses_is_not_sent() {
        crate::install_crypto_provider();
        let policy = Arc::new(AddressPolicy::default());
        let http = client(policy.clone()).expect("a client");
        let keys = [SigningKey::from_whsec("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap()];
        for (url, outcome, says) in [
            (
                "http://hooks.example.com/",
                Outcome::AddressForbidden,
                "scheme",
            ),
            (
                "https://user:pw@hooks.example.com/",
                Outcome::AddressForbidden,
                "credentials",
            ),
            ("https://10.0.0.1/", Outcome::AddressForbidden, "private"),
            ("https://[::a00:1]/", Outcome::AddressForbidden, "IPv4"),
            ("not a url", Outcome::RequestError, "invalid url"),
        ] {
            let attempt = Attempt {
                url,
                event_id: "msg_1",
                body: Bytes::from_static(b"{}"),
                keys: &keys,
                headers: &[],
                timeout: Duration::from_secs(1),
                redact_fields: &[],
            };
            let result = send(&http, &policy, attempt).await;
            assert_eq!(result.outcome, outcome, "{url}");
            assert!(result.snippet.contains(says), "{url}: {}", result.snippet);
        }
    }

    /// A receiver on `ip:port` that answers `200` and closes each connection (so every
    /// attempt resolves again); counts the connections it accepted.
    async fn counting_receiver(ip: &str, port: u16) -> (u16, Arc<std::sync::atomic::AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind((ip, port))
            .await
            .expect("bind");
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 16 * 1024];
                    let mut read = Vec::new();
                    // The request is small: its head and 2-byte body come in a read or two.
                    while !read.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => read.extend_from_slice(&buf[..n]),
                        }
                    }
                    let _ = stream
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                        )
                        .await;
                });
            }
        });
        (port, accepted)
    }

    /// Two receivers on one port: 127.0.0.1 (`ok`) and 127.0.0.2 (`internal`).
    async fn two_receivers() -> (
        u16,
        Arc<std::sync::atomic::AtomicUsize>,
        Arc<std::sync::atomic::AtomicUsize>,
    ) {
        // A port free on 127.0.0.1 is almost always free on 127.0.0.2; try a few.
        for _ in 0..10 {
            let (port, ok) = counting_receiver("127.0.0.1", 0).await;
            if tokio::net::TcpListener::bind(("127.0.0.2", port))
                .await
                .is_ok()
            {
                let (_, internal) = counting_receiver("127.0.0.2", port).await;
                return (port, ok, internal);
            }
        }
        panic!("no port free on both 127.0.0.1 and 127.0.0.2");
    }

    /// A resolver whose answers are scripted call by call (the last one repeats).
    fn scripted(answers: Vec<Vec<&str>>) -> (Lookup, Arc<std::sync::atomic::AtomicUsize>) {
        let answers: Vec<Vec<SocketAddr>> = answers
            .into_iter()
            .map(|ips| {
                ips.iter()
                    .map(|ip| SocketAddr::new(ip.parse().unwrap(), 0))
                    .collect()
            })
            .collect();
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = calls.clone();
        let lookup: Lookup = Arc::new(move |host: String| {
            assert_eq!(host, "hooks.test");
            let n = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let answer = answers[n.min(answers.len() - 1)].clone();
            Box::pin(async move { Ok(answer) })
        });
        (lookup, calls)
    }

    /// `127.0.0.1/32` stands for the public internet here (it is the allowlisted network
    /// of these tests); 127.0.0.2 for an internal address the policy refuses.
    fn policy(allow: &[&str]) -> Arc<AddressPolicy> {
        Arc::new(AddressPolicy {
            allow: allow.iter().map(|net| net.parse().unwrap()).collect(),
            allow_http: true,
        })
    }

    async fn post(http: &reqwest::Client, policy: &AddressPolicy, port: u16) -> AttemptResult {
        let keys = [SigningKey::from_whsec("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap()];
        let url = format!("http://hooks.test:{port}/");
        let attempt = Attempt {
            url: &url,
            event_id: "msg_1",
            body: Bytes::from_static(b"{}"),
            keys: &keys,
            headers: &[],
            timeout: Duration::from_secs(5),
            redact_fields: &[],
        };
        send(http, policy, attempt).await
    }

    fn count(n: &std::sync::atomic::AtomicUsize) -> usize {
        n.load(std::sync::atomic::Ordering::SeqCst)
    }

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

    /// DNS rebinding: the name answers an allowed address when it is checked and for the
    /// first connection, then an internal one. The check at connect time refuses the
    /// second connection; nothing reaches the internal receiver.
    #[tokio::test]
    async fn a_name_rebound_to_an_internal_address_is_refused_at_connect_time() {
        crate::install_crypto_provider();
        let (port, public, internal) = two_receivers().await;
        let policy = policy(&["127.0.0.1/32"]);
        let (lookup, calls) = scripted(vec![
            vec!["127.0.0.1"],
            vec!["127.0.0.1"],
            vec!["127.0.0.2"],
        ]);
        // What the operator does when it validates the endpoint: resolve, check.
        let validated = lookup("hooks.test".to_owned()).await.unwrap();
        assert_eq!(allowed_addresses(&policy, validated.clone()), Ok(validated));
        let http = client_with_lookup(policy.clone(), lookup).expect("a client");

        let first = post(&http, &policy, port).await;
        assert_eq!(first.outcome, Outcome::Success, "{}", first.snippet);
        let second = post(&http, &policy, port).await;
        assert_eq!(
            second.outcome,
            Outcome::AddressForbidden,
            "{}",
            second.snippet
        );
        assert!(second.snippet.contains("127.0.0.2"), "{}", second.snippet);
        assert!(second.snippet.contains("loopback"), "{}", second.snippet);
        assert_eq!(count(&calls), 3, "every connection resolves the name again");
        assert_eq!(count(&public), 1);
        assert_eq!(count(&internal), 0, "the rebound address was connected to");
    }

    /// A name with several addresses, the refused one first: only the allowed one is
    /// connected to, every time.
    #[tokio::test]
    async fn a_name_with_one_internal_address_among_several_connects_to_the_others() {
        crate::install_crypto_provider();
        let (port, public, internal) = two_receivers().await;
        let policy = policy(&["127.0.0.1/32"]);
        let (lookup, _) = scripted(vec![vec!["127.0.0.2", "127.0.0.1"]]);
        let http = client_with_lookup(policy.clone(), lookup).expect("a client");
        for _ in 0..3 {
            let result = post(&http, &policy, port).await;
            assert_eq!(result.outcome, Outcome::Success, "{}", result.snippet);
        }
        assert_eq!(count(&public), 3);
        assert_eq!(count(&internal), 0, "the refused address was connected to");
    }

    /// The allowlist opens exactly its range: 127.0.0.2/32 allowed reaches 127.0.0.2,
    /// and its neighbour 127.0.0.1 stays refused.
    #[tokio::test]
    async fn an_allowlisted_range_is_reached_and_its_neighbours_are_not() {
        crate::install_crypto_provider();
        let (port, neighbour, allowlisted) = two_receivers().await;
        let policy = policy(&["127.0.0.2/32"]);
        let (lookup, _) = scripted(vec![vec!["127.0.0.2"], vec!["127.0.0.1"]]);
        let http = client_with_lookup(policy.clone(), lookup).expect("a client");
        let allowed = post(&http, &policy, port).await;
        assert_eq!(allowed.outcome, Outcome::Success, "{}", allowed.snippet);
        let refused = post(&http, &policy, port).await;
        assert_eq!(
            refused.outcome,
            Outcome::AddressForbidden,
            "{}",
            refused.snippet
        );
        assert_eq!(count(&allowlisted), 1);
        assert_eq!(count(&neighbour), 0);
    }

    #[test]
    fn secrets_are_redacted_before_the_snippet_is_cut() {
        let headers = [
            Header {
                name: "Authorization".into(),
                value: "Bearer abc123".into(),
            },
            Header {
                name: "X-Api-Key".into(),
                value: "k-9".into(),
            },
            Header {
                name: "X-Tenant".into(),
                value: "shop".into(),
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

    /// A receiver on loopback that answers `body` (with a `content-length`) to every
    /// request.
    async fn answering(body: Vec<u8>) -> u16 {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let body = Arc::new(body);
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let body = body.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = stream.write_all(answer.as_bytes()).await;
                    let _ = stream.write_all(&body).await;
                });
            }
        });
        port
    }

    async fn send_to(port: u16, redact_fields: &[String]) -> AttemptResult {
        crate::install_crypto_provider();
        let policy = Arc::new(AddressPolicy::loopback_for_tests());
        let http = client(policy.clone()).expect("a client");
        let keys = [SigningKey::from_whsec("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap()];
        let url = format!("http://127.0.0.1:{port}/");
        send(
            &http,
            &policy,
            Attempt {
                url: &url,
                event_id: "msg_1",
                body: Bytes::from_static(b"{}"),
                keys: &keys,
                headers: &[],
                timeout: Duration::from_secs(5),
                redact_fields,
            },
        )
        .await
    }

    /// Over a real connection: a JSON answer larger than the snippet (but within the read
    /// limit) is parsed whole and redacted; one over the read limit is not kept.
    #[tokio::test]
    async fn responses_are_redacted_whole_or_not_kept() {
        let with = fields(&["/user/token"]);
        // Bigger than the snippet and its look-ahead: it has to be read whole to parse.
        let within = serde_json::json!({
            "user": {"token": "t-123", "id": 7},
            "zpadding": "p".repeat(20 * 1024),
        });
        let port = answering(within.to_string().into_bytes()).await;
        let result = send_to(port, &with).await;
        assert_eq!(result.outcome, Outcome::Success, "{}", result.snippet);
        assert_eq!(result.snippet.len(), SNIPPET_BYTES);
        assert!(
            result
                .snippet
                .starts_with(r#"{"user":{"id":7,"token":"[redacted]"},"zpadding":"ppp"#),
            "{}",
            result.snippet
        );

        let over = serde_json::json!({
            "user": {"token": "t-123"},
            "zpadding": "p".repeat(MAX_BODY_READ),
        });
        let port = answering(over.to_string().into_bytes()).await;
        let result = send_to(port, &with).await;
        assert_eq!(result.outcome, Outcome::Success, "{}", result.snippet);
        assert_eq!(result.snippet, NOT_KEPT);
        // Without fields, the same answer keeps its first kilobyte as before.
        let result = send_to(port, &[]).await;
        assert!(result.snippet.contains("t-123"), "{}", result.snippet);
    }

    /// A receiver that echoes the request head back (as debugging receivers do): the
    /// attempt log gets the echo with the credentials redacted.
    #[tokio::test]
    async fn an_echoed_request_is_logged_without_its_credentials() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        crate::install_crypto_provider();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let body = head;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
                let _ = stream.write_all(&body).await;
            }
        });
        let policy = Arc::new(AddressPolicy::loopback_for_tests());
        let http = client(policy.clone()).expect("a client");
        let keys = [SigningKey::from_whsec("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap()];
        let token = "Bearer 0123456789abcdef0123456789abcdef";
        let headers = [
            Header {
                name: "Authorization".into(),
                value: token.into(),
            },
            Header {
                name: "X-Tenant".into(),
                value: "shop".into(),
            },
        ];
        let url = format!("http://127.0.0.1:{port}/");
        let result = send(
            &http,
            &policy,
            Attempt {
                url: &url,
                event_id: "msg_1",
                body: Bytes::from_static(b"{}"),
                keys: &keys,
                headers: &headers,
                timeout: Duration::from_secs(5),
                redact_fields: &[],
            },
        )
        .await;
        assert_eq!(result.outcome, Outcome::Success, "{}", result.snippet);
        let snippet = &result.snippet;
        assert!(snippet.len() <= SNIPPET_BYTES);
        assert!(
            snippet.contains("webhook-signature: [redacted]"),
            "{snippet}"
        );
        assert!(snippet.contains("authorization: [redacted]"), "{snippet}");
        assert!(snippet.contains("x-tenant: shop"), "{snippet}");
        // No piece of the token either, however the snippet was cut.
        assert!(!snippet.contains("0123456789abcdef"), "{snippet}");
        assert!(!snippet.contains("v1,"), "{snippet}");
    }
}
