//! The `WebhookReplay` controller: validates a replay, hands a valid one to the data
//! plane as a [`ReplayRequest`] in `herald-config`, and withdraws it on deletion.
//!
//! Pipeline: dereference (does the endpoint exist? the event store's real retention,
//! `max_age` of `HERALD_EVENTS`) → [`check`], [`request`] and [`status`] (pure) →
//! request into `herald-config` (only when valid, only when changed) → status
//! (server-side apply, only when changed).
//!
//! Contract: `Ready` says whether the request is valid (the endpoint exists, the range
//! is within the retention the data plane really runs with); a valid replay's request
//! is under `replay.<ns>.<name>` with its range fixed (`to` defaults to the end of the
//! creation second), and the finalizer `herald.dev/replay-cleanup` stays until it is
//! deleted, so a deleted replay stops. The progress the dispatcher reports (only that of
//! this replay's uid) becomes phase, counts and `Complete` (`Completed` once its range is
//! read and, unless it is a dry run, every enqueued event is delivered or dead); no
//! progress is ever invented. A replay that
//! does not decode is reported with a Warning Event, and can still be deleted (its
//! request is withdrawn and the finalizer released).
//!
//! By concern: [`check`] (pure: is the replay valid, and the request it becomes),
//! [`status`] (pure: its status from what exists and the progress reported), and this
//! module (the controller's IO).

mod check;
mod status;

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;

use futures::StreamExt;
use herald_core::dataplane::{BucketKey, ReplayProgress, layout};
use herald_core::names::{self};
use herald_core::v1alpha1::{ReplayPhase, WebhookEndpoint, WebhookReplay};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use kube::{Api, ResourceExt};

use crate::nats;
use crate::reconcile::{self, Plumbing};

pub use check::{Found, check, request};
pub use status::status;

pub const KIND: &str = "WebhookReplay";
/// How soon a replay waiting for the event store to exist is looked at again.
const EVENT_STORE_RECHECK: Duration = Duration::from_secs(10);
/// How soon the progress of a replay under way is read again.
const PROGRESS_RECHECK: Duration = Duration::from_secs(2);

pub use reconcile::Error;

/// A `WebhookReplay` as watched: decoded, or the reason it could not be.
pub type Guarded = reconcile::Guarded<WebhookReplay>;

pub struct Context {
    pub plumbing: Plumbing<WebhookReplay>,
    /// Reads the event store's configuration (its retention), nothing else.
    pub js: jetstream::Context,
    /// Where replay requests go.
    pub config_kv: jetstream::kv::Store,
    /// Where the dispatchers report replay progress.
    pub health_kv: jetstream::kv::Store,
}

// A finalizer because the request lives outside Kubernetes: deleting the replay is how a
// tenant stops it, so the request must not outlive the resource.
impl reconcile::Reconciler for Context {
    type Watched = WebhookReplay;
    type Object = WebhookReplay;
    const FINALIZER: &'static str = names::REPLAY_FINALIZER;

    fn plumbing(&self) -> &Plumbing<WebhookReplay> {
        &self.plumbing
    }

    fn object(watched: &WebhookReplay) -> Result<WebhookReplay, Error> {
        Ok(watched.clone())
    }

    async fn apply(&self, obj: &WebhookReplay, _: &WebhookReplay) -> Result<Action, Error> {
        apply(obj, self).await
    }

    /// Deletes the replay's request from `herald-config`.
    async fn withdraw(&self, namespace: &str, name: &str) -> Result<(), Error> {
        let key = BucketKey::replay(namespace, name).to_string();
        nats::delete_if_present(&self.config_kv, &key).await?;
        Ok(())
    }
}

async fn apply(obj: &WebhookReplay, ctx: &Context) -> Result<Action, Error> {
    let ns = obj.namespace().ok_or(Error::NoNamespace)?;
    let endpoints: Api<WebhookEndpoint> = Api::namespaced(ctx.plumbing.client.clone(), &ns);
    let found = Found {
        endpoint_exists: endpoints.get_opt(&obj.spec.endpoint).await?.is_some(),
        retention: layout::event_retention(&ctx.js)
            .await
            .map_err(|e| Error::other("nats", "reading the event store's retention", e))?,
    };
    let now = Timestamp::now();
    let key = BucketKey::replay(&ns, &obj.name_any()).to_string();
    // Written once valid and then kept: the range is fixed, and a later check that
    // fails only because the window moved on must not stop a replay under way.
    let asked = request(obj, &check(obj, found, now));
    if let Some(request) = &asked {
        let value = serde_json::to_vec(request).unwrap_or_default();
        nats::put_if_changed(&ctx.config_kv, &key, value).await?;
    }
    let progress = nats::read(&ctx.health_kv, &key)
        .await?
        .and_then(|v| serde_json::from_slice::<ReplayProgress>(&v).ok());
    let new = status(obj, found, progress.as_ref(), now);
    if obj.status.as_ref() != Some(&new) {
        ctx.plumbing
            .apply_status(&ns, &obj.name_any(), names::FIELD_MANAGER, &new)
            .await?;
    }
    if found.retention.is_none() {
        return Ok(Action::requeue(EVENT_STORE_RECHECK));
    }
    // A replay under way: its progress is read again shortly.
    if asked.is_some() && new.phase != Some(ReplayPhase::Completed) {
        return Ok(Action::requeue(PROGRESS_RECHECK));
    }
    // The retention check depends on the clock (and the stream's configuration): look
    // again later.
    Ok(Action::requeue(Duration::from_secs(3600)))
}

/// Runs the controller until `stop` resolves.
pub async fn run(
    ctx: Arc<Context>,
    namespace: Option<String>,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.plumbing.client.clone();
    let controller = Controller::new(
        crate::scoped_api::<Guarded>(client.clone(), namespace.as_deref()),
        watcher::Config::default(),
    )
    .with_config(reconcile::controller_config());
    let store = controller.store();
    controller
        // A replay waiting for its endpoint becomes valid when the endpoint appears.
        .watches(
            crate::scoped_api::<crate::endpoint::Guarded>(client, namespace.as_deref()),
            watcher::Config::default(),
            move |ep| {
                let ns = ep.namespace();
                let name = ep.name_any();
                store
                    .state()
                    .into_iter()
                    .filter(|guard| {
                        guard
                            .0
                            .as_ref()
                            .is_ok_and(|r| r.namespace() == ns && r.spec.endpoint == name)
                    })
                    .map(|guard| ObjectRef::from_obj(&*guard))
                    .collect::<Vec<_>>()
            },
        )
        .trigger_backoff(reconcile::watch_backoff())
        .graceful_shutdown_on(stop)
        .run(reconcile::reconcile, reconcile::error_policy, ctx)
        .for_each(|_| async {})
        .await;
}
