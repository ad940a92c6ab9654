//! Herald's dispatcher, the data plane: fans events out of NATS JetStream into
//! per-endpoint lanes and delivers them, signed, with per-endpoint isolation.
//! `docs/architecture.md` describes the design; each module's `//!` says its part.

#![forbid(unsafe_code)]

pub mod attempt;
pub mod budget;
pub mod config;
pub mod context;
pub mod endpoint;
pub mod fanout;
pub mod http;
pub mod index;
pub mod lease;
pub mod metrics;
pub mod owner;
pub mod replay;
pub mod retry;
pub mod server;
pub mod setup;
pub mod shard;
pub mod silence;
pub mod supervise;
pub mod verify;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

pub use config::Config;
use supervise::{Readiness, supervise};

/// rustls could pick any compiled-in TLS crypto provider; Herald's binaries install ring
/// once, in `main`. An embedding (a test) calls this before [`run`].
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Connect(#[from] herald_core::flags::NatsConnectError),
    #[error(transparent)]
    Layout(#[from] herald_core::dataplane::layout::LayoutError),
    #[error(transparent)]
    Http(#[from] http::ClientError),
    #[error(transparent)]
    Egress(#[from] http::EgressError),
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
///
/// `/healthz` answers from the start; `/readyz` only once the configuration is
/// completely loaded, fan-out runs and no shard is failing. Fan-out, the configuration
/// watch and the lease loop are supervised: one that ends is restarted, and `/readyz`
/// says which part is down meanwhile.
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
        limits,
        health_interval,
        release_idle_after,
        http_idle_per_host,
        lane_buffer_bytes,
        grace,
        destinations,
        egress,
        listen,
        json_logs: _,
    } = config;
    // A replica keeps the endpoints of the shards it owns and of their partitions.
    index.scope_to(shards);
    let metrics = Arc::new(metrics::Metrics::new(index.clone()));
    metrics.shards.set(i64::from(shards));
    // Fan-out runs with the shards (one ingest partition each) and reports `fanout` not
    // ready while one of its workers is restarting.
    let readiness = Readiness::new(&[index::PART, lease::PART]);
    let server = server::serve(listen, metrics.clone(), readiness.clone())
        .await
        .map_err(|source| RunError::Listen {
            addr: listen,
            source,
        })?;
    tokio::pin!(shutdown);
    let connected = tokio::select! {
        connected = connect(&nats_args, &replica_id, (retention, shards, max_event_bytes)) => connected?,
        () = &mut shutdown => {
            server.abort();
            return Ok(());
        }
    };
    let (nats, layout) = connected;
    let policy = Arc::new(destinations.policy());
    let proxy_errors = metrics.proxy_errors.clone();
    let http = http::Client::new(
        policy.clone(),
        egress.egress()?,
        proxy_errors,
        http_idle_per_host,
    )?;

    let (stop_tx, stop) = watch::channel(false);
    let shared = context::Shared {
        layout: Arc::new(layout),
        index,
        http,
        policy,
        metrics,
        ceiling: Arc::new(tokio::sync::Semaphore::new(limits.per_dispatcher)),
        buffers: Arc::new(budget::LaneBudget::new(lane_buffer_bytes)),
        settings: context::ShardSettings {
            shards,
            limits,
            health_interval,
            release_idle_after,
            grace,
            retention,
            max_event_bytes,
        },
        replays: Arc::default(),
        readiness: readiness.clone(),
        nats: Arc::new(nats_args),
        replica_id: replica_id.as_str().into(),
    };
    let mut tasks = start(shared, replica_id.clone(), readiness.clone(), stop);
    tracing::info!(replica = replica_id, shards, "dispatcher running");

    shutdown.await;
    tracing::info!("shutting down");
    readiness.set(fanout::PART, false);
    let _ = stop_tx.send(true);
    // Bounded: with NATS gone, nothing here may hang the shutdown.
    let limit = grace + Duration::from_secs(5);
    let drained =
        tokio::time::timeout(limit, async { while tasks.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!("shards did not stop in time; their work stays in JetStream");
        tasks.abort_all();
    }
    server.abort();
    let _ = nats.flush().await;
    Ok(())
}

/// Connects to NATS, refuses a server Herald cannot run on, and brings the JetStream
/// layout up to date. A passing fault (a timeout, a stream without a leader while a NATS
/// node is down) is waited out, not ready meanwhile, rather than exiting into a crash
/// loop; only a permanent one ends the process. The URL is not logged or put into
/// errors: it may carry credentials.
async fn connect(
    nats: &herald_core::flags::NatsArgs,
    replica_id: &str,
    (retention, shards, max_event_bytes): (Duration, u32, usize),
) -> Result<(async_nats::Client, setup::Layout), RunError> {
    use herald_core::dataplane::layout::{LANE_HEADER_ROOM, check_server};
    let client = nats
        .connect(&format!("herald-dispatcher/{replica_id}"))
        .await?;
    let js = async_nats::jetstream::new(client.clone());
    let mut backoff = supervise::Backoff::new(Duration::from_millis(250), Duration::from_secs(5));
    loop {
        let ready = async {
            check_server(&js, max_event_bytes + LANE_HEADER_ROOM).await?;
            setup::ensure(&js, retention, shards, usize::from(nats.replicas)).await
        };
        match ready.await {
            Ok(layout) => return Ok((client, layout)),
            Err(error) if error.is_permanent() => return Err(error.into()),
            Err(error) => {
                let delay = backoff.next_delay(fastrand::f64());
                tracing::warn!(%error, retry_in = ?delay, "NATS is not ready for Herald yet; retrying");
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// Starts the configuration watch and the lease loop (which runs the shards and their
/// fan-out), each supervised.
fn start(
    shared: context::Shared,
    replica_id: String,
    readiness: Arc<Readiness>,
    stop: watch::Receiver<bool>,
) -> tokio::task::JoinSet<()> {
    let shards = shared.settings.shards;
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(supervise(index::PART, readiness.clone(), stop.clone(), {
        let (shared, readiness, stop) = (shared.clone(), readiness.clone(), stop.clone());
        move || {
            let bucket = shared.layout.config.clone();
            index::follow(
                shared.index.clone(),
                bucket,
                readiness.clone(),
                stop.clone(),
            )
        }
    }));
    tasks.spawn(supervise(lease::PART, readiness.clone(), stop.clone(), {
        let (readiness, stop) = (readiness.clone(), stop.clone());
        move || {
            let (shared, readiness, stop, id) = (
                shared.clone(),
                readiness.clone(),
                stop.clone(),
                replica_id.clone(),
            );
            async move {
                // Shards start with the complete configuration, not a partial one.
                shared.index.wait_loaded().await;
                lease::run(shared, id, shards, readiness, stop).await
            }
        }
    }));
    tasks
}
