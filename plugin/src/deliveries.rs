//! `deliveries`, `attempts`, `redeliver`, `redrive-dead` and `test`: the delivery log
//! and the on-demand actions of Herald's API, printed as tables (or the API's JSON).
//!
//! The tables are built by pure functions of the API's answers and the time now.

use jiff::Timestamp;

use crate::api::{Api, ApiError, Attempt, Delivery, DeliveryDetail, Query, Queued, Redrive};
use crate::table::{Output, Table, snippet};
use crate::time::{TimeArg, age, millis, relative};
use herald_core::api::Truncated;

/// The states `--status` takes: the API's, plus `failed` (retrying or dead).
pub const STATUSES: [&str; 6] = [
    "pending",
    "inFlight",
    "succeeded",
    "retrying",
    "dead",
    "failed",
];

/// Filters of `deliveries`.
#[derive(Clone, Debug, clap::Args)]
pub struct Filters {
    /// Only deliveries in these states (comma-separated); `failed` is retrying or dead.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "STATE",
        value_parser = clap::builder::PossibleValuesParser::new(STATUSES)
    )]
    pub status: Vec<String>,
    /// Only events of this type.
    #[arg(long = "type", value_name = "TYPE")]
    pub event_type: Option<String>,
    /// Only events since this time: RFC 3339 or a duration ago (30m, 2h, 7d).
    #[arg(long, value_name = "TIME")]
    pub since: Option<TimeArg>,
    /// Only events before this time: RFC 3339 or a duration ago.
    #[arg(long, value_name = "TIME")]
    pub until: Option<TimeArg>,
    /// At most this many deliveries (the newest), fetched page by page.
    #[arg(long, default_value_t = 50, value_name = "N")]
    pub limit: u32,
}

impl Filters {
    /// The first page's query.
    pub fn query(&self, now: Timestamp) -> Query {
        let Self {
            status,
            event_type,
            since,
            until,
            limit,
        } = self;
        Query {
            status: (!status.is_empty()).then(|| status.join(",")),
            event_type: event_type.clone(),
            since: since.map(|t| t.resolve(now)),
            until: until.map(|t| t.resolve(now)),
            limit: Some((*limit).clamp(1, 500)),
            cursor: None,
        }
    }
}

/// The delivery log as a table, newest first.
pub fn deliveries_table(items: &[Delivery], now: Timestamp, wide: bool) -> Table {
    let mut headers = vec![
        "event id",
        "type",
        "state",
        "attempts",
        "status",
        "latency",
        "last attempt",
        "next attempt",
    ];
    if wide {
        headers.extend(["last attempt time", "next attempt time"]);
    }
    let mut table = Table::new(headers);
    for d in items {
        let mut row = vec![
            d.event_id.to_string(),
            d.event_type.clone().unwrap_or_default(),
            d.state.to_string(),
            d.attempts.to_string(),
            d.last_status.map(|s| s.to_string()).unwrap_or_default(),
            d.last_latency_ms.map(millis).unwrap_or_default(),
            d.last_attempt_time.map(|t| age(t, now)).unwrap_or_default(),
            d.next_attempt_time
                .map(|t| relative(t, now))
                .unwrap_or_default(),
        ];
        if wide {
            row.push(
                d.last_attempt_time
                    .map(|t| t.to_string())
                    .unwrap_or_default(),
            );
            row.push(
                d.next_attempt_time
                    .map(|t| t.to_string())
                    .unwrap_or_default(),
            );
        }
        table.row(row);
    }
    table
}

/// Every attempt of one delivery, oldest first; the response snippet is cut to fit
/// unless `wide`.
pub fn attempts_table(attempts: &[Attempt], now: Timestamp, wide: bool) -> Table {
    let mut table = Table::new([
        "attempt", "time", "age", "outcome", "status", "latency", "response",
    ]);
    let mut attempts = attempts.to_vec();
    attempts.sort_by_key(|a| a.attempt);
    for a in &attempts {
        table.row([
            a.attempt.to_string(),
            a.time.to_string(),
            age(a.time, now),
            a.outcome.to_string(),
            a.status.map(|s| s.to_string()).unwrap_or_default(),
            millis(a.latency_ms),
            snippet(&a.response, if wide { 4096 } else { 60 }),
        ]);
    }
    table
}

/// What was sent and what came back, below the attempts table with `-o wide`: the body
/// every attempt sent, and each attempt's request and response headers.
pub fn exchange_text(d: &DeliveryDetail) -> String {
    let mut text = String::new();
    if let Some(body) = &d.request_body {
        let cut = if body.truncated { ", first 4 KiB" } else { "" };
        text.push_str(&format!(
            "\nRequest body ({} bytes{cut}):\n{}\n",
            body.bytes, body.body
        ));
    }
    let mut attempts = d.attempts.clone();
    attempts.sort_by_key(|a| a.attempt);
    for a in &attempts {
        for (what, headers) in [
            ("request", &a.request_headers),
            ("response", &a.response_headers),
        ] {
            if headers.is_empty() {
                continue;
            }
            text.push_str(&format!("\nAttempt {} {what} headers:\n", a.attempt));
            for h in headers {
                text.push_str(&format!("  {}: {}\n", h.name, h.value));
            }
        }
    }
    text
}

/// The heading above the attempts table.
pub fn delivery_heading(d: &DeliveryDetail, endpoint: &str) -> String {
    format!(
        "Event:     {}\nType:      {}\nEndpoint:  {endpoint}\nState:     {}\nAttempts:  {}\n",
        d.event_id,
        d.event_type.as_deref().unwrap_or_default(),
        d.state,
        d.attempts.len()
    )
}

/// What a 202 from `redeliver` or `test` means, in one or two lines.
pub fn queued_message(action: &str, endpoint: &str, q: &Queued) -> String {
    let Queued {
        event_id: id,
        request_id: request,
    } = q;
    match action {
        "test" => format!(
            "test event {id} queued for {endpoint} (request {request})\nfollow it with: kubectl herald attempts {endpoint} {id}"
        ),
        _ => format!(
            "event {id} queued for delivery to {endpoint} again, same webhook-id (request {request})"
        ),
    }
}

/// What a 202 from `redrive-dead` means.
pub fn redrive_message(endpoint: &str, r: &Redrive) -> String {
    let skipped = match r.skipped.len() {
        0 => String::new(),
        n => format!("; {n} not queued (test events, past retention, or types no longer taken)"),
    };
    let more = match &r.truncated {
        None => "",
        Some(_) => {
            "\nmore dead deliveries may be left (one request queues a bounded number): run it again once these are delivered"
        }
    };
    format!(
        "{} dead deliveries of {endpoint} queued for delivery again (request {}){skipped}{more}",
        r.count, r.request_id
    )
}

/// The note for an answer that stopped at one of the API's bounds.
pub fn truncated_note(truncated: &Truncated) -> String {
    let since = truncated
        .read_back_to
        .map(|t| format!(" since {}", herald_core::api::time::format(&t)))
        .unwrap_or_default();
    format!(
        "(the API read the delivery log back to its bound ({}): this covers events published{since}; narrow with --since)",
        truncated.limit
    )
}

/// `deliveries`: follows cursors until `--limit` items or the end.
pub async fn list(
    api: &Api,
    endpoint: &str,
    filters: &Filters,
    output: Output,
) -> Result<(), crate::Error> {
    let now = Timestamp::now();
    let mut query = filters.query(now);
    let wanted = filters.limit as usize;
    let mut items = Vec::new();
    let mut raw = Vec::new();
    let mut truncated = None;
    let more = loop {
        let (page, value) = api.deliveries(endpoint, &query).await?;
        raw.extend(value["items"].as_array().cloned().unwrap_or_default());
        items.extend(page.items);
        truncated = truncated.or(page.truncated);
        let next = page.next_cursor.filter(|c| !c.is_empty());
        if items.len() >= wanted || next.is_none() {
            break next;
        }
        query.cursor = next;
    };
    items.truncate(wanted);
    raw.truncate(wanted);
    let document = serde_json::json!({"items": raw, "nextCursor": more, "truncated": truncated});
    if output.print_document(&document)? {
        return Ok(());
    }
    if let Some(truncated) = &truncated {
        eprintln!("{}", truncated_note(truncated));
    }
    if items.is_empty() {
        eprintln!(
            "No deliveries found for endpoint {endpoint} in namespace {}.",
            api.namespace()
        );
        return Ok(());
    }
    print!("{}", deliveries_table(&items, now, output.wide()).render());
    if more.is_some() {
        eprintln!("(more deliveries: raise --limit, or narrow with --since/--until)");
    }
    Ok(())
}

/// `attempts`.
pub async fn attempts(
    api: &Api,
    endpoint: &str,
    event_id: &str,
    output: Output,
) -> Result<(), crate::Error> {
    let (detail, value) = api.delivery(endpoint, event_id).await?;
    if output.print_document(&value)? {
        return Ok(());
    }
    print!("{}", delivery_heading(&detail, endpoint));
    println!();
    if detail.attempts.is_empty() {
        println!("No attempts yet.");
    } else {
        print!(
            "{}",
            attempts_table(&detail.attempts, Timestamp::now(), output.wide()).render()
        );
    }
    if output.wide() {
        print!("{}", exchange_text(&detail));
    }
    if let Some(truncated) = &detail.truncated {
        eprintln!("{}", truncated_note(truncated));
    }
    Ok(())
}

/// `redeliver`, `redrive-dead`, `test`.
pub async fn act(
    api: &Api,
    action: &str,
    endpoint: &str,
    event_id: Option<&str>,
    output: Output,
) -> Result<(), crate::Error> {
    let (message, ids, value) = match (action, event_id) {
        ("redrive-dead", _) => {
            let (redrive, value) = api.redrive_dead(endpoint).await?;
            let message = redrive_message(endpoint, &redrive);
            (message, redrive.event_ids, value)
        }
        ("test", _) => {
            let (queued, value) = api.test(endpoint).await?;
            (queued_message(action, endpoint, &queued), Vec::new(), value)
        }
        (_, Some(id)) => {
            let (queued, value) = api.redeliver(endpoint, id).await?;
            (queued_message(action, endpoint, &queued), Vec::new(), value)
        }
        (_, None) => unreachable!("redeliver always has an event id"),
    };
    if output.print_document(&value)? {
        return Ok(());
    }
    println!("{message}");
    if output.wide() {
        for id in &ids {
            println!("  {id}");
        }
    }
    Ok(())
}

impl From<ApiError> for crate::Error {
    fn from(e: ApiError) -> Self {
        Self::Api(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::State;
    use herald_core::dataplane::AttemptOutcome;

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    fn delivery(id: &str, state: State, attempts: u32) -> Delivery {
        Delivery {
            event_id: id.into(),
            event_type: Some("order.created".into()),
            state: state.into(),
            attempts,
            last_status: (attempts > 0).then_some(500),
            last_latency_ms: (attempts > 0).then_some(12),
            last_attempt_time: (attempts > 0).then(|| at("2026-12-01T11:59:00Z")),
            next_attempt_time: (state == State::Retrying).then(|| at("2026-12-01T12:00:30Z")),
        }
    }

    #[test]
    fn the_delivery_log_table() {
        let now = at("2026-12-01T12:00:00Z");
        let items = [
            delivery("01JA", State::Retrying, 2),
            delivery("01JB", State::Pending, 0),
        ];
        assert_eq!(
            deliveries_table(&items, now, false).render(),
            "EVENT ID   TYPE            STATE      ATTEMPTS   STATUS   LATENCY   LAST ATTEMPT   NEXT ATTEMPT\n\
             01JA       order.created   retrying   2          500      12ms      60s            in 30s\n\
             01JB       order.created   pending    0          <none>   <none>    <none>         <none>\n"
        );
        let wide = deliveries_table(&items, now, true).render();
        assert!(
            wide.lines()
                .next()
                .unwrap()
                .ends_with("LAST ATTEMPT TIME      NEXT ATTEMPT TIME"),
            "{wide}"
        );
        assert!(wide.contains("2026-12-01T11:59:00Z"), "{wide}");
    }

    #[test]
    fn wide_shows_what_was_sent_and_what_came_back() {
        let header = |name: &str, value: &str| crate::api::HeaderField {
            name: name.into(),
            value: value.into(),
        };
        let detail: DeliveryDetail = serde_json::from_value(serde_json::json!({
            "eventId": "msg_1", "type": "order.created", "state": "retrying",
            "attempts": [{
                "attempt": 1, "time": "2026-12-01T11:00:00Z", "outcome": "HttpError",
                "status": 503, "latencyMs": 3, "response": "busy",
                "requestHeaders": [{"name": "webhook-signature", "value": "v1,[redacted]"}],
                "responseHeaders": [{"name": "retry-after", "value": "5"}]
            }],
            "requestBody": {"body": "{\"type\":\"order.created\"}", "bytes": 24}
        }))
        .unwrap();
        assert_eq!(
            detail.attempts[0].request_headers,
            [header("webhook-signature", "v1,[redacted]")]
        );
        let text = exchange_text(&detail);
        assert!(
            text.contains("Request body (24 bytes):\n{\"type\":\"order.created\"}"),
            "{text}"
        );
        assert!(
            text.contains("Attempt 1 request headers:\n  webhook-signature: v1,[redacted]"),
            "{text}"
        );
        assert!(
            text.contains("Attempt 1 response headers:\n  retry-after: 5"),
            "{text}"
        );
    }

    #[test]
    fn attempts_are_sorted_and_responses_cut_unless_wide() {
        let now = at("2026-12-01T12:00:00Z");
        let attempt = |n, response: &str| Attempt {
            attempt: n,
            time: at("2026-12-01T11:00:00Z"),
            outcome: AttemptOutcome::HttpError.into(),
            status: Some(503),
            latency_ms: 1500,
            response: response.into(),
            state: None,
            next_attempt_time: None,
            request_headers: Vec::new(),
            response_headers: Vec::new(),
        };
        let long = "x".repeat(100);
        let attempts = [attempt(2, &long), attempt(1, "busy\n")];
        let text = attempts_table(&attempts, now, false).render();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[1].starts_with("1 "), "{text}");
        assert!(lines[1].ends_with("busy"), "{text}");
        assert!(
            lines[2].ends_with(&format!("{}…", "x".repeat(59))),
            "{text}"
        );
        assert!(
            lines[2].contains("1.5s") && lines[2].contains("60m"),
            "{text}"
        );
        let wide = attempts_table(&attempts, now, true).render();
        assert!(wide.contains(&long));
    }

    #[test]
    fn filters_become_the_query() {
        let now = at("2026-12-01T12:00:00Z");
        let filters = Filters {
            status: vec!["failed".into(), "inFlight".into()],
            event_type: None,
            since: Some("2h".parse().unwrap()),
            until: None,
            limit: 10_000,
        };
        let q = filters.query(now);
        assert_eq!(q.since, Some(at("2026-12-01T10:00:00Z")));
        assert_eq!(
            q.limit,
            Some(500),
            "one page is capped; the rest follows cursors"
        );
        assert_eq!(q.status.as_deref(), Some("failed,inFlight"));
    }

    #[test]
    fn accepted_messages() {
        let q = Queued {
            event_id: "01JX".into(),
            request_id: "r1".into(),
        };
        assert_eq!(
            queued_message("redeliver", "orders", &q),
            "event 01JX queued for delivery to orders again, same webhook-id (request r1)"
        );
        assert!(
            queued_message("test", "orders", &q).contains("kubectl herald attempts orders 01JX")
        );
        let mut r = Redrive {
            request_id: "r1".into(),
            count: 2,
            event_ids: vec!["a".into(), "b".into()],
            skipped: vec![],
            truncated: None,
        };
        assert_eq!(
            redrive_message("orders", &r),
            "2 dead deliveries of orders queued for delivery again (request r1)"
        );
        r.skipped = vec!["t".into()];
        assert!(
            redrive_message("orders", &r).ends_with(
                "; 1 not queued (test events, past retention, or types no longer taken)"
            )
        );
        r.truncated = Some(Truncated {
            limit: herald_core::api::Limit::Count.into(),
            read_back_to: None,
        });
        assert!(redrive_message("orders", &r).contains("run it again"));
    }
}
