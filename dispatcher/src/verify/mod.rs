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
mod tests;
