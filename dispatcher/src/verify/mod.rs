//! Endpoint verification (`herald_core::verification`): the owner of a shard sends a
//! signed challenge to each endpoint of the shard whose configuration asks for one, and
//! writes what the challenge showed under `verify.<ns>.<name>` in the health bucket,
//! where the operator reads it and lets delivery start.
//!
//! Contract:
//! - a challenge is an ordinary attempt: the dispatcher's address policy, the endpoint's
//!   egress route, headers, client certificate and timeout, signed with its keys;
//! - at most [`CONCURRENT`] challenges of a shard are in flight at once, at most
//!   [`PER_TENANT`] of one namespace: a tenant with many endpoints at slow URLs cannot
//!   hold up another tenant's verification;
//! - an endpoint is challenged at once when it starts asking (or its URL, uid or
//!   generation changes), again after [`BACKOFF`] while challenges fail, and not again
//!   for [`AFTER_SUCCESS`] after one was echoed (the operator has stopped asking by
//!   then); after [`GIVE_UP_AFTER`] of failures it is not challenged again until its
//!   spec changes, so a URL that never agreed hears from Herald a bounded number of
//!   times;
//! - a challenge task that panics is reported as a failed challenge; the loop itself
//!   runs until `stop`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use herald_core::dataplane::{BucketKey, EndpointKey};
use herald_core::verification::{self, VerificationReport};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::context::Shared;
use crate::http;
use crate::index::Endpoint;
use herald_core::clock::now_ms;

/// Most challenges of one shard in flight at once.
pub const CONCURRENT: usize = 8;
/// Most challenges of one namespace in flight at once, per shard.
pub const PER_TENANT: usize = 2;
/// How long an endpoint is challenged without an echo before Herald stops.
pub const GIVE_UP_AFTER: Duration = Duration::from_secs(24 * 3600);
/// The waits after the first, second... failed challenge; the last repeats.
pub const BACKOFF: [Duration; 5] = [
    Duration::from_secs(5),
    Duration::from_secs(15),
    Duration::from_secs(30),
    Duration::from_secs(60),
    Duration::from_secs(300),
];
/// How long an echoed endpoint is left alone.
pub const AFTER_SUCCESS: Duration = Duration::from_secs(60);
/// How often the shard's endpoints are looked at.
const TICK: Duration = Duration::from_secs(1);

/// What the schedule knows of one endpoint.
#[derive(Debug, Clone, PartialEq)]
struct Track {
    /// uid, URL and generation: a change starts over.
    what: (String, String, i64),
    failures: usize,
    /// When the current run of failures started.
    failing_since: Option<Instant>,
    /// `None`: not challenged again until its spec changes (given up).
    next: Option<Instant>,
    in_flight: bool,
}

impl Track {
    fn new(what: (String, String, i64), now: Instant) -> Self {
        Self {
            what,
            failures: 0,
            failing_since: None,
            next: Some(now),
            in_flight: false,
        }
    }
}

/// When each endpoint is challenged (pure).
#[derive(Debug, Default)]
pub struct Schedule {
    tracks: HashMap<EndpointKey, Track>,
}

impl Schedule {
    /// The endpoints of `asking` to challenge now (at most `room`, at most
    /// [`PER_TENANT`] of a namespace in flight), marked in flight; endpoints that stopped
    /// asking are forgotten.
    pub fn due(
        &mut self,
        asking: &[Arc<Endpoint>],
        now: Instant,
        room: usize,
    ) -> Vec<Arc<Endpoint>> {
        let mut busy: HashMap<String, usize> = HashMap::new();
        for (key, track) in &self.tracks {
            if track.in_flight {
                *busy.entry(key.namespace().to_owned()).or_default() += 1;
            }
        }
        let mut keep = std::collections::HashSet::new();
        let mut due = Vec::new();
        for ep in asking {
            let c = &ep.config;
            let key = EndpointKey::new(&c.namespace, &c.name);
            let what = (c.uid.clone(), c.url.clone(), c.generation);
            let track = self
                .tracks
                .entry(key.clone())
                .or_insert_with(|| Track::new(what.clone(), now));
            if track.what != what && !track.in_flight {
                *track = Track::new(what, now);
            }
            let tenant = busy.entry(c.namespace.clone()).or_default();
            let ready = !track.in_flight && track.next.is_some_and(|at| at <= now);
            if ready && due.len() < room && *tenant < PER_TENANT {
                track.in_flight = true;
                *tenant += 1;
                due.push(ep.clone());
            }
            keep.insert(key);
        }
        self.tracks
            .retain(|key, track| track.in_flight || keep.contains(key));
        due
    }

    /// A challenge to `key` ended: when to try again. Returns whether Herald gives up on
    /// the endpoint (until its spec changes).
    pub fn finished(&mut self, key: &EndpointKey, verified: bool, now: Instant) -> bool {
        let Some(track) = self.tracks.get_mut(key) else {
            return false;
        };
        track.in_flight = false;
        if verified {
            track.failures = 0;
            track.failing_since = None;
            track.next = Some(now + AFTER_SUCCESS);
            return false;
        }
        let since = *track.failing_since.get_or_insert(now);
        if now.duration_since(since) >= GIVE_UP_AFTER {
            track.next = None;
            return true;
        }
        let wait = BACKOFF[track.failures.min(BACKOFF.len() - 1)];
        track.failures += 1;
        track.next = Some(now + wait);
        false
    }
}

/// Challenges the endpoints of `shard` that ask for it until `stop`.
pub async fn run(shared: Shared, shard: u32, mut stop: watch::Receiver<bool>) {
    let mut schedule = Schedule::default();
    let mut challenges: JoinSet<(EndpointKey, VerificationReport)> = JoinSet::new();
    let mut keys: HashMap<tokio::task::Id, (EndpointKey, String, String)> = HashMap::new();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let done = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = tick.tick() => {
                let asking = shared.index.awaiting_verification(shard);
                let room = CONCURRENT.saturating_sub(challenges.len());
                for ep in schedule.due(&asking, Instant::now(), room) {
                    let c = &ep.config;
                    let key = EndpointKey::new(&c.namespace, &c.name);
                    let what = (key.clone(), c.uid.clone(), c.url.clone());
                    let shared = shared.clone();
                    let task = challenges.spawn(async move {
                        let report = challenge(&shared, &ep).await;
                        (key, report)
                    });
                    keys.insert(task.id(), what);
                }
                continue;
            }
            Some(joined) = challenges.join_next_with_id() => joined,
        };
        let (key, report) = match done {
            Ok((id, done)) => {
                keys.remove(&id);
                done
            }
            Err(error) => {
                let Some((key, uid, url)) = keys.remove(&error.id()) else {
                    continue;
                };
                tracing::error!(endpoint = %key, %error, "a verification challenge failed unexpectedly");
                let report = VerificationReport {
                    uid,
                    url,
                    verified: false,
                    message:
                        "the challenge could not be sent (an internal error; Herald tries again)"
                            .into(),
                    time_ms: now_ms(),
                };
                (key, report)
            }
        };
        let mut report = report;
        if schedule.finished(&key, report.verified, Instant::now()) {
            report.message.push_str(
                "; Herald stopped challenging after a day without an echo: change the \
                 endpoint's spec to try again",
            );
        }
        write(&shared, &key, &report).await;
    }
}

/// Sends one challenge to `ep` and says what it showed.
async fn challenge(shared: &Shared, ep: &Endpoint) -> VerificationReport {
    let c = &ep.config;
    let key = EndpointKey::new(&c.namespace, &c.name);
    let report = |verified: bool, message: String| VerificationReport {
        uid: c.uid.clone(),
        url: c.url.clone(),
        verified,
        message,
        time_ms: now_ms(),
    };
    let Some(keys) = shared.index.keys(&c.namespace, &c.secret) else {
        return report(
            false,
            format!(
                "no signing key of SigningSecret {} yet to sign the challenge",
                c.secret
            ),
        );
    };
    let (challenge, id) = match verification::challenge()
        .and_then(|c| Ok((c, verification::request_id(now_ms())?)))
    {
        Ok(drawn) => drawn,
        Err(error) => return report(false, format!("no randomness for a challenge: {error}")),
    };
    let body = verification::request_body(&key, &challenge, jiff::Timestamp::now());
    let result = http::send(
        &shared.http,
        &shared.policy,
        http::Attempt::to(c, &id, body.into(), &keys),
    )
    .await;
    let verdict = verdict(&result, &challenge);
    tracing::info!(endpoint = %key, verified = verdict.is_ok(), "verification challenge");
    match verdict {
        Ok(()) => report(true, String::new()),
        Err(message) => report(false, message),
    }
}

/// Pure: whether an attempt's result echoes `challenge`, or what a person must fix.
fn verdict(result: &crate::attempt::AttemptResult, challenge: &str) -> Result<(), String> {
    match result.status {
        Some(status) if result.is_success() => {
            if verification::echoed(&result.snippet, challenge) {
                Ok(())
            } else {
                Err(format!(
                    "the receiver answered {status} without echoing the challenge: answer a \
                     {} request with its data.challenge as the body, or as {{\"challenge\": \"...\"}}",
                    verification::EVENT_TYPE
                ))
            }
        }
        Some(status) => Err(format!("the receiver answered the challenge with {status}")),
        None => Err(format!(
            "the challenge was not answered: {}",
            result.snippet
        )),
    }
}

/// Writes `report` under `verify.<ns>.<name>`; a failed write is logged (the next
/// challenge writes again).
async fn write(shared: &Shared, key: &EndpointKey, report: &VerificationReport) {
    let name = BucketKey::Verification(key.clone()).to_string();
    let value = serde_json::to_vec(report).expect("a report serializes");
    if let Err(error) = shared.layout.health.put(name, value.into()).await {
        tracing::warn!(endpoint = %key, %error, "writing a verification report failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attempt::AttemptResult;
    use herald_core::dataplane::{AttemptOutcome, EndpointConfig};

    fn endpoint(name: &str, url: &str, generation: i64) -> Arc<Endpoint> {
        let config: EndpointConfig = serde_json::from_value(serde_json::json!({
            "namespace": "shop", "name": name, "uid": "u1", "generation": generation,
            "url": url, "eventTypes": ["*"], "secret": "s", "delivery": {}, "shard": 0,
            "verify": true
        }))
        .unwrap();
        Arc::new(Endpoint::compile_for_test(config))
    }

    #[test]
    fn challenges_go_at_once_then_back_off_and_start_over_on_a_new_url() {
        let t0 = Instant::now();
        let mut s = Schedule::default();
        let a = endpoint("a", "https://a.example/", 1);
        let key = EndpointKey::new("shop", "a");
        assert_eq!(s.due(std::slice::from_ref(&a), t0, 8).len(), 1);
        assert!(
            s.due(std::slice::from_ref(&a), t0, 8).is_empty(),
            "one in flight"
        );
        s.finished(&key, false, t0);
        assert!(
            s.due(std::slice::from_ref(&a), t0 + Duration::from_secs(4), 8)
                .is_empty()
        );
        assert_eq!(
            s.due(std::slice::from_ref(&a), t0 + Duration::from_secs(5), 8)
                .len(),
            1
        );
        s.finished(&key, false, t0 + Duration::from_secs(5));
        assert!(
            s.due(std::slice::from_ref(&a), t0 + Duration::from_secs(19), 8)
                .is_empty()
        );
        assert_eq!(
            s.due(std::slice::from_ref(&a), t0 + Duration::from_secs(20), 8)
                .len(),
            1
        );
        s.finished(&key, false, t0 + Duration::from_secs(20));
        // A new URL is challenged at once.
        let moved = endpoint("a", "https://b.example/", 2);
        assert_eq!(
            s.due(
                std::slice::from_ref(&moved),
                t0 + Duration::from_secs(21),
                8
            )
            .len(),
            1
        );
        s.finished(&key, true, t0 + Duration::from_secs(21));
        assert!(
            s.due(
                std::slice::from_ref(&moved),
                t0 + Duration::from_secs(60),
                8
            )
            .is_empty()
        );
        assert_eq!(s.due(&[moved], t0 + Duration::from_secs(81), 8).len(), 1);
    }

    #[test]
    fn a_url_that_never_echoes_is_given_up_after_a_day_until_the_spec_changes() {
        let t0 = Instant::now();
        let mut s = Schedule::default();
        let a = endpoint("a", "https://a.example/", 1);
        let key = EndpointKey::new("shop", "a");
        let mut now = t0;
        let mut sent = 0;
        loop {
            if s.due(std::slice::from_ref(&a), now, 8).len() == 1 {
                sent += 1;
                if s.finished(&key, false, now) {
                    break;
                }
            }
            now += Duration::from_secs(1);
            assert!(now < t0 + 2 * GIVE_UP_AFTER, "never gave up");
        }
        // 5 s, 15 s, 30 s, 1 min, then every 5 min for a day.
        assert!((285..=295).contains(&sent), "{sent} challenges in a day");
        assert!(s.due(&[a], now + GIVE_UP_AFTER, 8).is_empty(), "given up");
        let edited = endpoint("a", "https://a.example/", 2);
        assert_eq!(s.due(&[edited], now, 8).len(), 1, "an edit starts over");
    }

    #[test]
    fn a_tenant_with_many_endpoints_cannot_hold_every_challenge_slot() {
        let t0 = Instant::now();
        let mut s = Schedule::default();
        let config = |ns: &str, name: &str| -> Arc<Endpoint> {
            let config: EndpointConfig = serde_json::from_value(serde_json::json!({
                "namespace": ns, "name": name, "uid": name, "generation": 1,
                "url": "https://slow.example/", "eventTypes": ["*"], "secret": "s",
                "delivery": {}, "shard": 0, "verify": true
            }))
            .unwrap();
            Arc::new(Endpoint::compile_for_test(config))
        };
        // The hostile tenant's 500 endpoints come first.
        let mut asking: Vec<_> = (0..500).map(|i| config("aaa", &format!("e{i}"))).collect();
        asking.push(config("zzz", "mine"));
        let due = s.due(&asking, t0, CONCURRENT);
        let of = |ns: &str| due.iter().filter(|e| e.config.namespace == ns).count();
        assert_eq!((of("aaa"), of("zzz")), (PER_TENANT, 1));
        // While those hang, the next round gives the hostile tenant nothing more.
        assert!(
            s.due(&asking, t0 + Duration::from_secs(1), CONCURRENT)
                .is_empty()
        );
    }

    #[test]
    fn the_room_bounds_a_round_and_those_that_stop_asking_are_forgotten() {
        let t0 = Instant::now();
        let mut s = Schedule::default();
        let many: Vec<_> = (0..20)
            .map(|i| endpoint(&format!("e{i}"), "https://a.example/", 1))
            .collect();
        assert_eq!(s.due(&many, t0, 1).len(), 1);
        assert_eq!(s.due(&many, t0, 8).len(), PER_TENANT - 1, "one namespace");
        for i in 0..PER_TENANT {
            s.finished(&EndpointKey::new("shop", &format!("e{i}")), true, t0);
        }
        assert_eq!(s.due(&[], t0, 8).len(), 0);
        assert!(s.tracks.is_empty(), "none in flight, none asking");
        let failures = |n: usize| BACKOFF[n.min(BACKOFF.len() - 1)];
        assert_eq!(failures(9), Duration::from_secs(300));
    }

    #[test]
    fn a_verdict_says_what_to_fix() {
        let answered = |status: u16, body: &str| AttemptResult {
            status: Some(status),
            snippet: body.into(),
            ..AttemptResult::failed(
                if (200..300).contains(&status) {
                    AttemptOutcome::Success
                } else {
                    AttemptOutcome::HttpError
                },
                Duration::ZERO,
                String::new(),
            )
        };
        assert_eq!(verdict(&answered(200, "hvc_1"), "hvc_1"), Ok(()));
        assert_eq!(
            verdict(&answered(200, r#"{"challenge":"hvc_1"}"#), "hvc_1"),
            Ok(())
        );
        let not_echoed = verdict(&answered(200, "ok"), "hvc_1").unwrap_err();
        assert!(not_echoed.contains("without echoing"), "{not_echoed}");
        assert_eq!(
            verdict(&answered(404, "hvc_1"), "hvc_1").unwrap_err(),
            "the receiver answered the challenge with 404"
        );
        let refused = AttemptResult::failed(
            AttemptOutcome::ConnectError,
            Duration::ZERO,
            "connect: connection refused".into(),
        );
        assert_eq!(
            verdict(&refused, "hvc_1").unwrap_err(),
            "the challenge was not answered: connect: connection refused"
        );
    }
}
