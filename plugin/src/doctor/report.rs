//! What `doctor` prints: one [`Verdict`] per check, a line each (or a JSON/YAML
//! document), and whether the installation passed. Pure.

use serde::Serialize;

/// How one check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    Ok,
    /// Something is wrong; the message says what and what to change.
    Fail,
    /// Not checked: not asked for (no `--api-url`), or something it needs failed first
    /// (that check's line says why).
    Skip,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Self::Ok => "OK",
            Self::Fail => "FAIL",
            Self::Skip => "SKIP",
        }
    }
}

/// One check's outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// What was checked: `crd/webhookendpoints.herald.dev`, `operator`, `shards`, `nats`,
    /// `stream/HERALD_EVENTS`, `herald-api`.
    pub check: String,
    pub status: Status,
    pub message: String,
}

impl Verdict {
    pub fn ok(check: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(check, Status::Ok, message)
    }

    pub fn fail(check: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(check, Status::Fail, message)
    }

    pub fn skip(check: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(check, Status::Skip, message)
    }

    fn new(check: impl Into<String>, status: Status, message: impl Into<String>) -> Self {
        Self {
            check: check.into(),
            status,
            message: message.into(),
        }
    }
}

/// Whether nothing failed (skipped checks do not fail the run).
pub fn passed(verdicts: &[Verdict]) -> bool {
    verdicts.iter().all(|v| v.status != Status::Fail)
}

/// One line per verdict: status, check and message in aligned columns.
pub fn lines(verdicts: &[Verdict]) -> String {
    let width = verdicts.iter().map(|v| v.check.len()).max().unwrap_or(0);
    let mut out = String::new();
    for v in verdicts {
        out.push_str(&format!(
            "{:<4}   {:<width$}   {}\n",
            v.status.label(),
            v.check,
            v.message
        ));
    }
    out
}

/// The document `-o json` and `-o yaml` print.
pub fn document(verdicts: &[Verdict]) -> serde_json::Value {
    serde_json::json!({"passed": passed(verdicts), "checks": verdicts})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_per_check_aligned_and_a_failure_fails_the_run() {
        let verdicts = [
            Verdict::ok("nats", "nats-server 2.15.1"),
            Verdict::fail("shards", "shard 3 of 4 has no live holder"),
            Verdict::skip("herald-api", "no --api-url"),
        ];
        assert_eq!(
            lines(&verdicts),
            "OK     nats         nats-server 2.15.1\n\
             FAIL   shards       shard 3 of 4 has no live holder\n\
             SKIP   herald-api   no --api-url\n"
        );
        assert!(!passed(&verdicts));
        assert!(passed(&verdicts[..1]));
        assert!(passed(&[verdicts[0].clone(), verdicts[2].clone()]));
        let doc = document(&verdicts);
        assert_eq!(doc["passed"], false);
        assert_eq!(doc["checks"][1]["status"], "FAIL");
        assert_eq!(doc["checks"][2]["check"], "herald-api");
    }
}
