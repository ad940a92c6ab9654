//! A webhook receiver that verifies Herald's signatures and deduplicates on `webhook-id`.
//!
//!     herald-receiver --listen 127.0.0.1:9000 --secret whsec_... [--fail-path failing]
//!
//! Every POST to any path is verified: 204 when the signature is valid, 401 when not.
//! A verification challenge (`herald.endpoint.verification`) with a valid signature is
//! answered 200 with the challenge, so endpoints with `spec.verify` are verified. Paths
//! named by `--fail-path` always answer 500 (to watch retries and a circuit open).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use clap::Parser;
use herald_core::signing::VerifyingKey;
use herald_examples::{challenge_answer, parse_secrets, unix_now, verify_request};

#[derive(Parser)]
#[command(about = "Receives Herald webhooks and verifies their signatures")]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9000")]
    listen: String,
    /// The endpoint's signing secret(s), `whsec_...`, or public key(s) `whpk_...` for an
    /// Ed25519 SigningSecret; two while a rotation overlaps.
    #[arg(long, env = "WEBHOOK_SECRET", value_delimiter = ',', required = true)]
    secret: Vec<String>,
    /// Paths (without `/`) that always answer 500.
    #[arg(long)]
    fail_path: Vec<String>,
}

struct Receiver {
    keys: Vec<VerifyingKey>,
    fail_paths: Vec<String>,
    /// (path, webhook-id) seen so far: delivery is at-least-once, so a receiver
    /// deduplicates. A real one keeps these in its database for longer than Herald retries
    /// (3 days by default). The same event goes to every matching endpoint with one id.
    seen: Mutex<HashSet<(String, String)>>,
}

async fn receive(
    State(rx): State<Arc<Receiver>>,
    Path(path): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if rx.fail_paths.contains(&path) {
        println!("/{path:<10} 500  failing on purpose (--fail-path)");
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    let id = match verify_request(&rx.keys, &headers, &body, unix_now()) {
        Ok(id) => id,
        Err(reason) => {
            println!("/{path:<10} 401  rejected: {reason}");
            return StatusCode::UNAUTHORIZED.into_response();
        }
    };
    let event: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    if let Some(challenge) = challenge_answer(&event) {
        println!("/{path:<10} 200  {id} verification challenge echoed");
        return (StatusCode::OK, challenge).into_response();
    }
    let first = rx
        .seen
        .lock()
        .expect("lock")
        .insert((path.clone(), id.clone()));
    println!(
        "/{path:<10} 204  {id} {:<16} {}{}",
        event["type"].as_str().unwrap_or("?"),
        event["data"],
        if first { "" } else { "  (duplicate, ignored)" }
    );
    StatusCode::NO_CONTENT.into_response()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let state = Arc::new(Receiver {
        keys: parse_secrets(&args.secret)?,
        fail_paths: args.fail_path,
        seen: Mutex::default(),
    });
    let app = Router::new()
        .route("/{*path}", post(receive))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(&args.listen).await?;
    println!(
        "herald-receiver: listening on http://{}",
        listener.local_addr()?
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
