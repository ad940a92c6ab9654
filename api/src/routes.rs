//! The route table (one list, from which the router is built and against which the
//! OpenAPI document is tested), the checks every tenant request passes — authenticate,
//! authorize, the namespace's rate limit — and the probes.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};

use herald_core::dataplane::EndpointConfig;

use crate::App;
use crate::auth::{Access, Caller};
use crate::error::ApiError;
use crate::handlers;
use crate::limit::{Quota, retry_after_secs};
use crate::metrics::{RequestLabel, RouteLabel};

/// Every route: method, path (OpenAPI's template syntax, which axum shares) and the
/// name used as its metric label.
pub const ROUTES: &[(Method, &str, &str)] = &[
    (
        Method::GET,
        "/v1/namespaces/{ns}/endpoints/{name}/deliveries",
        "listDeliveries",
    ),
    (
        Method::GET,
        "/v1/namespaces/{ns}/endpoints/{name}/deliveries/{eventId}",
        "getDelivery",
    ),
    (Method::POST, "/v1/namespaces/{ns}/events", "createEvent"),
    (
        Method::POST,
        "/v1/namespaces/{ns}/endpoints/{name}/redeliver/{eventId}",
        "redeliver",
    ),
    (
        Method::POST,
        "/v1/namespaces/{ns}/endpoints/{name}/redrive-dead",
        "redriveDead",
    ),
    (
        Method::POST,
        "/v1/namespaces/{ns}/endpoints/{name}/test",
        "sendTestEvent",
    ),
    (Method::GET, "/healthz", "healthz"),
    (Method::GET, "/readyz", "readyz"),
    (Method::GET, "/metrics", "metrics"),
    (Method::GET, "/openapi.json", "openapi"),
];

fn handler(name: &str) -> MethodRouter<Arc<App>> {
    match name {
        "listDeliveries" => get(handlers::list_deliveries),
        "getDelivery" => get(handlers::get_delivery),
        "createEvent" => post(handlers::create_event),
        "redeliver" => post(handlers::redeliver),
        "redriveDead" => post(handlers::redrive_dead),
        "sendTestEvent" => post(handlers::send_test_event),
        "healthz" => get(|| async { "ok" }),
        "readyz" => get(readyz),
        "metrics" => get(metrics),
        "openapi" => get(openapi),
        other => unreachable!("route {other} has no handler"),
    }
}

/// The API's router.
pub fn router(app: Arc<App>) -> Router {
    let mut router = Router::new();
    for (_, path, name) in ROUTES {
        router = router.route(path, handler(name));
    }
    router
        .fallback(|| async { ApiError::not_found("NotFound", "no such route; see /openapi.json") })
        .layer(middleware::from_fn_with_state(app.clone(), track))
        .with_state(app)
}

/// Counts and times every request by its route's name.
async fn track(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let path = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned());
    let route = path
        .and_then(|p| ROUTES.iter().find(|(_, path, _)| *path == p))
        .map_or("unknown", |(_, _, name)| *name);
    let response = next.run(request).await;
    let code = response.status().as_u16();
    app.metrics
        .requests
        .get_or_create(&RequestLabel { route, code })
        .inc();
    app.metrics
        .duration
        .get_or_create(&RouteLabel { route })
        .observe(started.elapsed().as_secs_f64());
    response
}

impl App {
    /// Authenticates the caller, checks `access` in the namespace (on the endpoint
    /// `name`, if given), then takes one request from the namespace's budget: only a
    /// caller with rights in a namespace can spend its budget.
    pub async fn guard(
        &self,
        caller: &Caller,
        namespace: &str,
        access: Access,
        name: Option<&str>,
    ) -> Result<(), ApiError> {
        self.auth.check(caller, namespace, access, name).await?;
        let quota = self.quota(namespace).await;
        if let Err(wait) = self.limits.take(namespace, quota, Instant::now()) {
            let secs = retry_after_secs(wait);
            let mut error = ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "TooManyRequests",
                format!(
                    "namespace {namespace} is over its API rate ({} requests/s, bursts of {}); retry after {secs} s",
                    quota.rate, quota.burst
                ),
            );
            error.retry_after = Some(secs);
            return Err(error);
        }
        Ok(())
    }

    /// The namespace's quota: its tenant policy's (read at most every
    /// [`QUOTA_TTL`](crate::limit::QUOTA_TTL)) over the defaults. When the policy cannot
    /// be read, the last one read, else the defaults.
    async fn quota(&self, namespace: &str) -> Quota {
        let now = Instant::now();
        if let Some(quota) = self.quotas.fresh(namespace, now) {
            return quota;
        }
        let default = Quota::new(
            self.settings.rate_per_namespace,
            self.settings.burst_per_namespace,
        );
        let Some(store) = self.store.get() else {
            return default;
        };
        match store.tenant_policy(namespace).await {
            Ok(policy) => {
                let quota = default.with_policy(policy.as_ref());
                self.quotas.remember(namespace, quota, now);
                quota
            }
            Err(error) => {
                tracing::debug!(%error, namespace, "reading the tenant policy");
                self.quotas.last(namespace).unwrap_or(default)
            }
        }
    }

    /// [`App::guard`] for a route on endpoint `name`, then the store and the endpoint's
    /// configuration (404 when Herald does not deliver to it).
    pub async fn endpoint(
        &self,
        caller: &Caller,
        namespace: &str,
        name: &str,
        access: Access,
    ) -> Result<(&crate::store::Store, EndpointConfig), ApiError> {
        self.guard(caller, namespace, access, Some(name)).await?;
        let store = self.store()?;
        let config = store.endpoint(namespace, name).await?;
        Ok((store, config))
    }

    /// What one request may read of `namespace`'s delivery log, once it has a slot
    /// among the reads running at once (429 or 503 when it gets none).
    pub async fn budget(&self, namespace: &str) -> Result<crate::store::Budget, ApiError> {
        let time = std::time::Duration::from_secs_f64(self.settings.max_scan_seconds);
        // The wait for a slot counts against the request's time.
        let until = tokio::time::Instant::now() + time;
        let slot = self.scans.acquire(namespace, time).await?;
        Ok(crate::store::Budget {
            records: self.settings.max_scan_records,
            until,
            slot,
        })
    }

    /// The store, or 503 until the streams exist.
    pub fn store(&self) -> Result<&crate::store::Store, ApiError> {
        self.store.get().ok_or_else(|| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "NotReady",
                "Herald's streams are not there yet (no dispatcher has started); try again",
            )
        })
    }
}

async fn readyz(State(app): State<Arc<App>>) -> Response {
    let connected = app.nats.connection_state() == async_nats::connection::State::Connected;
    let mut missing = Vec::new();
    if !connected {
        missing.push("nats");
    }
    if app.store.get().is_none() {
        missing.push("store");
    }
    if missing.is_empty() {
        (StatusCode::OK, "ready".to_owned()).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}", missing.join(", ")),
        )
            .into_response()
    }
}

async fn metrics(State(app): State<Arc<App>>) -> String {
    app.metrics.encode()
}

async fn openapi(State(app): State<Arc<App>>) -> axum::Json<serde_json::Value> {
    axum::Json(app.openapi.clone())
}
