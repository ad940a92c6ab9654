//! Endpoint verification, the operator's side (`herald_core::verification`): whether an
//! endpoint must be verified (`spec.verify`, or its namespace annotated
//! [`REQUIRE_ANNOTATION`] by the platform team), whether the dispatchers' report vouches
//! for its current URL, and what that means for its configuration (held, `verify` set,
//! until it does) and its `Ready` and `Verified` conditions.
//!
//! Contract: [`state`] and the builders are pure; a report vouches only for the uid and
//! URL it names, so a new URL (or a re-created endpoint) is verified again. [`follow`]
//! triggers a reconcile of an endpoint when its report changes and of a namespace's
//! endpoints when the namespace's requirement changes.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use futures::StreamExt;
use futures::channel::mpsc::UnboundedSender;
use herald_core::dataplane::{BucketKey, EndpointConfig, Hold};
use herald_core::names::{condition, reason};
use herald_core::verification::VerificationReport;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::watch;

use super::Guarded;
use crate::conditions::Desired;

/// The Namespace annotation by which the platform team requires every endpoint of the
/// namespace to be verified (`"true"`).
pub const REQUIRE_ANNOTATION: &str = "herald.dev/require-endpoint-verification";

/// The namespaces that require verification; `None` until the namespaces were read.
pub type Required = watch::Receiver<Option<Arc<BTreeSet<String>>>>;

/// Where an endpoint stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verification {
    /// Nothing asks for it.
    NotRequired,
    /// The receiver echoed a challenge to the current URL at `at_ms`.
    Verified { at_ms: u64 },
    /// Required, not vouched for: `failure` is the last challenge's, if one failed.
    Pending { failure: Option<String> },
}

/// Pure: where the endpoint with `uid` at `url` stands.
pub fn state(
    required: bool,
    report: Option<&VerificationReport>,
    uid: &str,
    url: &str,
) -> Verification {
    if !required {
        return Verification::NotRequired;
    }
    match report {
        Some(r) if r.vouches_for(uid, url) => Verification::Verified { at_ms: r.time_ms },
        // A report of another URL or endpoint says nothing about this one.
        Some(r) if r.uid == uid && r.url == url => Verification::Pending {
            failure: Some(r.message.clone()),
        },
        _ => Verification::Pending { failure: None },
    }
}

impl Verification {
    /// Holds a fresh configuration while the endpoint is not verified, and asks the
    /// dispatchers to challenge it.
    pub fn apply(&self, config: &mut EndpointConfig) {
        if let Self::Pending { .. } = self {
            config.verify = true;
            config.held = Some(Box::new(Hold {
                reason: reason::NOT_VERIFIED.to_owned(),
                message: self.waiting(&config.url),
            }));
        }
    }

    /// The `Ready` condition of a valid endpoint that is not verified.
    pub fn not_ready(&self, url: &str) -> Option<Desired> {
        matches!(self, Self::Pending { .. }).then(|| {
            Desired::new(
                condition::READY,
                false,
                reason::NOT_VERIFIED,
                format!(
                    "{}. Nothing is delivered until it does; events keep queueing",
                    self.waiting(url)
                ),
            )
        })
    }

    /// The `Verified` condition, written only while verification is required.
    pub fn condition(&self, url: &str) -> Option<Desired> {
        match self {
            Self::NotRequired => None,
            Self::Verified { at_ms } => Some(Desired::new(
                condition::VERIFIED,
                true,
                reason::CHALLENGE_ECHOED,
                format!(
                    "the receiver at {url} echoed Herald's verification challenge at {}",
                    time(*at_ms)
                ),
            )),
            Self::Pending { failure: None } => Some(Desired::new(
                condition::VERIFIED,
                false,
                reason::NOT_VERIFIED,
                format!("no verification challenge to {url} answered yet"),
            )),
            Self::Pending {
                failure: Some(message),
            } => Some(Desired::new(
                condition::VERIFIED,
                false,
                reason::CHALLENGE_FAILED,
                format!("{message}; Herald challenges {url} again, less often while it fails"),
            )),
        }
    }

    fn waiting(&self, url: &str) -> String {
        let why = match self {
            Self::Pending {
                failure: Some(message),
            } => format!(" (last challenge: {message})"),
            _ => String::new(),
        };
        format!("waiting for the receiver at {url} to echo Herald's verification challenge{why}")
    }
}

fn time(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .map_or_else(|| ms.to_string(), |t| t.to_string())
}

/// Pure: the namespaces whose annotations require verification, from `(name,
/// annotations)`; what is wrong with annotations that do not parse.
pub fn requiring<'a>(
    namespaces: impl IntoIterator<Item = (&'a str, Option<&'a String>)>,
) -> (BTreeSet<String>, Vec<String>) {
    let mut set = BTreeSet::new();
    let mut problems = Vec::new();
    for (namespace, value) in namespaces {
        match value.map(|v| v.trim()) {
            None | Some("false") => continue,
            Some("true") => {}
            // Unreadable is not a way out: a typo in the platform team's annotation
            // keeps the requirement.
            Some(other) => problems.push(format!(
                "namespace {namespace}: annotation {REQUIRE_ANNOTATION}: {other:?} is neither \
                 \"true\" nor \"false\"; verification is required until it is fixed"
            )),
        }
        set.insert(namespace.to_owned());
    }
    (set, problems)
}

/// The endpoint's report in the health bucket, if any (one that does not decode counts
/// as none: the endpoint is challenged again).
pub async fn read_report(
    health: &kv::Store,
    key: &herald_core::dataplane::EndpointKey,
) -> Result<Option<VerificationReport>, crate::nats::Error> {
    let name = BucketKey::Verification(key.clone()).to_string();
    Ok(crate::nats::read(health, &name).await?.and_then(|raw| {
        serde_json::from_slice(&raw)
            .inspect_err(
                |error| tracing::warn!(key = name, %error, "undecodable verification report"),
            )
            .ok()
    }))
}

/// Triggers reconciles (into `trigger`) until `stop`: of an endpoint when its
/// verification report changes, of a namespace's endpoints (from `store`) when its
/// requirement changes.
pub async fn follow(
    health: kv::Store,
    mut required: Required,
    store: Store<Guarded>,
    trigger: UnboundedSender<ObjectRef<Guarded>>,
    namespace: Option<String>,
    stop: impl Future<Output = ()>,
) {
    let send = |ns: &str, name: &str| {
        if namespace.as_deref().is_none_or(|scope| scope == ns) {
            let _ = trigger.unbounded_send(ObjectRef::new(name).within(ns));
        }
    };
    let mut before: Arc<BTreeSet<String>> = Arc::default();
    tokio::pin!(stop);
    'outer: loop {
        let mut watch = match health.watch(BucketKey::verification_filter()).await {
            Ok(watch) => watch,
            Err(error) => {
                tracing::warn!(%error, "watching verification reports failed; retrying");
                tokio::select! {
                    _ = &mut stop => return,
                    _ = tokio::time::sleep(Duration::from_secs(2)) => continue,
                }
            }
        };
        loop {
            tokio::select! {
                _ = &mut stop => return,
                changed = required.changed() => {
                    if changed.is_err() {
                        // The namespaces' reader is gone with the term.
                        return;
                    }
                    let now = required.borrow_and_update().clone().unwrap_or_default();
                    let flipped: BTreeSet<&String> = now.symmetric_difference(&before).collect();
                    for guard in store.state() {
                        let ns = guard.namespace().unwrap_or_default();
                        if flipped.iter().any(|f| **f == ns) {
                            send(&ns, &guard.name_any());
                        }
                    }
                    before = now;
                }
                entry = watch.next() => match entry {
                    Some(Ok(entry)) => {
                        if let Some(BucketKey::Verification(key)) = BucketKey::parse(&entry.key) {
                            send(key.namespace(), &key.name());
                        }
                    }
                    Some(Err(error)) => {
                        tracing::warn!(%error, "verification report watch failed; re-watching");
                        continue 'outer;
                    }
                    None => continue 'outer,
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(uid: &str, url: &str, verified: bool) -> VerificationReport {
        VerificationReport {
            uid: uid.into(),
            url: url.into(),
            verified,
            message: if verified {
                String::new()
            } else {
                "the receiver answered the challenge with 404".into()
            },
            time_ms: 1_800_000_000_000,
        }
    }

    const URL: &str = "https://hooks.example.com/";

    #[test]
    fn a_report_counts_for_its_uid_and_url_only() {
        assert_eq!(state(false, None, "u1", URL), Verification::NotRequired);
        assert_eq!(
            state(true, None, "u1", URL),
            Verification::Pending { failure: None }
        );
        let ok = report("u1", URL, true);
        assert_eq!(
            state(true, Some(&ok), "u1", URL),
            Verification::Verified {
                at_ms: 1_800_000_000_000
            }
        );
        assert_eq!(
            state(true, Some(&ok), "u1", "https://elsewhere.example.com/"),
            Verification::Pending { failure: None },
            "a new URL is verified again"
        );
        assert_eq!(
            state(true, Some(&ok), "u2", URL),
            Verification::Pending { failure: None },
            "a re-created endpoint is verified again"
        );
        let failed = report("u1", URL, false);
        assert_eq!(
            state(true, Some(&failed), "u1", URL),
            Verification::Pending {
                failure: Some("the receiver answered the challenge with 404".into())
            }
        );
    }

    #[test]
    fn a_pending_endpoint_is_held_asking_for_challenges_and_says_why() {
        let mut config: EndpointConfig = serde_json::from_value(serde_json::json!({
            "namespace": "shop", "name": "orders", "uid": "u1", "generation": 1,
            "url": URL, "eventTypes": ["*"], "secret": "s", "delivery": {}, "shard": 0
        }))
        .unwrap();
        let verified = Verification::Verified { at_ms: 0 };
        verified.apply(&mut config);
        assert!(!config.verify && config.held.is_none());
        assert!(verified.not_ready(URL).is_none());
        let c = verified.condition(URL).unwrap();
        assert_eq!((c.status, c.reason), (true, reason::CHALLENGE_ECHOED));
        assert!(c.message.contains("1970-01-01T00:00:00Z"), "{}", c.message);

        let pending = Verification::Pending {
            failure: Some("the receiver answered the challenge with 404".into()),
        };
        pending.apply(&mut config);
        assert!(config.verify);
        let hold = config.held.as_ref().unwrap();
        assert_eq!(hold.reason, reason::NOT_VERIFIED);
        assert!(hold.message.contains("with 404"), "{}", hold.message);
        let ready = pending.not_ready(URL).unwrap();
        assert_eq!((ready.status, ready.reason), (false, reason::NOT_VERIFIED));
        assert!(
            ready.message.contains("events keep queueing"),
            "{}",
            ready.message
        );
        let c = pending.condition(URL).unwrap();
        assert_eq!((c.status, c.reason), (false, reason::CHALLENGE_FAILED));
        assert_eq!(Verification::NotRequired.condition(URL), None);
    }

    #[test]
    fn namespaces_require_it_by_annotation_and_a_typo_keeps_the_requirement() {
        let yes = "true".to_owned();
        let no = "false".to_owned();
        let typo = "yes".to_owned();
        let (set, problems) = requiring([
            ("a", Some(&yes)),
            ("b", Some(&no)),
            ("c", None),
            ("d", Some(&typo)),
        ]);
        assert_eq!(set, BTreeSet::from(["a".to_owned(), "d".to_owned()]));
        assert_eq!(problems.len(), 1);
        assert!(problems[0].contains("\"yes\""), "{}", problems[0]);
    }
}
