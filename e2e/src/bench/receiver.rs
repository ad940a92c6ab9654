//! The benchmark's receiver: hyper's HTTP/1 server with keep-alive, no routing layer and
//! no JSON parse, so that it costs the machine it shares with the dispatcher as little as
//! possible (the profile counted the axum receiver with a JSON parse and one global lock
//! at about 25 µs per event).
//!
//! Contract:
//! - a path is `/<id>`, registered in advance with [`Receiver::path`] and its
//!   [`Behavior`]; an unknown path answers 404;
//! - per path it keeps every request's arrival (the event index of its body, the instant,
//!   whether it was accepted), the distinct event indices accepted, and counters; the hot
//!   path takes only the path's own lock, never one shared by all paths: each connection
//!   keeps a snapshot of the path table and reloads it only for an id it does not know;
//! - the event index is the number after the body's first `"i":` (the publisher writes
//!   `{"type": .., "data": {"i": N, ..}}`; Herald's envelope keeps `data` as it was
//!   published), found by a scan ([`event_index`]).

use std::cell::RefCell;
use std::collections::HashSet;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// How a path answers.
#[derive(Clone, Copy, Debug, Default)]
pub struct Behavior {
    /// Accepted requests are answered after this long (a slow receiver, or one that hangs
    /// past the sender's timeout).
    pub delay: Duration,
    /// A token bucket `(per second, burst)` in front: a request beyond it is answered 429
    /// at once, without `Retry-After` as many real rate limiters do, unless `retry_after`.
    pub rate_limit: Option<(f64, f64)>,
    /// `Retry-After` (seconds) on the rate limiter's 429s.
    pub retry_after: Option<u32>,
}

impl Behavior {
    pub fn delayed(delay: Duration) -> Self {
        Self {
            delay,
            ..Self::default()
        }
    }

    pub fn rate_limited(per_second: f64, burst: f64, delay: Duration) -> Self {
        Self {
            delay,
            rate_limit: Some((per_second, burst)),
            retry_after: None,
        }
    }

    /// The rate limiter's 429s ask for a pause of `seconds` (`Retry-After`).
    pub fn asking_pause(self, seconds: Option<u32>) -> Self {
        Self {
            retry_after: seconds,
            ..self
        }
    }
}

/// One request as the receiver saw it.
#[derive(Clone, Copy, Debug)]
pub struct Arrival {
    /// The event index of the body (`u64::MAX` when it has none).
    pub index: u64,
    pub at: Instant,
    /// Answered 2xx (else 429 by the rate limiter).
    pub accepted: bool,
}

/// A registered path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PathId(pub usize);

#[derive(Default)]
struct Log {
    arrivals: Vec<Arrival>,
    accepted: HashSet<u64>,
}

struct PathState {
    behavior: Behavior,
    log: Mutex<Log>,
    /// Distinct event indices accepted (the size of `log.accepted`, readable without it).
    distinct: AtomicU64,
    requests: AtomicU64,
    refused: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
    /// Token bucket: tokens and when they were counted.
    bucket: Mutex<(f64, Instant)>,
}

impl PathState {
    fn new(behavior: Behavior) -> Self {
        let burst = behavior.rate_limit.map_or(0.0, |(_, burst)| burst);
        Self {
            behavior,
            log: Mutex::default(),
            distinct: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            max_in_flight: AtomicU64::new(0),
            bucket: Mutex::new((burst, Instant::now())),
        }
    }

    /// Whether the rate limiter lets a request at `at` through.
    fn admit(&self, at: Instant) -> bool {
        let Some((per_second, burst)) = self.behavior.rate_limit else {
            return true;
        };
        let mut bucket = self.bucket.lock().unwrap();
        let (tokens, counted) = *bucket;
        let tokens =
            (tokens + at.saturating_duration_since(counted).as_secs_f64() * per_second).min(burst);
        let ok = tokens >= 1.0;
        *bucket = (if ok { tokens - 1.0 } else { tokens }, at.max(counted));
        ok
    }
}

type Table = Arc<Vec<Arc<PathState>>>;

/// The receiver; clones share it.
#[derive(Clone)]
pub struct Receiver {
    table: Arc<RwLock<Table>>,
    /// `http://127.0.0.1:<port>` of the listener [`Receiver::start`] opened.
    pub base: String,
}

impl Receiver {
    /// Starts the receiver on a free port of 127.0.0.1.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding the receiver");
        let base = format!(
            "http://{}",
            listener.local_addr().expect("receiver address")
        );
        let rx = Self {
            table: Arc::default(),
            base,
        };
        rx.serve(listener);
        rx
    }

    /// Serves the same paths on another listener (a receiver that was down coming back
    /// on its port) until the handle is aborted; open connections outlive it.
    pub fn serve(&self, listener: TcpListener) -> JoinHandle<()> {
        let table = self.table.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let table = table.clone();
                tokio::spawn(async move {
                    let local = RefCell::new(table.read().unwrap().clone());
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let state = route(&table, &local, req.uri().path());
                        handle(state, req)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .keep_alive(true)
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        })
    }

    /// Registers a path answering as `behavior`.
    pub fn path(&self, behavior: Behavior) -> PathId {
        let mut table = self.table.write().unwrap();
        let mut next: Vec<Arc<PathState>> = table.as_ref().clone();
        next.push(Arc::new(PathState::new(behavior)));
        *table = Arc::new(next);
        PathId(table.len() - 1)
    }

    /// Registers `n` paths answering as `behavior`.
    pub fn paths(&self, n: usize, behavior: Behavior) -> Vec<PathId> {
        let mut table = self.table.write().unwrap();
        let mut next: Vec<Arc<PathState>> = table.as_ref().clone();
        let first = next.len();
        next.extend((0..n).map(|_| Arc::new(PathState::new(behavior))));
        *table = Arc::new(next);
        (first..first + n).map(PathId).collect()
    }

    /// The URL of `path` on this receiver's own listener.
    pub fn url(&self, path: PathId) -> String {
        format!("{}/{}", self.base, path.0)
    }

    /// The URL of `path` at another base (a listener given to [`Receiver::serve`]).
    pub fn url_at(base: &str, path: PathId) -> String {
        format!("{base}/{}", path.0)
    }

    fn state(&self, path: PathId) -> Arc<PathState> {
        self.table.read().unwrap()[path.0].clone()
    }

    /// Distinct event indices `paths` accepted, summed (cheap: counters only).
    pub fn distinct(&self, paths: &[PathId]) -> u64 {
        let table = self.table.read().unwrap().clone();
        paths
            .iter()
            .map(|p| table[p.0].distinct.load(Ordering::Relaxed))
            .sum()
    }

    /// Requests on every path so far.
    pub fn total_requests(&self) -> u64 {
        let table = self.table.read().unwrap().clone();
        table
            .iter()
            .map(|p| p.requests.load(Ordering::Relaxed))
            .sum()
    }

    /// Requests on `path`, and how many of them the rate limiter refused.
    pub fn requests(&self, path: PathId) -> (u64, u64) {
        let state = self.state(path);
        (
            state.requests.load(Ordering::Relaxed),
            state.refused.load(Ordering::Relaxed),
        )
    }

    /// The most requests in flight at once on `path` (accepted ones, while delayed).
    pub fn max_in_flight(&self, path: PathId) -> u64 {
        self.state(path).max_in_flight.load(Ordering::Relaxed)
    }

    /// Every request on `path`, in arrival order.
    pub fn arrivals(&self, path: PathId) -> Vec<Arrival> {
        self.state(path).log.lock().unwrap().arrivals.clone()
    }

    /// The first accepted arrival of every event index on `path`, in arrival order.
    pub fn first_accepted(&self, path: PathId) -> Vec<(u64, Instant)> {
        let mut seen = HashSet::new();
        self.arrivals(path)
            .into_iter()
            .filter(|a| a.accepted && seen.insert(a.index))
            .map(|a| (a.index, a.at))
            .collect()
    }
}

/// The state of the path of `uri_path`, from the connection's snapshot of the table
/// (reloaded, under the table's lock, only for an id the snapshot does not have).
fn route(table: &RwLock<Table>, local: &RefCell<Table>, uri_path: &str) -> Option<Arc<PathState>> {
    let id: usize = uri_path.trim_start_matches('/').parse().ok()?;
    if id >= local.borrow().len() {
        *local.borrow_mut() = table.read().unwrap().clone();
    }
    local.borrow().get(id).cloned()
}

fn answer(status: StatusCode) -> Result<Response<Full<Bytes>>, Infallible> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = status;
    Ok(response)
}

async fn handle(
    state: Option<Arc<PathState>>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let body = match req.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => return answer(StatusCode::BAD_REQUEST),
    };
    let at = Instant::now();
    let Some(state) = state else {
        return answer(StatusCode::NOT_FOUND);
    };
    let index = event_index(&body).unwrap_or(u64::MAX);
    state.requests.fetch_add(1, Ordering::Relaxed);
    let accepted = state.admit(at);
    {
        let mut log = state.log.lock().unwrap();
        log.arrivals.push(Arrival {
            index,
            at,
            accepted,
        });
        if accepted && log.accepted.insert(index) {
            state.distinct.fetch_add(1, Ordering::Relaxed);
        }
    }
    if !accepted {
        state.refused.fetch_add(1, Ordering::Relaxed);
        let mut refusal = answer(StatusCode::TOO_MANY_REQUESTS)?;
        if let Some(seconds) = state.behavior.retry_after {
            refusal
                .headers_mut()
                .insert(hyper::header::RETRY_AFTER, seconds.into());
        }
        return Ok(refusal);
    }
    if !state.behavior.delay.is_zero() {
        let now = state.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        state.max_in_flight.fetch_max(now, Ordering::Relaxed);
        // Counted down also when hyper drops this future (the sender gave up).
        struct Leave<'a>(&'a AtomicU64);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::Relaxed);
            }
        }
        let _leave = Leave(&state.in_flight);
        tokio::time::sleep(state.behavior.delay).await;
    }
    answer(StatusCode::OK)
}

/// The number after the first `"i":` of `body` (whitespace allowed around the colon).
pub fn event_index(body: &[u8]) -> Option<u64> {
    const KEY: &[u8] = b"\"i\"";
    let at = body.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let rest = &body[at..];
    let rest = rest
        .trim_ascii_start()
        .strip_prefix(b":")?
        .trim_ascii_start();
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_event_index_is_read_from_the_envelope() {
        let body = br#"{"type":"t3","timestamp":"2026-12-01T10:00:00Z","data":{"i":4711}}"#;
        assert_eq!(event_index(body), Some(4711));
        assert_eq!(event_index(br#"{"data":{"i" : 12, "k": 3}}"#), Some(12));
        assert_eq!(event_index(br#"{"data":{"k":3,"i":0}}"#), Some(0));
        assert_eq!(event_index(br#"{"data":{"j":1}}"#), None);
        assert_eq!(event_index(br#"{"data":{"i":"x"}}"#), None);
        assert_eq!(event_index(b""), None);
    }

    #[test]
    fn the_rate_limiter_lets_a_burst_through_then_the_rate() {
        let state = PathState::new(Behavior::rate_limited(100.0, 5.0, Duration::ZERO));
        let t0 = *state.bucket.lock().unwrap();
        let t0 = t0.1;
        let burst = (0..10).filter(|_| state.admit(t0)).count();
        assert_eq!(burst, 5, "the burst, then nothing");
        // 100 ms later: 10 tokens accrued, capped at the burst of 5.
        let later = t0 + Duration::from_millis(100);
        assert_eq!((0..10).filter(|_| state.admit(later)).count(), 5);
        // 15 ms later: one and a half tokens.
        let soon = later + Duration::from_millis(15);
        assert_eq!((0..10).filter(|_| state.admit(soon)).count(), 1);
    }
}
