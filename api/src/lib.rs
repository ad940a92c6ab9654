//! Herald's HTTP API: a stateless component of its own (see `docs/architecture.md`,
//! "HTTP API") that answers "did you send it?" and "send it again" from the delivery
//! log, takes events over HTTP, and lets the caller's Kubernetes RBAC decide every
//! request (TokenReview, then SubjectAccessReview in the route's namespace).
//!
//! - [`routes`]: the route table, the handlers and the checks every request passes;
//! - [`deliveries`]: the delivery log folded into states and pages (pure);
//! - [`store`]: what is read from and written to NATS;
//! - [`ingest`], [`enqueue`]: HTTP ingest; redeliver, redrive-dead and test events;
//! - [`auth`], [`limit`]: who may do what, and how often;
//! - [`openapi`]: the committed OpenAPI document (`api/openapi.yaml`), served as JSON.

#![forbid(unsafe_code)]

pub mod auth;
pub mod config;
pub mod deliveries;
pub mod enqueue;
pub mod error;
pub mod handlers;
pub mod ingest;
pub mod limit;
pub mod metrics;
pub mod openapi;
pub mod routes;
pub mod scans;
pub mod store;

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

pub use config::Config;

use crate::auth::Auth;
use crate::limit::{Limits, Quotas};
use crate::metrics::Metrics;
use crate::store::Store;

/// Why the API could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error(transparent)]
    Nats(#[from] herald_core::flags::NatsConnectError),
    #[error("reading the kubeconfig: {0}")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
    #[error("building the Kubernetes client: {0}")]
    Kube(#[source] kube::Error),
    #[error("listening on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Everything a request needs.
pub struct App {
    pub settings: Config,
    pub auth: Auth,
    pub limits: Limits,
    pub quotas: Quotas,
    /// The reads of the delivery log running at once.
    pub scans: std::sync::Arc<scans::Scans>,
    pub metrics: Metrics,
    pub nats: async_nats::Client,
    /// Set once the streams and the bucket exist (the dispatchers create them).
    pub store: OnceLock<Store>,
    pub openapi: serde_json::Value,
}

/// Installs ring as rustls' process-wide crypto provider (kube and async-nats both use
/// rustls); a second call is harmless.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

async fn kube_client(path: Option<&std::path::Path>) -> Result<kube::Client, Error> {
    let Some(path) = path else {
        return kube::Client::try_default().await.map_err(Error::Kube);
    };
    let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(Error::Kubeconfig)?;
    let options = kube::config::KubeConfigOptions::default();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .map_err(Error::Kubeconfig)?;
    kube::Client::try_from(config).map_err(Error::Kube)
}

/// Serves the API until `shutdown` resolves.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    config.validate()?;
    let metrics = Metrics::default();
    let auth = if config.insecure_dev_no_auth {
        tracing::warn!(
            listen = %config.listen,
            "--insecure-dev-no-auth: no authentication or authorization (loopback only)"
        );
        Auth::Disabled
    } else {
        Auth::kube(
            kube_client(config.kubeconfig.as_deref()).await?,
            metrics.reviews.clone(),
            config.max_reviews_per_second,
        )
    };
    let nats = config.nats.connect("herald-api").await?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| Error::Listen {
            addr: config.listen,
            source,
        })?;
    let app = Arc::new(App {
        limits: Limits::default(),
        quotas: Quotas::default(),
        scans: scans::Scans::new(config.max_concurrent_scans),
        settings: config,
        auth,
        metrics,
        nats: nats.clone(),
        store: OnceLock::new(),
        openapi: openapi::document(),
    });
    tokio::spawn(open_store(app.clone()));
    tracing::info!(listen = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(), "herald-api serving");
    axum::serve(
        listener,
        routes::router(app).into_make_service_with_connect_info::<std::net::SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
    .map_err(|source| Error::Listen {
        addr: std::net::SocketAddr::from(([0, 0, 0, 0], 0)),
        source,
    })
}

/// Opens the streams and the bucket, retrying until they exist (`/readyz` says
/// `store` meanwhile).
async fn open_store(app: Arc<App>) {
    let js = async_nats::jetstream::new(app.nats.clone());
    let mut delay = Duration::from_millis(200);
    loop {
        match Store::open(js.clone(), app.settings.idempotency_window).await {
            Ok(store) => {
                let _ = app.store.set(store);
                tracing::info!("streams and buckets found");
                return;
            }
            Err(error) => {
                tracing::info!(%error, "waiting for Herald's streams and buckets");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    }
}
