//! A Herald webhook receiver in Rust (axum), verifying with the official Standard
//! Webhooks crate, `standardwebhooks`.
//!
//! ```sh
//! WEBHOOK_SECRET=whsec_... cargo run -- --port 9005
//! ```
//!
//! Answers 204 for a valid signature, also for a duplicate (delivery is at-least-once: a
//! retry, a replay or a redelivery after a dispatcher restart carries the same
//! `webhook-id`), which is then not processed again; 401 for a bad signature or a
//! timestamp more than 5 minutes away. Prints `processed <webhook-id> <type>` or
//! `duplicate <webhook-id>` per request.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use standardwebhooks::{Webhook, WebhookError};

/// How many `webhook-id`s the receiver remembers. A real receiver keeps them in its
/// database (for longer than Herald retries and replays: days), in the same transaction
/// as the effect of the event; memory is enough for an example.
const REMEMBERED: usize = 10_000;

/// A bounded set of keys, the path and the `webhook-id`: the oldest is forgotten first.
/// The path is in the key because Herald sends an event to each of a namespace's
/// endpoints that match it with the same `webhook-id`: a receiver serving several
/// endpoints (one path each) processes it once per endpoint.
#[derive(Default)]
struct Seen {
    ids: HashSet<String>,
    order: VecDeque<String>,
}

impl Seen {
    /// Records `key` and says whether it is new. The caller holds the lock for both, so
    /// two concurrent deliveries of one event (a retry racing a slow first attempt)
    /// cannot both be taken for new.
    fn first_time(&mut self, key: String) -> bool {
        if !self.ids.insert(key.clone()) {
            return false;
        }
        self.order.push_back(key);
        if self.order.len() > REMEMBERED
            && let Some(oldest) = self.order.pop_front()
        {
            self.ids.remove(&oldest);
        }
        true
    }
}

struct Receiver {
    /// One per secret: two while a key rotation overlaps. Herald signs with every key of
    /// an overlap, so either secret alone suffices.
    webhooks: Vec<Webhook>,
    seen: Mutex<Seen>,
}

impl Receiver {
    /// `Ok` when one of the secrets signed the raw body.
    fn verify(&self, body: &[u8], headers: &HeaderMap) -> Result<(), WebhookError> {
        let mut error = WebhookError::InvalidSignature;
        for webhook in &self.webhooks {
            match webhook.verify(body, headers) {
                Ok(()) => return Ok(()),
                Err(e) => error = e,
            }
        }
        Err(error)
    }
}

/// The signature covers the raw bytes: the handler takes `Bytes`, not `Json`, and
/// decodes only what verified.
async fn receive(
    State(rx): State<Arc<Receiver>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(e) = rx.verify(&body, &headers) {
        println!("rejected {e}");
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let Ok(event) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let id = headers
        .get("webhook-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let kind = event["type"].as_str().unwrap_or_default();
    // Herald's endpoint verification (an endpoint with `spec.verify`): echo the
    // challenge. Its `webhook-id` is fresh each time, so it needs no deduplication.
    if kind == "herald.endpoint.verification" {
        println!("challenge {id}");
        let answer = serde_json::json!({"challenge": event["data"]["challenge"]});
        return (
            [(header::CONTENT_TYPE, "application/json")],
            answer.to_string(),
        )
            .into_response();
    }
    if !rx
        .seen
        .lock()
        .unwrap()
        .first_time(format!("{} {id}", uri.path()))
    {
        println!("duplicate {id}");
        return StatusCode::NO_CONTENT.into_response();
    }
    println!("processed {id} {kind}");
    StatusCode::NO_CONTENT.into_response()
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip_while(|a| a != "--port").skip(1);
    let port: u16 = args
        .next()
        .map_or(9005, |p| p.parse().expect("--port <number>"));
    let webhooks = std::env::var("WEBHOOK_SECRET")
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| Webhook::new(s).expect("WEBHOOK_SECRET: whsec_ and base64"))
        .collect();
    let rx = Arc::new(Receiver {
        webhooks,
        seen: Mutex::default(),
    });
    let app = Router::new().fallback(post(receive)).with_state(rx);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("binding the port");
    println!("listening on http://127.0.0.1:{port}");
    axum::serve(listener, app).await.expect("serving");
}
