//! Reconcile plumbing shared by every controller of the operator (`endpoint`,
//! `signing_secret`, `replay` and the endpoint health writer).
//!
//! Contract:
//! - a controller implements [`Reconciler`] (what applying its kind means, what its
//!   deletion withdraws from outside Kubernetes) and runs [`reconcile`], the one entry
//!   point: the finalizer, the object Herald cannot decode, and the instrumentation are
//!   here, once; its failures are [`Error`]s;
//! - every reconcile runs through [`Plumbing::instrument`]: timed, counted by result and
//!   by the error's [`Categorized::category`] (a bounded label set), and the object's
//!   backoff forgotten on success;
//! - every failure goes through [`Plumbing::error_policy`], the one error policy:
//!   exponential backoff per object ([`retry_delay`]: 1 s doubling to at most 60 s,
//!   jittered), so a failing object retries quickly at first, a long outage costs
//!   little, and objects do not retry in lockstep;
//! - status is written by [`Plumbing::apply_status`]: server-side apply under a fixed
//!   field manager, `apiVersion` and `kind` taken from the type;
//! - Events go through [`Plumbing::publish`]; failing to publish one is logged, never
//!   fatal;
//! - every kind is watched as a [`Guarded`] object: one the operator cannot decode (a
//!   newer CRD version, a hand-edited status) is reported with a Warning Event
//!   ([`Plumbing::report_undecodable`]) instead of wedging the watch, and
//!   [`Plumbing::release_finalizer`] lets its deletion complete.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use herald_core::names::reason;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Patch, PatchParams};
use kube::core::DeserializeGuard;
use kube::core::error_boundary::InvalidObject;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::finalizer::{self, Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::utils::Backoff;
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::lean::events::Publisher;
use crate::metrics::Metrics;

/// An object as watched: decoded, or the reason it could not be.
pub type Guarded<K> = DeserializeGuard<K>;

/// The field manager of the health writer: it owns the health fields, `state` and the
/// `Healthy` and `Disabled` conditions of `WebhookEndpoint` status, while
/// `herald_core::names::FIELD_MANAGER` owns everything else Herald writes.
pub const HEALTH_FIELD_MANAGER: &str = "herald.dev/operator-health";

/// The prefix of the annotations Herald reads (`herald.dev/enable`, `herald.dev/rotate`).
const HERALD_ANNOTATIONS: &str = "herald.dev/";

/// Drops what no reconcile reads before an object enters a controller's store:
/// `managedFields` (one entry per field manager, often larger than the object), labels
/// and every annotation but Herald's own (the client-side apply copy of the manifest,
/// GitOps tools' tracking marks). Writes are server-side applies and patches that do not
/// send these fields, so nothing is lost. Applied to every watch event with
/// `WatchStreamExt::modify`, so a cached object costs what reconciling needs: a label
/// alone is a 540-byte map node per object (docs/scale.md).
pub fn slim<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    meta.labels = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.retain(|key, _| key.starts_with(HERALD_ANNOTATIONS));
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
}

/// Reconciles of one controller that run at once. kube-runtime's default is unbounded:
/// creating 20,000 endpoints then starts thousands of reconciles together, each holding
/// its own connection to the API server (HTTP/1.1), and the test environment's API
/// server ran out of file descriptors (docs/scale.md). Sixteen keep the API server busy
/// (each reconcile waits on it, not on the CPU) with a bounded number of connections.
pub const CONCURRENCY: u16 = 16;

/// The controller configuration every controller uses: [`CONCURRENCY`].
pub fn controller_config() -> kube::runtime::controller::Config {
    kube::runtime::controller::Config::default().concurrency(CONCURRENCY)
}

/// First retry after a failure.
const RETRY_BASE: Duration = Duration::from_secs(1);
/// Longest wait between two retries of one object.
const RETRY_CAP: Duration = Duration::from_secs(60);

/// A controller's error: a low-cardinality category for metrics and logs.
pub trait Categorized: std::error::Error + Send + Sync + 'static {
    fn category(&self) -> &'static str;
}

/// Why a reconcile of any kind failed (retried with the object's backoff).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Nats(#[from] crate::nats::Error),
    #[error("object has no namespace")]
    NoNamespace,
    /// What one kind alone can fail at, with its category.
    #[error("{what}: {source}")]
    Other {
        category: &'static str,
        what: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<finalizer::Error<Error>>),
}

impl Error {
    /// A failure of one kind's own: `what` failed, counted under `category`.
    pub fn other(
        category: &'static str,
        what: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::Other {
            category,
            what,
            source: source.into(),
        }
    }
}

impl Categorized for Error {
    fn category(&self) -> &'static str {
        match self {
            Self::Kube(_) => "kube",
            Self::Nats(_) => "nats",
            Self::NoNamespace => "invalid",
            Self::Other { category, .. } => category,
            Self::Finalizer(e) => finalizer_category(e),
        }
    }
}

/// One controller of the operator: the steps that differ by kind. [`reconcile`] runs
/// them inside the steps every kind shares.
pub trait Reconciler: Send + Sync + 'static {
    /// The kind as the controller's store keeps it.
    type Watched: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static;
    /// The kind as applied (with the finalizer).
    type Object: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + Serialize
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static;
    /// The finalizer that keeps the object until what it put outside Kubernetes is
    /// withdrawn.
    const FINALIZER: &'static str;

    fn plumbing(&self) -> &Plumbing<Self::Watched>;

    /// The object to apply, from the one watched.
    fn object(watched: &Self::Watched) -> Result<Self::Object, Error>;

    /// Makes the world match `obj` (`watched` as the store keeps it).
    fn apply(
        &self,
        obj: &Self::Object,
        watched: &Self::Watched,
    ) -> impl Future<Output = Result<Action, Error>> + Send;

    /// Withdraws what object `name` in `namespace` put outside Kubernetes: it is being
    /// deleted (decoded or not).
    fn withdraw(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// An object Herald cannot decode that is not being deleted: by default, a Warning
    /// Event says so.
    fn undecodable(
        &self,
        guard: &Guarded<Self::Watched>,
        invalid: &InvalidObject,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        async move {
            self.plumbing().report_undecodable(guard, invalid).await;
            Ok(())
        }
    }
}

/// Every controller's entry point: instrumented; an object that decodes goes through
/// the finalizer to [`Reconciler::apply`] or, deleted, [`Reconciler::withdraw`]; one that
/// does not is withdrawn and let go when deleted, else [`Reconciler::undecodable`].
pub async fn reconcile<R: Reconciler>(
    guard: Arc<Guarded<R::Watched>>,
    ctx: Arc<R>,
) -> Result<Action, Error> {
    let work = async {
        let ns = guard.namespace().ok_or(Error::NoNamespace)?;
        let name = guard.name_any();
        match &guard.0 {
            Ok(watched) => {
                let obj = Arc::new(R::object(watched)?);
                let api: Api<R::Object> = Api::namespaced(ctx.plumbing().client.clone(), &ns);
                finalizer(&api, R::FINALIZER, obj, |event| async {
                    match event {
                        FinalizerEvent::Apply(obj) => ctx.apply(&obj, watched).await,
                        FinalizerEvent::Cleanup(_) => {
                            ctx.withdraw(&ns, &name).await?;
                            Ok(Action::await_change())
                        }
                    }
                })
                .await
                .map_err(|e| Error::Finalizer(Box::new(e)))
            }
            Err(_) if guard.meta().deletion_timestamp.is_some() => {
                ctx.withdraw(&ns, &name).await?;
                ctx.plumbing()
                    .release_finalizer(&guard, R::FINALIZER)
                    .await?;
                Ok(Action::await_change())
            }
            Err(invalid) => {
                ctx.undecodable(&guard, invalid).await?;
                Ok(Action::await_change())
            }
        }
    };
    ctx.plumbing().instrument(&guard, work).await
}

/// Every controller's error policy ([`Plumbing::error_policy`]).
pub fn error_policy<R: Reconciler>(
    obj: Arc<Guarded<R::Watched>>,
    error: &Error,
    ctx: Arc<R>,
) -> Action {
    ctx.plumbing().error_policy(&obj, error)
}

/// The category of an error that went through kube-runtime's finalizer helper.
pub fn finalizer_category<E: Categorized>(error: &finalizer::Error<E>) -> &'static str {
    match error {
        finalizer::Error::ApplyFailed(e) | finalizer::Error::CleanupFailed(e) => e.category(),
        _ => "finalizer",
    }
}

/// How long to wait before retry number `failures` (1 for the first), given `unit`
/// drawn uniformly from `[0, 1)`: `min(cap, base · 2^(failures-1))`, of which the upper
/// half is jittered.
pub fn retry_delay(failures: u32, unit: f64) -> Duration {
    let exp = failures.saturating_sub(1).min(16);
    let full = RETRY_BASE.saturating_mul(1u32 << exp).min(RETRY_CAP);
    full.div_f64(2.0) + full.div_f64(2.0).mul_f64(unit.clamp(0.0, 1.0))
}

/// Watch reconnects: 0.5 s doubling to at most 5 s (jittered), so that the operator sees
/// the API server again within seconds after an outage (kube's default waits up to 30 s).
#[derive(Default)]
pub struct WatchBackoff {
    failures: u32,
}

pub fn watch_backoff() -> WatchBackoff {
    WatchBackoff::default()
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        self.failures = self.failures.saturating_add(1);
        let full = Duration::from_millis(500)
            .saturating_mul(1u32 << (self.failures - 1).min(4))
            .min(Duration::from_secs(5));
        Some(full.mul_f64(0.5 + fastrand::f64() / 2.0))
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.failures = 0;
    }
}

/// The consecutive failures of each object that is failing now.
struct Failures<K: Resource>(Mutex<HashMap<ObjectRef<K>, u32>>);

impl<K: Resource<DynamicType = ()>> Failures<K> {
    fn record(&self, obj: ObjectRef<K>) -> u32 {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = map.entry(obj).or_default();
        *n = n.saturating_add(1);
        *n
    }

    fn forget(&self, obj: &ObjectRef<K>) {
        // Every operation is one insert or remove: a poisoned lock is still consistent.
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(obj);
    }
}

/// What every controller of one kind `K` shares: the client, the Event publisher, the
/// metrics and the per-object backoff.
pub struct Plumbing<K: Resource> {
    /// The `kind` label of this controller's metrics.
    kind: &'static str,
    pub client: Client,
    events: Publisher,
    metrics: Arc<Metrics>,
    failures: Failures<Guarded<K>>,
}

impl<K> Plumbing<K>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug,
{
    pub fn new(
        kind: &'static str,
        client: Client,
        events: Publisher,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            kind,
            client,
            events,
            metrics,
            failures: Failures(Mutex::default()),
        }
    }

    pub fn api(&self, namespace: &str) -> Api<K> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// Runs one reconcile of `obj`: timed and counted, its backoff forgotten on success.
    pub async fn instrument<E: Categorized>(
        &self,
        obj: &Guarded<K>,
        work: impl Future<Output = Result<Action, E>>,
    ) -> Result<Action, E> {
        let started = Instant::now();
        let result = work.await;
        if result.is_ok() {
            self.failures.forget(&ObjectRef::from_obj(obj));
        }
        let category = result.as_ref().err().map(Categorized::category);
        self.metrics
            .reconciled(self.kind, started.elapsed(), category);
        result
    }

    /// The one error policy: log, then retry this object after its next backoff delay.
    pub fn error_policy<E: Categorized>(&self, obj: &Guarded<K>, error: &E) -> Action {
        let failures = self.failures.record(ObjectRef::from_obj(obj));
        let delay = retry_delay(failures, fastrand::f64());
        tracing::warn!(
            kind = self.kind,
            namespace = obj.namespace(),
            name = obj.name_any(),
            category = error.category(),
            failures,
            retry_in = ?delay,
            %error,
            "reconcile failed"
        );
        Action::requeue(delay)
    }

    /// Writes `status` (only the fields it holds) with server-side apply as `manager`.
    pub async fn apply_status<S: Serialize>(
        &self,
        namespace: &str,
        name: &str,
        manager: &str,
        status: &S,
    ) -> Result<(), kube::Error> {
        let patch = json!({
            "apiVersion": K::api_version(&()),
            "kind": K::kind(&()),
            "status": status,
        });
        self.api(namespace)
            .patch_status(
                name,
                &PatchParams::apply(manager).force(),
                &Patch::Apply(&patch),
            )
            .await?;
        Ok(())
    }

    /// Publishes an Event about `reference`.
    pub async fn publish(
        &self,
        reference: &ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(error) = self.events.publish(&event, reference).await {
            tracing::warn!(%error, reason, "publishing an Event failed");
        }
    }

    /// Tells the object's owner that Herald cannot read it.
    pub async fn report_undecodable(&self, obj: &Guarded<K>, invalid: &InvalidObject) {
        tracing::warn!(
            kind = self.kind,
            namespace = obj.namespace(),
            name = obj.name_any(),
            error = %invalid,
            "cannot decode object"
        );
        self.publish(
            &obj.object_ref(&()),
            EventType::Warning,
            reason::INVALID_SPEC,
            format!(
                "Herald cannot read this object (is the operator older than the CRD?): {invalid}"
            ),
        )
        .await;
    }

    /// Removes `finalizer` from an object that is being deleted, without decoding it
    /// (guarded by `resourceVersion`, like kube-runtime's own finalizer removal).
    pub async fn release_finalizer(
        &self,
        obj: &Guarded<K>,
        finalizer: &str,
    ) -> Result<(), kube::Error> {
        let meta = obj.meta();
        let finalizers = obj.finalizers();
        if meta.deletion_timestamp.is_none() || !finalizers.iter().any(|f| f == finalizer) {
            return Ok(());
        }
        let rest: Vec<&String> = finalizers.iter().filter(|f| *f != finalizer).collect();
        let patch =
            json!({"metadata": {"finalizers": rest, "resourceVersion": meta.resource_version}});
        self.api(&obj.namespace().unwrap_or_default())
            .patch(
                &obj.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_core::v1alpha1::WebhookEndpoint;

    #[test]
    fn slim_keeps_what_reconciling_reads_and_drops_the_rest() {
        let mut obj: WebhookEndpoint = serde_json::from_value(json!({
            "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookEndpoint",
            "metadata": {
                "name": "orders", "namespace": "shop", "uid": "u1", "generation": 3,
                "resourceVersion": "42", "finalizers": ["herald.dev/delivery-cleanup"],
                "labels": {"app.kubernetes.io/instance": "shop"},
                "annotations": {
                    "kubectl.kubernetes.io/last-applied-configuration": "{\"spec\":{}}",
                    "argocd.argoproj.io/tracking-id": "shop:herald.dev/WebhookEndpoint:shop/orders",
                    "herald.dev/enable": "1"
                },
                "managedFields": [{"manager": "kubectl", "operation": "Apply",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:url": {}}}}]
            },
            "spec": {"url": "https://hooks.example.com/", "eventTypes": ["order.*"],
                "secretRef": {"name": "s"}},
            "status": {"observedGeneration": 3}
        }))
        .unwrap();
        let before = obj.clone();
        slim(&mut obj);
        assert_eq!(obj.metadata.managed_fields, None);
        assert_eq!(obj.metadata.labels, None);
        let annotations = obj.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(annotations.len(), 1, "{annotations:?}");
        assert_eq!(
            annotations.get("herald.dev/enable").map(String::as_str),
            Some("1")
        );
        assert_eq!(obj.spec, before.spec);
        assert_eq!(obj.status, before.status);
        assert_eq!(
            (
                &obj.metadata.uid,
                &obj.metadata.generation,
                &obj.metadata.finalizers
            ),
            (
                &before.metadata.uid,
                &before.metadata.generation,
                &before.metadata.finalizers
            )
        );
        let mut bare = before.clone();
        bare.metadata.annotations = Some([("note".to_owned(), String::new())].into());
        slim(&mut bare);
        assert_eq!(bare.metadata.annotations, None);
    }

    #[test]
    fn retries_back_off_exponentially_with_jitter_up_to_a_cap() {
        let table = [
            (1, 1_000),
            (2, 2_000),
            (3, 4_000),
            (6, 32_000),
            (7, 60_000),
            (40, 60_000),
        ];
        for (failures, full_ms) in table {
            let full = Duration::from_millis(full_ms);
            assert_eq!(retry_delay(failures, 0.0), full / 2, "{failures}");
            assert_eq!(retry_delay(failures, 1.0), full, "{failures}");
            let mid = retry_delay(failures, 0.5);
            assert!(mid > full / 2 && mid < full, "{failures}: {mid:?}");
        }
        assert_eq!(retry_delay(0, 1.0), RETRY_BASE);
    }
}
