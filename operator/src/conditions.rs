//! Status conditions, merged so that `lastTransitionTime` moves only when a condition's
//! status flips.
//!
//! Contract: [`merge`] is pure and deterministic given `now`; rendering the same desired
//! conditions twice yields identical output, so a reconcile that changes nothing writes
//! nothing.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// A condition as a reconciler wants it, without the bookkeeping fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    pub type_: &'static str,
    pub status: bool,
    pub reason: &'static str,
    pub message: String,
}

impl Desired {
    pub fn new(
        type_: &'static str,
        status: bool,
        reason: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            type_,
            status,
            reason,
            message: message.into(),
        }
    }
}

/// `ready` and, while it is False, the condition kstatus reads (kstatus computes status
/// for Flux's `wait` and other tools from `Reconciling` and `Stalled`, not from `Ready`):
/// `Reconciling` when Herald waits for something that can come on its own (a
/// SigningSecret, a DNS answer, a referenced endpoint), `Stalled` when a person must
/// change something. Each is written only while True (kstatus looks for True), so a
/// resource that is fine carries `Ready` alone.
pub fn ready_with_kstatus(ready: Desired) -> Vec<Desired> {
    use herald_core::names::{condition, reason};
    const WAITING: [&str; 9] = [
        reason::SECRET_NOT_FOUND,
        reason::HEADER_SECRET_NOT_FOUND,
        reason::TLS_SECRET_NOT_FOUND,
        reason::SECRET_NOT_READY,
        // The platform team grants the rights; the tenant waits.
        reason::SECRET_FORBIDDEN,
        reason::URL_UNRESOLVABLE,
        reason::ENDPOINT_NOT_FOUND,
        // The first dispatcher creates the event store.
        reason::EVENT_STORE_MISSING,
        // The receiver's owner deploys the echo; Herald keeps challenging.
        reason::NOT_VERIFIED,
    ];
    if ready.status {
        return vec![ready];
    }
    let kind = if WAITING.contains(&ready.reason) {
        condition::RECONCILING
    } else {
        condition::STALLED
    };
    let also = Desired::new(kind, true, ready.reason, ready.message.clone());
    vec![ready, also]
}

/// Whether `type_` is one [`ready_with_kstatus`] writes.
pub fn is_ready_or_kstatus(type_: &str) -> bool {
    use herald_core::names::condition;
    [condition::READY, condition::RECONCILING, condition::STALLED].contains(&type_)
}

/// The conditions to write: `desired` in order, each keeping the `lastTransitionTime`
/// of the existing condition of its type when the status did not change.
pub fn merge(
    existing: &[Condition],
    desired: &[Desired],
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    desired
        .iter()
        .map(|d| {
            let status = if d.status { "True" } else { "False" };
            let since = existing
                .iter()
                .find(|c| c.type_ == d.type_ && c.status == status)
                .map(|c| c.last_transition_time.clone())
                .unwrap_or_else(|| now.clone());
            Condition {
                type_: d.type_.to_owned(),
                status: status.to_owned(),
                reason: d.reason.to_owned(),
                message: d.message.clone(),
                observed_generation: generation,
                last_transition_time: since,
            }
        })
        .collect()
}

/// The condition of `type_`, if present.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of `type_` is `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    #[test]
    fn kstatus_sees_waiting_as_reconciling_and_a_needed_fix_as_stalled() {
        use herald_core::names::{condition, reason};
        let ok = Desired::new(condition::READY, true, reason::ACCEPTED, "fine");
        assert_eq!(ready_with_kstatus(ok.clone()), [ok]);
        let waiting = Desired::new(condition::READY, false, reason::SECRET_NOT_READY, "wait");
        let out = ready_with_kstatus(waiting);
        assert_eq!(
            (out[1].type_, out[1].status),
            (condition::RECONCILING, true)
        );
        let broken = Desired::new(condition::READY, false, reason::URL_FORBIDDEN, "no");
        let out = ready_with_kstatus(broken);
        assert_eq!(
            (out[1].type_, out[1].reason),
            (condition::STALLED, reason::URL_FORBIDDEN)
        );
    }

    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn transition_time_moves_only_on_flips() {
        let ready = Desired::new("Ready", true, "Accepted", "ok");
        let first = merge(&[], std::slice::from_ref(&ready), Some(1), &at(100));
        assert_eq!(first[0].last_transition_time, at(100));
        // Same status, new message and generation: the time stays.
        let again = Desired::new("Ready", true, "Accepted", "still ok");
        let second = merge(&first, &[again], Some(2), &at(200));
        assert_eq!(second[0].last_transition_time, at(100));
        assert_eq!(second[0].observed_generation, Some(2));
        let down = Desired::new("Ready", false, "UrlForbidden", "no");
        let third = merge(&second, &[down], Some(2), &at(300));
        assert_eq!(third[0].last_transition_time, at(300));
        assert_eq!(third[0].status, "False");
    }
}
