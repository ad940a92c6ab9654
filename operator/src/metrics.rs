//! Prometheus metrics and the `/metrics`, `/healthz`, `/readyz` endpoints.
//!
//! Contract: every label set is bounded (resource kind, result, error category, endpoint
//! state); names of objects and error text never become labels.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use herald_core::v1alpha1::EndpointState;
use prometheus_client::encoding::{EncodeLabelSet, text::encode};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    pub kind: &'static str,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub kind: &'static str,
    pub category: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: &'static str,
}

/// The operator's metrics, registered once.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<ReconcileLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    duration: Family<KindLabels, Histogram>,
    endpoints: Family<StateLabels, Gauge>,
    leader: Gauge,
    ready: AtomicBool,
}

/// Every value of the `state` label, so the gauge reports zeros instead of nothing.
pub const STATES: [&str; 6] = [
    "Pending", "Active", "Degraded", "Paused", "Disabled", "NotReady",
];

/// The `state` label of an endpoint (`NotReady` when it has no state).
pub fn state_label(state: Option<EndpointState>) -> &'static str {
    match state {
        Some(EndpointState::Pending) => "Pending",
        Some(EndpointState::Active) => "Active",
        Some(EndpointState::Degraded) => "Degraded",
        Some(EndpointState::Paused) => "Paused",
        Some(EndpointState::Disabled) => "Disabled",
        None => "NotReady",
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("herald_operator");
        let reconciles = Family::<ReconcileLabels, Counter>::default();
        let errors = Family::<ErrorLabels, Counter>::default();
        let duration = Family::<KindLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 14))
        });
        let endpoints = Family::<StateLabels, Gauge>::default();
        let leader = Gauge::default();
        registry.register(
            "reconciles",
            "Reconciliations by resource kind and result",
            reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Failed reconciliations by resource kind and error category",
            errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Duration of one reconciliation",
            duration.clone(),
        );
        registry.register(
            "endpoints",
            "WebhookEndpoints by state; alert on state=\"Disabled\"",
            endpoints.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease",
            leader.clone(),
        );
        for state in STATES {
            endpoints.get_or_create(&StateLabels { state }).set(0);
        }
        Self {
            registry,
            reconciles,
            errors,
            duration,
            endpoints,
            leader,
            ready: AtomicBool::new(false),
        }
    }
}

impl Metrics {
    pub fn reconciled(&self, kind: &'static str, duration: Duration, error: Option<&'static str>) {
        let result = if error.is_some() { "error" } else { "ok" };
        self.reconciles
            .get_or_create(&ReconcileLabels { kind, result })
            .inc();
        if let Some(category) = error {
            self.errors
                .get_or_create(&ErrorLabels { kind, category })
                .inc();
        }
        self.duration
            .get_or_create(&KindLabels { kind })
            .observe(duration.as_secs_f64());
    }

    /// Sets the endpoint gauge from complete counts.
    pub fn set_endpoint_counts(&self, counts: &[(&'static str, i64)]) {
        for &(state, n) in counts {
            self.endpoints.get_or_create(&StateLabels { state }).set(n);
        }
    }

    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// Serves the metrics and probes on `listener` until `stop` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = axum::Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready_handler))
        .with_state(metrics);
    tracing::info!(addr = %listener.local_addr()?, "serving metrics and probes");
    axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await
}

async fn metrics_handler(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        metrics.encode(),
    )
}

/// Ready once NATS is reachable and the buckets exist; a standby replica is ready too
/// (it is a valid target for nothing but failover).
async fn ready_handler(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    if metrics.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_has_bounded_families() {
        let m = Metrics::default();
        m.reconciled("WebhookEndpoint", Duration::from_millis(3), None);
        m.reconciled("WebhookEndpoint", Duration::from_millis(3), Some("kube"));
        m.set_endpoint_counts(&[("Active", 3)]);
        let text = m.encode();
        assert!(
            text.contains(r#"herald_operator_endpoints{state="Active"} 3"#),
            "{text}"
        );
        assert!(
            text.contains(r#"herald_operator_endpoints{state="Disabled"} 0"#),
            "{text}"
        );
        assert!(text.contains(r#"herald_operator_reconcile_errors_total{kind="WebhookEndpoint",category="kube"} 1"#), "{text}");
    }
}
