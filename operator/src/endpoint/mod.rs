//! The `WebhookEndpoint` controller.
//!
//! Pipeline per reconcile: dereference (the `SigningSecret`, DNS) → [`validate`] →
//! [`build`] (pure: `EndpointConfig`, status) → apply (the config entry in
//! `herald-config`) → status (server-side apply, only when it changed) → Events on flips.
//!
//! Contract:
//! - a valid endpoint has its `EndpointConfig` under `ep.<ns>.<name>` in `herald-config`;
//!   an invalid or deleted one has none (so deliveries stop);
//! - the finalizer `herald.dev/delivery-cleanup` stays until that entry is gone;
//! - this controller is the only writer of endpoint status; health arrives through
//!   [`crate::health::Published`], already coalesced;
//! - an object that does not decode is reported (Warning Event), has no config entry,
//!   and can still be deleted.

pub mod build;
pub mod validate;

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::channel::mpsc::UnboundedReceiver;
use herald_core::dataplane::{EndpointKey, shard_for};
use herald_core::names::{self, condition, reason};
use herald_core::ssrf::AddressPolicy;
use herald_core::v1alpha1::{SigningSecret, WebhookEndpoint, WebhookEndpointStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::core::DeserializeGuard;
use kube::core::error_boundary::InvalidObject;
use kube::runtime::controller::Action;
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::finalizer::{self, Event as Finalizer, finalizer};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

use crate::health::Published;
use crate::metrics::{self, Metrics};
use crate::nats;
use crate::signing_secret::publish;
use validate::Invalid;

pub const KIND: &str = "WebhookEndpoint";
/// Re-check valid endpoints this often: DNS answers change.
const RESYNC: Duration = Duration::from_secs(300);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Nats(#[from] nats::Error),
    #[error("object has no namespace")]
    NoNamespace,
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<finalizer::Error<Error>>),
}

impl Error {
    /// Low-cardinality name for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Nats(_) => "nats",
            Error::NoNamespace => "invalid",
            Error::Finalizer(e) => match e.as_ref() {
                finalizer::Error::ApplyFailed(e) | finalizer::Error::CleanupFailed(e) => {
                    e.category()
                }
                _ => "finalizer",
            },
        }
    }
}

pub struct Context {
    pub client: Client,
    pub config_kv: async_nats::jetstream::kv::Store,
    pub policy: AddressPolicy,
    pub shards: u32,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub health: Arc<Published>,
    /// The state label of every endpoint, for the gauge.
    states: Mutex<HashMap<ObjectRef<WebhookEndpoint>, &'static str>>,
}

impl Context {
    pub fn new(
        client: Client,
        config_kv: async_nats::jetstream::kv::Store,
        policy: AddressPolicy,
        shards: u32,
        recorder: Recorder,
        metrics: Arc<Metrics>,
        health: Arc<Published>,
    ) -> Self {
        Self {
            client,
            config_kv,
            policy,
            shards,
            recorder,
            metrics,
            health,
            states: Mutex::default(),
        }
    }

    fn record_state(&self, obj: ObjectRef<WebhookEndpoint>, state: Option<&'static str>) {
        let mut states = self.states.lock().unwrap_or_else(|e| e.into_inner());
        match state {
            Some(s) => states.insert(obj, s),
            None => states.remove(&obj),
        };
        let counts: Vec<(&'static str, i64)> = metrics::STATES
            .iter()
            .map(|s| (*s, states.values().filter(|v| *v == s).count() as i64))
            .collect();
        drop(states);
        self.metrics.set_endpoint_counts(&counts);
    }
}

/// The controller's entry point. Objects that do not deserialize into the Rust type
/// (`DeserializeGuard`: a newer CRD version, a hand-edited status) are reported on the
/// object instead of wedging the watch; their deletion still completes.
pub async fn reconcile(guard: Arc<Guarded>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = match &guard.0 {
        Ok(obj) => reconcile_valid(Arc::new(obj.clone()), &ctx).await,
        Err(invalid) => reconcile_undecodable(&guard, invalid, &ctx).await,
    };
    ctx.metrics.reconciled(
        KIND,
        started.elapsed(),
        result.as_ref().err().map(Error::category),
    );
    result
}

/// A `WebhookEndpoint` as watched: decoded, or the reason it could not be.
pub type Guarded = DeserializeGuard<WebhookEndpoint>;

async fn reconcile_valid(obj: Arc<WebhookEndpoint>, ctx: &Context) -> Result<Action, Error> {
    let ns = obj.namespace().ok_or(Error::NoNamespace)?;
    let api: Api<WebhookEndpoint> = Api::namespaced(ctx.client.clone(), &ns);
    finalizer(&api, names::ENDPOINT_FINALIZER, obj, |event| async {
        match event {
            Finalizer::Apply(obj) => apply(&obj, ctx).await,
            Finalizer::Cleanup(obj) => cleanup(&obj, ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

async fn reconcile_undecodable(
    guard: &Guarded,
    invalid: &InvalidObject,
    ctx: &Context,
) -> Result<Action, Error> {
    let meta = guard.meta();
    let ns = meta.namespace.clone().ok_or(Error::NoNamespace)?;
    let name = meta.name.clone().unwrap_or_default();
    // Nothing undecodable may be delivered to: withdraw its configuration.
    nats::delete_if_present(&ctx.config_kv, &EndpointKey::new(&ns, &name).config_key()).await?;
    let finalizers = meta.finalizers.clone().unwrap_or_default();
    if meta.deletion_timestamp.is_some()
        && finalizers.iter().any(|f| f == names::ENDPOINT_FINALIZER)
    {
        let api: Api<WebhookEndpoint> = Api::namespaced(ctx.client.clone(), &ns);
        let rest: Vec<&String> = finalizers
            .iter()
            .filter(|f| *f != names::ENDPOINT_FINALIZER)
            .collect();
        // Guarded by resourceVersion, like kube-runtime's own finalizer removal.
        let patch =
            json!({"metadata": {"finalizers": rest, "resourceVersion": meta.resource_version}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        return Ok(Action::await_change());
    }
    publish(
        &ctx.recorder,
        &guard.object_ref(&()),
        EventType::Warning,
        reason::INVALID_SPEC,
        format!("Herald cannot read this object (is the operator older than the CRD?): {invalid}"),
    )
    .await;
    Ok(Action::await_change())
}

pub fn error_policy(_obj: Arc<Guarded>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(kind = KIND, category = error.category(), %error, "reconcile failed");
    Action::requeue(Duration::from_millis(2_000 + fastrand::u64(0..3_000)))
}

/// Dereference and validate: the shard when valid.
async fn validate(
    obj: &WebhookEndpoint,
    ns: &str,
    ctx: &Context,
) -> Result<Result<u32, Invalid>, Error> {
    let url = match validate::check_spec(&obj.spec, &ctx.policy) {
        Ok(url) => url,
        Err(invalid) => return Ok(Err(invalid)),
    };
    // The URL first: a forbidden destination is the problem to report even while the
    // secret is still being created.
    if let Err(invalid) = validate::resolve(&url, &ctx.policy).await {
        return Ok(Err(invalid));
    }
    let secrets: Api<SigningSecret> = Api::namespaced(ctx.client.clone(), ns);
    let secret_name = &obj.spec.secret_ref.name;
    let secret = secrets.get_opt(secret_name).await?;
    if let Err(invalid) = validate::check_secret(secret_name, secret.as_ref()) {
        return Ok(Err(invalid));
    }
    Ok(Ok(shard_for(ns, &obj.name_any(), ctx.shards)))
}

async fn apply(obj: &WebhookEndpoint, ctx: &Context) -> Result<Action, Error> {
    let ns = obj.namespace().ok_or(Error::NoNamespace)?;
    let name = obj.name_any();
    let key = EndpointKey::new(&ns, &name);
    let validity = validate(obj, &ns, ctx).await?;

    match &validity {
        Ok(shard) => {
            let config = build::config(obj, *shard);
            let value = serde_json::to_vec(&config).unwrap_or_default();
            if nats::put_if_changed(&ctx.config_kv, &key.config_key(), value).await? {
                tracing::info!(
                    namespace = ns,
                    name,
                    shard,
                    "published endpoint configuration"
                );
            }
        }
        Err(invalid) => {
            if nats::delete_if_present(&ctx.config_kv, &key.config_key()).await? {
                tracing::info!(
                    namespace = ns,
                    name,
                    reason = invalid.reason,
                    "withdrew endpoint configuration"
                );
            }
        }
    }

    let health = ctx
        .health
        .get(&key)
        .filter(|h| Some(&h.uid) == obj.metadata.uid.as_ref());
    let old = obj.status.clone().unwrap_or_default();
    let new = build::status(obj, &validity, health.as_ref(), &Time(Timestamp::now()));
    if obj.status.as_ref() != Some(&new) {
        let api: Api<WebhookEndpoint> = Api::namespaced(ctx.client.clone(), &ns);
        let patch = json!({"apiVersion": "herald.dev/v1alpha1", "kind": KIND, "status": new});
        api.patch_status(
            &name,
            &PatchParams::apply(names::FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    }
    announce(obj, &old, &new, ctx).await;
    ctx.record_state(
        ObjectRef::from_obj(obj),
        Some(metrics::state_label(new.state)),
    );

    Ok(match validity {
        Err(Invalid {
            retry: Some(retry), ..
        }) => Action::requeue(retry),
        _ => Action::requeue(RESYNC),
    })
}

/// Events on condition flips only, so a resync publishes nothing.
async fn announce(
    obj: &WebhookEndpoint,
    old: &WebhookEndpointStatus,
    new: &WebhookEndpointStatus,
    ctx: &Context,
) {
    let find = |s: &WebhookEndpointStatus, t: &str| -> Option<Condition> {
        s.conditions.iter().find(|c| c.type_ == t).cloned()
    };
    let reference = obj.object_ref(&());
    let key = |c: &Option<Condition>| c.as_ref().map(|c| (c.status.clone(), c.reason.clone()));
    let (old_ready, new_ready) = (find(old, condition::READY), find(new, condition::READY));
    if key(&old_ready) != key(&new_ready)
        && let Some(c) = new_ready
    {
        let type_ = if c.status == "True" {
            EventType::Normal
        } else {
            EventType::Warning
        };
        publish(&ctx.recorder, &reference, type_, &c.reason, c.message).await;
    }
    let disabled = |s: &WebhookEndpointStatus| {
        find(s, condition::DISABLED).is_some_and(|c| c.status == "True")
    };
    match (disabled(old), disabled(new)) {
        (false, true) => {
            let message = find(new, condition::DISABLED)
                .map(|c| c.message)
                .unwrap_or_default();
            publish(
                &ctx.recorder,
                &reference,
                EventType::Warning,
                reason::DISABLED,
                message,
            )
            .await;
        }
        (true, false) => {
            publish(
                &ctx.recorder,
                &reference,
                EventType::Normal,
                reason::RECOVERED,
                "deliveries to this endpoint are enabled again".into(),
            )
            .await;
        }
        _ => {}
    }
}

async fn cleanup(obj: &WebhookEndpoint, ctx: &Context) -> Result<Action, Error> {
    let ns = obj.namespace().ok_or(Error::NoNamespace)?;
    let key = EndpointKey::new(&ns, &obj.name_any());
    nats::delete_if_present(&ctx.config_kv, &key.config_key()).await?;
    ctx.record_state(ObjectRef::from_obj(obj), None);
    tracing::info!(
        namespace = ns,
        name = obj.name_any(),
        "endpoint deleted; configuration withdrawn"
    );
    Ok(Action::await_change())
}

/// What makes an endpoint worth reconciling: its spec, the enable annotation, its
/// finalizers and deletion. Status changes — our own writes — are not.
fn relevant(obj: &Guarded) -> Option<u64> {
    let mut hasher = DefaultHasher::new();
    obj.meta().generation.hash(&mut hasher);
    obj.annotations()
        .get(names::ENABLE_ANNOTATION)
        .hash(&mut hasher);
    obj.finalizers().hash(&mut hasher);
    obj.meta()
        .deletion_timestamp
        .as_ref()
        .map(|t| t.0.as_nanosecond())
        .hash(&mut hasher);
    obj.meta().uid.hash(&mut hasher);
    Some(hasher.finish())
}

/// Runs the controller until `stop` resolves. `health` triggers a reconcile of an
/// endpoint whose published health changed.
pub async fn run(
    ctx: Arc<Context>,
    health: UnboundedReceiver<ObjectRef<WebhookEndpoint>>,
    namespace: Option<String>,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let (reader, writer) = reflector::store();
    let endpoints = watcher(
        crate::scoped_api::<Guarded>(client.clone(), namespace.as_deref()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(writer)
    .applied_objects()
    .predicate_filter(relevant, Default::default());
    let store = reader.clone();
    Controller::for_stream(endpoints, reader)
        // A SigningSecret that appears or changes re-validates the endpoints using it.
        .watches(
            crate::scoped_api::<SigningSecret>(client, namespace.as_deref()),
            watcher::Config::default(),
            move |secret| {
                let ns = secret.namespace();
                let name = secret.name_any();
                store
                    .state()
                    .into_iter()
                    .filter(|guard| {
                        guard
                            .0
                            .as_ref()
                            .is_ok_and(|ep| ep.namespace() == ns && ep.spec.secret_ref.name == name)
                    })
                    .map(|guard| ObjectRef::from_obj(&*guard))
                    .collect::<Vec<_>>()
            },
        )
        .reconcile_on(health.map(|r| {
            let obj = ObjectRef::<Guarded>::new(&r.name);
            match r.namespace {
                Some(ns) => obj.within(&ns),
                None => obj,
            }
        }))
        .graceful_shutdown_on(stop)
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {})
        .await;
}
