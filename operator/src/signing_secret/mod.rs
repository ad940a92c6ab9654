//! The `SigningSecret` controller: keeps the Kubernetes Secret with the keys, rotates
//! them, and publishes the key set the dispatchers sign with.
//!
//! Pipeline: `dereference` (read the Secret) → [`plan`] (pure: what to generate, rotate
//! or drop) → apply (write the Secret, then the `KeySet` in `herald-config`) → status.
//!
//! Contract:
//! - the Secret holds `current` (`whsec_...`) and, during a rotation's overlap,
//!   `previous` and `previousValidUntil` (RFC 3339); it is generated, owned by the
//!   SigningSecret, when absent;
//! - `KeySet { keys: [current, previous?] }` is in `herald-config` under
//!   `key.<ns>.<name>` whenever the Secret is valid, rewritten only on change;
//! - key material never reaches status, Events or logs: only key ids (`SigningKey::id`);
//! - the finalizer `herald.dev/keyset-cleanup` stays until the `KeySet` is withdrawn
//!   from `herald-config` (key material must not outlive its resource);
//! - a rotation request (`spec.rotation.request` and the `herald.dev/rotate` annotation,
//!   combined into one token) is acted on once per distinct value.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use herald_core::dataplane::{KeySet, keyset_key};
use herald_core::names::{self, condition, reason};
use herald_core::signing::{KeyError, SigningKey, generate_whsec};
use herald_core::v1alpha1::{SigningSecret, SigningSecretStatus};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::finalizer::{self, Event as Finalizer, finalizer};
use kube::runtime::{Controller, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

use crate::conditions::{self, Desired};
use crate::metrics::Metrics;
use crate::nats;

pub const KIND: &str = "SigningSecret";
const CURRENT: &str = "current";
const PREVIOUS: &str = "previous";
const PREVIOUS_VALID_UNTIL: &str = "previousValidUntil";
/// Re-read the Secret at least this often, for Secrets Herald does not own (and
/// therefore does not watch).
const RESYNC: Duration = Duration::from_secs(300);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Nats(#[from] nats::Error),
    #[error("generating a key: {0}")]
    KeyGen(#[source] KeyError),
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
            Error::KeyGen(_) => "keygen",
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
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
}

/// The keys as stored in the Secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Keys {
    pub current: String,
    pub previous: Option<(String, Timestamp)>,
}

/// A data key of the Secret that does not hold what it should. The message names the
/// key and the problem, never the value.
#[derive(Debug, PartialEq, Eq)]
pub struct BadData {
    pub key: &'static str,
    pub problem: String,
}

/// Reads the keys out of Secret data.
pub fn read_keys(data: &BTreeMap<String, ByteString>) -> Result<Keys, BadData> {
    let text = |key: &'static str| -> Result<Option<String>, BadData> {
        data.get(key)
            .map(|v| {
                String::from_utf8(v.0.clone()).map_err(|_| BadData {
                    key,
                    problem: "is not UTF-8 text".into(),
                })
            })
            .transpose()
    };
    let check = |key: &'static str, value: &str| {
        SigningKey::from_whsec(value).map_err(|e| BadData {
            key,
            problem: describe(&e),
        })
    };
    let current = text(CURRENT)?.ok_or(BadData {
        key: CURRENT,
        problem: "is missing".into(),
    })?;
    check(CURRENT, &current)?;
    let previous = match (text(PREVIOUS)?, text(PREVIOUS_VALID_UNTIL)?) {
        (Some(previous), Some(until)) => {
            check(PREVIOUS, &previous)?;
            let until = until.trim().parse::<Timestamp>().map_err(|_| BadData {
                key: PREVIOUS_VALID_UNTIL,
                problem: "is not an RFC 3339 time such as 2026-11-30T12:00:00Z".into(),
            })?;
            Some((previous.trim().to_owned(), until))
        }
        (Some(_), None) => {
            return Err(BadData {
                key: PREVIOUS_VALID_UNTIL,
                problem: "is missing while `previous` is set".into(),
            });
        }
        (None, _) => None,
    };
    Ok(Keys {
        current: current.trim().to_owned(),
        previous,
    })
}

/// A key error in words that cannot leak key material (base64 decode errors quote the
/// offending byte, so they are not passed through).
fn describe(e: &KeyError) -> String {
    match e {
        KeyError::NotBase64(_) => "is not valid base64 after \"whsec_\"".into(),
        other => format!("is not a valid key: {other}"),
    }
}

fn key_id(whsec: &str) -> Option<String> {
    SigningKey::from_whsec(whsec)
        .ok()
        .map(|k| k.id().to_owned())
}

/// What one reconcile does to the keys.
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    /// Generate a new current key, moving the old one to `previous`.
    pub rotate: bool,
    /// Drop the previous key: its overlap is over.
    pub drop_previous: bool,
}

/// The rotation request token: `spec.rotation.request` and the annotation, combined so
/// that a new value of either triggers exactly one rotation.
pub fn rotation_request(obj: &SigningSecret) -> Option<String> {
    let spec = obj.spec.rotation.request.clone();
    let annotation = obj.annotations().get(names::ROTATE_ANNOTATION).cloned();
    match (spec, annotation) {
        (Some(s), Some(a)) => Some(format!("{s}+{a}")),
        (s, a) => s.or(a),
    }
}

/// Pure: decides what to do given the keys, the spec and status, and the time.
pub fn plan(obj: &SigningSecret, keys: &Keys, now: Timestamp) -> Plan {
    let status = obj.status.clone().unwrap_or_default();
    let requested = rotation_request(obj);
    let on_demand = requested.is_some() && requested != status.observed_rotation_request;
    let scheduled = match (&obj.spec.rotation.every, &status.last_rotation) {
        (Some(every), Some(last)) => {
            let every = SignedDuration::try_from(every.get()).unwrap_or(SignedDuration::MAX);
            last.0.checked_add(every).is_ok_and(|due| due <= now)
        }
        _ => false,
    };
    let drop_previous = keys
        .previous
        .as_ref()
        .is_some_and(|(_, until)| *until <= now);
    Plan {
        rotate: on_demand || scheduled,
        drop_previous,
    }
}

/// The Secret data for `keys`. `data`, not `stringData`: server-side apply tracks
/// ownership of `data` keys, so leaving `previous` out of the next apply removes it.
fn secret_data(keys: &Keys) -> BTreeMap<String, ByteString> {
    let bytes = |s: &str| ByteString(s.as_bytes().to_vec());
    let mut data = BTreeMap::from([(CURRENT.to_owned(), bytes(&keys.current))]);
    if let Some((previous, until)) = &keys.previous {
        data.insert(PREVIOUS.to_owned(), bytes(previous));
        data.insert(PREVIOUS_VALID_UNTIL.to_owned(), bytes(&until.to_string()));
    }
    data
}

pub async fn reconcile(obj: Arc<SigningSecret>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let ns = obj.namespace().ok_or(Error::NoNamespace)?;
    let api: Api<SigningSecret> = Api::namespaced(ctx.client.clone(), &ns);
    // A finalizer because the key set lives outside Kubernetes: key material must not
    // outlive its SigningSecret in `herald-config`. The Secret itself is garbage-collected
    // through its owner reference.
    let result = finalizer(&api, names::SIGNING_SECRET_FINALIZER, obj, |event| async {
        match event {
            Finalizer::Apply(obj) => apply(&obj, &ctx).await,
            Finalizer::Cleanup(obj) => cleanup(&obj, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    ctx.metrics.reconciled(
        KIND,
        started.elapsed(),
        result.as_ref().err().map(Error::category),
    );
    result
}

pub fn error_policy(_obj: Arc<SigningSecret>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(kind = KIND, category = error.category(), %error, "reconcile failed");
    // Jitter, so that a NATS outage does not make every object retry in lockstep.
    Action::requeue(Duration::from_millis(5_000 + fastrand::u64(0..5_000)))
}

async fn cleanup(obj: &SigningSecret, ctx: &Context) -> Result<Action, Error> {
    let ns = obj.namespace().ok_or(Error::NoNamespace)?;
    nats::delete_if_present(&ctx.config_kv, &keyset_key(&ns, &obj.name_any())).await?;
    Ok(Action::await_change())
}

async fn apply(obj: &SigningSecret, ctx: &Context) -> Result<Action, Error> {
    let ns = obj.namespace().ok_or(Error::NoNamespace)?;
    let name = obj.name_any();
    let secret_name = obj.spec.secret_name.clone().unwrap_or_else(|| name.clone());
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let now = Timestamp::now();
    let old_status = obj.status.clone().unwrap_or_default();
    let mut status = old_status.clone();
    let reference = obj.object_ref(&());

    let existing = secrets.get_opt(&secret_name).await?;
    let owned = existing.as_ref().is_none_or(|s| {
        s.owner_references()
            .iter()
            .any(|o| Some(&o.uid) == obj.uid().as_ref())
    });
    let mut event = None;
    let (mut keys, generated) = match &existing {
        None => {
            let (current, id) = generate_whsec().map_err(Error::KeyGen)?;
            event = Some((
                reason::KEY_GENERATED,
                format!("generated key {id} in Secret {secret_name}"),
            ));
            (
                Keys {
                    current,
                    previous: None,
                },
                true,
            )
        }
        Some(secret) => match read_keys(&secret.data.clone().unwrap_or_default()) {
            Ok(keys) => (keys, false),
            Err(bad) => {
                let message = format!(
                    "data key `{}` of Secret {secret_name} {}; it must hold `whsec_` followed by the base64 of 24 to 64 random bytes (delete the Secret to let Herald generate one)",
                    bad.key, bad.problem
                );
                status.conditions = conditions::merge(
                    &old_status.conditions,
                    &[Desired::new(
                        condition::READY,
                        false,
                        reason::INVALID_SPEC,
                        message,
                    )],
                    obj.metadata.generation,
                    &Time(now),
                );
                status.observed_generation = obj.metadata.generation;
                write_status(ctx, obj, &ns, &old_status, &status).await?;
                return Ok(Action::requeue(RESYNC));
            }
        },
    };

    let plan = plan(obj, &keys, now);
    let before = keys.clone();
    if plan.drop_previous {
        keys.previous = None;
    }
    let requested = rotation_request(obj);
    if generated {
        // A fresh key answers any pending request: no need to rotate it right away.
        status.last_rotation = Some(Time(now));
    } else if plan.rotate {
        let (current, id) = generate_whsec().map_err(Error::KeyGen)?;
        let overlap = SignedDuration::try_from(obj.spec.rotation.overlap.get())
            .unwrap_or(SignedDuration::from_hours(24));
        let until = now.checked_add(overlap).unwrap_or(now);
        let old = std::mem::replace(&mut keys.current, current);
        let old_id = key_id(&old).unwrap_or_default();
        keys.previous = Some((old, until));
        status.last_rotation = Some(Time(now));
        event = Some((
            reason::SECRET_ROTATED,
            format!("rotated to key {id}; previous key {old_id} keeps signing until {until}"),
        ));
    }
    if requested.is_some() {
        status.observed_rotation_request = requested;
    }

    if generated || keys != before {
        let mut secret = json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": secret_name, "namespace": ns},
            "data": secret_data(&keys),
        });
        if owned {
            secret["metadata"]["labels"] = json!({names::MANAGED_BY_LABEL: names::MANAGED_BY});
            secret["metadata"]["ownerReferences"] = json!([obj.controller_owner_ref(&())]);
            secret["type"] = json!("Opaque");
        }
        secrets
            .patch(
                &secret_name,
                &PatchParams::apply(names::FIELD_MANAGER).force(),
                &Patch::Apply(&secret),
            )
            .await?;
    }

    let mut set = vec![keys.current.clone()];
    set.extend(keys.previous.as_ref().map(|(p, _)| p.clone()));
    let value = serde_json::to_vec(&KeySet { keys: set }).unwrap_or_default();
    nats::put_if_changed(&ctx.config_kv, &keyset_key(&ns, &name), value).await?;

    let active = key_id(&keys.current);
    if active != old_status.active_key_id && !generated && !plan.rotate {
        // The Secret was edited by hand: that is a rotation too.
        status.last_rotation = Some(Time(now));
    }
    if status.last_rotation.is_none() {
        status.last_rotation = Some(Time(now));
    }
    status.active_key_id = active.clone();
    status.previous_key_id = keys.previous.as_ref().and_then(|(p, _)| key_id(p));
    status.previous_key_valid_until = keys.previous.as_ref().map(|(_, until)| Time(*until));
    status.observed_generation = obj.metadata.generation;
    let message = match &status.previous_key_id {
        Some(prev) => format!(
            "key {} signs, with previous key {prev} until {}",
            active.as_deref().unwrap_or_default(),
            keys.previous
                .as_ref()
                .map(|(_, u)| u.to_string())
                .unwrap_or_default()
        ),
        None => format!("key {} signs", active.as_deref().unwrap_or_default()),
    };
    status.conditions = conditions::merge(
        &old_status.conditions,
        &[Desired::new(
            condition::READY,
            true,
            reason::ACCEPTED,
            message,
        )],
        obj.metadata.generation,
        &Time(now),
    );
    write_status(ctx, obj, &ns, &old_status, &status).await?;

    if let Some((reason, note)) = event {
        publish(&ctx.recorder, &reference, EventType::Normal, reason, note).await;
    }

    // Come back when the overlap ends or the next scheduled rotation is due.
    let mut next = RESYNC;
    if let Some((_, until)) = &keys.previous {
        next = next.min(until_from(now, *until));
    }
    if let (Some(every), Some(last)) = (&obj.spec.rotation.every, &status.last_rotation)
        && let Ok(every) = SignedDuration::try_from(every.get())
        && let Ok(due) = last.0.checked_add(every)
    {
        next = next.min(until_from(now, due));
    }
    Ok(Action::requeue(next))
}

/// Time from `now` to `at`, at least a little so a clock edge does not spin.
fn until_from(now: Timestamp, at: Timestamp) -> Duration {
    Duration::try_from(at.duration_since(now))
        .unwrap_or_default()
        .max(Duration::from_millis(200))
        + Duration::from_millis(50)
}

async fn write_status(
    ctx: &Context,
    obj: &SigningSecret,
    ns: &str,
    old: &SigningSecretStatus,
    new: &SigningSecretStatus,
) -> Result<(), Error> {
    if old == new && obj.status.is_some() {
        return Ok(());
    }
    let api: Api<SigningSecret> = Api::namespaced(ctx.client.clone(), ns);
    let patch = json!({
        "apiVersion": "herald.dev/v1alpha1",
        "kind": KIND,
        "status": new,
    });
    api.patch_status(
        &obj.name_any(),
        &PatchParams::apply(names::FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}

/// Publishes an Event; failing to is logged, never fatal.
pub async fn publish(
    recorder: &Recorder,
    reference: &k8s_openapi::api::core::v1::ObjectReference,
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
    if let Err(error) = recorder.publish(&event, reference).await {
        tracing::warn!(%error, reason, "publishing an Event failed");
    }
}

/// Runs the controller until `stop` resolves.
pub async fn run(
    ctx: Arc<Context>,
    namespace: Option<String>,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    Controller::new(
        crate::scoped_api::<SigningSecret>(client.clone(), namespace.as_deref()),
        watcher::Config::default(),
    )
    .owns(
        crate::scoped_api::<Secret>(client, namespace.as_deref()),
        watcher::Config::default().labels(&format!(
            "{}={}",
            names::MANAGED_BY_LABEL,
            names::MANAGED_BY
        )),
    )
    .graceful_shutdown_on(stop)
    .run(reconcile, error_policy, ctx)
    .for_each(|_| async {})
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_core::v1alpha1::SigningSecretSpec;

    fn secret(spec: serde_json::Value, status: serde_json::Value) -> SigningSecret {
        let mut obj = SigningSecret::new(
            "s",
            serde_json::from_value::<SigningSecretSpec>(spec).unwrap(),
        );
        obj.status = serde_json::from_value(status).unwrap();
        obj
    }

    fn keys() -> Keys {
        Keys {
            current: generate_whsec().unwrap().0,
            previous: None,
        }
    }

    #[test]
    fn a_new_request_rotates_once() {
        let now = Timestamp::now();
        let obj = secret(
            json!({"rotation": {"request": "a"}}),
            json!({"observedRotationRequest": "a"}),
        );
        assert!(!plan(&obj, &keys(), now).rotate);
        let obj = secret(
            json!({"rotation": {"request": "b"}}),
            json!({"observedRotationRequest": "a"}),
        );
        assert!(plan(&obj, &keys(), now).rotate);
    }

    #[test]
    fn schedules_rotate_when_due_and_overlaps_end() {
        let now: Timestamp = "2026-11-30T12:00:00Z".parse().unwrap();
        let obj = secret(
            json!({"rotation": {"every": "1h"}}),
            json!({"lastRotation": "2026-11-30T10:30:00Z"}),
        );
        assert!(plan(&obj, &keys(), now).rotate);
        let obj = secret(
            json!({"rotation": {"every": "2h"}}),
            json!({"lastRotation": "2026-11-30T10:30:00Z"}),
        );
        assert!(!plan(&obj, &keys(), now).rotate);
        let mut k = keys();
        k.previous = Some((keys().current, "2026-11-30T11:59:00Z".parse().unwrap()));
        assert!(plan(&obj, &k, now).drop_previous);
    }

    #[test]
    fn bad_data_names_the_key_not_the_value() {
        let value = "whsec_!!notbase64!!";
        let data = BTreeMap::from([(CURRENT.to_owned(), ByteString(value.as_bytes().to_vec()))]);
        let bad = read_keys(&data).err().unwrap();
        assert_eq!(bad.key, CURRENT);
        assert!(!bad.problem.contains("notbase64"), "{}", bad.problem);
        let data = BTreeMap::from([
            (CURRENT.to_owned(), ByteString(keys().current.into_bytes())),
            (PREVIOUS.to_owned(), ByteString(b"nope".to_vec())),
            (
                PREVIOUS_VALID_UNTIL.to_owned(),
                ByteString(b"2026-01-01T00:00:00Z".to_vec()),
            ),
        ]);
        assert_eq!(read_keys(&data).err().unwrap().key, PREVIOUS);
    }
}
