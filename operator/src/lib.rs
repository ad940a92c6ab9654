//! Herald's operator: the control plane that reconciles `WebhookEndpoint`,
//! `SigningSecret` and `WebhookReplay`.
//!
//! - [`crdgen`]: the CRD manifests generated from the `herald_core::v1alpha1` types;
//! - [`config`]: flags and environment;
//! - [`leader`]: Lease-based leader election; only the leader runs controllers;
//! - [`nats`]: the `herald-config` and `herald-health` buckets;
//! - [`signing_secret`], [`endpoint`], [`replay`]: the controllers;
//! - [`health`]: dispatcher health into endpoint status, coalesced;
//! - [`conditions`]: status conditions that only move on flips;
//! - [`metrics`]: Prometheus metrics and probes.
//!
//! [`run`] is the whole operator, returning when `shutdown` resolves, so tests run it
//! in-process.

#![forbid(unsafe_code)]

pub mod conditions;
pub mod config;
pub mod crdgen;
pub mod endpoint;
pub mod health;
pub mod leader;
pub mod metrics;
pub mod nats;
pub mod replay;
pub mod signing_secret;

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::events::{Recorder, Reporter};
use tokio::task::JoinSet;
use tokio::time::Instant;

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
    #[error("lost the leader Lease; restarting is the safe way back to standby")]
    LostLeadership,
}

type Stop = Shared<BoxFuture<'static, ()>>;

/// Runs the operator until `shutdown` resolves (`Ok`) or leadership is lost (`Err`).
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let policy = config.address_policy();
    let Config {
        nats_url,
        shards,
        allow_networks: _,
        allow_http: _,
        status_interval,
        listen,
        lease_name,
        lease_namespace,
        identity,
        lease_duration,
        lease_renew,
        namespace,
        kubeconfig,
        json_logs: _,
    } = config;
    let shutdown: Stop = shutdown.boxed().shared();
    let identity =
        identity.unwrap_or_else(|| format!("herald-operator-{:016x}", fastrand::u64(..)));
    let client = match kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path).map_err(Error::Kubeconfig)?;
            let config =
                kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                    .await
                    .map_err(Error::Kubeconfig)?;
            Client::try_from(config).map_err(Error::Client)?
        }
        None => Client::try_default().await.map_err(Error::Client)?,
    };
    let metrics = Arc::new(metrics::Metrics::default());
    // Background tasks are aborted when this future is dropped: a test that drops the
    // operator (or a crash) leaves nothing behind.
    let mut background = JoinSet::new();
    // Bound here so that a taken port fails start-up instead of a background task.
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(Error::Serve)?;
    {
        let stop = shutdown.clone();
        let m = metrics.clone();
        background.spawn(async move {
            if let Err(error) = metrics::serve(listener, m, stop).await {
                tracing::error!(%error, "metrics server failed");
            }
        });
    }

    // NATS may start after the operator (or be restarting): wait for it, unready,
    // rather than crash-looping.
    let buckets = loop {
        tokio::select! {
            buckets = nats::Buckets::connect(&nats_url) => match buckets {
                Ok(buckets) => break buckets,
                Err(error) => tracing::warn!(%error, "opening the NATS buckets; retrying"),
            },
            _ = shutdown.clone() => return Ok(()),
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
            _ = shutdown.clone() => return Ok(()),
        }
    };
    metrics.set_ready(true);

    let mut elector = leader::Elector::new(
        client.clone(),
        &lease_namespace,
        &lease_name,
        &identity,
        lease_duration,
    );
    tracing::info!(identity, lease = lease_name, "waiting for the leader Lease");
    loop {
        match elector.try_acquire_or_renew().await {
            Ok(true) => break,
            Ok(false) => {}
            Err(error) => tracing::warn!(%error, "leader election"),
        }
        tokio::select! {
            _ = shutdown.clone() => return Ok(()),
            _ = tokio::time::sleep(lease_renew) => {}
        }
    }
    tracing::info!(identity, "leading: starting controllers");
    metrics.set_leader(true);

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let stop: Stop = async move {
        let _ = stop_rx.await;
    }
    .boxed()
    .shared();
    let reporter = Reporter {
        controller: "herald-operator".into(),
        instance: Some(identity.clone()),
    };
    let mut controllers = JoinSet::new();
    let published = Arc::new(health::Published::default());
    let (health_tx, health_rx) = futures::channel::mpsc::unbounded();
    controllers.spawn(health::run(
        buckets.health.clone(),
        published.clone(),
        health_tx,
        status_interval,
        namespace.clone(),
        stop.clone(),
    ));
    controllers.spawn(signing_secret::run(
        Arc::new(signing_secret::Context {
            client: client.clone(),
            config_kv: buckets.config.clone(),
            recorder: Recorder::new(client.clone(), reporter.clone()),
            metrics: metrics.clone(),
        }),
        namespace.clone(),
        stop.clone(),
    ));
    controllers.spawn(endpoint::run(
        Arc::new(endpoint::Context::new(
            client.clone(),
            buckets.config.clone(),
            policy,
            shards,
            Recorder::new(client.clone(), reporter),
            metrics.clone(),
            published,
        )),
        health_rx,
        namespace.clone(),
        stop.clone(),
    ));
    controllers.spawn(replay::run(
        Arc::new(replay::Context {
            client: client.clone(),
            metrics: metrics.clone(),
        }),
        namespace,
        stop.clone(),
    ));

    let mut renewed = Instant::now();
    let outcome = loop {
        tokio::select! {
            _ = shutdown.clone() => break Ok(()),
            _ = tokio::time::sleep(lease_renew) => {}
        }
        match tokio::time::timeout(lease_renew, elector.try_acquire_or_renew()).await {
            Ok(Ok(true)) => renewed = Instant::now(),
            Ok(Ok(false)) => break Err(Error::LostLeadership),
            Ok(Err(error)) => tracing::warn!(%error, "renewing the leader Lease"),
            Err(_) => tracing::warn!("renewing the leader Lease timed out"),
        }
        // Stop before the Lease can expire in the eyes of a standby: after that, two
        // leaders could act at once.
        if renewed.elapsed() + lease_renew >= lease_duration {
            break Err(Error::LostLeadership);
        }
    };
    let _ = stop_tx.send(());
    let drained = tokio::time::timeout(Duration::from_secs(10), async {
        while controllers.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!("controllers did not stop within 10s");
    }
    metrics.set_leader(false);
    if outcome.is_ok()
        && let Err(error) = elector.release().await
    {
        tracing::warn!(%error, "releasing the leader Lease");
    }
    tracing::info!(identity, "stopped");
    background.shutdown().await;
    outcome
}
