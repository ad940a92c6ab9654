//! `/metrics`, `/healthz` (the process answers) and `/readyz` (every part works: the
//! configuration is loaded, fan-out runs, no shard is failing; otherwise the parts that
//! do not are named).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::task::JoinHandle;

use crate::metrics::Metrics;
use crate::supervise::Readiness;

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
}

/// Binds `addr` and serves in a task.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
) -> std::io::Result<JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready_handler))
        .with_state(AppState { metrics, readiness });
    Ok(tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::warn!(%error, "metrics server stopped");
        }
    }))
}

async fn metrics_handler(State(state): State<AppState>) -> String {
    state.metrics.encode()
}

async fn ready_handler(State(state): State<AppState>) -> (StatusCode, String) {
    let not_ready = state.readiness.not_ready();
    if not_ready.is_empty() {
        (StatusCode::OK, "ready".into())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}", not_ready.join(", ")),
        )
    }
}
