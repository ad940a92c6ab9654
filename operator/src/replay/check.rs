//! Pure: whether a `WebhookReplay` is valid against what exists (the endpoint, the event
//! store's retention), and the [`ReplayRequest`] a valid one becomes.

use std::time::Duration;

use herald_core::dataplane::ReplayRequest;
use herald_core::names::{condition, reason};
use herald_core::v1alpha1::WebhookReplay;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::conditions::Desired;

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

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use herald_core::v1alpha1::WebhookReplaySpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    pub(crate) fn replay(from: &str) -> WebhookReplay {
        let spec: WebhookReplaySpec =
            serde_json::from_value(json!({"endpoint": "orders", "from": from})).unwrap();
        WebhookReplay::new("r", spec)
    }

    pub(crate) const DAYS_30: Duration = Duration::from_secs(30 * 86_400);

    pub(crate) fn found(endpoint_exists: bool, retention: Option<Duration>) -> Found {
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
    fn windows_read_like_durations() {
        assert_eq!(window(DAYS_30), "30d");
        assert_eq!(window(Duration::from_secs(7200)), "2h");
        assert_eq!(window(Duration::from_secs(5400)), "90m");
        assert_eq!(window(Duration::from_secs(45)), "45s");
    }
}
