//! The delivery log as a tenant reads it: one endpoint's attempt records and queued lane
//! messages folded into one summary per event, filtered and paged. Pure: the records,
//! the lane entries and the time come in; [`crate::log`] reads them from NATS.
//!
//! A delivery's state is derived from what the data plane stores, nothing else:
//! - `pending`: queued in a lane, no attempt logged yet;
//! - `inFlight`: attempted before and back in the pipeline: its retry is due (the
//!   newest record is `retrying` and its next attempt time has passed) or it was queued
//!   again after its newest record (a fired retry, a redelivery, a replay);
//! - `succeeded`, `retrying`, `dead`: the newest record, nothing queued since.
//!
//! An attempt under way is invisible until it ends (records are written when an attempt
//! finishes, batched about once a second), so `pending` and `inFlight` include the
//! attempt being made right now.
//!
//! Pages are ordered newest event first (event ids sort by publish time). The cursor
//! holds the position (the last id returned) and the log's state when the first page was
//! read (the highest attempt-log and lane sequences): later pages fold only what was
//! there then, so new attempts arriving meanwhile can neither repeat an event nor skip
//! one, and each event keeps the state it had at the first page.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use herald_core::api::{Delivery, State, time};
use herald_core::dataplane::{AttemptRecord, DeliveryState, event_published_ms};
use herald_core::pattern::Pattern;

use crate::error::ApiError;

/// The states a `status` filter's word selects.
fn parse_state(text: &str) -> Option<&'static [State]> {
    Some(match text {
        "pending" => &[State::Pending],
        "inFlight" => &[State::InFlight],
        "succeeded" => &[State::Succeeded],
        "retrying" => &[State::Retrying],
        "dead" => &[State::Dead],
        // Everything that did not (yet) succeed after an attempt.
        "failed" => &[State::Retrying, State::Dead],
        _ => return None,
    })
}

/// One attempt-log record and its sequence in the attempt log.
#[derive(Clone)]
pub struct Logged {
    pub seq: u64,
    pub record: AttemptRecord,
}

/// One message on the endpoint's lanes: an event queued for it.
#[derive(Clone)]
pub struct Queued {
    pub seq: u64,
    pub event_id: Arc<str>,
    pub event_type: Option<String>,
    pub published_ms: u64,
}

/// What a list asks for.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub states: Option<Vec<State>>,
    pub event_type: Option<Pattern>,
    /// Publish time bounds, Unix ms, inclusive.
    pub since_ms: Option<u64>,
    pub until_ms: Option<u64>,
}

impl Filter {
    pub fn states(text: &str) -> Result<Vec<State>, ApiError> {
        let mut states = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let parsed = parse_state(part).ok_or_else(|| {
                ApiError::bad_request(
                    "InvalidStatus",
                    format!(
                        "status {part:?} is not one of pending, inFlight, succeeded, retrying, dead, failed"
                    ),
                )
            })?;
            states.extend_from_slice(parsed);
        }
        Ok(states)
    }

    /// Whether a delivery of an event published at `published_ms`, in `state`, of
    /// `event_type`, is one the filter takes.
    fn takes(&self, published_ms: u64, state: State, event_type: Option<&str>) -> bool {
        self.states.as_ref().is_none_or(|s| s.contains(&state))
            && self
                .event_type
                .as_ref()
                .is_none_or(|p| event_type.is_some_and(|t| p.matches(t)))
            && self.since_ms.is_none_or(|s| published_ms >= s)
            && self.until_ms.is_none_or(|u| published_ms <= u)
    }
}

/// The log's state a listing is read at, and the position in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cursor {
    /// Highest attempt-log sequence folded into states.
    pub attempts_seq: u64,
    /// Highest lane sequence folded into states.
    pub lanes_seq: u64,
    /// The last event id of the previous page (`None`: the first page).
    pub after: Option<String>,
}

impl Cursor {
    pub fn encode(&self) -> String {
        format!(
            "v1.{}.{}.{}",
            self.attempts_seq,
            self.lanes_seq,
            self.after.as_deref().unwrap_or("")
        )
    }

    pub fn decode(text: &str) -> Result<Self, ApiError> {
        let bad = || {
            ApiError::bad_request(
                "InvalidCursor",
                "cursor is not one this API returned as nextCursor",
            )
        };
        let mut parts = text.splitn(4, '.');
        (parts.next() == Some("v1")).then_some(()).ok_or_else(bad)?;
        let attempts_seq = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let lanes_seq = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let after = parts.next().ok_or_else(bad)?;
        if after.is_empty() || event_published_ms(after).is_none() {
            return Err(bad());
        }
        Ok(Self {
            attempts_seq,
            lanes_seq,
            after: Some(after.to_owned()),
        })
    }
}

/// One page and the cursor of the next, if any.
pub struct Page {
    pub items: Vec<Delivery>,
    pub next: Option<Cursor>,
}

/// What a listing keeps of an event's newest record (not its response snippet).
#[derive(Clone, Copy)]
struct Brief {
    seq: u64,
    state: DeliveryState,
    http_status: Option<u16>,
    latency_ms: u64,
    time_ms: u64,
    next_attempt_ms: Option<u64>,
}

/// What a listing keeps of one event: about 100 bytes, no allocation of its own (the
/// type is shared by every event of that type).
#[derive(Default)]
struct Acc {
    event_type: Option<Arc<str>>,
    newest: Option<Brief>,
    attempts: u32,
    queued_ms: u64,
}

/// Records and queued messages folded into one summary per event as they are read, in
/// any order (the newest record is the one with the highest log sequence). Events a
/// page cannot hold — at or after the cursor's position, outside the filter's time
/// bounds, ids that are not Herald's — are not kept. Records and messages above the
/// cursor's sequences still make an event listed (it was queued when the first page was
/// read) but do not change its state.
pub struct Fold<'a> {
    at: &'a Cursor,
    after: Option<u128>,
    since_ms: u64,
    until_ms: u64,
    /// By the event id's ULID.
    by_id: HashMap<u128, Acc>,
    types: HashSet<Arc<str>>,
}

fn ulid_of(event_id: &str) -> Option<u128> {
    Some(event_id.strip_prefix("msg_")?.parse::<ulid::Ulid>().ok()?.0)
}

fn published_of(ulid: u128) -> u64 {
    ulid::Ulid(ulid).timestamp_ms()
}

impl<'a> Fold<'a> {
    pub fn new(at: &'a Cursor, filter: &Filter) -> Self {
        Self {
            at,
            after: at.after.as_deref().and_then(ulid_of),
            since_ms: filter.since_ms.unwrap_or(0),
            until_ms: filter.until_ms.unwrap_or(u64::MAX),
            by_id: HashMap::new(),
            types: HashSet::new(),
        }
    }

    fn entry(&mut self, id: &str, event_type: Option<&str>) -> Option<&mut Acc> {
        let ulid = ulid_of(id)?;
        let wanted = self.after.is_none_or(|after| ulid < after)
            && (self.since_ms..=self.until_ms).contains(&published_of(ulid));
        if !wanted {
            return None;
        }
        let acc = self.by_id.entry(ulid).or_default();
        if acc.event_type.is_none()
            && let Some(ty) = event_type
        {
            let shared = match self.types.get(ty) {
                Some(shared) => shared.clone(),
                None => {
                    let shared: Arc<str> = Arc::from(ty);
                    self.types.insert(shared.clone());
                    shared
                }
            };
            acc.event_type = Some(shared);
        }
        Some(acc)
    }

    /// Folds in one record and its attempt-log sequence.
    pub fn record(&mut self, seq: u64, record: AttemptRecord) {
        let counts = seq <= self.at.attempts_seq;
        let Some(acc) = self.entry(&record.event_id, record.event_type.as_deref()) else {
            return;
        };
        if counts {
            acc.attempts += 1;
            if acc.newest.is_none_or(|n| n.seq <= seq) {
                acc.newest = Some(Brief {
                    seq,
                    state: record.state,
                    http_status: record.http_status,
                    latency_ms: record.latency_ms,
                    time_ms: record.time_ms,
                    next_attempt_ms: record.next_attempt_ms,
                });
            }
        }
    }

    /// Folds in one message queued on the endpoint's lanes.
    pub fn queued(&mut self, q: Queued) {
        let counts = q.seq <= self.at.lanes_seq;
        let Some(acc) = self.entry(&q.event_id, q.event_type.as_deref()) else {
            return;
        };
        if counts {
            acc.queued_ms = acc.queued_ms.max(q.published_ms);
        }
    }

    /// How many events published at or after `complete_from_ms` the filter takes: once
    /// the log is read back to that time, their summaries are final.
    pub fn complete(&self, filter: &Filter, complete_from_ms: u64, now_ms: u64) -> usize {
        self.by_id
            .iter()
            .filter(|(id, acc)| {
                let published = published_of(**id);
                published >= complete_from_ms
                    && filter.takes(published, state(acc, now_ms), acc.event_type.as_deref())
            })
            .count()
    }

    /// The page of events published at or after `complete_from_ms` (0: all) that the
    /// filter takes, newest event first; only the page's summaries are built.
    pub fn page(self, filter: &Filter, complete_from_ms: u64, limit: usize, now_ms: u64) -> Page {
        let mut ids: Vec<u128> = self
            .by_id
            .keys()
            .copied()
            .filter(|id| published_of(*id) >= complete_from_ms)
            .collect();
        ids.sort_unstable_by(|a, b| b.cmp(a));
        let at = self.at;
        let items = ids.into_iter().filter_map(|id| {
            let acc = &self.by_id[&id];
            let published = published_of(id);
            filter
                .takes(published, state(acc, now_ms), acc.event_type.as_deref())
                .then(|| delivery(format!("msg_{}", ulid::Ulid(id)).into(), acc, now_ms))
        });
        paginate(items, at, limit)
    }

    /// Every summary, newest event first.
    fn deliveries(self, now_ms: u64) -> Vec<Delivery> {
        let mut ids: Vec<u128> = self.by_id.keys().copied().collect();
        ids.sort_unstable_by(|a, b| b.cmp(a));
        ids.into_iter()
            .map(|id| {
                delivery(
                    format!("msg_{}", ulid::Ulid(id)).into(),
                    &self.by_id[&id],
                    now_ms,
                )
            })
            .collect()
    }
}

fn state(acc: &Acc, now_ms: u64) -> State {
    let newest = acc.newest.as_ref();
    let queued_after = acc.queued_ms > 0 && newest.is_none_or(|r| acc.queued_ms > r.time_ms);
    match newest {
        None => State::Pending,
        Some(_) if queued_after => State::InFlight,
        Some(r) => match r.state {
            DeliveryState::Succeeded => State::Succeeded,
            DeliveryState::Dead => State::Dead,
            DeliveryState::Retrying if r.next_attempt_ms.is_some_and(|n| n <= now_ms) => {
                State::InFlight
            }
            DeliveryState::Retrying => State::Retrying,
        },
    }
}

fn delivery(event_id: Arc<str>, acc: &Acc, now_ms: u64) -> Delivery {
    let newest = acc.newest.as_ref();
    Delivery {
        event_id,
        event_type: acc.event_type.as_deref().map(str::to_owned),
        state: state(acc, now_ms).into(),
        attempts: acc.attempts,
        last_status: newest.and_then(|r| r.http_status),
        last_latency_ms: newest.map(|r| r.latency_ms),
        last_attempt_time: newest.map(|r| time::from_ms(r.time_ms)),
        next_attempt_time: newest
            .filter(|r| r.state == DeliveryState::Retrying)
            .and_then(|r| r.next_attempt_ms)
            .map(time::from_ms),
    }
}

/// Every record and queued message folded (a test's and a lookup's whole set).
pub fn summarize(
    records: Vec<Logged>,
    queued: Vec<Queued>,
    at: &Cursor,
    now_ms: u64,
) -> Vec<Delivery> {
    let everything = Cursor {
        after: None,
        ..at.clone()
    };
    let mut fold = Fold::new(&everything, &Filter::default());
    for Logged { seq, record } in records {
        fold.record(seq, record);
    }
    queued.into_iter().for_each(|q| fold.queued(q));
    fold.deliveries(now_ms)
}

/// The first `limit` of `items` (in page order) and the cursor after them when more
/// follow.
fn paginate(items: impl Iterator<Item = Delivery>, at: &Cursor, limit: usize) -> Page {
    let mut items: Vec<Delivery> = items.take(limit + 1).collect();
    let more = items.len() > limit;
    items.truncate(limit);
    let next = (more && !items.is_empty()).then(|| Cursor {
        after: items.last().map(|d| d.event_id.to_string()),
        ..at.clone()
    });
    Page { items, next }
}

#[cfg(test)]
#[path = "deliveries_tests.rs"]
mod tests;
