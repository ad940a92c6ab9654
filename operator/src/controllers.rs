//! One leadership term: every controller and the health watch, started together and
//! stopped together.
//!
//! With a list of namespaces, each namespace gets controllers of its own, each watching
//! that namespace only (kube-runtime's reflector holds one list-watch per store), so the
//! operator needs rights in those namespaces and nothing cluster-wide. The endpoint
//! gauge is shared: its keys carry the namespace.
//!
//! Contract: [`Term::start`] builds fresh state (stores, published health, the endpoint
//! gauge) so a term never sees a previous one's; [`Term::stop`] asks everything to stop,
//! waits at most `grace`, then aborts what is left — a replica that lost the Lease must
//! not write after it could have expired.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use futures::{Stream, StreamExt};
use herald_core::ssrf::AddressPolicy;
use herald_core::v1alpha1::SigningSecret;
use kube::Client;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::oneshot;
use tokio::task::JoinSet;

use crate::health::coalesce::Pacing;
use crate::lean::listed::Listed;
use crate::metrics::{EndpointStates, Metrics};
use crate::reconcile::{self, Guarded, Plumbing};
use crate::{endpoint, health, nats, replay, signing_secret, tenants};

/// What every term is built from.
pub struct Setup {
    pub client: Client,
    pub buckets: nats::Buckets,
    pub policy: AddressPolicy,
    /// The egress proxies endpoints may pick.
    pub egress: Arc<herald_core::egress::Egress>,
    pub shards: u32,
    pub status_interval: Duration,
    /// Shortest time between two writes of an endpoint's gauges alone.
    pub status_refresh: Duration,
    /// How often headers' values are read again from their Secrets.
    pub header_secret_refresh: Duration,
    /// How often the served Namespaces' annotations are read.
    pub namespace_refresh: Duration,
    /// The namespaces served; empty: all of them.
    pub namespaces: Vec<String>,
    /// Serving all namespaces: watch generated Secrets cluster-wide too.
    pub watch_secrets_cluster_wide: bool,
    pub metrics: Arc<Metrics>,
    pub identity: String,
}

/// The controllers of one leadership term.
pub struct Term {
    stop: oneshot::Sender<()>,
    tasks: JoinSet<()>,
}

type Stop = Shared<BoxFuture<'static, ()>>;

/// What every scope of a term shares.
#[derive(Clone, Copy)]
struct Scope<'a> {
    states: &'a Arc<EndpointStates>,
    verifying: &'a endpoint::verification::Required,
    stop: &'a Stop,
}

impl Setup {
    fn plumbing<K>(&self, kind: &'static str) -> Plumbing<K>
    where
        K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let reporter = Reporter {
            controller: "herald-operator".into(),
            instance: Some(self.identity.clone()),
        };
        let events = crate::lean::events::Publisher::new(self.client.clone(), reporter);
        Plumbing::new(kind, self.client.clone(), events, self.metrics.clone())
    }
}

/// The one watch of `SigningSecret`s of a scope: its store (for the SigningSecret
/// controller, and for the endpoint controller with a readiness signal of its own: see
/// [`crate::lean::listed`]), the stream that drives it (polled by the SigningSecret controller)
/// and a second subscriber for the endpoint controller.
#[allow(clippy::type_complexity)]
fn secret_watch(
    client: Client,
    namespace: Option<&str>,
) -> (
    Store<Guarded<SigningSecret>>,
    Listed<Guarded<SigningSecret>>,
    impl Stream<Item = Result<Guarded<SigningSecret>, watcher::Error>> + Send + 'static,
    impl Stream<Item = Arc<Guarded<SigningSecret>>> + Send + 'static,
) {
    let (reader, writer) = reflector::store_shared(256);
    let events = writer.subscribe();
    let reflected = watcher(
        crate::scoped_api::<Guarded<SigningSecret>>(client, namespace),
        watcher::Config::default(),
    )
    .backoff(reconcile::watch_backoff())
    .modify(reconcile::slim)
    .reflect_shared(writer);
    let (listed, reflected) = crate::lean::listed::listed(reader.clone(), reflected);
    let stream = reflected.applied_objects();
    // A shared store always has subscribers; `None` would only mean it was not shared.
    let events = futures::stream::iter(events).flatten();
    (reader, listed, stream, events)
}

impl Term {
    /// Starts every controller.
    pub fn start(setup: &Setup) -> Self {
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let stop: Stop = async move {
            let _ = stop_rx.await;
        }
        .boxed()
        .shared();
        let mut tasks = JoinSet::new();
        let states = Arc::new(EndpointStates::new(setup.metrics.clone()));
        let (verifying_tx, verifying) = tokio::sync::watch::channel(None);
        tasks.spawn(tenants::run(
            setup.client.clone(),
            setup.buckets.config.clone(),
            setup.namespaces.clone(),
            setup.namespace_refresh,
            verifying_tx,
            stop.clone(),
        ));
        let scope = Scope {
            states: &states,
            verifying: &verifying,
            stop: &stop,
        };
        if setup.namespaces.is_empty() {
            let watch_secrets = setup.watch_secrets_cluster_wide;
            Self::start_scope(setup, None, watch_secrets, &scope, &mut tasks);
        }
        for namespace in &setup.namespaces {
            let namespace = Some(namespace.clone());
            Self::start_scope(setup, namespace, true, &scope, &mut tasks);
        }
        Self {
            stop: stop_tx,
            tasks,
        }
    }

    /// Starts the controllers of one namespace (`None`: all of them).
    fn start_scope(
        setup: &Setup,
        namespace: Option<String>,
        watch_secrets: bool,
        scope: &Scope<'_>,
        tasks: &mut JoinSet<()>,
    ) {
        let Scope {
            states,
            verifying,
            stop,
        } = *scope;
        let pacing = Pacing {
            interval: setup.status_interval,
            refresh: setup.status_refresh,
        };
        let board = Arc::new(health::Board::new(setup.buckets.health.clone(), pacing));
        let (health_tx, health_rx) = futures::channel::mpsc::unbounded();
        tasks.spawn(health::run(
            board.clone(),
            health_tx,
            pacing.interval,
            namespace.clone(),
            stop.clone(),
        ));
        let (secret_store, listed_secrets, secret_stream, secret_events) =
            secret_watch(setup.client.clone(), namespace.as_deref());
        let secrets = signing_secret::Context {
            plumbing: setup.plumbing(signing_secret::KIND),
            config_kv: setup.buckets.config.clone(),
        };
        tasks.spawn(signing_secret::run(
            Arc::new(secrets),
            secret_stream,
            secret_store.clone(),
            namespace.clone(),
            watch_secrets,
            stop.clone(),
        ));
        let endpoints = endpoint::Context {
            plumbing: setup.plumbing(endpoint::KIND),
            config_kv: setup.buckets.config.clone(),
            policy: setup.policy.clone(),
            egress: setup.egress.clone(),
            shards: setup.shards,
            states: states.clone(),
            secrets: listed_secrets,
            header_secret_refresh: setup.header_secret_refresh,
            health_kv: setup.buckets.health.clone(),
            verifying: verifying.clone(),
        };
        let writer = health::writer::Parts {
            plumbing: setup.plumbing(health::writer::KIND),
            health: board,
            states: states.clone(),
            js: setup.buckets.js.clone(),
        };
        // One watch of `WebhookEndpoint`s, one store: the endpoint controller and the
        // health writer both follow it.
        let (reader, store_writer) = reflector::store_shared(1024);
        let Some(subscriber) = store_writer.subscribe() else {
            tracing::error!("a shared store always has subscribers");
            return;
        };
        let watched = endpoint::watch(setup.client.clone(), namespace.as_deref(), store_writer);
        let (verified_tx, verified_rx) = futures::channel::mpsc::unbounded();
        tasks.spawn(endpoint::verification::follow(
            setup.buckets.health.clone(),
            verifying.clone(),
            reader.clone(),
            verified_tx,
            namespace.clone(),
            stop.clone(),
        ));
        tasks.spawn(endpoint::run(
            Arc::new(endpoints),
            watched,
            reader.clone(),
            secret_events,
            verified_rx,
            stop.clone(),
        ));
        tasks.spawn(health::writer::run(
            writer,
            subscriber,
            reader,
            health_rx,
            stop.clone(),
        ));
        let replays = replay::Context {
            plumbing: setup.plumbing(replay::KIND),
            js: setup.buckets.js.clone(),
            config_kv: setup.buckets.config.clone(),
            health_kv: setup.buckets.health.clone(),
        };
        tasks.spawn(replay::run(Arc::new(replays), namespace, stop.clone()));
    }

    /// Stops every controller: gracefully within `grace`, then by force.
    pub async fn stop(self, grace: Duration) {
        let Self { stop, mut tasks } = self;
        let _ = stop.send(());
        let drained =
            tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            tracing::warn!(?grace, "controllers did not stop in time; aborting them");
            tasks.shutdown().await;
        }
    }
}
