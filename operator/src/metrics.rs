//! Prometheus metrics and the `/metrics`, `/healthz`, `/readyz` endpoints.
//!
//! Contract: every label set is bounded (resource kind, result, error category, endpoint
//! state); names of objects and error text never become labels.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use herald_core::dataplane::EndpointKey;
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

    fn add_endpoints(&self, state: &'static str, delta: i64) {
        self.endpoints
            .get_or_create(&StateLabels { state })
            .inc_by(delta);
    }

    /// Zeroes the endpoint gauge: a replica that stops leading counts nothing.
    pub fn reset_endpoints(&self) {
        for state in STATES {
            self.endpoints.get_or_create(&StateLabels { state }).set(0);
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

/// The `state` label of every endpoint, kept so that the `herald_operator_endpoints`
/// gauge moves by one per change: O(1) per reconcile, whatever the number of endpoints.
pub struct EndpointStates {
    metrics: Arc<Metrics>,
    labels: Mutex<HashMap<EndpointKey, &'static str>>,
}

impl EndpointStates {
    /// Starts from zero (a new leadership term sees every endpoint again).
    pub fn new(metrics: Arc<Metrics>) -> Self {
        metrics.reset_endpoints();
        Self {
            metrics,
            labels: Mutex::default(),
        }
    }

    /// Records the state label of `key` (held as `key`: pass the clone other maps hold,
    /// and one allocation serves them all).
    pub fn set(&self, key: EndpointKey, label: &'static str) {
        let mut labels = self.lock();
        // A key held as another allocation is swapped for `key` (an insert keeps the old).
        let swapped = if labels
            .get_key_value(&key)
            .is_some_and(|(held, _)| !held.shares(&key))
        {
            labels.remove(&key)
        } else {
            None
        };
        let old = labels.insert(key, label).or(swapped);
        drop(labels);
        if old != Some(label) {
            if let Some(old) = old {
                self.metrics.add_endpoints(old, -1);
            }
            self.metrics.add_endpoints(label, 1);
        }
    }

    /// Forgets `key` (the endpoint is being deleted).
    pub fn remove(&self, key: &EndpointKey) {
        if let Some(old) = self.lock().remove(key) {
            self.metrics.add_endpoints(old, -1);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<EndpointKey, &'static str>> {
        // Every operation is one insert or remove: a poisoned lock is still consistent.
        self.labels.lock().unwrap_or_else(|e| e.into_inner())
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
        let m = Arc::new(m);
        let states = EndpointStates::new(m.clone());
        for name in ["a", "b", "c", "d"] {
            states.set(EndpointKey::new("ns", name), "Pending");
        }
        for name in ["a", "b", "c"] {
            states.set(EndpointKey::new("ns", name), "Active");
        }
        states.set(EndpointKey::new("ns", "a"), "Active");
        states.remove(&EndpointKey::new("ns", "d"));
        states.remove(&EndpointKey::new("ns", "gone"));
        let text = m.encode();
        assert!(
            text.contains(r#"herald_operator_endpoints{state="Pending"} 0"#),
            "{text}"
        );
        assert!(
            text.contains(r#"herald_operator_endpoints{state="Active"} 3"#),
            "{text}"
        );
        assert!(
            text.contains(r#"herald_operator_endpoints{state="Disabled"} 0"#),
            "{text}"
        );
        assert!(text.contains(r#"herald_operator_reconcile_errors_total{kind="WebhookEndpoint",category="kube"} 1"#), "{text}");
        m.reset_endpoints();
        assert!(
            m.encode()
                .contains(r#"herald_operator_endpoints{state="Active"} 0"#),
            "a term that ends counts nothing"
        );
    }
}
