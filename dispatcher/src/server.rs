//! `/metrics`, `/healthz` (the process answers) and `/readyz` (connected and running).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::metrics::Metrics;

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    ready: watch::Receiver<bool>,
}

/// Binds `addr` and serves in a task.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    ready: watch::Receiver<bool>,
) -> std::io::Result<JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready_handler))
        .with_state(AppState { metrics, ready });
    Ok(tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::warn!(%error, "metrics server stopped");
        }
    }))
}

async fn metrics_handler(State(state): State<AppState>) -> String {
    state.metrics.encode()
}

async fn ready_handler(State(state): State<AppState>) -> (StatusCode, &'static str) {
    if *state.ready.borrow() {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}
