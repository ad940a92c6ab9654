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

/// kube and reqwest could each pick a TLS crypto provider; Herald's binaries install ring
/// once, in `main`. An embedding (a test) calls this before [`run`].
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("connecting to NATS: {0}")]
    Connect(#[source] async_nats::ConnectError),
    #[error(transparent)]
    Layout(#[from] herald_core::dataplane::layout::LayoutError),
    #[error("following the configuration bucket: {0}")]
    Config(#[from] async_nats::jetstream::kv::WatchError),
    #[error("building the HTTP client (is a rustls crypto provider installed?): {0}")]
    Http(#[source] reqwest::Error),
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
    let Config {
        nats: nats_args,
        replica_id,
        shards,
        retention,
        max_event_bytes,
        max_in_flight_per_shard,
        health_interval,
        grace,
        destinations,
        listen,
        json_logs: _,
    } = config;
    // The URL is not logged or put into errors: it may carry credentials.
    let nats = async_nats::ConnectOptions::new()
        .name(format!("herald-dispatcher/{replica_id}"))
        .retry_on_initial_connect()
        .connect(nats_args.nats_url.as_str())
        .await
        .map_err(RunError::Connect)?;
    let js = async_nats::jetstream::new(nats.clone());
    let layout = setup::ensure(&js, retention, usize::from(nats_args.replicas)).await?;
    let watcher = index::follow(index.clone(), layout.config.clone()).await?;
    let metrics = Arc::new(metrics::Metrics::default());
    let policy = Arc::new(destinations.policy());
    let http = http::client(policy.clone()).map_err(RunError::Http)?;
    let (ready_tx, ready_rx) = watch::channel(false);
    let server = server::serve(listen, metrics.clone(), ready_rx)
        .await
        .map_err(|source| RunError::Listen {
            addr: listen,
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
        max_event_bytes,
    };
    let fanout = tokio::spawn(fanout.run(stopped(stop_rx.clone())));
    let shared = shard::Shared {
        layout,
        index,
        http,
        policy,
        metrics,
        settings: shard::ShardSettings {
            max_in_flight: max_in_flight_per_shard,
            health_interval,
            grace,
        },
    };
    let leases = tokio::spawn(lease::run(
        shared,
        replica_id.clone(),
        shards,
        stopped(stop_rx.clone()),
    ));
    let _ = ready_tx.send(true);
    tracing::info!(replica = replica_id, shards, "dispatcher running");

    shutdown.await;
    tracing::info!("shutting down");
    let _ = ready_tx.send(false);
    let _ = stop_tx.send(true);
    // Bounded: with NATS gone, nothing here may hang the shutdown.
    let limit = grace + Duration::from_secs(5);
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
