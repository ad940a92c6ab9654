//! A webhook receiver on 127.0.0.1 for tests: records every request and answers as told
//! per path (a status sequence, a delay, extra headers).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;

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
}

impl Default for Behavior {
    fn default() -> Self {
        Self {
            statuses: vec![200],
            delay: Duration::ZERO,
            headers: Vec::new(),
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
}

#[derive(Default)]
struct Inner {
    received: Vec<Received>,
    behaviors: HashMap<String, Behavior>,
    served: HashMap<String, usize>,
    in_flight: HashMap<String, usize>,
    max_in_flight: HashMap<String, usize>,
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
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding the receiver");
        let addr = listener.local_addr().expect("receiver address");
        let inner = Arc::new(Mutex::new(Inner::default()));
        let app = Router::new()
            .route("/{*path}", post(handle))
            .with_state(inner.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, inner }
    }

    /// `http://127.0.0.1:<port>/<path>`.
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

    /// The most requests that were ever in flight at once on `path`.
    pub fn max_in_flight(&self, path: &str) -> usize {
        *self
            .inner
            .lock()
            .unwrap()
            .max_in_flight
            .get(path)
            .unwrap_or(&0)
    }
}

async fn handle(
    State(inner): State<Arc<Mutex<Inner>>>,
    Path(path): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let behavior = {
        let mut inner = inner.lock().unwrap();
        let headers = headers
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_owned(),
                    v.to_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        inner.received.push(Received {
            path: path.clone(),
            headers,
            body,
            at: Instant::now(),
        });
        let n = inner.in_flight.entry(path.clone()).or_default();
        *n += 1;
        let now = *n;
        let max = inner.max_in_flight.entry(path.clone()).or_default();
        *max = (*max).max(now);
        let behavior = inner.behaviors.get(&path).cloned().unwrap_or_default();
        let served = inner.served.entry(path.clone()).or_default();
        let status = behavior.statuses[(*served).min(behavior.statuses.len() - 1)];
        *served += 1;
        (behavior, status)
    };
    let (behavior, status) = behavior;
    if !behavior.delay.is_zero() {
        tokio::time::sleep(behavior.delay).await;
    }
    *inner.lock().unwrap().in_flight.entry(path).or_default() -= 1;
    let mut response =
        (StatusCode::from_u16(status).unwrap_or(StatusCode::OK), "ok").into_response();
    for (name, value) in behavior.headers {
        response.headers_mut().insert(
            axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    response
}
