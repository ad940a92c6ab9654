//! The `WebhookReplay` controller: validates a replay request and reports, truthfully,
//! that this version of Herald does not carry replays out yet.
//!
//! Pipeline: dereference (does the endpoint exist? the event store's real retention,
//! `max_age` of `HERALD_EVENTS`) → [`check`] and [`status`] (pure) → status (server-side
//! apply, only when changed).
//!
//! Contract: `Ready` says whether the request is valid (the endpoint exists, the range
//! is within the retention the data plane really runs with); `Complete` is `False` with
//! reason `NotImplemented` and phase `Pending`. No progress is ever invented. A replay that does not decode is reported
//! with a Warning Event (it has no finalizer, so its deletion never waits for Herald).

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;

use futures::StreamExt;
use herald_core::dataplane::layout;
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
/// How soon a replay waiting for the event store to exist is looked at again.
const EVENT_STORE_RECHECK: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("object has no namespace")]
    NoNamespace,
    #[error("reading the event store's retention: {0}")]
    Nats(#[from] layout::LayoutError),
}

impl Categorized for Error {
    fn category(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::NoNamespace => "invalid",
            Error::Nats(_) => "nats",
        }
    }
}

/// A `WebhookReplay` as watched: decoded, or the reason it could not be.
pub type Guarded = reconcile::Guarded<WebhookReplay>;

pub struct Context {
    pub plumbing: Plumbing<WebhookReplay>,
    /// Reads the event store's configuration (its retention), nothing else.
    pub js: jetstream::Context,
}

/// What the replay is checked against, read from the cluster and NATS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found {
    pub endpoint_exists: bool,
    /// `max_age` of the event store as the server has it; `None` while the stream does
    /// not exist (no dispatcher has started yet).
    pub retention: Option<Duration>,
}

/// A retention window for people: `30d`, `2h`, `90m`, `45s`.
fn window(d: Duration) -> String {
    let secs = d.as_secs();
    match secs {
        0 => "unlimited".to_owned(),
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3_600 == 0 => format!("{}h", s / 3_600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// Pure: the `Ready` condition of a replay, given what exists.
pub fn check(replay: &WebhookReplay, found: Found, now: Timestamp) -> Desired {
    let spec = &replay.spec;
    if !found.endpoint_exists {
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
    let Some(retention) = found.retention else {
        return Desired::new(
            condition::READY,
            false,
            reason::EVENT_STORE_MISSING,
            "the event store (NATS stream HERALD_EVENTS) does not exist yet: no herald-dispatcher has started, so its retention window is unknown; checked again shortly",
        );
    };
    // max_age 0 is JetStream's "kept until removed": nothing is too old.
    let oldest = SignedDuration::try_from(retention)
        .ok()
        .filter(|r| !r.is_zero())
        .and_then(|r| now.checked_sub(r).ok());
    if let Some(oldest) = oldest
        && spec.from.0 < oldest
    {
        return Desired::new(
            condition::READY,
            false,
            reason::OUTSIDE_RETENTION,
            format!(
                "spec.from {} is older than the event store's {} retention window (max age of NATS stream HERALD_EVENTS): events before {} are gone; create a replay from a later time",
                spec.from.0,
                window(retention),
                oldest
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

/// Pure: the status of `replay` given what exists.
pub fn status(replay: &WebhookReplay, found: Found, now: Timestamp) -> WebhookReplayStatus {
    let old = replay.status.clone().unwrap_or_default();
    let mut desired = conditions::ready_with_kstatus(check(replay, found, now));
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
    let found = Found {
        endpoint_exists: endpoints.get_opt(&obj.spec.endpoint).await?.is_some(),
        retention: layout::event_retention(&ctx.js).await?,
    };
    let new = status(obj, found, Timestamp::now());
    if obj.status.as_ref() != Some(&new) {
        ctx.plumbing
            .apply_status(&ns, &obj.name_any(), names::FIELD_MANAGER, &new)
            .await?;
    }
    if found.retention.is_none() {
        return Ok(Action::requeue(EVENT_STORE_RECHECK));
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

    const DAYS_30: Duration = Duration::from_secs(30 * 86_400);

    fn found(endpoint_exists: bool, retention: Option<Duration>) -> Found {
        Found {
            endpoint_exists,
            retention,
        }
    }

    #[test]
    fn validity_reasons() {
        let now: Timestamp = "2026-11-30T00:00:00Z".parse().unwrap();
        let two_hours = Some(Duration::from_secs(7200));
        let cases = [
            (
                "2026-11-29T00:00:00Z",
                found(false, Some(DAYS_30)),
                reason::ENDPOINT_NOT_FOUND,
            ),
            (
                "2026-10-01T00:00:00Z",
                found(true, Some(DAYS_30)),
                reason::OUTSIDE_RETENTION,
            ),
            (
                "2026-11-29T00:00:00Z",
                found(true, Some(DAYS_30)),
                reason::VALID,
            ),
            // The real window, not a constant: 3 h ago is too old for a 2 h stream.
            (
                "2026-11-29T21:00:00Z",
                found(true, two_hours),
                reason::OUTSIDE_RETENTION,
            ),
            (
                "2026-11-29T23:00:00Z",
                found(true, two_hours),
                reason::VALID,
            ),
            // max_age 0: JetStream keeps events until removed.
            (
                "2020-01-01T00:00:00Z",
                found(true, Some(Duration::ZERO)),
                reason::VALID,
            ),
            (
                "2026-11-29T23:00:00Z",
                found(true, None),
                reason::EVENT_STORE_MISSING,
            ),
        ];
        for (from, found, want) in cases {
            let got = check(&replay(from), found, now);
            assert_eq!(got.reason, want, "{from} {found:?}: {got:?}");
            assert_eq!(got.status, want == reason::VALID, "{from} {found:?}");
        }
        let message = check(&replay("2026-11-29T21:00:00Z"), found(true, two_hours), now).message;
        assert!(message.contains("2h retention window"), "{message}");
    }

    #[test]
    fn windows_read_like_durations() {
        assert_eq!(window(DAYS_30), "30d");
        assert_eq!(window(Duration::from_secs(7200)), "2h");
        assert_eq!(window(Duration::from_secs(5400)), "90m");
        assert_eq!(window(Duration::from_secs(45)), "45s");
    }
}
