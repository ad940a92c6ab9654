//! Herald's operator: the control plane that reconciles `WebhookEndpoint`,
//! `SigningSecret` and `WebhookReplay`.
//!
//! - [`crdgen`]: the CRD manifests generated from the `herald_core::v1alpha1` types;
//! - [`config`]: flags and environment;
//! - [`leader`]: Lease-based leader election; only the leader runs controllers;
//! - [`controllers`]: one leadership term — every controller started and stopped together;
//! - [`reconcile`]: the plumbing every controller shares (metrics, error policy with
//!   per-object backoff, status via server-side apply, Events, undecodable objects);
//! - [`nats`]: the `herald-config` and `herald-health` buckets;
//! - [`signing_secret`], [`endpoint`], [`replay`]: the controllers;
//! - [`health`]: dispatcher health into endpoint status, coalesced, by its own writer;
//! - [`conditions`]: status conditions that only move on flips;
//! - [`events`]: Kubernetes Events, with a bounded memory of what was published;
//! - [`metrics`]: Prometheus metrics and probes.
//!
//! [`run`] is the whole operator, returning when `shutdown` resolves, so tests run it
//! in-process.

#![forbid(unsafe_code)]

pub mod conditions;
pub mod config;
pub mod controllers;
pub mod crdgen;
pub mod endpoint;
pub mod health;
pub mod leader;
pub mod lean;
pub mod metrics;
pub mod nats;
pub mod reconcile;
pub mod replay;
pub mod signing_secret;
pub mod tenants;

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::task::JoinSet;

pub use config::Config;

/// The API of `K` in `namespace`, or in all namespaces.
pub(crate) fn scoped_api<K>(client: Client, namespace: Option<&str>) -> kube::Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    <K as kube::Resource>::DynamicType: Default,
{
    match namespace {
        Some(ns) => kube::Api::namespaced(client, ns),
        None => kube::Api::all(client),
    }
}

/// Why the operator stopped other than by request.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading the kubeconfig: {0}")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
    #[error("building the Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    #[error("serving metrics: {0}")]
    Serve(#[source] std::io::Error),
    #[error(transparent)]
    Egress(#[from] herald_core::egress::EgressError),
}

type Stop = Shared<BoxFuture<'static, ()>>;

/// How long controllers get to finish in-flight work on a graceful shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Runs the operator until `shutdown` resolves. Leadership lost (another replica took
/// the Lease, or the API server was unreachable until it expired) is not an exit: the
/// replica stops its controllers and stands by again, in this process.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let Config {
        nats: nats_args,
        shards,
        destinations,
        egress,
        status_interval,
        status_refresh,
        header_secret_refresh,
        namespace_refresh,
        listen,
        lease_name,
        lease_namespace,
        identity,
        lease_duration,
        lease_renew,
        namespaces,
        watch_secrets_cluster_wide,
        kubeconfig,
        json_logs: _,
    } = config;
    // Refused before anything starts, like the dispatcher's.
    let egress = Arc::new(egress.egress()?);
    let shutdown: Stop = shutdown.boxed().shared();
    let identity =
        identity.unwrap_or_else(|| format!("herald-operator-{:016x}", fastrand::u64(..)));
    let client = kube_client(kubeconfig).await?;
    let metrics = Arc::new(metrics::Metrics::default());
    // Background tasks are aborted when this future is dropped: a test that drops the
    // operator (or a crash) leaves nothing behind.
    let mut background = serve_probes(listen, metrics.clone(), shutdown.clone()).await?;
    let Some(buckets) = open_buckets(&nats_args, shards, shutdown.clone()).await else {
        return Ok(());
    };
    metrics.set_ready(true);

    let elector = leader::Elector::new(
        client.clone(),
        &lease_namespace,
        &lease_name,
        &identity,
        lease_duration,
    );
    let setup = controllers::Setup {
        client,
        buckets,
        policy: destinations.policy(),
        egress,
        shards,
        status_interval,
        status_refresh,
        header_secret_refresh,
        namespace_refresh,
        namespaces: namespaces.into_iter().filter(|ns| !ns.is_empty()).collect(),
        watch_secrets_cluster_wide,
        metrics,
        identity: identity.clone(),
    };
    take_turns(elector, &setup, lease_renew, shutdown).await;
    tracing::info!(identity, "stopped");
    background.shutdown().await;
    Ok(())
}

/// Stands by, leads while the Lease is ours, and stands by again when it is lost —
/// until `shutdown`, when the Lease is released.
async fn take_turns(
    mut elector: leader::Elector,
    setup: &controllers::Setup,
    renew: Duration,
    shutdown: Stop,
) {
    let identity = &setup.identity;
    loop {
        tracing::info!(identity, "standing by for the leader Lease");
        if !leader::stand_by(&mut elector, renew, shutdown.clone()).await {
            return;
        }
        tracing::info!(identity, "leading: starting controllers");
        setup.metrics.set_leader(true);
        let term = controllers::Term::start(setup);
        let ended = leader::lead(&mut elector, renew, shutdown.clone()).await;
        let grace = match ended {
            leader::Ended::Shutdown => SHUTDOWN_GRACE,
            // Stop before the Lease can expire in the eyes of a standby.
            leader::Ended::Lost => leader::margin(elector.duration()) / 2,
        };
        term.stop(grace).await;
        setup.metrics.set_leader(false);
        setup.metrics.reset_endpoints();
        if ended == leader::Ended::Shutdown {
            if let Err(error) = elector.release().await {
                tracing::warn!(%error, "releasing the leader Lease");
            }
            return;
        }
        tracing::warn!(
            identity,
            "lost the leader Lease; controllers stopped, standing by"
        );
    }
}

/// The Kubernetes client: from `kubeconfig`, else in-cluster or `$KUBECONFIG`.
async fn kube_client(kubeconfig: Option<std::path::PathBuf>) -> Result<Client, Error> {
    let Some(path) = kubeconfig else {
        return Client::try_default().await.map_err(Error::Client);
    };
    let kubeconfig = Kubeconfig::read_from(path).map_err(Error::Kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(Error::Kubeconfig)?;
    Client::try_from(config).map_err(Error::Client)
}

/// Serves metrics and probes in the background until `shutdown`. Bound here so that a
/// taken port fails start-up instead of a background task.
async fn serve_probes(
    listen: std::net::SocketAddr,
    metrics: Arc<metrics::Metrics>,
    shutdown: Stop,
) -> Result<JoinSet<()>, Error> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(Error::Serve)?;
    let mut background = JoinSet::new();
    background.spawn(async move {
        if let Err(error) = metrics::serve(listener, metrics, shutdown).await {
            tracing::error!(%error, "metrics server failed");
        }
    });
    Ok(background)
}

/// Opens the NATS buckets, waiting (unready) for NATS rather than crash-looping; `None`
/// when `shutdown` resolves first.
async fn open_buckets(
    nats_args: &herald_core::flags::NatsArgs,
    shards: u32,
    shutdown: Stop,
) -> Option<nats::Buckets> {
    loop {
        tokio::select! {
            buckets = nats::Buckets::connect(nats_args, shards) => match buckets {
                Ok(buckets) => return Some(buckets),
                // Not ready meanwhile; the NATS server may be fixed without a restart.
                Err(nats::Error::Layout(error)) if error.is_unfit_server() => {
                    tracing::error!(%error, "NATS cannot carry Herald; retrying");
                }
                Err(error) => tracing::warn!(%error, "opening the NATS buckets; retrying"),
            },
            _ = shutdown.clone() => return None,
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
            _ = shutdown.clone() => return None,
        }
    }
}
