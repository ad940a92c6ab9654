//! `tail ENDPOINT`: new attempts as they happen, one line each, until Ctrl-C.
//!
//! Herald's API has no stream, so `tail` polls the delivery log: the pages of
//! deliveries whose events came after a moving `since` (the oldest delivery not yet
//! final, or the start), newest first, following cursors. [`Seen`] remembers how many
//! attempts of each delivery were printed, so every attempt prints once; when several
//! happened between two polls, the delivery's own attempts fill the gap. [`Backoff`]
//! polls fast while attempts arrive and slows down (to a bound) while nothing does or
//! the API refuses (honouring `Retry-After`). Both are pure.

use std::collections::HashMap;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

use crate::api::{Api, ApiError, Attempt, Delivery, Query};
use crate::table::{Output, line, snippet};
use crate::time::{TimeArg, millis};
use herald_core::api::time;

/// Attempts printed so far, per event id.
#[derive(Debug, Default)]
pub struct Seen {
    printed: HashMap<std::sync::Arc<str>, u32>,
}

/// What to print for one delivery of a poll.
#[derive(Debug, Clone, PartialEq)]
pub enum News {
    /// Its newest attempt (the only new one).
    Latest(Delivery),
    /// Attempts `from..=to` are new: more than the newest, fetch them.
    Several { delivery: Delivery, from: u32 },
}

impl Seen {
    /// Marks the deliveries as printed without printing them (the state at the start).
    pub fn baseline(&mut self, items: &[Delivery]) {
        for d in items {
            self.printed.insert(d.event_id.clone(), d.attempts);
        }
    }

    /// What is new in `items` (one poll, any order), oldest attempt first, and marks it
    /// printed.
    pub fn news(&mut self, items: &[Delivery]) -> Vec<News> {
        let mut news: Vec<News> = Vec::new();
        for d in items {
            let printed = self.printed.get(&d.event_id).copied().unwrap_or(0);
            if d.attempts <= printed {
                continue;
            }
            self.printed.insert(d.event_id.clone(), d.attempts);
            news.push(if d.attempts == printed + 1 {
                News::Latest(d.clone())
            } else {
                News::Several {
                    delivery: d.clone(),
                    from: printed + 1,
                }
            });
        }
        news.sort_by_key(|n| {
            let d = match n {
                News::Latest(d) | News::Several { delivery: d, .. } => d,
            };
            (d.last_attempt_time, d.event_id.clone())
        });
        news
    }
}

/// The wait between polls.
#[derive(Debug, Clone, PartialEq)]
pub struct Backoff {
    pub min: Duration,
    pub max: Duration,
    current: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max,
            current: min,
        }
    }

    /// The wait after a poll that printed something (`true`) or nothing.
    pub fn after_poll(&mut self, found: bool) -> Duration {
        self.current = if found {
            self.min
        } else {
            (self.current * 3 / 2).min(self.max)
        };
        self.current
    }

    /// The wait after a failed poll: doubled (bounded), or `Retry-After` when the API
    /// says so (still bounded by ten times the maximum).
    pub fn after_error(&mut self, retry_after: Option<u64>) -> Duration {
        self.current = (self.current * 2).min(self.max);
        match retry_after {
            Some(secs) => Duration::from_secs(secs).clamp(self.min, self.max * 10),
            None => self.current,
        }
    }
}

/// The columns of a tail line.
pub const HEADERS: [&str; 8] = [
    "TIME", "EVENT ID", "TYPE", "ATTEMPT", "STATE", "STATUS", "LATENCY", "RESPONSE",
];

fn widths() -> Vec<usize> {
    vec![20, 26, 16, 7, 9, 6, 7]
}

/// The header line.
pub fn header() -> String {
    line(&HEADERS.map(str::to_owned), &widths())
}

/// What one tail line shows of an attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub attempt: u32,
    pub time: Option<Timestamp>,
    /// For the newest attempt, the delivery's state; for older ones, their outcome.
    pub state: String,
    pub status: Option<u16>,
    pub latency_ms: Option<u64>,
    pub response: String,
}

impl Line {
    /// An attempt of `d` as the delivery's detail lists it; the newest shows the
    /// delivery's state.
    pub fn of(d: &Delivery, a: &Attempt, newest: bool) -> Self {
        Self {
            attempt: a.attempt,
            time: Some(a.time),
            state: if newest {
                d.state.to_string()
            } else {
                a.outcome.to_string()
            },
            status: a.status,
            latency_ms: Some(a.latency_ms),
            response: a.response.clone(),
        }
    }
}

/// One attempt's line.
pub fn attempt_line(d: &Delivery, a: &Line) -> String {
    line(
        &[
            a.time
                .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
                .unwrap_or_else(|| "-".into()),
            d.event_id.to_string(),
            d.event_type.clone().unwrap_or_default(),
            a.attempt.to_string(),
            a.state.clone(),
            a.status
                .map(|s| s.to_string())
                .unwrap_or_else(|| "-".into()),
            a.latency_ms.map(millis).unwrap_or_else(|| "-".into()),
            snippet(&a.response, 60),
        ],
        &widths(),
    )
}

/// The newest attempt of a delivery, from the log's summary.
pub fn latest_attempt(d: &Delivery) -> Line {
    Line {
        attempt: d.attempts,
        time: d.last_attempt_time,
        state: d.state.to_string(),
        status: d.last_status,
        latency_ms: d.last_latency_ms,
        response: String::new(),
    }
}

/// `tail`: polls until Ctrl-C.
pub async fn run(
    api: &Api,
    endpoint: &str,
    since: Option<TimeArg>,
    output: Output,
) -> Result<(), crate::Error> {
    let start = Timestamp::now();
    let from_start = since.map(|s| s.resolve(start));
    // Events published a little before an attempt are still looked at: the log's `since`
    // is about events, attempts come later.
    let window = SignedDuration::from_mins(10);
    let mut since = from_start.unwrap_or(start - window);
    let mut seen = Seen::default();
    if from_start.is_none() {
        seen.baseline(&poll(api, endpoint, since).await?);
    }
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(5));
    if output == Output::Table || output == Output::Wide {
        println!("{}", header());
    }
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let wait = match poll(api, endpoint, since).await {
            Ok(items) => {
                let news = seen.news(&items);
                let found = !news.is_empty();
                for n in news {
                    print_news(api, endpoint, n, output).await;
                }
                // Move `since` on, but keep every delivery that may still get attempts.
                let now = Timestamp::now();
                since = since.max(now - window);
                backoff.after_poll(found)
            }
            Err(crate::Error::Api(
                e @ ApiError::Status {
                    status: 401 | 403 | 404,
                    ..
                },
            )) => {
                return Err(e.into());
            }
            Err(e) => {
                let retry_after = match &e {
                    crate::Error::Api(api) => api.retry_after(),
                    _ => None,
                };
                let wait = backoff.after_error(retry_after);
                eprintln!("tail: {e}; polling again in {wait:?}");
                wait
            }
        };
        tokio::select! {
            _ = &mut ctrl_c => return Ok(()),
            () = tokio::time::sleep(wait) => {}
        }
    }
}

async fn print_news(api: &Api, endpoint: &str, news: News, output: Output) {
    let (delivery, attempts) = match news {
        News::Latest(d) => {
            let a = latest_attempt(&d);
            (d, vec![a])
        }
        News::Several { delivery, from } => {
            let attempts = match api.delivery(endpoint, &delivery.event_id).await {
                Ok((detail, _)) => {
                    let newest = detail.attempts.iter().map(|a| a.attempt).max();
                    detail
                        .attempts
                        .iter()
                        .filter(|a| a.attempt >= from)
                        .map(|a| Line::of(&delivery, a, Some(a.attempt) == newest))
                        .collect()
                }
                Err(_) => vec![latest_attempt(&delivery)],
            };
            (delivery, attempts)
        }
    };
    for a in attempts {
        match output {
            Output::Json | Output::Yaml => {
                let value = serde_json::json!({
                    "eventId": delivery.event_id, "type": delivery.event_type,
                    "attempt": a.attempt, "time": a.time.as_ref().map(time::format),
                    "state": a.state, "status": a.status, "latencyMs": a.latency_ms,
                });
                println!("{value}");
            }
            Output::Table | Output::Wide => println!("{}", attempt_line(&delivery, &a)),
        }
    }
}

/// Every delivery of events since `since`, all pages.
async fn poll(api: &Api, endpoint: &str, since: Timestamp) -> Result<Vec<Delivery>, crate::Error> {
    let mut query = Query {
        since: Some(since),
        limit: Some(500),
        ..Default::default()
    };
    let mut items = Vec::new();
    // Bounded: a tail does not read an unbounded log every half second.
    for _ in 0..20 {
        let (page, _) = api.deliveries(endpoint, &query).await?;
        items.extend(page.items);
        match page.next_cursor.filter(|c| !c.is_empty()) {
            Some(cursor) => query.cursor = Some(cursor),
            None => break,
        }
    }
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(id: &str, attempts: u32, secs: i64) -> Delivery {
        Delivery {
            event_id: id.into(),
            event_type: Some("t".into()),
            state: crate::api::State::Succeeded.into(),
            attempts,
            last_status: Some(200),
            last_latency_ms: Some(3),
            last_attempt_time: Some(Timestamp::from_second(1_800_000_000 + secs).unwrap()),
            next_attempt_time: None,
        }
    }

    #[test]
    fn every_attempt_is_news_once() {
        let mut seen = Seen::default();
        seen.baseline(&[d("old", 1, 0)]);
        assert!(
            seen.news(&[d("old", 1, 0)]).is_empty(),
            "the baseline is not news"
        );
        let news = seen.news(&[d("b", 1, 5), d("a", 1, 3), d("old", 2, 4)]);
        let ids: Vec<_> = news
            .iter()
            .map(|n| match n {
                News::Latest(d) => &*d.event_id,
                News::Several { .. } => panic!("one new attempt each: {n:?}"),
            })
            .collect();
        assert_eq!(ids, ["a", "old", "b"], "oldest attempt first");
        assert!(
            seen.news(&[d("b", 1, 5), d("a", 1, 3), d("old", 2, 4)])
                .is_empty()
        );
        // Three more attempts of `a` between two polls: the gap is filled.
        assert_eq!(
            seen.news(&[d("a", 4, 9)]),
            vec![News::Several {
                delivery: d("a", 4, 9),
                from: 2
            }]
        );
        // A delivery without attempts yet is not news.
        assert!(seen.news(&[d("p", 0, 0)]).is_empty());
    }

    #[test]
    fn backoff_is_fast_while_busy_and_bounded_while_idle_or_refused() {
        let (min, max) = (Duration::from_millis(500), Duration::from_secs(5));
        let mut b = Backoff::new(min, max);
        let idle: Vec<Duration> = (0..8).map(|_| b.after_poll(false)).collect();
        assert!(idle.windows(2).all(|w| w[0] <= w[1]), "{idle:?}");
        assert_eq!(*idle.last().unwrap(), max);
        assert_eq!(b.after_poll(true), min);
        assert_eq!(b.after_error(None), Duration::from_secs(1));
        for _ in 0..10 {
            assert!(b.after_error(None) <= max);
        }
        assert_eq!(
            b.after_error(Some(7)),
            Duration::from_secs(7),
            "Retry-After honoured"
        );
        assert_eq!(b.after_error(Some(3_600)), max * 10, "but bounded");
        assert_eq!(b.after_error(Some(0)), min);
    }

    #[test]
    fn lines_line_up_under_the_header() {
        let delivery = d("01JDXQ4Z7Y9T4K0ZB2C5W1V3HN", 1, 0);
        let text = attempt_line(&delivery, &latest_attempt(&delivery));
        let head = header();
        assert_eq!(head.find("EVENT ID"), text.find("01JDXQ"), "{head}\n{text}");
        assert!(text.starts_with("2027-01-15T08:00:00Z"), "{text}");
        assert!(text.contains("succeeded"), "{text}");
    }
}
