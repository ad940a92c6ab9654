//! One reconcile of a `WebhookEndpoint`, as a pipeline:
//! [`dereference`] (IO: DNS, the `SigningSecret`, the Secrets of headers' `valueFrom`,
//! the current entry in `herald-config`, the verification report when one is required)
//! → [`decide`] (pure: [`validate`](super::validate), then [`build`](super::build)'s
//! publication and status) → [`publish`] (the entry) → status (server-side apply, only
//! when changed) → Events on `Ready` flips.
//!
//! Contract: only [`withdraw`] (the resource is being deleted) removes the entry; a
//! resource that does not validate or does not decode is held with its last good
//! configuration.

use herald_core::dataplane::{BucketKey, Credentials, EndpointConfig, EndpointKey, shard_for};
use herald_core::names::{self, condition};
use herald_core::v1alpha1::{SigningSecret, WebhookEndpoint, WebhookEndpointStatus};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::core::error_boundary::InvalidObject;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};

use super::build::{self, Publication};
use super::secret_values;
use super::validate::{self, Invalid, Lookup};
use super::verification;
use super::{Context, Error, Guarded};
use crate::lean::cached::{self, Recorded};
use crate::nats;
use herald_core::verification::VerificationReport;

/// What validation needs from outside the object.
struct Observed {
    /// The pure checks of the spec: the URL when they pass.
    url: Result<url::Url, Invalid>,
    /// What the URL's host resolved to (not looked up when the spec already fails).
    lookup: Option<Lookup>,
    secret: Option<SigningSecret>,
    /// What the endpoint takes from Secrets (not read when the spec already fails).
    resolved: Result<secret_values::Resolved, Invalid>,
    /// The entry in `herald-config` now, as stored and as decoded.
    current: Option<(Vec<u8>, Option<EndpointConfig>)>,
    /// Whether the endpoint must be verified, and the dispatchers' last report on it.
    verification: (bool, Option<VerificationReport>),
}

/// What one reconcile decided.
struct Decision {
    validity: Result<u32, Invalid>,
    publication: Publication,
    /// The values from Secrets of a fresh publication, split from it.
    credentials: Option<Credentials>,
    status: WebhookEndpointStatus,
}

/// Dereference: the only reads of this pipeline.
async fn dereference(obj: &WebhookEndpoint, ns: &str, ctx: &Context) -> Result<Observed, Error> {
    let url = validate::check_spec(&obj.spec, &ctx.policy)
        .and_then(|url| validate::check_proxy(&obj.spec, &ctx.egress).map(|()| url));
    let lookup = match &url {
        Ok(url) => validate::lookup(url).await,
        Err(_) => None,
    };
    // From the shared watch's store, not a GET: a reconcile costs the API server nothing
    // but its status write. Until the store's first list is in, an absent secret would be
    // a false "not found" (not kube's `wait_until_ready`: see `crate::lean::listed`).
    ctx.secrets
        .ready()
        .await
        .map_err(|e| Error::other("store", "the SigningSecret store", e))?;
    let name = &obj.spec.secret_ref.name;
    // One that does not decode counts as one without a usable key.
    let secret =
        ctx.secrets
            .store
            .get(&ObjectRef::new(name).within(ns))
            .map(|guard| match &guard.0 {
                Ok(secret) => secret.clone(),
                Err(_) => undecodable_secret(name),
            });
    let resolved = match &url {
        Ok(_) if secret_values::uses_secrets(&obj.spec) => {
            let api: Api<Secret> = Api::namespaced(ctx.plumbing.client.clone(), ns);
            secret_values::resolve(&api, &obj.spec).await
        }
        _ => Ok(secret_values::Resolved {
            headers: obj.spec.headers.clone(),
            tls: None,
        }),
    };
    let key = EndpointKey::new(ns, &obj.name_any());
    let current = read_config(ctx, &key).await?;
    let required = obj.spec.verify || namespace_requires(ctx, ns).await?;
    let report = match required {
        true => verification::read_report(&ctx.health_kv, &key).await?,
        false => None,
    };
    Ok(Observed {
        url,
        lookup,
        secret,
        resolved,
        current,
        verification: (required, report),
    })
}

/// Whether `ns` requires its endpoints to be verified. Until the namespaces were read,
/// nothing is published: an endpoint held for verification must not be released by an
/// operator that does not know yet.
async fn namespace_requires(ctx: &Context, ns: &str) -> Result<bool, Error> {
    let mut verifying = ctx.verifying.clone();
    let known = tokio::time::timeout(NAMESPACES_WAIT, verifying.wait_for(Option::is_some)).await;
    match known {
        Ok(Ok(set)) => Ok(set.as_ref().is_some_and(|set| set.contains(ns))),
        _ => Err(Error::other(
            "namespaces",
            "waiting for the namespaces' annotations (can the operator read Namespaces?)",
            "the namespaces have not been read yet",
        )),
    }
}

/// How long a reconcile waits for the namespaces to be read first.
const NAMESPACES_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

fn undecodable_secret(name: &str) -> SigningSecret {
    SigningSecret::new(
        name,
        herald_core::v1alpha1::SigningSecretSpec {
            secret_name: None,
            algorithm: None,
            rotation: Default::default(),
        },
    )
}

async fn read_config(
    ctx: &Context,
    key: &EndpointKey,
) -> Result<Option<(Vec<u8>, Option<EndpointConfig>)>, Error> {
    let Some(raw) = nats::read(&ctx.config_kv, &key.config_key()).await? else {
        return Ok(None);
    };
    let decoded = serde_json::from_slice(&raw)
        .inspect_err(|error| tracing::warn!(key = %key, %error, "undecodable configuration entry"))
        .ok();
    Ok(Some((raw, decoded)))
}

/// Decide (pure): validity, what to publish, the status.
fn decide(obj: &WebhookEndpoint, observed: &Observed, ctx: &Context, now: &Time) -> Decision {
    let ns = obj.namespace().unwrap_or_default();
    let validity = validate::endpoint(
        &observed.url,
        observed.lookup.as_ref(),
        &ctx.policy,
        &obj.spec.secret_ref.name,
        observed.secret.as_ref(),
    )
    .and_then(|()| observed.resolved.as_ref().map(|_| ()).map_err(Clone::clone))
    .map(|()| shard_for(&ns, &obj.name_any(), ctx.shards));
    let current = observed.current.as_ref().and_then(|(_, c)| c.clone());
    let mut publication = build::publication(obj, &validity, current);
    // With what the endpoint's Secrets hold.
    if let (Publication::Fresh(config), Ok(resolved)) = (&mut publication, &observed.resolved) {
        config.headers = resolved.headers.clone();
        config.tls = resolved.tls.clone();
    }
    let (required, report) = &observed.verification;
    let uid = obj.metadata.uid.as_deref().unwrap_or_default();
    let verification = verification::state(*required, report.as_ref(), uid, &obj.spec.url);
    let credentials = match &mut publication {
        Publication::Fresh(config) => {
            verification.apply(config);
            // Out of the entry herald-api reads.
            Credentials::split(config)
        }
        _ => None,
    };
    let status = build::status(obj, &validity, &publication, &verification, now);
    Decision {
        validity,
        publication,
        credentials,
        status,
    }
}

/// Writes the entry when it should change, and the credentials of a fresh one before it
/// (the dispatchers hold an entry whose credentials they do not have yet); deletes the
/// credentials once the entry that named them (`had_credentials`) needs none. Never
/// deletes one of this endpoint.
async fn publish(
    ctx: &Context,
    key: &EndpointKey,
    current: Option<&[u8]>,
    had_credentials: bool,
    publication: &Publication,
    credentials: Option<&Credentials>,
) -> Result<(), Error> {
    let config_key = key.config_key();
    let credentials_key = BucketKey::Credentials(key.clone()).to_string();
    if let Some(credentials) = credentials {
        let value = serde_json::to_vec(credentials).expect("credentials serialize");
        nats::put_if_changed(&ctx.config_kv, &credentials_key, value).await?;
    }
    match publication {
        Publication::Fresh(config) | Publication::Held(config) => {
            let value = serde_json::to_vec(config).unwrap_or_default();
            if current != Some(value.as_slice()) {
                nats::put(&ctx.config_kv, &config_key, value).await?;
                let held = config.held.as_ref().map(|h| h.reason.as_str());
                tracing::info!(endpoint = %key, shard = config.shard, held, "published endpoint configuration");
            }
        }
        Publication::Stale => {
            nats::delete_if_present(&ctx.config_kv, &config_key).await?;
            nats::delete_if_present(&ctx.config_kv, &credentials_key).await?;
            tracing::info!(endpoint = %key, "withdrew the configuration of a deleted endpoint");
        }
        Publication::Nothing => {}
    }
    // A fresh entry that needs none any more (no read for the many that never had any).
    if let (Publication::Fresh(_), None, true) = (publication, credentials, had_credentials) {
        nats::delete_if_present(&ctx.config_kv, &credentials_key).await?;
    }
    Ok(())
}

/// Reconciles `obj` ([`super::Cached::endpoint`]) whose stored status is `recorded`.
pub(super) async fn apply(
    obj: &WebhookEndpoint,
    recorded: &Recorded,
    ctx: &Context,
) -> Result<Action, Error> {
    let ns = obj.namespace().ok_or(Error::NoNamespace)?;
    let name = obj.name_any();
    let key = EndpointKey::new(&ns, &name);
    let observed = dereference(obj, &ns, ctx).await?;
    let decision = decide(obj, &observed, ctx, &Time(Timestamp::now()));
    let current = observed.current.as_ref().map(|(raw, _)| raw.as_slice());
    let had_credentials = observed
        .current
        .as_ref()
        .and_then(|(_, decoded)| decoded.as_ref())
        .is_some_and(|c| c.credentials.is_some());
    let credentials = decision.credentials.as_ref();
    publish(
        ctx,
        &key,
        current,
        had_credentials,
        &decision.publication,
        credentials,
    )
    .await?;

    let old = obj.status.clone().unwrap_or_default();
    if !recorded.present || recorded.controller != cached::fingerprint(&decision.status) {
        ctx.plumbing
            .apply_status(&ns, &name, names::FIELD_MANAGER, &decision.status)
            .await?;
    }
    announce(obj, &old, &decision.status, ctx).await;
    Ok(match decision.validity {
        Err(Invalid {
            retry: Some(retry), ..
        }) => Action::requeue(retry),
        // No watch on Secrets it does not own: read them again this often.
        _ if secret_values::uses_secrets(&obj.spec) => Action::requeue(ctx.header_secret_refresh),
        // The periodic re-check is `super::resync`'s, not a requeue per endpoint.
        _ => Action::await_change(),
    })
}

/// An Event when `Ready` flips (status or reason), so a resync publishes nothing.
async fn announce(
    obj: &WebhookEndpoint,
    old: &WebhookEndpointStatus,
    new: &WebhookEndpointStatus,
    ctx: &Context,
) {
    let ready = |s: &WebhookEndpointStatus| {
        crate::conditions::find(&s.conditions, condition::READY).cloned()
    };
    let (before, after) = (ready(old), ready(new));
    let key = |c: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>| {
        c.as_ref().map(|c| (c.status.clone(), c.reason.clone()))
    };
    if key(&before) == key(&after) {
        return;
    }
    if let Some(c) = after {
        let type_ = if c.status == "True" {
            EventType::Normal
        } else {
            EventType::Warning
        };
        ctx.plumbing
            .publish(&obj.object_ref(&()), type_, &c.reason, c.message)
            .await;
    }
}

/// The resource is being deleted (decoded or not): its entry goes, and the dispatchers
/// drop its lanes.
pub(super) async fn withdraw(ctx: &Context, ns: &str, name: &str) -> Result<(), Error> {
    let key = EndpointKey::new(ns, name);
    nats::delete_if_present(&ctx.config_kv, &key.config_key()).await?;
    let credentials = BucketKey::Credentials(key.clone()).to_string();
    nats::delete_if_present(&ctx.config_kv, &credentials).await?;
    ctx.states.remove(&key);
    tracing::info!(endpoint = %key, "endpoint deleted; configuration withdrawn");
    Ok(())
}

/// An object that does not decode and is not being deleted: hold its last good
/// configuration and say why.
pub(super) async fn hold_undecodable(
    guard: &Guarded,
    invalid: &InvalidObject,
    ctx: &Context,
) -> Result<(), Error> {
    let ns = guard.namespace().ok_or(Error::NoNamespace)?;
    let key = EndpointKey::new(&ns, &guard.name_any());
    let why = Invalid::new(
        herald_core::names::reason::INVALID_SPEC,
        format!("Herald cannot read this object: {invalid}"),
    );
    let current = read_config(ctx, &key).await?;
    let uid = guard.uid().unwrap_or_default();
    let publication = build::hold(current.as_ref().and_then(|(_, c)| c.clone()), &uid, &why);
    let raw = current.as_ref().map(|(raw, _)| raw.as_slice());
    publish(ctx, &key, raw, false, &publication, None).await?;
    ctx.plumbing.report_undecodable(guard, invalid).await;
    Ok(())
}
