//! The `WebhookEndpoint` controller.
//!
//! Pipeline per reconcile ([`apply`]): dereference (DNS, the `SigningSecret`, the current
//! entry in `herald-config`) → [`validate`] (pure) → [`build`] (pure: what to publish, the
//! status) → publish the entry → status (server-side apply, only when changed) → Events
//! on `Ready` flips.
//!
//! Contract:
//! - a valid endpoint has its `EndpointConfig` under `ep.<ns>.<name>` in `herald-config`;
//!   one that stops validating (or decoding) keeps its last good configuration there with
//!   `held` set, so the dispatchers keep its backlog and deliver nothing until it
//!   validates again; only deletion removes the entry;
//! - the finalizer `herald.dev/delivery-cleanup` stays until that entry is gone;
//! - this controller owns `observedGeneration`, `shard` and the `Ready` condition of the
//!   status (field manager `herald.dev/operator`); the health writer
//!   ([`crate::health::writer`]) owns the rest, so a health update never re-validates;
//! - an object that does not decode is reported (Warning Event), held, and can still be
//!   deleted.

mod apply;
pub mod build;
pub mod observed;
pub mod resync;
pub mod secret_values;
pub mod validate;
pub mod verification;

use std::sync::Arc;

use futures::{Stream, StreamExt};
use herald_core::names;
use herald_core::ssrf::AddressPolicy;
use herald_core::v1alpha1::{SigningSecret, WebhookEndpoint};
use kube::ResourceExt;
use kube::core::error_boundary::InvalidObject;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{Controller, WatchStreamExt, watcher};

use crate::metrics::EndpointStates;
use crate::reconcile::{self, Plumbing};

pub const KIND: &str = "WebhookEndpoint";

pub use crate::lean::cached::{self, Cached, Guarded};
use crate::lean::relevance;

pub use reconcile::Error;

pub struct Context {
    pub plumbing: Plumbing<Cached>,
    pub config_kv: async_nats::jetstream::kv::Store,
    pub policy: AddressPolicy,
    pub egress: Arc<herald_core::egress::Egress>,
    pub shards: u32,
    /// The `state` label of every endpoint, for the gauge (set by the health writer,
    /// forgotten here on deletion).
    pub states: Arc<EndpointStates>,
    /// The `SigningSecret`s of the scope (the shared watch of `crate::controllers`):
    /// reconciles read the endpoint's secret here, not with a GET each.
    pub secrets: crate::lean::listed::Listed<reconcile::Guarded<SigningSecret>>,
    /// How often an endpoint whose headers take values from Secrets reads them again.
    pub header_secret_refresh: std::time::Duration,
    /// `herald-health`, where the dispatchers report verification challenges.
    pub health_kv: async_nats::jetstream::kv::Store,
    /// The namespaces whose endpoints must all be verified.
    pub verifying: verification::Required,
}

impl reconcile::Reconciler for Context {
    type Watched = Cached;
    type Object = WebhookEndpoint;
    const FINALIZER: &'static str = names::ENDPOINT_FINALIZER;

    fn plumbing(&self) -> &Plumbing<Cached> {
        &self.plumbing
    }

    fn object(cached: &Cached) -> Result<WebhookEndpoint, Error> {
        cached
            .endpoint()
            .map_err(|e| Error::other("store", "decoding the cached spec", e))
    }

    async fn apply(&self, obj: &WebhookEndpoint, cached: &Cached) -> Result<Action, Error> {
        apply::apply(obj, &cached.status, self).await
    }

    async fn withdraw(&self, namespace: &str, name: &str) -> Result<(), Error> {
        apply::withdraw(self, namespace, name).await
    }

    async fn undecodable(&self, guard: &Guarded, invalid: &InvalidObject) -> Result<(), Error> {
        apply::hold_undecodable(guard, invalid, self).await
    }
}

/// The endpoints using SigningSecret `secret`, from the controller's store.
fn using(
    store: &reflector::Store<Guarded>,
    secret: &reconcile::Guarded<SigningSecret>,
) -> Vec<ObjectRef<Guarded>> {
    let (ns, name) = (secret.namespace(), secret.name_any());
    store
        .state()
        .into_iter()
        .filter(|guard| {
            guard
                .0
                .as_ref()
                .is_ok_and(|ep| ep.namespace() == ns && ep.uses_secret(&name))
        })
        .map(|guard| ObjectRef::from_obj(&*guard))
        .collect()
}

/// The shared watch of `WebhookEndpoint`s in `namespace` (all when `None`), kept slim in
/// `store_writer`'s store, and only the events worth a reconcile ([`relevance`]). Other
/// controllers follow the same store through its subscribers (the health writer).
pub fn watch(
    client: kube::Client,
    namespace: Option<&str>,
    store_writer: reflector::store::Writer<Guarded>,
) -> impl Stream<Item = Result<Guarded, watcher::Error>> + Send + 'static {
    let endpoints = watcher(
        crate::scoped_api::<Guarded>(client, namespace),
        watcher::Config::default(),
    )
    .backoff(reconcile::watch_backoff())
    .modify(cached::slim)
    .reflect_shared(store_writer);
    relevance::changed(endpoints)
}

/// Runs the endpoint controller on `endpoints` (from [`watch`]) until `stop` resolves.
pub async fn run(
    ctx: Arc<Context>,
    endpoints: impl Stream<Item = Result<Guarded, watcher::Error>> + Send + 'static,
    reader: reflector::Store<Guarded>,
    signing_secrets: impl Stream<Item = Arc<reconcile::Guarded<SigningSecret>>> + Send + 'static,
    verification: impl Stream<Item = ObjectRef<Guarded>> + Send + 'static,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let store = reader.clone();
    Controller::for_stream(endpoints, reader.clone())
        .with_config(reconcile::controller_config())
        // A SigningSecret that appears or changes re-validates the endpoints using it.
        .watches_shared_stream(signing_secrets, move |secret| using(&store, &secret))
        // DNS answers change: every endpoint is re-checked once per `resync::PERIOD`.
        .reconcile_on(resync::triggers(reader))
        // A verification report, or a namespace's requirement, changed.
        .reconcile_on(verification)
        .trigger_backoff(reconcile::watch_backoff())
        .graceful_shutdown_on(stop)
        .run(reconcile::reconcile, reconcile::error_policy, ctx)
        .for_each(|_| async {})
        .await;
}
