//! The health writer: the second writer of `WebhookEndpoint` status, under its own field
//! manager ([`HEALTH_FIELD_MANAGER`]).
//!
//! Contract: it owns what the data plane observed — `state`, `circuit`,
//! `concurrencyLimit`, `backlog`, `oldestPending`, `lastDelivery`, `successRate`,
//! `p95Latency`, `firstFailure` and the `Healthy` and `Disabled` conditions — rendered by
//! [`observed`] from the endpoint as stored and its newest health record, read from the
//! bucket when it renders. It renders when health is published ([`super::run`]) and when
//! what it renders from changed in the stored endpoint ([`Cached::inputs`]: so `state`
//! follows the `Ready` condition the endpoint controller writes), not when its own write
//! comes back — gauges waiting for their refresh do not go out with it — and patches only
//! when its part changed. It keeps the `herald_operator_endpoints` gauge and publishes the
//! `Disabled` and `Recovered` Events.

use std::sync::Arc;

use herald_core::dataplane::EndpointKey;
use herald_core::names::{condition, reason};
use herald_core::operational;
use herald_core::v1alpha1::{WebhookEndpoint, WebhookEndpointStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};

use super::Board;
use super::coalesce::Prints;
use crate::conditions;
use crate::endpoint::{Cached, Guarded, observed};
use crate::lean::cached;
use crate::metrics::{self, EndpointStates};
use crate::reconcile::{Categorized, HEALTH_FIELD_MANAGER, Plumbing};

/// The `kind` label of the writer's reconcile metrics.
pub const KIND: &str = "EndpointHealth";

/// How long publishing an operational event may take.
const OPERATIONAL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("decoding the cached spec: {0}")]
    Cache(#[source] serde_json::Error),
    #[error("reading health: {0}")]
    Health(#[from] super::ReadError),
}

impl Categorized for Error {
    fn category(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Cache(_) => "store",
            Error::Health(super::ReadError::Nats(_)) => "nats",
            Error::Health(super::ReadError::Malformed { .. }) => "store",
        }
    }
}

/// What the writer needs, before the endpoint store exists.
pub struct Parts {
    pub plumbing: Plumbing<Cached>,
    pub health: Arc<Board>,
    pub states: Arc<EndpointStates>,
    /// Where operational events go (the event store).
    pub js: async_nats::jetstream::Context,
}

impl Parts {
    pub fn into_context(self, endpoints: Store<Guarded>) -> Context {
        let Parts {
            plumbing,
            health,
            states,
            js,
        } = self;
        Context {
            plumbing,
            health,
            states,
            endpoints,
            js,
        }
    }
}

pub struct Context {
    plumbing: Plumbing<Cached>,
    health: Arc<Board>,
    states: Arc<EndpointStates>,
    /// The endpoint controller's store, to check an endpoint still exists before it is
    /// counted.
    endpoints: Store<Guarded>,
    js: async_nats::jetstream::Context,
}

/// Runs the health writer until `stop` resolves: on the endpoint controller's shared
/// store (`endpoints`, the store's subscription), for the endpoints `triggers` names
/// (their published health changed).
pub async fn run(
    parts: Parts,
    endpoints: impl futures::Stream<Item = Arc<Guarded>> + Send + 'static,
    store: Store<Guarded>,
    triggers: impl futures::Stream<Item = ObjectRef<Guarded>> + Send + 'static,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) {
    use futures::StreamExt;
    kube::runtime::Controller::for_shared_stream(endpoints, store.clone())
        .with_config(crate::reconcile::controller_config())
        .reconcile_on(triggers)
        .graceful_shutdown_on(stop)
        .run(reconcile, error_policy, Arc::new(parts.into_context(store)))
        .for_each(|_| async {})
        .await;
}

pub async fn reconcile(guard: Arc<Guarded>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.plumbing.instrument(&guard, write(&guard, &ctx)).await
}

pub fn error_policy(obj: Arc<Guarded>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.plumbing.error_policy(&obj, error)
}

async fn write(guard: &Guarded, ctx: &Context) -> Result<Action, Error> {
    // An object that does not decode is reported by the endpoint controller.
    let Ok(cached) = &guard.0 else {
        return Ok(Action::await_change());
    };
    let ns = cached.namespace().unwrap_or_default();
    let key = EndpointKey::new(&ns, &cached.name_any());
    if cached.meta().deletion_timestamp.is_some() {
        ctx.states.remove(&key);
        return Ok(Action::await_change());
    }
    let (render, key) = ctx.health.begin(&key, cached.inputs(cached.status.health));
    if !render {
        return Ok(Action::await_change());
    }
    let written = render_and_patch(guard, cached, &key, ctx).await;
    if written.is_err() {
        ctx.health.failed(&key);
    }
    written
}

/// Renders the writer's part from the newest health record and patches it when it
/// changed.
async fn render_and_patch(
    guard: &Guarded,
    cached: &Cached,
    key: &EndpointKey,
    ctx: &Context,
) -> Result<Action, Error> {
    let obj = &cached.endpoint().map_err(Error::Cache)?;
    let record = ctx.health.read(key).await?;
    let prints = Prints::of(record.as_ref());
    let health = record.filter(|h| Some(&h.uid) == obj.metadata.uid.as_ref());
    let old = obj.status.clone().unwrap_or_default();
    // In whole seconds, as the API server stores it: the part written is then the part
    // that comes back, and its fingerprint the one `rendered` expects.
    let now = Timestamp::from_second(Timestamp::now().as_second()).unwrap_or_default();
    let new = observed::status(obj, health.as_ref(), &Time(now));
    let part = cached::fingerprint(&new);
    if cached.status.health != part {
        ctx.plumbing
            .apply_status(key.namespace(), &obj.name_any(), HEALTH_FIELD_MANAGER, &new)
            .await?;
    }
    // What the stored endpoint will hold once this write comes back.
    ctx.health
        .rendered(key.clone(), cached.inputs(part), prints);
    announce(obj, &old, &new, ctx).await;
    // Counted only while it still exists undeleted: the endpoint controller forgets it
    // on deletion, and this must not count it again.
    let current = ctx.endpoints.get(&ObjectRef::from_obj(guard));
    if current.is_some_and(|c| c.meta().deletion_timestamp.is_none()) {
        ctx.states.set(key.clone(), metrics::state_label(new.state));
    }
    Ok(Action::await_change())
}

/// `Disabled` (Warning) and `Recovered` (Normal) Events when the `Disabled` condition
/// flips, and the operational events of the transition into the tenant's namespace
/// (`herald_core::operational`).
async fn announce(
    obj: &WebhookEndpoint,
    old: &WebhookEndpointStatus,
    new: &WebhookEndpointStatus,
    ctx: &Context,
) {
    let ns = obj.namespace().unwrap_or_default();
    for event in operational::endpoint_transitions(&ns, &obj.name_any(), old, new) {
        // A new leader rendering the same transition publishes the same message id,
        // which the event store drops as a duplicate.
        if let Err(error) = event.publish(&ctx.js, OPERATIONAL_TIMEOUT).await {
            tracing::warn!(namespace = ns, endpoint = obj.name_any(), event_type = event.event_type, %error, "could not publish an operational event");
        }
    }
    fn disabled(s: &WebhookEndpointStatus) -> Option<&Condition> {
        conditions::find(&s.conditions, condition::DISABLED).filter(|c| c.status == "True")
    }
    let (type_, reason, note) = match (disabled(old), disabled(new)) {
        (None, Some(c)) => (EventType::Warning, reason::DISABLED, c.message.clone()),
        (Some(_), None) => (
            EventType::Normal,
            reason::RECOVERED,
            "deliveries to this endpoint are enabled again".to_owned(),
        ),
        _ => return,
    };
    ctx.plumbing
        .publish(&obj.object_ref(&()), type_, reason, note)
        .await;
}
