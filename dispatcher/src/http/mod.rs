//! One delivery attempt over HTTP: the Standard Webhooks request, the SSRF check on the
//! resolved address at connect time, the way out (direct, or through an egress proxy
//! the platform allows), and the classification of what came back into a
//! `crate::attempt::AttemptResult` (what follows from it is decided there, purely).
//!
//! - [`resolve`]: the address policy applied to every new connection's addresses;
//! - `herald_core::egress`: the proxies the platform configured and which one a
//!   delivery takes (shared with the operator, which validates the endpoint's choice);
//! - [`tunnel`]: CONNECT tunnels to vetted addresses through a proxy;
//! - [`redact`]: what the attempt log keeps of a response;
//! - [`classify`]: what a failed request was, and its text in the attempt log.

mod classify;
mod redact;
mod resolve;
mod tunnel;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use herald_core::signing::{self, SigningKey};
use herald_core::ssrf::{AddressPolicy, Forbidden};
use herald_core::v1alpha1::{EgressProxy, Header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::attempt::AttemptResult;
use crate::retry::parse_retry_after;
use herald_core::dataplane::AttemptOutcome as Outcome;

use classify::{direct_error, proxied_error};
pub use herald_core::egress::{DEFAULT_PROXY, Egress, EgressArgs, EgressError, ProxyDef, Route};
pub use redact::SNIPPET_BYTES;
use redact::{Chunks, read_snippet};
use resolve::{Lookup, PolicyResolver, system_lookup};
use tunnel::{ProxyErrors, TunnelConnector};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
const POOL_MAX_IDLE_PER_HOST: usize = 64;
const USER_AGENT: &str = concat!("Herald/", env!("CARGO_PKG_VERSION"));

type Proxied = HyperClient<hyper_rustls::HttpsConnector<TunnelConnector>, Full<Bytes>>;

/// The delivery client: a pooled direct client and one pooled client per egress proxy
/// (so connections are reused per proxy, never across proxies). Cheap to clone.
#[derive(Clone)]
pub struct Client {
    direct: reqwest::Client,
    egress: Arc<Egress>,
    proxied: Arc<BTreeMap<String, Proxied>>,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("building the HTTP client (is a rustls crypto provider installed?): {0}")]
    Http(#[source] reqwest::Error),
    #[error("loading the platform's TLS roots for proxied deliveries: {0}")]
    Tls(#[source] rustls::Error),
}

impl Client {
    /// Builds the clients: pooled connections, no redirects, the policy-checking
    /// resolver, the proxies of `egress`. Needs a process-wide rustls crypto provider
    /// (`main` installs one; see [`crate::install_crypto_provider`]).
    /// Proxy failures are counted in `proxy_errors`
    /// (`herald_dispatcher_egress_proxy_errors_total`).
    pub fn new(
        policy: Arc<AddressPolicy>,
        egress: Egress,
        proxy_errors: ProxyErrors,
    ) -> Result<Self, ClientError> {
        Self::build(policy, egress, system_lookup(), None, proxy_errors)
    }

    /// With `tls` unset, TLS inside tunnels checks certificates like the direct client
    /// (the platform's roots); tests give their own roots.
    fn build(
        policy: Arc<AddressPolicy>,
        egress: Egress,
        lookup: Lookup,
        tls: Option<rustls::ClientConfig>,
        proxy_errors: ProxyErrors,
    ) -> Result<Self, ClientError> {
        let direct = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .connect_timeout(CONNECT_TIMEOUT)
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .pool_max_idle_per_host(POOL_MAX_IDLE_PER_HOST)
            .tcp_nodelay(true)
            .user_agent(USER_AGENT)
            .dns_resolver(PolicyResolver {
                policy: policy.clone(),
                lookup: lookup.clone(),
            })
            .build()
            .map_err(ClientError::Http)?;
        let tls = match tls {
            Some(tls) => tls,
            None if egress.proxies.is_empty() => {
                return Ok(Self {
                    direct,
                    egress: Arc::new(egress),
                    proxied: Arc::default(),
                });
            }
            None => {
                use rustls_platform_verifier::ConfigVerifierExt;
                rustls::ClientConfig::with_platform_verifier().map_err(ClientError::Tls)?
            }
        };
        let proxied = egress
            .proxies
            .values()
            .map(|proxy| {
                let connector = TunnelConnector {
                    proxy: Arc::new(proxy.clone()),
                    policy: policy.clone(),
                    lookup: lookup.clone(),
                    connect_timeout: CONNECT_TIMEOUT,
                    errors: proxy_errors.clone(),
                };
                let https = hyper_rustls::HttpsConnectorBuilder::new()
                    .with_tls_config(tls.clone())
                    .https_or_http()
                    .enable_http1()
                    .wrap_connector(connector);
                let client = HyperClient::builder(TokioExecutor::new())
                    .pool_timer(TokioTimer::new())
                    .pool_idle_timeout(POOL_IDLE_TIMEOUT)
                    .pool_max_idle_per_host(POOL_MAX_IDLE_PER_HOST)
                    .build(https);
                (proxy.name.clone(), client)
            })
            .collect();
        Ok(Self {
            direct,
            egress: Arc::new(egress),
            proxied: Arc::new(proxied),
        })
    }
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
    /// The endpoint's choice of egress proxy (`spec.delivery.proxy`).
    pub proxy: Option<&'a EgressProxy>,
}

/// What came back, before the body is read.
struct Answer<B> {
    status: u16,
    retry_after: Option<Duration>,
    body: B,
}

/// Sends one attempt. Never panics and never takes longer than `timeout` (plus the time
/// to read at most 64 KiB of a response that already arrived).
pub async fn send(client: &Client, policy: &AddressPolicy, attempt: Attempt<'_>) -> AttemptResult {
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
    let route = client
        .egress
        .route(attempt.proxy, url.host_str().unwrap_or_default());
    let now = jiff::Timestamp::now().as_second();
    let signature = signing::sign(attempt.keys, attempt.event_id, now, &attempt.body);
    let secrets = redact::secrets(attempt.headers, &signature);
    let signed = Signed {
        url,
        now,
        signature: &signature,
        attempt: &attempt,
    };
    let snippet = match route {
        Route::Refused(why) => return fail(Outcome::AddressForbidden, why),
        Route::Direct => match direct(&client.direct, signed).await {
            Ok(answer) => answered(answer, started, &attempt, &secrets).await,
            Err(e) => Err(direct_error(&e)),
        },
        Route::Proxy(proxy) => match client.proxied.get(&proxy.name) {
            Some(via) => match proxied(via, signed, started).await {
                Ok(answer) => answered(answer, started, &attempt, &secrets).await,
                Err(failure) => Err(failure),
            },
            // Every configured proxy has a client (`build`); kept as a failure, not a panic.
            None => Err((
                Outcome::RequestError,
                format!("no client for egress proxy {proxy}"),
            )),
        },
    };
    match snippet {
        Ok(result) => result,
        Err((outcome, snippet)) => fail(outcome, snippet),
    }
}

/// A request about to go out.
struct Signed<'a> {
    url: url::Url,
    now: i64,
    signature: &'a str,
    attempt: &'a Attempt<'a>,
}

impl Signed<'_> {
    /// The request's headers, Herald's first.
    fn headers(&self) -> impl Iterator<Item = (&str, String)> {
        let a = self.attempt;
        [
            ("content-type", "application/json".to_owned()),
            ("webhook-id", a.event_id.to_owned()),
            ("webhook-timestamp", self.now.to_string()),
            ("webhook-signature", self.signature.to_owned()),
        ]
        .into_iter()
        .chain(a.headers.iter().map(|h| (h.name.as_str(), h.value.clone())))
    }
}

async fn direct(
    client: &reqwest::Client,
    signed: Signed<'_>,
) -> Result<Answer<reqwest::Response>, reqwest::Error> {
    let attempt = signed.attempt;
    let mut request = client.post(signed.url.clone()).timeout(attempt.timeout);
    for (name, value) in signed.headers() {
        request = request.header(name, value);
    }
    let response = request.body(attempt.body.clone()).send().await?;
    Ok(Answer {
        status: response.status().as_u16(),
        retry_after: retry_after(response.headers(), signed.now),
        body: response,
    })
}

async fn proxied(
    client: &Proxied,
    signed: Signed<'_>,
    started: Instant,
) -> Result<Answer<ProxiedBody>, (Outcome, String)> {
    let attempt = signed.attempt;
    let deadline = tokio::time::Instant::from_std(started + attempt.timeout);
    let mut request = hyper::Request::post(signed.url.as_str()).header("user-agent", USER_AGENT);
    for (name, value) in signed.headers() {
        request = request.header(name, value);
    }
    let request = request.body(Full::new(attempt.body.clone())).map_err(|e| {
        (
            Outcome::RequestError,
            format!("{}: {e}", Outcome::RequestError.as_str()),
        )
    })?;
    let response = match tokio::time::timeout_at(deadline, client.request(request)).await {
        Err(_) => {
            let secs = attempt.timeout.as_secs_f64();
            return Err((
                Outcome::Timeout,
                format!("timeout: no answer within {secs}s"),
            ));
        }
        Ok(Err(e)) => return Err(proxied_error(&e)),
        Ok(Ok(response)) => response,
    };
    Ok(Answer {
        status: response.status().as_u16(),
        retry_after: retry_after(response.headers(), signed.now),
        body: ProxiedBody {
            body: response.into_body(),
            deadline,
        },
    })
}

fn retry_after(headers: &hyper::HeaderMap, now: i64) -> Option<Duration> {
    headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| parse_retry_after(v, now))
}

/// The outcome of an answer: its status, and the snippet of its body.
async fn answered(
    answer: Answer<impl Chunks>,
    started: Instant,
    attempt: &Attempt<'_>,
    secrets: &[&str],
) -> Result<AttemptResult, (Outcome, String)> {
    let latency = started.elapsed();
    let snippet = read_snippet(answer.body, attempt.redact_fields, secrets).await;
    Ok(AttemptResult {
        outcome: Outcome::of_status(answer.status),
        status: Some(answer.status),
        latency,
        snippet,
        retry_after: answer.retry_after,
    })
}

/// A proxied response's body, read until the attempt's deadline at the latest.
struct ProxiedBody {
    body: hyper::body::Incoming,
    deadline: tokio::time::Instant,
}

impl Chunks for ProxiedBody {
    async fn next_chunk(&mut self) -> Result<Option<Bytes>, ()> {
        loop {
            match tokio::time::timeout_at(self.deadline, self.body.frame()).await {
                Ok(None) => return Ok(None),
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        return Ok(Some(data));
                    }
                }
                Err(_) | Ok(Some(Err(_))) => return Err(()),
            }
        }
    }
}

#[cfg(test)]
mod tests;
