//! Pure: what one reconcile of a `SigningSecret` does to its keys and status.
//!
//! Contract: [`decide`] takes what the Secret holds, the time and a source of fresh keys
//! (the only randomness, passed in), and returns the [`Outcome`]: the keys to keep (none
//! when the Secret holds bad data — then nothing is touched and the last published
//! `KeySet` keeps signing), whether the Secret must be written, the status, an Event and
//! when to look again. A rotation request (`spec.rotation.request` and the
//! `herald.dev/rotate` annotation, combined into one token) is acted on once per value.

use std::time::Duration;

use herald_core::names::{self, condition, reason};
use herald_core::signing::{KeyError, Scheme};
use herald_core::v1alpha1::{SigningSecret, SigningSecretStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;

use super::keys::{BadData, Keys, Stored, key_id, public_key, scheme};
use crate::conditions::{self, Desired};

/// Re-read the Secret at least this often: for Secrets Herald does not own (and
/// therefore does not watch), and for all of them when Secrets are not watched (serving
/// every namespace without cluster-wide Secret rights).
pub const RESYNC: Duration = Duration::from_secs(300);

/// Look again this soon when the operator may not touch Secrets in the namespace: the
/// platform team granting it should not wait for [`RESYNC`].
pub const FORBIDDEN_RETRY: Duration = Duration::from_secs(30);

/// What one reconcile does to the keys.
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    /// Generate a new current key, moving the old one to `previous`.
    pub rotate: bool,
    /// The current key is not of `spec.algorithm`: the rotation (`rotate` is set too)
    /// moves to a key of that kind.
    pub change_algorithm: bool,
    /// Drop the previous key: its overlap is over.
    pub drop_previous: bool,
}

/// The outcome of [`decide`].
pub struct Outcome {
    /// The keys that sign from now on; `None` when the Secret holds bad data.
    pub keys: Option<Keys>,
    /// The Secret must be (re)written: generated, rotated or its previous key dropped.
    pub write_secret: bool,
    pub status: SigningSecretStatus,
    /// A Normal Event: reason and note.
    pub event: Option<(&'static str, String)>,
    /// When to look again.
    pub requeue: Duration,
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

/// Decides what to do given the keys, the spec and status, and the time.
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
    let change_algorithm = obj
        .spec
        .algorithm
        .is_some_and(|wanted| scheme(&keys.current) != Some(wanted.scheme()));
    Plan {
        rotate: on_demand || scheduled || change_algorithm,
        change_algorithm,
        drop_previous,
    }
}

/// The kind of key to generate: what the spec asks for, else the kind the current key
/// is (a rotation keeps it), else HMAC.
fn wanted_scheme(obj: &SigningSecret, current: Option<&str>) -> Scheme {
    obj.spec
        .algorithm
        .map(|a| a.scheme())
        .or_else(|| current.and_then(scheme))
        .unwrap_or(Scheme::Hmac)
}

/// How status and Events name a scheme.
fn scheme_name(scheme: Scheme) -> &'static str {
    match scheme {
        Scheme::Hmac => "HMAC",
        Scheme::Ed25519 => "Ed25519",
    }
}

/// The whole decision of one reconcile. `fresh` generates a key of a scheme: `(the key
/// as the Secret holds it, key id)`.
pub fn decide(
    obj: &SigningSecret,
    secret_name: &str,
    stored: Stored,
    now: Timestamp,
    mut fresh: impl FnMut(Scheme) -> Result<(String, String), KeyError>,
) -> Result<Outcome, KeyError> {
    let old = obj.status.clone().unwrap_or_default();
    let mut status = old.clone();
    let (mut keys, generated, mut event) = match stored {
        Stored::Missing => {
            let scheme = wanted_scheme(obj, None);
            let (current, id) = fresh(scheme)?;
            let note = format!(
                "generated {} key {id} in Secret {secret_name}",
                scheme_name(scheme)
            );
            let keys = Keys {
                current,
                previous: None,
            };
            (keys, true, Some((reason::KEY_GENERATED, note)))
        }
        Stored::Valid(keys) => (keys, false, None),
        Stored::Invalid(bad) => return Ok(invalid(obj, secret_name, &bad, now)),
    };
    let plan = plan(obj, &keys, now);
    let before = keys.clone();
    if plan.drop_previous {
        keys.previous = None;
    }
    if generated {
        // A fresh key answers any pending request: no need to rotate it right away.
        status.last_rotation = Some(Time(now));
    } else if plan.rotate {
        let scheme = wanted_scheme(obj, Some(&keys.current));
        let (current, id) = fresh(scheme)?;
        let overlap = SignedDuration::try_from(obj.spec.rotation.overlap.get())
            .unwrap_or(SignedDuration::from_hours(24));
        let until = now.checked_add(overlap).unwrap_or(now);
        let old_id = key_id(&keys.current).unwrap_or_default();
        keys.previous = Some((std::mem::replace(&mut keys.current, current), until));
        status.last_rotation = Some(Time(now));
        let why = if plan.change_algorithm {
            " as spec.algorithm asks"
        } else {
            ""
        };
        event = Some((
            reason::SECRET_ROTATED,
            format!(
                "rotated to {} key {id}{why}; previous key {old_id} keeps signing until {until}",
                scheme_name(scheme)
            ),
        ));
    }
    if let Some(requested) = rotation_request(obj) {
        status.observed_rotation_request = Some(requested);
    }
    let active = key_id(&keys.current);
    if (active != old.active_key_id && !generated && !plan.rotate) || status.last_rotation.is_none()
    {
        // The Secret was edited by hand: that is a rotation too.
        status.last_rotation = Some(Time(now));
    }
    accepted(obj, &keys, &mut status, now);
    Ok(Outcome {
        write_secret: generated || keys != before,
        requeue: next_check(obj, &keys, &status, now),
        keys: Some(keys),
        status,
        event,
    })
}

/// The status of a SigningSecret whose keys sign.
fn accepted(obj: &SigningSecret, keys: &Keys, status: &mut SigningSecretStatus, now: Timestamp) {
    let old = obj.status.clone().unwrap_or_default();
    let active = key_id(&keys.current);
    status.active_key_id = active.clone();
    status.previous_key_id = keys.previous.as_ref().and_then(|(p, _)| key_id(p));
    status.active_public_key = public_key(&keys.current);
    status.previous_public_key = keys.previous.as_ref().and_then(|(p, _)| public_key(p));
    status.previous_key_valid_until = keys.previous.as_ref().map(|(_, until)| Time(*until));
    status.observed_generation = obj.metadata.generation;
    let active = active.unwrap_or_default();
    let kind = scheme(&keys.current).map_or("", scheme_name);
    let message = match (&status.previous_key_id, &keys.previous) {
        (Some(prev), Some((previous, until))) => {
            let previous_kind = scheme(previous).map_or("", scheme_name);
            format!(
                "{kind} key {active} signs, with previous {previous_kind} key {prev} until {until}"
            )
        }
        _ => format!("{kind} key {active} signs"),
    };
    let ready = Desired::new(condition::READY, true, reason::ACCEPTED, message);
    status.conditions = conditions::merge(
        &old.conditions,
        &conditions::ready_with_kstatus(ready),
        obj.metadata.generation,
        &Time(now),
    );
}

/// The outcome for a Secret holding bad data: say which key and what is wrong.
fn invalid(obj: &SigningSecret, secret_name: &str, bad: &BadData, now: Timestamp) -> Outcome {
    let old = obj.status.clone().unwrap_or_default();
    let message = format!(
        "data key `{}` of Secret {secret_name} {}; it must hold `whsec_` followed by the base64 of 24 to 64 random bytes (HMAC), or `whsk_` followed by the base64 of a 32-byte Ed25519 seed (delete the Secret to let Herald generate one)",
        bad.key, bad.problem
    );
    let ready = Desired::new(condition::READY, false, reason::INVALID_SPEC, message);
    let status = SigningSecretStatus {
        conditions: conditions::merge(
            &old.conditions,
            &conditions::ready_with_kstatus(ready),
            obj.metadata.generation,
            &Time(now),
        ),
        observed_generation: obj.metadata.generation,
        ..old
    };
    Outcome {
        keys: None,
        write_secret: false,
        status,
        event: None,
        requeue: RESYNC,
    }
}

/// The status of a SigningSecret whose Secret the operator may not read or write: its
/// identity has no rights on Secrets in `ns`. Nothing else changes (key ids, last
/// rotation): the last published keys keep signing.
pub fn forbidden(
    obj: &SigningSecret,
    ns: &str,
    secret_name: &str,
    now: Timestamp,
) -> SigningSecretStatus {
    let old = obj.status.clone().unwrap_or_default();
    let message = format!(
        "Herald may not read or write Secret {secret_name}: its operator has no rights on Secrets in namespace {ns}. Ask the platform team to add {ns} to the chart's operator.tenantNamespaces, or to bind the ClusterRole <release>-herald-operator-secrets to the operator's ServiceAccount with a RoleBinding in {ns}; retried every {}s",
        FORBIDDEN_RETRY.as_secs()
    );
    let ready = Desired::new(condition::READY, false, reason::SECRET_FORBIDDEN, message);
    SigningSecretStatus {
        conditions: conditions::merge(
            &old.conditions,
            &conditions::ready_with_kstatus(ready),
            obj.metadata.generation,
            &Time(now),
        ),
        observed_generation: obj.metadata.generation,
        ..old
    }
}

/// When the overlap ends or the next scheduled rotation is due, at most [`RESYNC`].
fn next_check(
    obj: &SigningSecret,
    keys: &Keys,
    status: &SigningSecretStatus,
    now: Timestamp,
) -> Duration {
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
    next
}

/// Time from `now` to `at`, at least a little so a clock edge does not spin.
fn until_from(now: Timestamp, at: Timestamp) -> Duration {
    Duration::try_from(at.duration_since(now))
        .unwrap_or_default()
        .max(Duration::from_millis(200))
        + Duration::from_millis(50)
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_core::signing::{generate, generate_whsec};
    use herald_core::v1alpha1::SigningSecretSpec;
    use serde_json::json;

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
    fn a_missing_secret_is_generated_and_a_request_rotates_with_overlap() {
        let now: Timestamp = "2026-11-30T12:00:00Z".parse().unwrap();
        let obj = secret(json!({"rotation": {"request": "r1"}}), json!(null));
        let out = decide(&obj, "s", Stored::Missing, now, generate).unwrap();
        assert!(out.write_secret);
        assert_eq!(out.event.as_ref().unwrap().0, reason::KEY_GENERATED);
        assert_eq!(out.status.observed_rotation_request.as_deref(), Some("r1"));
        let first = out.keys.unwrap();

        let mut obj = secret(json!({"rotation": {"request": "r2"}}), json!(null));
        obj.status = Some(out.status);
        let out = decide(&obj, "s", Stored::Valid(first.clone()), now, generate).unwrap();
        let keys = out.keys.unwrap();
        assert_eq!(keys.previous.as_ref().unwrap().0, first.current);
        assert_eq!(out.event.unwrap().0, reason::SECRET_ROTATED);
        assert_eq!(out.status.previous_key_id, key_id(&first.current));
        assert!(out.requeue <= Duration::from_secs(300));
    }

    #[test]
    fn an_algorithm_generates_its_kind_and_a_change_rotates_with_overlap() {
        let now: Timestamp = "2026-11-30T12:00:00Z".parse().unwrap();
        // Generated: of the kind the spec asks, its public key in the status.
        let obj = secret(json!({"algorithm": "Ed25519"}), json!(null));
        let out = decide(&obj, "s", Stored::Missing, now, generate).unwrap();
        let first = out.keys.unwrap();
        assert!(first.current.starts_with("whsk_"));
        let public = out.status.active_public_key.clone().unwrap();
        assert!(public.starts_with("whpk_"), "{public}");
        assert!(
            !public.contains(&first.current[5..]),
            "the public key is not the seed"
        );
        assert!(out.event.unwrap().1.contains("Ed25519"));
        // A rotation keeps the kind, without the spec saying it again.
        let mut obj = secret(json!({"rotation": {"request": "r1"}}), json!(null));
        obj.status = Some(out.status);
        let out = decide(&obj, "s", Stored::Valid(first.clone()), now, generate).unwrap();
        let second = out.keys.unwrap();
        assert!(second.current.starts_with("whsk_"));
        assert_eq!(
            out.status.previous_public_key.as_deref(),
            Some(public.as_str())
        );
        // HMAC held, Ed25519 asked: rotate to Ed25519, the HMAC key signs through the overlap.
        let hmac = keys();
        let obj = secret(
            json!({"algorithm": "Ed25519", "rotation": {"overlap": "1h"}}),
            json!({"lastRotation": "2026-11-30T11:00:00Z"}),
        );
        assert!(plan(&obj, &hmac, now).change_algorithm);
        let out = decide(&obj, "s", Stored::Valid(hmac.clone()), now, generate).unwrap();
        let moved = out.keys.unwrap();
        assert!(moved.current.starts_with("whsk_"));
        assert_eq!(moved.previous.as_ref().unwrap().0, hmac.current);
        assert!(out.write_secret);
        assert!(out.event.unwrap().1.contains("as spec.algorithm asks"));
        assert!(
            out.status.previous_public_key.is_none(),
            "an HMAC key has no public half"
        );
        let ready = conditions::find(&out.status.conditions, condition::READY).unwrap();
        assert!(
            ready.message.starts_with("Ed25519 key"),
            "{}",
            ready.message
        );
        assert!(
            ready.message.contains("previous HMAC key"),
            "{}",
            ready.message
        );
        // Once moved, nothing more to do.
        assert!(!plan(&obj, &moved, now).change_algorithm);
        // No algorithm in the spec: a user's Ed25519 Secret is kept as it is.
        let obj = secret(json!({}), json!({"lastRotation": "2026-11-30T11:00:00Z"}));
        assert!(!plan(&obj, &moved, now).rotate);
    }

    #[test]
    fn bad_data_changes_nothing_but_the_condition() {
        let now = Timestamp::now();
        let obj = secret(json!({}), json!({"activeKeyId": "abc"}));
        let bad = BadData {
            key: "current",
            problem: "is missing".into(),
        };
        let out = decide(&obj, "s", Stored::Invalid(bad), now, |_| {
            panic!("no key is generated for a Secret with bad data")
        })
        .unwrap();
        assert!(out.keys.is_none() && !out.write_secret);
        assert_eq!(out.status.active_key_id.as_deref(), Some("abc"));
        let ready = conditions::find(&out.status.conditions, condition::READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "InvalidSpec")
        );
        assert!(ready.message.contains("`current`"), "{}", ready.message);
    }

    #[test]
    fn no_rights_on_secrets_is_said_in_the_status_and_waits_for_the_grant() {
        let now = Timestamp::now();
        let obj = secret(json!({}), json!({"activeKeyId": "abc"}));
        let status = forbidden(&obj, "tenant-a", "keys", now);
        assert_eq!(status.active_key_id.as_deref(), Some("abc"), "keys kept");
        let ready = conditions::find(&status.conditions, condition::READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "SecretForbidden")
        );
        assert!(
            ready.message.contains("namespace tenant-a")
                && ready.message.contains("operator.tenantNamespaces"),
            "{}",
            ready.message
        );
        // Not a tenant's mistake: kstatus sees it as in progress, not failed.
        assert!(conditions::is_true(
            &status.conditions,
            condition::RECONCILING
        ));
        assert!(!conditions::is_true(&status.conditions, condition::STALLED));
        // Deterministic: a second pass writes nothing new.
        let mut again = obj.clone();
        again.status = Some(status.clone());
        assert_eq!(forbidden(&again, "tenant-a", "keys", now), status);
    }
}
