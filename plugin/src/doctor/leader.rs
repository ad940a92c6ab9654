//! Does an operator lead? The operator replicas elect their leader with a
//! coordination.k8s.io Lease in their namespace; the leader renews it every few seconds
//! (`--lease-renew`, 5 s) and it lasts `leaseDurationSeconds` (15 s). A Lease that has
//! no holder, or whose `renewTime` is older than its duration, means no operator is
//! reconciling: resources are not validated, configurations and keys do not reach the
//! data plane, status is not written. Pure: the Lease and the time are passed in.
//!
//! The age is measured with this machine's clock against the API server's record of
//! the renewal, so a clock that is off by more than a few seconds shows here.

use jiff::Timestamp;

use super::report::Verdict;
use crate::time::age;

/// What the Lease says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseFacts {
    pub name: String,
    pub holder: Option<String>,
    pub renewed: Option<Timestamp>,
    /// `leaseDurationSeconds`.
    pub duration_secs: Option<i32>,
}

/// The Lease the chart gives the operator when installed as release `herald`
/// (`<release>-operator-leader`).
const CHART_LEASE: &str = "herald-operator-leader";

/// The Lease names looked for: `--lease-name`, else the chart's (release `herald`) and
/// the operator's own default.
pub fn candidates(flag: Option<&str>) -> Vec<String> {
    match flag {
        Some(name) => vec![name.to_owned()],
        None => vec![
            CHART_LEASE.to_owned(),
            herald_core::names::LEADER_LEASE.to_owned(),
        ],
    }
}

/// The verdict on the operator's leadership: `lease` is the first of `looked_for` that
/// exists in `namespace` (`None`: none does).
pub fn verdict(
    namespace: &str,
    looked_for: &[String],
    lease: &Result<Option<LeaseFacts>, String>,
    now: Timestamp,
) -> Verdict {
    const CHECK: &str = "operator";
    let pods = format!(
        "check the operator's pods and logs (kubectl -n {namespace} get pods -l app.kubernetes.io/component=operator)"
    );
    let lease = match lease {
        Err(error) => {
            return Verdict::fail(CHECK, format!("cannot read its Lease: {error}"));
        }
        Ok(None) => {
            return Verdict::fail(
                CHECK,
                format!(
                    "no leader Lease ({}) in namespace {namespace}: no operator has run there. If it runs in another namespace or with another Lease name, pass --operator-namespace / --lease-name; else {pods}",
                    looked_for.join(" or ")
                ),
            );
        }
        Ok(Some(lease)) => lease,
    };
    let name = format!("Lease {namespace}/{}", lease.name);
    let renewed = lease.renewed.map(|t| format!("{} ago", age(t, now)));
    let holder = lease.holder.as_deref().filter(|h| !h.is_empty());
    let Some(holder) = holder else {
        return Verdict::fail(
            CHECK,
            format!(
                "no operator leads: {name} has no holder (released {}; the last leader stopped and no standby took over): {pods}",
                renewed.as_deref().unwrap_or("at an unknown time")
            ),
        );
    };
    let (Some(renewed_at), Some(duration)) = (lease.renewed, lease.duration_secs) else {
        return Verdict::fail(
            CHECK,
            format!("{name} held by {holder} has no renewTime or leaseDurationSeconds: {pods}"),
        );
    };
    let elapsed = now.duration_since(renewed_at).as_secs();
    let renewed = renewed.unwrap_or_default();
    if elapsed > i64::from(duration) {
        return Verdict::fail(
            CHECK,
            format!(
                "no operator leads: {name} was last renewed {renewed} by {holder} and lasts {duration}s (the leader stopped, or cannot reach the API server): {pods}"
            ),
        );
    }
    Verdict::ok(
        CHECK,
        format!("{holder} leads ({name} renewed {renewed}, lasts {duration}s)"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::report::Status;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn lease(holder: Option<&str>, renewed: &str) -> LeaseFacts {
        LeaseFacts {
            name: "herald-operator-leader".into(),
            holder: holder.map(str::to_owned),
            renewed: Some(at(renewed)),
            duration_secs: Some(15),
        }
    }

    const NOW: &str = "2026-12-01T10:00:30Z";

    #[test]
    fn a_fresh_holder_leads() {
        let v = verdict(
            "herald-system",
            &candidates(None),
            &Ok(Some(lease(Some("op-0"), "2026-12-01T10:00:27Z"))),
            at(NOW),
        );
        assert_eq!(v.status, Status::Ok);
        assert_eq!(v.check, "operator");
        assert_eq!(
            v.message,
            "op-0 leads (Lease herald-system/herald-operator-leader renewed 3s ago, lasts 15s)"
        );
        // A renewal a little ahead of this machine's clock is fresh too.
        let ahead = verdict(
            "herald-system",
            &candidates(None),
            &Ok(Some(lease(Some("op-0"), "2026-12-01T10:00:32Z"))),
            at(NOW),
        );
        assert_eq!(ahead.status, Status::Ok);
    }

    #[test]
    fn a_stale_lease_no_holder_or_no_lease_fails_with_what_to_check() {
        let stale = verdict(
            "herald-system",
            &candidates(None),
            &Ok(Some(lease(Some("op-0"), "2026-12-01T10:00:00Z"))),
            at(NOW),
        );
        assert_eq!(stale.status, Status::Fail);
        assert!(
            stale.message.starts_with(
                "no operator leads: Lease herald-system/herald-operator-leader was last renewed 30s ago by op-0 and lasts 15s"
            ),
            "{stale:?}"
        );
        assert!(stale.message.contains("kubectl -n herald-system get pods"));

        let released = verdict(
            "herald-system",
            &candidates(None),
            &Ok(Some(lease(None, "2026-12-01T10:00:00Z"))),
            at(NOW),
        );
        assert!(
            released
                .message
                .starts_with("no operator leads: Lease herald-system/herald-operator-leader has no holder (released 30s ago"),
            "{released:?}"
        );

        let none = verdict("herald", &candidates(None), &Ok(None), at(NOW));
        assert_eq!(none.status, Status::Fail);
        assert!(
            none.message.starts_with(
                "no leader Lease (herald-operator-leader or herald-operator) in namespace herald"
            ),
            "{none:?}"
        );
        assert!(none.message.contains("--operator-namespace"));

        let forbidden = verdict(
            "herald",
            &candidates(Some("x")),
            &Err("forbidden".into()),
            at(NOW),
        );
        assert_eq!(forbidden.message, "cannot read its Lease: forbidden");
    }

    #[test]
    fn the_lease_name_flag_replaces_the_defaults() {
        assert_eq!(candidates(Some("mine")), ["mine"]);
        assert_eq!(
            candidates(None),
            ["herald-operator-leader", "herald-operator"]
        );
    }
}
