//! Pure: a `WebhookReplay`'s status from what exists and the progress its dispatcher
//! reported (only progress of this very replay, by uid, counts; none is invented).

use herald_core::dataplane::ReplayProgress;
use herald_core::names::{condition, reason};
use herald_core::v1alpha1::{ReplayPhase, WebhookReplay, WebhookReplayStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::conditions::{self, Desired};

use super::check::{Found, check, request};

/// Pure: the status of `replay` given what exists and the progress a dispatcher reported
/// (only progress of this very replay, by uid, counts).
pub fn status(
    replay: &WebhookReplay,
    found: Found,
    progress: Option<&ReplayProgress>,
    now: Timestamp,
) -> WebhookReplayStatus {
    let old = replay.status.clone().unwrap_or_default();
    let ready = check(replay, found, now);
    let asked = request(replay, &ready);
    let progress = progress.filter(|p| replay.metadata.uid.as_deref() == Some(p.uid.as_str()));
    let mut desired = conditions::ready_with_kstatus(ready);
    let mut new = WebhookReplayStatus {
        observed_generation: replay.metadata.generation,
        phase: Some(ReplayPhase::Pending),
        ..Default::default()
    };
    let dry_run = replay.spec.dry_run;
    let complete = match (progress, asked) {
        (Some(p), _) => {
            new.matched = Some(p.matched);
            new.enqueued = Some(p.enqueued);
            if !dry_run {
                new.delivered = Some(p.delivered);
                new.failed = Some(p.failed);
            }
            new.start_time = Some(old.start_time.clone().unwrap_or(Time(now)));
            if p.finished(dry_run) {
                new.phase = Some(ReplayPhase::Completed);
                new.completion_time = Some(old.completion_time.clone().unwrap_or(Time(now)));
                let what = if dry_run {
                    format!(
                        "{} events in the range would be sent (dry run: nothing was sent)",
                        p.matched
                    )
                } else {
                    format!(
                        "{} events in the range sent again: {} delivered, {} failed (dead)",
                        p.enqueued, p.delivered, p.failed
                    )
                };
                Desired::new(condition::COMPLETE, true, reason::COMPLETED, what)
            } else {
                new.phase = Some(ReplayPhase::Running);
                let message = if p.done {
                    format!(
                        "all {} matching events enqueued; {} delivered, {} failed, {} still being delivered",
                        p.enqueued,
                        p.delivered,
                        p.failed,
                        p.enqueued.saturating_sub(p.delivered + p.failed)
                    )
                } else if dry_run {
                    format!("{} events matched so far", p.matched)
                } else {
                    format!(
                        "{} events matched so far, {} enqueued; {} delivered, {} failed",
                        p.matched, p.enqueued, p.delivered, p.failed
                    )
                };
                let running = Desired::new(condition::COMPLETE, false, reason::RUNNING, message);
                desired.push(Desired::new(
                    condition::RECONCILING,
                    true,
                    reason::RUNNING,
                    running.message.clone(),
                ));
                running
            }
        }
        (None, Some(_)) => {
            let waiting = Desired::new(
                condition::COMPLETE,
                false,
                reason::WAITING,
                "waiting for the dispatcher that owns the endpoint's shard to take the replay up",
            );
            desired.push(Desired::new(
                condition::RECONCILING,
                true,
                reason::WAITING,
                waiting.message.clone(),
            ));
            waiting
        }
        (None, None) => Desired::new(
            condition::COMPLETE,
            false,
            reason::WAITING,
            "the replay starts once it is valid (see Ready)",
        ),
    };
    desired.push(complete);
    new.conditions = conditions::merge(
        &old.conditions,
        &desired,
        replay.metadata.generation,
        &Time(now),
    );
    new
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::check::tests::{DAYS_30, found, replay};
    use k8s_openapi::jiff::SignedDuration;
    #[test]
    fn progress_of_this_replay_becomes_its_status() {
        let now: Timestamp = "2026-11-30T00:00:00Z".parse().unwrap();
        let mut r = replay("2026-11-29T00:00:00Z");
        r.metadata.namespace = Some("shop".into());
        r.metadata.uid = Some("u-1".into());
        r.metadata.creation_timestamp = Some(Time(now));
        r.spec.dry_run = true;
        let ok = found(true, Some(DAYS_30));
        let complete = |s: &WebhookReplayStatus| {
            let c = conditions::find(&s.conditions, condition::COMPLETE).unwrap();
            (c.status.clone(), c.reason.clone())
        };
        let waiting = status(&r, ok, None, now);
        assert_eq!(waiting.phase, Some(ReplayPhase::Pending));
        assert_eq!(complete(&waiting), ("False".into(), reason::WAITING.into()));
        assert_eq!(waiting.matched, None, "no invented progress");
        let mut progress = ReplayProgress {
            uid: "u-1".into(),
            matched: 7,
            cursor: 40,
            ..Default::default()
        };
        let running = status(&r, ok, Some(&progress), now);
        assert_eq!(running.phase, Some(ReplayPhase::Running));
        assert_eq!(running.matched, Some(7));
        assert!(conditions::find(&running.conditions, condition::RECONCILING).is_some());
        progress.done = true;
        r.status = Some(running);
        let later = now + SignedDuration::from_secs(5);
        let done = status(&r, ok, Some(&progress), later);
        assert_eq!(done.phase, Some(ReplayPhase::Completed));
        assert_eq!(complete(&done), ("True".into(), reason::COMPLETED.into()));
        assert_eq!(
            done.start_time,
            Some(Time(now)),
            "kept from the first report"
        );
        assert_eq!(done.completion_time, Some(Time(later)));
        assert!(conditions::find(&done.conditions, condition::RECONCILING).is_none());
        // Another replay's progress (an earlier one of the same name) is not this one's.
        let stale = ReplayProgress {
            uid: "u-0".into(),
            ..progress.clone()
        };
        assert_eq!(status(&r, ok, Some(&stale), now).matched, None);
        // A replay that sends: complete only once every enqueued event is delivered
        // or dead.
        r.spec.dry_run = false;
        r.status = None;
        progress.enqueued = 7;
        progress.delivered = 5;
        progress.failed = 1;
        let sending = status(&r, ok, Some(&progress), now);
        assert_eq!(sending.phase, Some(ReplayPhase::Running));
        assert_eq!(complete(&sending), ("False".into(), reason::RUNNING.into()));
        assert_eq!(
            (sending.enqueued, sending.delivered, sending.failed),
            (Some(7), Some(5), Some(1))
        );
        progress.failed = 2;
        let sent = status(&r, ok, Some(&progress), now);
        assert_eq!(sent.phase, Some(ReplayPhase::Completed));
        let c = conditions::find(&sent.conditions, condition::COMPLETE).unwrap();
        assert_eq!(
            c.message,
            "7 events in the range sent again: 5 delivered, 2 failed (dead)"
        );
    }
}
