//! Does herald-api answer? Its `/readyz` is 200 once it is connected to NATS and has
//! opened its store, else 503 naming what it waits for. Checked only when an API address
//! is given (`--api-url`, `HERALD_API_URL`). Pure: the answer is passed in.

use super::report::Verdict;

const CHECK: &str = "herald-api";

/// What `GET <api>/readyz` returned: its status and body, or why there was no answer.
pub type Answer = Result<(u16, String), String>;

/// The verdict on herald-api at `url` (`None`: no address given), installed in
/// `namespace`.
pub fn verdict(url: Option<&str>, answer: Option<&Answer>, namespace: &str) -> Verdict {
    let (Some(url), Some(answer)) = (url, answer) else {
        return Verdict::skip(
            CHECK,
            format!(
                "no --api-url (HERALD_API_URL): not checked. To check it: kubectl port-forward -n {namespace} svc/herald-api 8080:8080 and --api-url http://127.0.0.1:8080"
            ),
        );
    };
    let url = url.trim_end_matches('/');
    match answer {
        Err(error) => Verdict::fail(
            CHECK,
            format!(
                "no answer from {url}: {error}. Is herald-api running (the chart's api.enabled) and the address or port-forward right?"
            ),
        ),
        Ok((200, _)) => Verdict::ok(CHECK, format!("{url} is ready")),
        Ok((status, body)) => {
            let body = crate::table::snippet(body.trim(), 200);
            Verdict::fail(
                CHECK,
                format!(
                    "{url}/readyz answered HTTP {status}{}: its logs say why (kubectl -n {namespace} logs deploy/herald-api)",
                    if body.is_empty() {
                        String::new()
                    } else {
                        format!(" ({body})")
                    }
                ),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::report::Status;

    #[test]
    fn ready_not_ready_unreachable_and_not_asked() {
        let url = Some("http://127.0.0.1:8080");
        let v = verdict(url, Some(&Ok((200, "ready".into()))), "herald-system");
        assert_eq!(v.status, Status::Ok);
        assert_eq!(v.message, "http://127.0.0.1:8080 is ready");
        let v = verdict(
            url,
            Some(&Ok((503, "not ready: nats\n".into()))),
            "herald-system",
        );
        assert_eq!(v.status, Status::Fail);
        assert!(
            v.message
                .starts_with("http://127.0.0.1:8080/readyz answered HTTP 503 (not ready: nats)"),
            "{v:?}"
        );
        let v = verdict(
            url,
            Some(&Err("connection refused".into())),
            "herald-system",
        );
        assert!(
            v.message
                .starts_with("no answer from http://127.0.0.1:8080: connection refused."),
            "{v:?}"
        );
        let v = verdict(None, None, "herald-system");
        assert_eq!(v.status, Status::Skip);
        assert!(v.message.starts_with("no --api-url"));
    }
}
