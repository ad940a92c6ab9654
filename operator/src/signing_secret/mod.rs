//! The `SigningSecret` controller: keeps the Kubernetes Secret with the keys, rotates
//! them, and publishes the key set the dispatchers sign with.
//!
//! Pipeline per reconcile ([`apply`]): dereference (read the Secret) → [`keys::stored`]
//! and [`plan::decide`] (pure: what to generate, rotate or drop, the status) → write the
//! Secret → publish the `KeySet` in `herald-config` → status → Event.
//!
//! Contract:
//! - the Secret holds `current` (`whsec_...`) and, during a rotation's overlap,
//!   `previous` and `previousValidUntil` (RFC 3339); it is generated, owned by the
//!   SigningSecret, when absent;
//! - `KeySet { keys: [current, previous?] }` is in `herald-config` under
//!   `key.<ns>.<name>` whenever the Secret is valid, rewritten only on change; a Secret
//!   with bad data leaves the last published key set in place;
//! - key material never reaches status, Events or logs: only key ids (`SigningKey::id`);
//! - the finalizer `herald.dev/keyset-cleanup` stays until the `KeySet` is withdrawn
//!   from `herald-config` (key material must not outlive its resource);
//! - a SigningSecret that does not decode is reported with a Warning Event, keeps its
//!   published keys, and can still be deleted.

pub mod keys;
pub mod plan;

use std::sync::Arc;

use futures::{Stream, StreamExt};
use herald_core::dataplane::keyset_key;
use herald_core::names;
use herald_core::signing::generate;
use herald_core::v1alpha1::SigningSecret;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::Store;
use kube::runtime::{Controller, watcher};
use kube::{Api, Resource, ResourceExt};

use crate::nats;
use crate::reconcile::{self, Plumbing};
use keys::Keys;

pub const KIND: &str = "SigningSecret";

/// A `SigningSecret` as watched: decoded, or the reason it could not be.
pub type Guarded = reconcile::Guarded<SigningSecret>;

pub use reconcile::Error;

pub struct Context {
    pub plumbing: Plumbing<SigningSecret>,
    pub config_kv: async_nats::jetstream::kv::Store,
}

// A finalizer because the key set lives outside Kubernetes: key material must not outlive
// its SigningSecret in `herald-config`. The Secret itself is garbage-collected through
// its owner reference.
impl reconcile::Reconciler for Context {
    type Watched = SigningSecret;
    type Object = SigningSecret;
    const FINALIZER: &'static str = names::SIGNING_SECRET_FINALIZER;

    fn plumbing(&self) -> &Plumbing<SigningSecret> {
        &self.plumbing
    }

    fn object(watched: &SigningSecret) -> Result<SigningSecret, Error> {
        Ok(watched.clone())
    }

    async fn apply(&self, obj: &SigningSecret, _: &SigningSecret) -> Result<Action, Error> {
        apply(obj, self).await
    }

    /// Removes the key set from `herald-config`.
    async fn withdraw(&self, namespace: &str, name: &str) -> Result<(), Error> {
        nats::delete_if_present(&self.config_kv, &keyset_key(namespace, name)).await?;
        Ok(())
    }
}

async fn apply(obj: &SigningSecret, ctx: &Context) -> Result<Action, Error> {
    let ns = obj.namespace().ok_or(Error::NoNamespace)?;
    let name = obj.name_any();
    let secret_name = obj.spec.secret_name.clone().unwrap_or_else(|| name.clone());

    // Dereference.
    let secrets: Api<Secret> = Api::namespaced(ctx.plumbing.client.clone(), &ns);
    let existing = match secrets.get_opt(&secret_name).await {
        Err(e) if is_forbidden(&e) => return forbidden(obj, ctx, &ns, &secret_name).await,
        read => read?,
    };
    // Herald adds its labels and owner reference only to a Secret it creates.
    let owned = existing.as_ref().is_none_or(|s| {
        s.owner_references()
            .iter()
            .any(|o| Some(&o.uid) == obj.uid().as_ref())
    });

    // Decide.
    let stored = keys::stored(existing.as_ref());
    let outcome = plan::decide(obj, &secret_name, stored, Timestamp::now(), generate)
        .map_err(|e| Error::other("keygen", "generating a key", e))?;

    // Write: the Secret first, so the published keys are always ones it holds.
    if let Some(keys) = &outcome.keys {
        if outcome.write_secret {
            match write_secret(&secrets, obj, &ns, &secret_name, keys, owned).await {
                Err(Error::Kube(e)) if is_forbidden(&e) => {
                    return forbidden(obj, ctx, &ns, &secret_name).await;
                }
                written => written?,
            }
        }
        let value = serde_json::to_vec(&keys.key_set()).unwrap_or_default();
        nats::put_if_changed(&ctx.config_kv, &keyset_key(&ns, &name), value).await?;
    }
    if obj.status.as_ref() != Some(&outcome.status) {
        ctx.plumbing
            .apply_status(&ns, &name, names::FIELD_MANAGER, &outcome.status)
            .await?;
    }
    if let Some((reason, note)) = outcome.event {
        let reference = obj.object_ref(&());
        ctx.plumbing
            .publish(&reference, EventType::Normal, reason, note)
            .await;
    }
    Ok(Action::requeue(outcome.requeue))
}

/// Whether the API server refused the operator's identity (RBAC).
fn is_forbidden(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.is_forbidden())
}

/// The operator may not read or write Secrets in this namespace: the platform team has
/// not granted it (see the chart's README, "RBAC"). Said in the status, looked at again
/// after [`plan::FORBIDDEN_RETRY`]; the last published keys keep signing.
async fn forbidden(
    obj: &SigningSecret,
    ctx: &Context,
    ns: &str,
    secret_name: &str,
) -> Result<Action, Error> {
    tracing::warn!(
        namespace = ns,
        secret = secret_name,
        "the operator may not read or write Secrets in this namespace"
    );
    let status = plan::forbidden(obj, ns, secret_name, Timestamp::now());
    if obj.status.as_ref() != Some(&status) {
        ctx.plumbing
            .apply_status(ns, &obj.name_any(), names::FIELD_MANAGER, &status)
            .await?;
    }
    Ok(Action::requeue(plan::FORBIDDEN_RETRY))
}

async fn write_secret(
    secrets: &Api<Secret>,
    obj: &SigningSecret,
    ns: &str,
    secret_name: &str,
    keys: &Keys,
    owned: bool,
) -> Result<(), Error> {
    let manifest = keys::manifest(obj, ns, secret_name, keys, owned);
    secrets
        .patch(
            secret_name,
            &PatchParams::apply(names::FIELD_MANAGER).force(),
            &Patch::Apply(&manifest),
        )
        .await?;
    Ok(())
}

/// Runs the controller until `stop` resolves, driven by `signing_secrets` (the shared
/// watch of `SigningSecret`s that fills `store`; see `crate::controllers`). With
/// `watch_secrets`, the Secrets Herald generated (found by label in the watched namespace)
/// trigger their SigningSecret, so a hand edit is picked up at once; that needs list and
/// watch of Secrets there (a trigger only: no Secret is cached). Without it,
/// [`plan::RESYNC`] picks edits up.
pub async fn run(
    ctx: Arc<Context>,
    signing_secrets: impl Stream<Item = Result<Guarded, watcher::Error>> + Send + 'static,
    store: Store<Guarded>,
    namespace: Option<String>,
    watch_secrets: bool,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.plumbing.client.clone();
    let mut controller =
        Controller::for_stream(signing_secrets, store).with_config(reconcile::controller_config());
    if watch_secrets {
        controller = controller.owns(
            crate::scoped_api::<Secret>(client, namespace.as_deref()),
            watcher::Config::default().labels(&format!(
                "{}={}",
                names::MANAGED_BY_LABEL,
                names::MANAGED_BY
            )),
        );
    }
    controller
        .trigger_backoff(reconcile::watch_backoff())
        .graceful_shutdown_on(stop)
        .run(reconcile::reconcile, reconcile::error_policy, ctx)
        .for_each(|_| async {})
        .await;
}
