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

/// A resolver that drops every address the policy refuses, so a host name that resolves
/// (or is rebound) to an internal address can never be connected to.
struct PolicyResolver {
    policy: Arc<AddressPolicy>,
}

impl Resolve for PolicyResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let resolved: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
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
                (true, Some(forbidden)) => Err(Box::new(forbidden) as _),
                _ => Ok(Box::new(allowed.into_iter()) as Addrs),
            }
        })
    }
}

/// Builds the shared HTTP client: pooled connections, no redirects, no proxies, the
/// policy-checking resolver. Needs a process-wide rustls crypto provider (`main`
/// installs one; see [`crate::install_crypto_provider`]).
pub fn client(policy: Arc<AddressPolicy>) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .connect_timeout(Duration::from_secs(5))
        .pool_idle_timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(64)
        .tcp_nodelay(true)
        .user_agent(concat!("Herald/", env!("CARGO_PKG_VERSION")))
        .dns_resolver(PolicyResolver { policy })
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
        .header("webhook-signature", signature);
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
    let snippet = read_snippet(response).await;
    AttemptResult {
        outcome: Outcome::of_status(status),
        status: Some(status),
        latency,
        snippet,
        retry_after,
    }
}

async fn read_snippet(mut response: reqwest::Response) -> String {
    let mut snippet = Vec::new();
    let mut read = 0;
    while let Ok(Some(chunk)) = response.chunk().await {
        read += chunk.len();
        if snippet.len() < SNIPPET_BYTES {
            let take = (SNIPPET_BYTES - snippet.len()).min(chunk.len());
            snippet.extend_from_slice(&chunk[..take]);
        }
        if read > MAX_BODY_READ {
            break;
        }
    }
    String::from_utf8_lossy(&snippet).into_owned()
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
    text.truncate(SNIPPET_BYTES);
    text
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
            };
            let result = send(&http, &policy, attempt).await;
            assert_eq!(result.outcome, outcome, "{url}");
            assert!(result.snippet.contains(says), "{url}: {}", result.snippet);
        }
    }
}
