//! `deliveries`, `attempts`, `redeliver`, `redrive-dead` and `test`: the delivery log
//! and the on-demand actions of Herald's API, printed as tables (or the API's JSON).
//!
//! The tables are built by pure functions of the API's answers and the time now.

use jiff::Timestamp;

use crate::api::{Accepted, Api, ApiError, Attempt, Delivery, DeliveryDetail, Query};
use crate::table::{Output, Table, snippet};
use crate::time::{TimeArg, age, millis, relative};

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
            d.event_id.clone(),
            d.event_type.clone(),
            d.state.clone(),
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
        let response = a.response.as_deref().unwrap_or_default();
        table.row([
            a.attempt.to_string(),
            a.time.map(|t| t.to_string()).unwrap_or_default(),
            a.time.map(|t| age(t, now)).unwrap_or_default(),
            a.outcome.clone(),
            a.status.map(|s| s.to_string()).unwrap_or_default(),
            a.latency_ms.map(millis).unwrap_or_default(),
            snippet(response, if wide { 4096 } else { 60 }),
        ]);
    }
    table
}

/// The heading above the attempts table.
pub fn delivery_heading(d: &DeliveryDetail, endpoint: &str) -> String {
    format!(
        "Event:     {}\nType:      {}\nEndpoint:  {endpoint}\nState:     {}\nAttempts:  {}\n",
        d.event_id,
        d.event_type,
        d.state,
        d.attempts.len()
    )
}

/// What a 202 from `redeliver`, `redrive-dead` or `test` means, in one or two lines.
pub fn accepted_message(action: &str, endpoint: &str, a: &Accepted) -> String {
    let request = a
        .request_id
        .as_deref()
        .map(|r| format!(" (request {r})"))
        .unwrap_or_default();
    match action {
        "redrive-dead" => {
            let count = a.count.unwrap_or(a.event_ids.len() as u64);
            format!("{count} dead deliveries of {endpoint} queued for delivery again{request}")
        }
        "test" => {
            let id = a.event_id.as_deref().unwrap_or("?");
            format!(
                "test event {id} queued for {endpoint}{request}\nfollow it with: kubectl herald attempts {endpoint} {id}"
            )
        }
        _ => {
            let id = a.event_id.as_deref().unwrap_or("?");
            format!("event {id} queued for delivery to {endpoint} again, same webhook-id{request}")
        }
    }
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
    let more = loop {
        let (page, value) = api.deliveries(endpoint, &query).await?;
        raw.extend(value["items"].as_array().cloned().unwrap_or_default());
        items.extend(page.items);
        let next = page.next_cursor.filter(|c| !c.is_empty());
        if items.len() >= wanted || next.is_none() {
            break next;
        }
        query.cursor = next;
    };
    items.truncate(wanted);
    raw.truncate(wanted);
    let document = serde_json::json!({"items": raw, "nextCursor": more});
    if output.print_document(&document)? {
        return Ok(());
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
    let (accepted, value) = match (action, event_id) {
        ("redrive-dead", _) => api.redrive_dead(endpoint).await?,
        ("test", _) => api.test(endpoint).await?,
        (_, Some(id)) => api.redeliver(endpoint, id).await?,
        (_, None) => unreachable!("redeliver always has an event id"),
    };
    if output.print_document(&value)? {
        return Ok(());
    }
    println!("{}", accepted_message(action, endpoint, &accepted));
    if output.wide() {
        for id in &accepted.event_ids {
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

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    fn delivery(id: &str, state: &str, attempts: u32) -> Delivery {
        Delivery {
            event_id: id.into(),
            event_type: "order.created".into(),
            state: state.into(),
            attempts,
            last_status: (attempts > 0).then_some(500),
            last_latency_ms: (attempts > 0).then_some(12.0),
            last_attempt_time: (attempts > 0).then(|| at("2026-12-01T11:59:00Z")),
            next_attempt_time: (state == "retrying").then(|| at("2026-12-01T12:00:30Z")),
        }
    }

    #[test]
    fn the_delivery_log_table() {
        let now = at("2026-12-01T12:00:00Z");
        let items = [
            delivery("01JA", "retrying", 2),
            delivery("01JB", "pending", 0),
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
    fn attempts_are_sorted_and_responses_cut_unless_wide() {
        let now = at("2026-12-01T12:00:00Z");
        let attempt = |n, response: &str| Attempt {
            attempt: n,
            time: Some(at("2026-12-01T11:00:00Z")),
            outcome: "HttpError".into(),
            status: Some(503),
            latency_ms: Some(1500.0),
            response: Some(response.into()),
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
        let a = Accepted {
            event_id: Some("01JX".into()),
            request_id: Some("r1".into()),
            count: None,
            event_ids: vec!["a".into(), "b".into()],
        };
        assert_eq!(
            accepted_message("redeliver", "orders", &a),
            "event 01JX queued for delivery to orders again, same webhook-id (request r1)"
        );
        assert_eq!(
            accepted_message("redrive-dead", "orders", &a),
            "2 dead deliveries of orders queued for delivery again (request r1)"
        );
        assert!(
            accepted_message("test", "orders", &a).contains("kubectl herald attempts orders 01JX")
        );
    }
}
