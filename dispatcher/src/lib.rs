//! Herald's dispatcher, the data plane: fans events out of NATS JetStream into
//! per-endpoint lanes and delivers them, signed, with per-endpoint isolation.
//! `docs/architecture.md` describes the design; each module's `//!` says its part.

#![forbid(unsafe_code)]

pub mod config;
pub mod endpoint;
pub mod envelope;
pub mod fanout;
pub mod http;
pub mod index;
pub mod lease;
pub mod metrics;
pub mod retry;
pub mod server;
pub mod setup;
pub mod shard;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

pub use config::Config;

/// kube and reqwest could each pick a TLS crypto provider; Herald installs ring once.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("connecting to NATS at {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: async_nats::ConnectError,
    },
    #[error(transparent)]
    Setup(#[from] setup::SetupError),
    #[error("following the configuration bucket: {0}")]
    Config(#[from] async_nats::jetstream::kv::WatchError),
    #[error("serving metrics on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Runs a dispatcher replica until `shutdown` resolves, then stops gracefully: fan-out
/// stops taking events, owned shards finish or return their in-flight attempts and
/// release their leases.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), RunError> {
    run_with_index(config, index::Index::default(), shutdown).await
}

/// [`run`] with a given configuration index, so an embedding (a test) can observe what
/// the dispatcher knows.
pub async fn run_with_index(
    config: Config,
    index: index::Index,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    install_crypto_provider();
    let nats = async_nats::ConnectOptions::new()
        .name(format!("herald-dispatcher/{}", config.replica_id))
        .retry_on_initial_connect()
        .connect(&config.nats_url)
        .await
        .map_err(|source| RunError::Connect {
            url: config.nats_url.clone(),
            source,
        })?;
    let js = async_nats::jetstream::new(nats.clone());
    let layout = setup::ensure(&js, config.retention()).await?;
    let watcher = index::follow(index.clone(), layout.config.clone()).await?;
    let metrics = Arc::new(metrics::Metrics::default());
    let policy = Arc::new(config.policy());
    let (ready_tx, ready_rx) = watch::channel(false);
    let server = server::serve(config.listen, metrics.clone(), ready_rx)
        .await
        .map_err(|source| RunError::Listen {
            addr: config.listen,
            source,
        })?;

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let fanout = fanout::FanOut {
        js: layout.js.clone(),
        events: layout.events.clone(),
        index: index.clone(),
        metrics: metrics.clone(),
        max_event_bytes: config.max_event_bytes,
    };
    let fanout = tokio::spawn(fanout.run(stopped(stop_rx.clone())));
    let shared = shard::Shared {
        layout,
        index,
        http: http::client(policy.clone()),
        policy,
        metrics,
        settings: shard::ShardSettings {
            max_in_flight: config.max_in_flight_per_shard,
            health_interval: config.health_interval,
            grace: Duration::from_secs_f64(config.grace_seconds),
        },
    };
    let leases = tokio::spawn(lease::run(
        shared,
        config.replica_id.clone(),
        config.shards,
        stopped(stop_rx.clone()),
    ));
    let _ = ready_tx.send(true);
    tracing::info!(
        replica = config.replica_id,
        shards = config.shards,
        "dispatcher running"
    );

    shutdown.await;
    tracing::info!("shutting down");
    let _ = ready_tx.send(false);
    let _ = stop_tx.send(true);
    // Bounded: with NATS gone, nothing here may hang the shutdown.
    let limit = Duration::from_secs_f64(config.grace_seconds) + Duration::from_secs(5);
    match tokio::time::timeout(limit, fanout).await {
        Ok(Ok(Err(error))) => tracing::warn!(%error, "fan-out ended with an error"),
        Err(_) => tracing::warn!("fan-out did not stop in time"),
        _ => {}
    }
    match tokio::time::timeout(limit, leases).await {
        Ok(Ok(Err(error))) => tracing::warn!(%error, "lease loop ended with an error"),
        Err(_) => tracing::warn!("shards did not stop in time; their work stays in JetStream"),
        _ => {}
    }
    watcher.abort();
    server.abort();
    let _ = nats.flush().await;
    Ok(())
}
