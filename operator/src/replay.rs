//! The `WebhookReplay` controller: validates a replay request and reports, truthfully,
//! that this version of Herald does not carry replays out yet.
//!
//! Pipeline: dereference (does the endpoint exist?) → [`check`] and [`status`] (pure) →
//! status (server-side apply, only when changed).
//!
//! Contract: `Ready` says whether the request is valid (the endpoint exists, the range
//! is within retention); `Complete` is `False` with reason `NotImplemented` and phase
//! `Pending`. No progress is ever invented. A replay that does not decode is reported
//! with a Warning Event (it has no finalizer, so its deletion never waits for Herald).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use herald_core::names::{self, condition, reason};
use herald_core::v1alpha1::{ReplayPhase, WebhookEndpoint, WebhookReplay, WebhookReplayStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use kube::{Api, ResourceExt};

use crate::conditions::{self, Desired};
use crate::reconcile::{self, Categorized, Plumbing};

pub const KIND: &str = "WebhookReplay";
/// Events older than this are gone from the event store (the chart's default).
pub const RETENTION: SignedDuration = SignedDuration::from_hours(30 * 24);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("object has no namespace")]
    NoNamespace,
}

impl Categorized for Error {
    fn category(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::NoNamespace => "invalid",
        }
    }
}

/// A `WebhookReplay` as watched: decoded, or the reason it could not be.
pub type Guarded = reconcile::Guarded<WebhookReplay>;

pub struct Context {
    pub plumbing: Plumbing<WebhookReplay>,
}

/// Pure: the `Ready` condition of a replay, given whether its endpoint exists.
pub fn check(replay: &WebhookReplay, endpoint_exists: bool, now: Timestamp) -> Desired {
    let spec = &replay.spec;
    if !endpoint_exists {
        return Desired::new(
            condition::READY,
            false,
            reason::ENDPOINT_NOT_FOUND,
            format!(
                "WebhookEndpoint {} does not exist in this namespace",
                spec.endpoint
            ),
        );
    }
    if let Some(to) = &spec.to
        && spec.from.0 >= to.0
    {
        return Desired::new(
            condition::READY,
            false,
            reason::INVALID_SPEC,
            "spec.from must be before spec.to",
        );
    }
    if let Ok(oldest) = now.checked_sub(RETENTION)
        && spec.from.0 < oldest
    {
        return Desired::new(
            condition::READY,
            false,
            reason::OUTSIDE_RETENTION,
            format!(
                "spec.from {} is older than the 30-day retention window: events before {} are gone; create a replay from a later time",
                spec.from.0, oldest
            ),
        );
    }
    Desired::new(
        condition::READY,
        true,
        reason::VALID,
        "the replay request is valid",
    )
}

/// Pure: the status of `replay` given whether its endpoint exists.
pub fn status(
    replay: &WebhookReplay,
    endpoint_exists: bool,
    now: Timestamp,
) -> WebhookReplayStatus {
    let old = replay.status.clone().unwrap_or_default();
    let mut desired = conditions::ready_with_kstatus(check(replay, endpoint_exists, now));
    desired.push(Desired::new(
        condition::COMPLETE,
        false,
        reason::NOT_IMPLEMENTED,
        "replay delivery is not carried out yet by this version of Herald",
    ));
    WebhookReplayStatus {
        conditions: conditions::merge(
            &old.conditions,
            &desired,
            replay.metadata.generation,
            &Time(now),
        ),
        observed_generation: replay.metadata.generation,
        phase: Some(ReplayPhase::Pending),
        ..Default::default()
    }
}

pub async fn reconcile(guard: Arc<Guarded>, ctx: Arc<Context>) -> Result<Action, Error> {
    let work = async {
        match &guard.0 {
            Ok(obj) => apply(obj, &ctx).await,
            Err(invalid) => {
                ctx.plumbing.report_undecodable(&guard, invalid).await;
                Ok(Action::await_change())
            }
        }
    };
    ctx.plumbing.instrument(&guard, work).await
}

pub fn error_policy(obj: Arc<Guarded>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.plumbing.error_policy(&obj, error)
}

async fn apply(obj: &WebhookReplay, ctx: &Context) -> Result<Action, Error> {
    let ns = obj.namespace().ok_or(Error::NoNamespace)?;
    let endpoints: Api<WebhookEndpoint> = Api::namespaced(ctx.plumbing.client.clone(), &ns);
    let exists = endpoints.get_opt(&obj.spec.endpoint).await?.is_some();
    let new = status(obj, exists, Timestamp::now());
    if obj.status.as_ref() != Some(&new) {
        ctx.plumbing
            .apply_status(&ns, &obj.name_any(), names::FIELD_MANAGER, &new)
            .await?;
    }
    // The retention check depends on the clock: look again later.
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
    );
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
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {})
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_core::v1alpha1::WebhookReplaySpec;
    use serde_json::json;

    fn replay(from: &str) -> WebhookReplay {
        let spec: WebhookReplaySpec =
            serde_json::from_value(json!({"endpoint": "orders", "from": from})).unwrap();
        WebhookReplay::new("r", spec)
    }

    #[test]
    fn validity_reasons() {
        let now: Timestamp = "2026-11-30T00:00:00Z".parse().unwrap();
        assert_eq!(
            check(&replay("2026-11-29T00:00:00Z"), false, now).reason,
            reason::ENDPOINT_NOT_FOUND
        );
        assert_eq!(
            check(&replay("2026-10-01T00:00:00Z"), true, now).reason,
            reason::OUTSIDE_RETENTION
        );
        let ok = check(&replay("2026-11-29T00:00:00Z"), true, now);
        assert!(ok.status, "{ok:?}");
    }
}
