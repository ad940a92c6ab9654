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

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;

use futures::StreamExt;
use herald_core::dataplane::{BucketKey, ReplayProgress, ReplayRequest, layout};
use herald_core::names::{self, condition, reason};
use herald_core::v1alpha1::{ReplayPhase, WebhookEndpoint, WebhookReplay, WebhookReplayStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{self, Event as Finalizer, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use kube::{Api, Resource, ResourceExt};

use crate::conditions::{self, Desired};
use crate::nats;
use crate::reconcile::{self, Categorized, Plumbing};

pub const KIND: &str = "WebhookReplay";
/// How soon a replay waiting for the event store to exist is looked at again.
const EVENT_STORE_RECHECK: Duration = Duration::from_secs(10);
/// How soon the progress of a replay under way is read again.
const PROGRESS_RECHECK: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("object has no namespace")]
    NoNamespace,
    #[error("reading the event store's retention: {0}")]
    Retention(#[from] layout::LayoutError),
    #[error(transparent)]
    Nats(#[from] nats::Error),
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<finalizer::Error<Error>>),
}

impl Categorized for Error {
    fn category(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::NoNamespace => "invalid",
            Error::Retention(_) | Error::Nats(_) => "nats",
            Error::Finalizer(e) => reconcile::finalizer_category(e),
        }
    }
}

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

/// Pure: what the data plane is asked to do for `replay`, given its check. `None`
/// unless the check passed (and the resource is complete enough to say it).
pub fn request(replay: &WebhookReplay, ready: &Desired) -> Option<ReplayRequest> {
    if !ready.status {
        return None;
    }
    let millis = |t: Timestamp| u64::try_from(t.as_millisecond()).unwrap_or(0);
    let spec = &replay.spec;
    // Without `to`: up to the end of the second the replay was created in (the API server
    // keeps whole seconds, and an event published just before it must not be left out).
    let to_ms = match &spec.to {
        Some(to) => millis(to.0),
        None => millis(replay.metadata.creation_timestamp.as_ref()?.0) + 1_000,
    };
    Some(ReplayRequest {
        namespace: replay.metadata.namespace.clone()?,
        name: replay.metadata.name.clone()?,
        uid: replay.metadata.uid.clone()?,
        endpoint: spec.endpoint.clone(),
        from_ms: millis(spec.from.0),
        to_ms,
        event_types: spec.event_types.clone(),
        only_failed: spec.only_failed,
        dry_run: spec.dry_run,
    })
}

/// Pure: the status of `replay` given what exists and the progress a dispatcher reported
/// (only progress of this very replay, by uid, counts).
pub fn status(
    replay: &WebhookReplay,
    found: Found,
    progress: Option<&ReplayProgress>,
    now: Timestamp,
) -> WebhookReplayStatus {
    let old = replay.status.clone().unwrap_or_default();
    let ready = check(replay, found, now);
    let asked = request(replay, &ready);
    let progress = progress.filter(|p| replay.metadata.uid.as_deref() == Some(p.uid.as_str()));
    let mut desired = conditions::ready_with_kstatus(ready);
    let mut new = WebhookReplayStatus {
        observed_generation: replay.metadata.generation,
        phase: Some(ReplayPhase::Pending),
        ..Default::default()
    };
    let dry_run = replay.spec.dry_run;
    let complete = match (progress, asked) {
        (Some(p), _) => {
            new.matched = Some(p.matched);
            new.enqueued = Some(p.enqueued);
            if !dry_run {
                new.delivered = Some(p.delivered);
                new.failed = Some(p.failed);
            }
            new.start_time = Some(old.start_time.clone().unwrap_or(Time(now)));
            if p.finished(dry_run) {
                new.phase = Some(ReplayPhase::Completed);
                new.completion_time = Some(old.completion_time.clone().unwrap_or(Time(now)));
                let what = if dry_run {
                    format!(
                        "{} events in the range would be sent (dry run: nothing was sent)",
                        p.matched
                    )
                } else {
                    format!(
                        "{} events in the range sent again: {} delivered, {} failed (dead)",
                        p.enqueued, p.delivered, p.failed
                    )
                };
                Desired::new(condition::COMPLETE, true, reason::COMPLETED, what)
            } else {
                new.phase = Some(ReplayPhase::Running);
                let message = if p.done {
                    format!(
                        "all {} matching events enqueued; {} delivered, {} failed, {} still being delivered",
                        p.enqueued,
                        p.delivered,
                        p.failed,
                        p.enqueued.saturating_sub(p.delivered + p.failed)
                    )
                } else if dry_run {
                    format!("{} events matched so far", p.matched)
                } else {
                    format!(
                        "{} events matched so far, {} enqueued; {} delivered, {} failed",
                        p.matched, p.enqueued, p.delivered, p.failed
                    )
                };
                let running = Desired::new(condition::COMPLETE, false, reason::RUNNING, message);
                desired.push(Desired::new(
                    condition::RECONCILING,
                    true,
                    reason::RUNNING,
                    running.message.clone(),
                ));
                running
            }
        }
        (None, Some(_)) => {
            let waiting = Desired::new(
                condition::COMPLETE,
                false,
                reason::WAITING,
                "waiting for the dispatcher that owns the endpoint's shard to take the replay up",
            );
            desired.push(Desired::new(
                condition::RECONCILING,
                true,
                reason::WAITING,
                waiting.message.clone(),
            ));
            waiting
        }
        (None, None) => Desired::new(
            condition::COMPLETE,
            false,
            reason::WAITING,
            "the replay starts once it is valid (see Ready)",
        ),
    };
    desired.push(complete);
    new.conditions = conditions::merge(
        &old.conditions,
        &desired,
        replay.metadata.generation,
        &Time(now),
    );
    new
}

pub async fn reconcile(guard: Arc<Guarded>, ctx: Arc<Context>) -> Result<Action, Error> {
    let work = async {
        match &guard.0 {
            Ok(obj) => reconcile_decoded(Arc::new(obj.clone()), &ctx).await,
            Err(invalid) => {
                if guard.meta().deletion_timestamp.is_some() {
                    let ns = guard.namespace().ok_or(Error::NoNamespace)?;
                    withdraw(&ctx, &ns, &guard.name_any()).await?;
                    ctx.plumbing
                        .release_finalizer(&guard, names::REPLAY_FINALIZER)
                        .await?;
                } else {
                    ctx.plumbing.report_undecodable(&guard, invalid).await;
                }
                Ok(Action::await_change())
            }
        }
    };
    ctx.plumbing.instrument(&guard, work).await
}

async fn reconcile_decoded(obj: Arc<WebhookReplay>, ctx: &Context) -> Result<Action, Error> {
    let ns = obj.namespace().ok_or(Error::NoNamespace)?;
    // A finalizer because the request lives outside Kubernetes: deleting the replay is
    // how a tenant stops it, so the request must not outlive the resource.
    finalizer(
        &ctx.plumbing.api(&ns),
        names::REPLAY_FINALIZER,
        obj,
        |event| async {
            match event {
                Finalizer::Apply(obj) => apply(&obj, ctx).await,
                Finalizer::Cleanup(obj) => {
                    withdraw(ctx, &ns, &obj.name_any()).await?;
                    Ok(Action::await_change())
                }
            }
        },
    )
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

/// Deletes the replay's request from `herald-config`.
async fn withdraw(ctx: &Context, ns: &str, name: &str) -> Result<(), Error> {
    nats::delete_if_present(&ctx.config_kv, &BucketKey::replay(ns, name).to_string()).await?;
    Ok(())
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
    fn a_valid_replay_becomes_a_request_with_a_fixed_range() {
        let now: Timestamp = "2026-11-30T00:00:00Z".parse().unwrap();
        let mut r = replay("2026-11-29T00:00:00Z");
        r.metadata.namespace = Some("shop".into());
        r.metadata.uid = Some("u-1".into());
        r.metadata.creation_timestamp = Some(Time("2026-11-29T12:00:00Z".parse().unwrap()));
        r.spec.event_types = vec!["order.*".into()];
        r.spec.only_failed = true;
        let valid = check(&r, found(true, Some(DAYS_30)), now);
        let got = request(&r, &valid).expect("a request");
        assert_eq!(
            got,
            ReplayRequest {
                namespace: "shop".into(),
                name: "r".into(),
                uid: "u-1".into(),
                endpoint: "orders".into(),
                from_ms: 1_795_910_400_000,
                // No `to`: the end of the creation second, so the range does not grow.
                to_ms: 1_795_953_601_000,
                event_types: vec!["order.*".into()],
                only_failed: true,
                dry_run: false,
            }
        );
        r.spec.to = Some(Time("2026-11-29T06:00:00Z".parse().unwrap()));
        assert_eq!(request(&r, &valid).unwrap().to_ms, 1_795_932_000_000);
        let invalid = check(&r, found(false, Some(DAYS_30)), now);
        assert_eq!(
            request(&r, &invalid),
            None,
            "only a valid replay is asked for"
        );
    }

    #[test]
    fn progress_of_this_replay_becomes_its_status() {
        let now: Timestamp = "2026-11-30T00:00:00Z".parse().unwrap();
        let mut r = replay("2026-11-29T00:00:00Z");
        r.metadata.namespace = Some("shop".into());
        r.metadata.uid = Some("u-1".into());
        r.metadata.creation_timestamp = Some(Time(now));
        r.spec.dry_run = true;
        let ok = found(true, Some(DAYS_30));
        let complete = |s: &WebhookReplayStatus| {
            let c = conditions::find(&s.conditions, condition::COMPLETE).unwrap();
            (c.status.clone(), c.reason.clone())
        };
        let waiting = status(&r, ok, None, now);
        assert_eq!(waiting.phase, Some(ReplayPhase::Pending));
        assert_eq!(complete(&waiting), ("False".into(), reason::WAITING.into()));
        assert_eq!(waiting.matched, None, "no invented progress");
        let mut progress = ReplayProgress {
            uid: "u-1".into(),
            matched: 7,
            cursor: 40,
            ..Default::default()
        };
        let running = status(&r, ok, Some(&progress), now);
        assert_eq!(running.phase, Some(ReplayPhase::Running));
        assert_eq!(running.matched, Some(7));
        assert!(conditions::find(&running.conditions, condition::RECONCILING).is_some());
        progress.done = true;
        r.status = Some(running);
        let later = now + SignedDuration::from_secs(5);
        let done = status(&r, ok, Some(&progress), later);
        assert_eq!(done.phase, Some(ReplayPhase::Completed));
        assert_eq!(complete(&done), ("True".into(), reason::COMPLETED.into()));
        assert_eq!(
            done.start_time,
            Some(Time(now)),
            "kept from the first report"
        );
        assert_eq!(done.completion_time, Some(Time(later)));
        assert!(conditions::find(&done.conditions, condition::RECONCILING).is_none());
        // Another replay's progress (an earlier one of the same name) is not this one's.
        let stale = ReplayProgress {
            uid: "u-0".into(),
            ..progress.clone()
        };
        assert_eq!(status(&r, ok, Some(&stale), now).matched, None);
        // A replay that sends: complete only once every enqueued event is delivered
        // or dead.
        r.spec.dry_run = false;
        r.status = None;
        progress.enqueued = 7;
        progress.delivered = 5;
        progress.failed = 1;
        let sending = status(&r, ok, Some(&progress), now);
        assert_eq!(sending.phase, Some(ReplayPhase::Running));
        assert_eq!(complete(&sending), ("False".into(), reason::RUNNING.into()));
        assert_eq!(
            (sending.enqueued, sending.delivered, sending.failed),
            (Some(7), Some(5), Some(1))
        );
        progress.failed = 2;
        let sent = status(&r, ok, Some(&progress), now);
        assert_eq!(sent.phase, Some(ReplayPhase::Completed));
        let c = conditions::find(&sent.conditions, condition::COMPLETE).unwrap();
        assert_eq!(
            c.message,
            "7 events in the range sent again: 5 delivered, 2 failed (dead)"
        );
    }

    #[test]
    fn windows_read_like_durations() {
        assert_eq!(window(DAYS_30), "30d");
        assert_eq!(window(Duration::from_secs(7200)), "2h");
        assert_eq!(window(Duration::from_secs(5400)), "90m");
        assert_eq!(window(Duration::from_secs(45)), "45s");
    }
}
