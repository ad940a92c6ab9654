//! One delivery attempt over HTTP: the Standard Webhooks request, the SSRF check on the
//! resolved address at connect time, the way out (direct, or through an egress proxy
//! the platform allows), and the classification of what came back into a
//! `crate::attempt::AttemptResult` (what follows from it is decided there, purely).
//!
//! - [`resolve`]: the address policy applied to every new connection's addresses;
//! - [`connect`]: direct connections to vetted addresses;
//! - `herald_core::egress`: the proxies the platform configured and which one a
//!   delivery takes (shared with the operator, which validates the endpoint's choice);
//! - [`tunnel`]: CONNECT tunnels to vetted addresses through a proxy;
//! - [`endpoint_tls`]: clients of endpoints with their own client certificate or CA;
//! - [`redact`]: what the attempt log keeps of a response;
//! - [`classify`]: what a failed request was, and its text in the attempt log.

mod classify;
mod connect;
mod endpoint_tls;
mod redact;
mod resolve;
mod tunnel;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use herald_core::dataplane::{EndpointConfig, TlsMaterial};
use herald_core::signing::{self, SigningKey};
use herald_core::ssrf::{AddressPolicy, Forbidden};
use herald_core::v1alpha1::{EgressProxy, Header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::attempt::AttemptResult;
use crate::retry::parse_retry_after;
use herald_core::dataplane::AttemptOutcome as Outcome;

use classify::request_error;
use connect::DirectConnector;
pub use herald_core::egress::{DEFAULT_PROXY, Egress, EgressArgs, EgressError, ProxyDef, Route};
pub use redact::SNIPPET_BYTES;
use redact::{Chunks, read_snippet};
use resolve::{Lookup, system_lookup};
use tunnel::{ProxyErrors, TunnelConnector};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Idle connections kept per receiver host (and per proxy) by default: at least the
/// attempts that are in flight to one host at once, or connections are opened and closed
/// per delivery (`docs/bench/profile.md` measured 15–20 µs of CPU per event for that
/// with a pool of 64 below 640 attempts in flight to one host).
pub const DEFAULT_IDLE_PER_HOST: usize = 1024;
const USER_AGENT: &str = concat!("Herald/", env!("CARGO_PKG_VERSION"));

/// A pooled hyper client over a connector (TLS by `hyper-rustls`, HTTP/1.1 and, where
/// the receiver offers it in ALPN, HTTP/2).
type Pooled<C> = HyperClient<hyper_rustls::HttpsConnector<C>, Full<Bytes>>;

/// The delivery client: a pooled direct client and one pooled client per egress proxy
/// (so connections are reused per proxy, never across proxies). Cheap to clone.
///
/// Both are hyper's client, driven directly: reqwest's layers on top of it (redirect and
/// retry policies that Herald turns off, URL conversions) cost about a third of the
/// direct path's CPU per delivery (`docs/bench/profile.md`, "Fixes").
#[derive(Clone)]
pub struct Client {
    direct: Pooled<DirectConnector>,
    egress: Arc<Egress>,
    proxied: Arc<BTreeMap<String, Pooled<TunnelConnector>>>,
    /// The connectors of `direct` and `proxied`, for endpoints with TLS of their own.
    connector: DirectConnector,
    tunnels: Arc<BTreeMap<String, TunnelConnector>>,
    idle_per_host: usize,
    endpoint_clients: endpoint_tls::EndpointClients,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("loading the platform's TLS roots (is a rustls crypto provider installed?): {0}")]
    Tls(#[source] rustls::Error),
}

/// A pooled client over `connector`.
fn pooled<C>(connector: C, tls: &rustls::ClientConfig, idle_per_host: usize) -> Pooled<C>
where
    C: tower_service::Service<hyper::Uri> + Clone + Send + Sync + 'static,
    C::Response: hyper::rt::Read
        + hyper::rt::Write
        + hyper_util::client::legacy::connect::Connection
        + Send
        + Unpin,
    C::Future: Send + Unpin,
    C::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls.clone())
        .https_or_http()
        .enable_all_versions()
        .wrap_connector(connector);
    HyperClient::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .pool_max_idle_per_host(idle_per_host)
        .build(https)
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
        idle_per_host: usize,
    ) -> Result<Self, ClientError> {
        Self::build(
            policy,
            egress,
            system_lookup(),
            None,
            proxy_errors,
            idle_per_host,
        )
    }

    /// With `tls` unset, TLS checks certificates against the platform's roots; tests
    /// give their own roots.
    fn build(
        policy: Arc<AddressPolicy>,
        egress: Egress,
        lookup: Lookup,
        tls: Option<rustls::ClientConfig>,
        proxy_errors: ProxyErrors,
        idle_per_host: usize,
    ) -> Result<Self, ClientError> {
        let tls = match tls {
            Some(tls) => tls,
            None => {
                use rustls_platform_verifier::ConfigVerifierExt;
                rustls::ClientConfig::with_platform_verifier().map_err(ClientError::Tls)?
            }
        };
        let direct = DirectConnector {
            policy: policy.clone(),
            lookup: lookup.clone(),
            connect_timeout: CONNECT_TIMEOUT,
        };
        let connector = direct.clone();
        let direct = pooled(direct, &tls, idle_per_host);
        let tunnels: BTreeMap<String, TunnelConnector> = egress
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
                (proxy.name.clone(), connector)
            })
            .collect();
        let proxied = tunnels
            .iter()
            .map(|(name, connector)| (name.clone(), pooled(connector.clone(), &tls, idle_per_host)))
            .collect();
        Ok(Self {
            direct,
            egress: Arc::new(egress),
            proxied: Arc::new(proxied),
            connector,
            tunnels: Arc::new(tunnels),
            idle_per_host,
            endpoint_clients: endpoint_tls::EndpointClients::default(),
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
    /// The endpoint's own client certificate and CA (`spec.tls`).
    pub tls: Option<&'a TlsMaterial>,
}

impl<'a> Attempt<'a> {
    /// A request of `body` to the endpoint `config` describes, as every attempt to it
    /// goes out.
    pub fn to(
        config: &'a EndpointConfig,
        event_id: &'a str,
        body: Bytes,
        keys: &'a [SigningKey],
    ) -> Self {
        let delivery = &config.delivery;
        Self {
            url: &config.url,
            event_id,
            body,
            keys,
            headers: &config.headers,
            timeout: delivery.timeout.get(),
            redact_fields: &delivery.redact_response_fields,
            proxy: delivery.proxy.as_ref(),
            tls: config.tls.as_deref(),
        }
    }
}

/// What came back, before the body is read.
struct Answer<B> {
    status: u16,
    retry_after: Option<Duration>,
    headers: hyper::HeaderMap,
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
    let request_headers = redact::request_headers(
        [("user-agent", USER_AGENT.to_owned())]
            .into_iter()
            .chain(signed.headers()),
        attempt.headers,
    );
    let no_proxy = |proxy: &ProxyDef| {
        // Every configured proxy has a client (`build`); kept as a failure, not a panic.
        (
            Outcome::RequestError,
            format!("no client for egress proxy {proxy}"),
        )
    };
    let tls_failed = |why: String| (Outcome::RequestError, format!("tls: {why}"));
    let sent = match (route, attempt.tls) {
        (Route::Refused(why), _) => return fail(Outcome::AddressForbidden, why),
        (Route::Direct, None) => Ok(request(&client.direct, signed, started).await),
        (Route::Direct, Some(material)) => {
            match client
                .endpoint_clients
                .direct(material, &client.connector, client.idle_per_host)
            {
                Ok(via) => Ok(request(&via, signed, started).await),
                Err(why) => Err(tls_failed(why)),
            }
        }
        (Route::Proxy(proxy), None) => match client.proxied.get(&proxy.name) {
            Some(via) => Ok(request(via, signed, started).await),
            None => Err(no_proxy(proxy)),
        },
        (Route::Proxy(proxy), Some(material)) => match client.tunnels.get(&proxy.name) {
            Some(tunnel) => match client.endpoint_clients.proxied(
                material,
                &proxy.name,
                tunnel,
                client.idle_per_host,
            ) {
                Ok(via) => Ok(request(&via, signed, started).await),
                Err(why) => Err(tls_failed(why)),
            },
            None => Err(no_proxy(proxy)),
        },
    };
    let answered = match sent {
        Ok(Ok(answer)) => answered(answer, started, &attempt, &secrets).await,
        Ok(Err(failure)) | Err(failure) => Err(failure),
    };
    let mut result = match answered {
        Ok(result) => result,
        Err((outcome, snippet)) => fail(outcome, snippet),
    };
    result.request_headers = request_headers;
    result
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

/// Sends `signed` through `client` within the attempt's timeout (from `started`).
async fn request<C>(
    client: &Pooled<C>,
    signed: Signed<'_>,
    started: Instant,
) -> Result<Answer<TimedBody>, (Outcome, String)>
where
    C: tower_service::Service<hyper::Uri> + Clone + Send + Sync + 'static,
    C::Response: hyper::rt::Read
        + hyper::rt::Write
        + hyper_util::client::legacy::connect::Connection
        + Send
        + Unpin,
    C::Future: Send + Unpin,
    C::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
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
        Ok(Err(e)) => return Err(request_error(&e)),
        Ok(Ok(response)) => response,
    };
    let (parts, body) = response.into_parts();
    Ok(Answer {
        status: parts.status.as_u16(),
        retry_after: retry_after(&parts.headers, signed.now),
        headers: parts.headers,
        body: TimedBody { body, deadline },
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
    let response_headers = redact::response_headers(&answer.headers, secrets);
    let snippet = read_snippet(answer.body, attempt.redact_fields, secrets).await;
    Ok(AttemptResult {
        outcome: Outcome::of_status(answer.status),
        status: Some(answer.status),
        latency,
        snippet,
        retry_after: answer.retry_after,
        // Set by `send`, which built the request.
        request_headers: Vec::new(),
        response_headers,
    })
}

/// A response's body, read until the attempt's deadline at the latest.
struct TimedBody {
    body: hyper::body::Incoming,
    deadline: tokio::time::Instant,
}

impl Chunks for TimedBody {
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
