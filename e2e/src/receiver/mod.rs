//! A webhook receiver on 127.0.0.1 for tests: records every request and answers as told
//! per path (a status sequence, a delay, extra headers), or per event: a scripted
//! failure of some events' first attempt ([`Behavior::fail_first_of_every`]) or seeded
//! random faults ([`Chaos`]: error statuses, hangs past the sender's timeout, connection
//! resets, slow bodies, 429 with `Retry-After`).
//!
//! Besides the raw requests it keeps, per path, what fault tests need cheaply: the first
//! receipt of every `webhook-id` in arrival order ([`Receiver::first_receipts`]), the
//! number of requests, the most requests in flight at once, and what each request was
//! answered ([`Receiver::exchanges`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use tokio::net::TcpListener;

mod chaos;
mod reset;
pub mod tls;

pub use chaos::{Chaos, Fault};
use reset::{Conn, ResettableListener};

/// One request as received.
#[derive(Debug, Clone)]
pub struct Received {
    pub path: String,
    pub headers: HashMap<String, String>,
    pub body: Bytes,
    pub at: Instant,
}

impl Received {
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .map(String::as_str)
            .unwrap_or_default()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("the body is JSON")
    }
}

/// How a path answers.
#[derive(Debug, Clone)]
pub struct Behavior {
    /// Statuses for successive requests; the last one repeats.
    pub statuses: Vec<u16>,
    pub delay: Duration,
    pub headers: Vec<(String, String)>,
    /// A per-event rule that comes first; requests it lets through answer as above.
    pub per_event: Option<EventRule>,
    /// A rate limiter before everything else: `(per second, burst)`, a token bucket;
    /// a request beyond it answers 429, without `Retry-After` as many real limiters do
    /// unless `limit_retry_after` is set.
    pub rate_limit: Option<(f64, f64)>,
    /// `Retry-After` (seconds) on the rate limiter's 429s.
    pub limit_retry_after: Option<u32>,
    /// Answer Herald's verification challenges (`herald.endpoint.verification`) with the
    /// challenge, as a receiver that agreed to receive does.
    pub echo_challenges: bool,
}

impl Default for Behavior {
    fn default() -> Self {
        Self {
            statuses: vec![200],
            delay: Duration::ZERO,
            headers: Vec::new(),
            per_event: None,
            rate_limit: None,
            limit_retry_after: None,
            echo_challenges: false,
        }
    }
}

impl Behavior {
    pub fn statuses(statuses: &[u16]) -> Self {
        Self {
            statuses: statuses.to_vec(),
            ..Default::default()
        }
    }

    pub fn delayed(delay: Duration) -> Self {
        Self {
            delay,
            ..Default::default()
        }
    }

    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// The first request of every `every`-th event (by its numeric `data`: 0, every,
    /// 2·every, ...) answers `status`; its retries and every other event answer 200.
    pub fn fail_first_of_every(every: u64, status: u16) -> Self {
        Self {
            per_event: Some(EventRule::FailFirstOfEvery { every, status }),
            ..Default::default()
        }
    }

    /// Accepts `per_second` requests per second with bursts of `burst`; 429 beyond.
    pub fn rate_limited(per_second: f64, burst: f64) -> Self {
        Self {
            rate_limit: Some((per_second, burst)),
            ..Default::default()
        }
    }

    /// [`Behavior::rate_limited`], its 429s asking for a pause of `retry_after` seconds.
    pub fn rate_limited_with_pause(per_second: f64, burst: f64, retry_after: u32) -> Self {
        Self {
            limit_retry_after: Some(retry_after),
            ..Self::rate_limited(per_second, burst)
        }
    }

    /// Answers 200, and echoes verification challenges.
    pub fn echoing() -> Self {
        Self {
            echo_challenges: true,
            ..Default::default()
        }
    }

    /// Seeded random faults per request (see [`Chaos`]).
    pub fn chaos(chaos: Chaos) -> Self {
        Self {
            per_event: Some(EventRule::Chaos(chaos)),
            ..Default::default()
        }
    }
}

/// An answer decided per event rather than per path.
#[derive(Debug, Clone)]
pub enum EventRule {
    /// See [`Behavior::fail_first_of_every`].
    FailFirstOfEvery { every: u64, status: u16 },
    /// See [`Chaos`].
    Chaos(Chaos),
}

/// What a request was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// A status from the path's sequence (or a per-event rule's status).
    Status(u16),
    /// A random fault.
    Fault(Fault),
}

/// One request and its answer, in arrival order.
#[derive(Debug, Clone)]
pub struct Exchange {
    pub at: Instant,
    pub webhook_id: String,
    /// The event's `data` when it is a number.
    pub data: Option<i64>,
    pub answer: Answer,
}

/// The first request of one `webhook-id` on a path.
#[derive(Debug, Clone)]
pub struct FirstReceipt {
    pub webhook_id: String,
    pub data: Option<i64>,
    pub at: Instant,
}

#[derive(Default)]
struct PathLog {
    requests: usize,
    /// webhook-id -> requests so far.
    tries: HashMap<String, u32>,
    /// webhook-id -> faulty answers so far (chaos budget).
    faults: HashMap<String, u32>,
    /// webhook-ids answered with a success already.
    succeeded: std::collections::HashSet<String>,
    /// Requests of a webhook-id that had been answered with a success before.
    after_success: usize,
    firsts: Vec<FirstReceipt>,
    exchanges: Vec<Exchange>,
}

#[derive(Default)]
struct Inner {
    received: Vec<Received>,
    behaviors: HashMap<String, Behavior>,
    served: HashMap<String, usize>,
    in_flight: HashMap<String, usize>,
    max_in_flight: HashMap<String, usize>,
    logs: HashMap<String, PathLog>,
    /// Token buckets of rate-limited paths: tokens and when they were counted.
    buckets: HashMap<String, (f64, Instant)>,
}

/// A running receiver; stops when dropped... or with the test process.
#[derive(Clone)]
pub struct Receiver {
    pub addr: SocketAddr,
    inner: Arc<Mutex<Inner>>,
}

impl Receiver {
    /// Starts a receiver on a free port of 127.0.0.1.
    pub async fn start() -> Self {
        Self::start_on("127.0.0.1").await
    }

    /// Starts a receiver on a free port of `ip` (e.g. 127.0.0.2, for a policy that
    /// allows that address and not 127.0.0.1).
    pub async fn start_on(ip: &str) -> Self {
        let listener = TcpListener::bind((ip, 0))
            .await
            .expect("binding the receiver");
        let addr = listener.local_addr().expect("receiver address");
        let inner = Arc::new(Mutex::new(Inner::default()));
        let app = Router::new()
            .route("/{*path}", post(handle))
            .with_state(inner.clone());
        tokio::spawn(async move {
            let _ = axum::serve(
                ResettableListener(listener),
                app.into_make_service_with_connect_info::<Conn>(),
            )
            .await;
        });
        Self { addr, inner }
    }

    /// `http://<ip>:<port>/<path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}/{path}", self.addr)
    }

    pub fn behave(&self, path: &str, behavior: Behavior) {
        self.inner
            .lock()
            .unwrap()
            .behaviors
            .insert(path.to_owned(), behavior);
    }

    /// Requests received on `path` so far.
    pub fn received(&self, path: &str) -> Vec<Received> {
        self.inner
            .lock()
            .unwrap()
            .received
            .iter()
            .filter(|r| r.path == path)
            .cloned()
            .collect()
    }

    /// Waits until `path` has received every number in `0..count` as its event's `data`
    /// (a numbered stream); `Err` with the numbers still missing after `timeout`.
    pub async fn until_numbered(
        &self,
        path: &str,
        count: i64,
        timeout: Duration,
    ) -> Result<(), Vec<i64>> {
        let missing = || -> Vec<i64> {
            let got: std::collections::BTreeSet<i64> = self
                .received(path)
                .iter()
                .filter_map(|r| r.json()["data"].as_i64())
                .collect();
            (0..count).filter(|i| !got.contains(i)).collect()
        };
        let started = Instant::now();
        loop {
            let left = missing();
            if left.is_empty() {
                return Ok(());
            }
            if started.elapsed() > timeout {
                return Err(left);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The most requests that were ever in flight at once on `path` (a request is in
    /// flight until its response body is sent or its connection is gone).
    pub fn max_in_flight(&self, path: &str) -> usize {
        *self
            .inner
            .lock()
            .unwrap()
            .max_in_flight
            .get(path)
            .unwrap_or(&0)
    }

    /// Requests received on `path` so far (cheap).
    pub fn request_count(&self, path: &str) -> usize {
        self.inner
            .lock()
            .unwrap()
            .logs
            .get(path)
            .map_or(0, |l| l.requests)
    }

    /// Distinct `webhook-id`s received on `path` so far (cheap).
    pub fn distinct_count(&self, path: &str) -> usize {
        self.inner
            .lock()
            .unwrap()
            .logs
            .get(path)
            .map_or(0, |l| l.firsts.len())
    }

    /// Requests on `path` for a `webhook-id` that had already been answered with a
    /// success: the duplicates a receiver deduplicates (retries after a failure are not
    /// counted).
    pub fn duplicate_count(&self, path: &str) -> usize {
        self.inner
            .lock()
            .unwrap()
            .logs
            .get(path)
            .map_or(0, |l| l.after_success)
    }

    /// The `webhook-id`s `path` answered with a success.
    pub fn succeeded_ids(&self, path: &str) -> std::collections::HashSet<String> {
        self.inner
            .lock()
            .unwrap()
            .logs
            .get(path)
            .map(|l| l.succeeded.clone())
            .unwrap_or_default()
    }

    /// The first request of every `webhook-id` on `path`, in arrival order.
    pub fn first_receipts(&self, path: &str) -> Vec<FirstReceipt> {
        self.inner
            .lock()
            .unwrap()
            .logs
            .get(path)
            .map(|l| l.firsts.clone())
            .unwrap_or_default()
    }

    /// Every request on `path` with its answer, in arrival order.
    pub fn exchanges(&self, path: &str) -> Vec<Exchange> {
        self.inner
            .lock()
            .unwrap()
            .logs
            .get(path)
            .map(|l| l.exchanges.clone())
            .unwrap_or_default()
    }
}

/// Counts a request in flight until dropped: when the handler returns, when its slow body
/// is sent, or when hyper drops the handler because the client went away.
struct InFlight {
    inner: Arc<Mutex<Inner>>,
    path: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Ok(mut inner) = self.inner.lock()
            && let Some(n) = inner.in_flight.get_mut(&self.path)
        {
            *n = n.saturating_sub(1);
        }
    }
}

/// What the handler does after recording the request.
enum Plan {
    Scripted {
        status: u16,
        delay: Duration,
        headers: Vec<(String, String)>,
    },
    Fault(Fault, Duration),
}

async fn handle(
    State(inner): State<Arc<Mutex<Inner>>>,
    ConnectInfo(conn): ConnectInfo<Conn>,
    Path(path): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let parsed = serde_json::from_slice::<serde_json::Value>(&body).ok();
    let data = parsed
        .as_ref()
        .and_then(|v| v.get("data").and_then(serde_json::Value::as_i64));
    let challenge = parsed
        .as_ref()
        .filter(|v| v["type"] == herald_core::verification::EVENT_TYPE)
        .and_then(|v| v["data"]["challenge"].as_str().map(str::to_owned));
    let (plan, guard, reply) = {
        let mut guard = inner.lock().unwrap();
        let inner_ref = &mut *guard;
        let headers: HashMap<String, String> = headers
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_owned(),
                    v.to_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        let webhook_id = headers.get("webhook-id").cloned().unwrap_or_default();
        let at = Instant::now();
        inner_ref.received.push(Received {
            path: path.clone(),
            headers,
            body,
            at,
        });
        let n = inner_ref.in_flight.entry(path.clone()).or_default();
        *n += 1;
        let now = *n;
        let max = inner_ref.max_in_flight.entry(path.clone()).or_default();
        *max = (*max).max(now);
        let behavior = inner_ref.behaviors.get(&path).cloned().unwrap_or_default();
        let log = inner_ref.logs.entry(path.clone()).or_default();
        log.requests += 1;
        let tries = log.tries.entry(webhook_id.clone()).or_default();
        let nth = *tries;
        *tries += 1;
        if nth == 0 {
            log.firsts.push(FirstReceipt {
                webhook_id: webhook_id.clone(),
                data,
                at,
            });
        }
        let event = data.map_or_else(|| webhook_id.clone(), |d| d.to_string());
        let limited = behavior.rate_limit.is_some_and(|(per_second, burst)| {
            let (tokens, counted) = inner_ref.buckets.get(&path).copied().unwrap_or((burst, at));
            let tokens = (tokens + (at - counted).as_secs_f64() * per_second).min(burst);
            let ok = tokens >= 1.0;
            let left = if ok { tokens - 1.0 } else { tokens };
            inner_ref.buckets.insert(path.clone(), (left, at));
            !ok
        });
        let log = inner_ref.logs.entry(path.clone()).or_default();
        let plan = match &behavior.per_event {
            _ if limited => Some(Plan::Scripted {
                status: 429,
                delay: Duration::ZERO,
                headers: behavior
                    .limit_retry_after
                    .map(|after| ("retry-after".to_owned(), after.to_string()))
                    .into_iter()
                    .collect(),
            }),
            Some(EventRule::FailFirstOfEvery { every, status })
                if nth == 0 && data.is_some_and(|d| d.rem_euclid((*every).max(1) as i64) == 0) =>
            {
                Some(Plan::Scripted {
                    status: *status,
                    delay: Duration::ZERO,
                    headers: Vec::new(),
                })
            }
            Some(EventRule::Chaos(chaos)) => {
                let spent = log.faults.get(&webhook_id).copied().unwrap_or(0);
                let fault = chaos
                    .draw(&path, &event, nth)
                    .filter(|f| !f.fails() || spent < chaos.max_faults);
                if fault.is_some_and(Fault::fails) {
                    *log.faults.entry(webhook_id.clone()).or_default() += 1;
                }
                let wait = match fault {
                    Some(Fault::Hang) => chaos.hang,
                    _ => chaos.slow_body,
                };
                Some(fault.map_or(
                    Plan::Scripted {
                        status: 200,
                        delay: Duration::ZERO,
                        headers: Vec::new(),
                    },
                    |f| Plan::Fault(f, wait),
                ))
            }
            _ => None,
        };
        let plan = plan.unwrap_or_else(|| {
            let served = inner_ref.served.entry(path.clone()).or_default();
            let status = behavior.statuses[(*served).min(behavior.statuses.len() - 1)];
            *served += 1;
            Plan::Scripted {
                status,
                delay: behavior.delay,
                headers: behavior.headers.clone(),
            }
        });
        let answer = match &plan {
            Plan::Scripted { status, .. } => Answer::Status(*status),
            Plan::Fault(f, _) => Answer::Fault(*f),
        };
        let log = inner_ref.logs.entry(path.clone()).or_default();
        let success = match answer {
            Answer::Status(s) => (200..300).contains(&s),
            Answer::Fault(f) => f == Fault::SlowBody,
        };
        if log.succeeded.contains(&webhook_id) {
            log.after_success += 1;
        } else if success {
            log.succeeded.insert(webhook_id.clone());
        }
        log.exchanges.push(Exchange {
            at,
            webhook_id,
            data,
            answer,
        });
        let guard = InFlight {
            inner: inner.clone(),
            path,
        };
        let reply = challenge
            .filter(|_| behavior.echo_challenges)
            .unwrap_or_else(|| "ok".to_owned());
        (plan, guard, reply)
    };
    match plan {
        Plan::Scripted {
            status,
            delay,
            headers,
        } => {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            drop(guard);
            let mut response = (
                StatusCode::from_u16(status).unwrap_or(StatusCode::OK),
                reply,
            )
                .into_response();
            for (name, value) in headers {
                response.headers_mut().insert(
                    axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                    value.parse().unwrap(),
                );
            }
            response
        }
        Plan::Fault(Fault::Status(status), _) => {
            drop(guard);
            (
                StatusCode::from_u16(status).unwrap_or(StatusCode::OK),
                "fault",
            )
                .into_response()
        }
        Plan::Fault(Fault::RetryAfter(seconds), _) => {
            drop(guard);
            let mut response = (StatusCode::TOO_MANY_REQUESTS, "slow down").into_response();
            response
                .headers_mut()
                .insert("retry-after", seconds.to_string().parse().unwrap());
            response
        }
        Plan::Fault(Fault::Hang, hang) => {
            // Dropped here (guard and all) if the client gives up and hyper notices.
            tokio::time::sleep(hang).await;
            drop(guard);
            (StatusCode::OK, "late").into_response()
        }
        Plan::Fault(Fault::Reset, _) => {
            // The connection fails the response's write and is closed with SO_LINGER 0:
            // the client gets a TCP RST instead of an answer.
            conn.0.store(true, Ordering::SeqCst);
            drop(guard);
            (StatusCode::OK, "never sent").into_response()
        }
        Plan::Fault(Fault::SlowBody, slow) => {
            const CHUNKS: u32 = 5;
            let pause = slow / CHUNKS;
            let body = futures::stream::unfold((0u32, Some(guard)), move |(i, guard)| async move {
                if i == CHUNKS {
                    drop(guard);
                    return None;
                }
                tokio::time::sleep(pause).await;
                Some((
                    Ok::<_, std::io::Error>(Bytes::from_static(b"slow ")),
                    (i + 1, guard),
                ))
            });
            (StatusCode::OK, Body::from_stream(body)).into_response()
        }
    }
}
