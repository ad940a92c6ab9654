//! Per-endpoint delivery state and the decisions made on it, without any I/O: which
//! lane goes next, whether an attempt may start (limit, circuit, `Retry-After`, rate,
//! pause, disable), and how an outcome moves the adaptive limit, the circuit breaker and
//! the failure clock. The shard runtime (`shard.rs`) does the I/O around it.
//!
//! An idle endpoint holds no buffer and no statistics window (both are allocated on
//! first use and released when drained), so it costs a few hundred bytes.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use herald_core::dataplane::{
    AttemptRecord, DeadReason, DeliveryState, DisabledReason, EndpointHealth, Lane, LastAttempt,
};
use herald_core::signing::SigningKey;
use herald_core::v1alpha1::{CircuitState, EndpointState as State};

use crate::http::{Outcome, Response};
use crate::index;

/// Initial adaptive concurrency limit (capped by the endpoint's `maxInFlight`).
pub const INITIAL_LIMIT: u32 = 4;

/// One delivery waiting or in flight.
#[derive(Debug, Clone)]
pub struct Item {
    /// Sequence in the deliveries stream.
    pub seq: u64,
    pub lane: Lane,
    pub event_id: Arc<str>,
    pub body: Bytes,
    pub published_ms: u64,
    /// The number of the attempt this item makes next (1 for a fresh event).
    pub attempt: u32,
    /// Unix milliseconds of the first attempt, for the retry deadline.
    pub first_attempt_ms: Option<u64>,
    /// In-place retry time (ordered endpoints keep a failed head here).
    pub not_before: Option<Instant>,
    /// Hash of the event's ordering key (`spec.orderingKey`), for ordered endpoints.
    pub ordering_key: Option<u64>,
}

/// One lane of an endpoint: a small in-memory window onto its JetStream subject.
#[derive(Debug, Default)]
pub struct LaneQueue {
    buf: VecDeque<Item>,
    /// First sequence not buffered (the rest of the backlog waits in JetStream).
    overflow_from: Option<u64>,
    unbuffered: u64,
    last_seen: u64,
    in_flight: BTreeSet<u64>,
    fetching: bool,
    purged_below: u64,
}

impl LaneQueue {
    /// Takes a message from the shard's consumer. Returns whether it was buffered; if not,
    /// it stays in JetStream and is fetched again when there is room.
    pub fn offer(&mut self, item: Item, cap: usize) -> bool {
        if item.seq <= self.last_seen {
            return false;
        }
        self.last_seen = item.seq;
        if self.overflow_from.is_some() || self.buf.len() >= cap {
            self.overflow_from.get_or_insert(item.seq);
            self.unbuffered += 1;
            return false;
        }
        self.buf.push_back(item);
        true
    }

    /// Where to continue reading the backlog from JetStream, if it is time to.
    pub fn refill_from(&mut self, cap: usize) -> Option<u64> {
        let from = self.overflow_from?;
        if self.fetching || self.buf.len() > cap / 2 {
            return None;
        }
        self.fetching = true;
        Some(from)
    }

    /// The newest sequence seen on this lane (a refill never reads past it).
    pub fn last_seen(&self) -> u64 {
        self.last_seen
    }

    /// Adds what a refill read; `next` is the sequence to continue from.
    pub fn refilled(&mut self, items: Vec<Item>, next: Option<u64>) {
        self.fetching = false;
        let Some(from) = self.overflow_from else {
            return;
        };
        for item in items.into_iter().filter(|i| i.seq >= from) {
            self.unbuffered = self.unbuffered.saturating_sub(1);
            self.buf.push_back(item);
        }
        self.overflow_from = next.filter(|n| *n <= self.last_seen);
        if self.overflow_from.is_none() {
            self.unbuffered = 0;
        }
    }

    /// The lowest sequence not yet done: everything below may be purged.
    pub fn low_water(&self) -> u64 {
        let mut low = self.last_seen + 1;
        if let Some(item) = self.buf.iter().map(|i| i.seq).min() {
            low = low.min(item);
        }
        if let Some(&seq) = self.in_flight.first() {
            low = low.min(seq);
        }
        if let Some(from) = self.overflow_from {
            low = low.min(from);
        }
        low
    }

    /// `Some(seq)` when the lane should be purged below `seq` (and records it as done).
    pub fn purge_point(&mut self) -> Option<u64> {
        let low = self.low_water();
        (low > self.purged_below && self.last_seen > 0).then(|| {
            self.purged_below = low;
            low
        })
    }

    pub fn pending(&self) -> u64 {
        self.buf.len() as u64 + self.in_flight.len() as u64 + self.unbuffered
    }

    fn oldest_published_ms(&self) -> Option<u64> {
        self.buf.iter().map(|i| i.published_ms).min()
    }

    fn release_idle_memory(&mut self) {
        if self.buf.is_empty() && self.buf.capacity() > 0 {
            self.buf = VecDeque::new();
        }
    }
}

/// Whether an endpoint can start an attempt now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    Ready(Lane),
    /// Not before this instant (Retry-After, circuit probe, rate limit, in-place retry).
    Until(Instant),
    /// Nothing to do until something changes (no work, at its limit, paused, disabled).
    Idle,
}

/// What the attempt task decided about the item.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Disposition {
    /// Delivered.
    Done,
    /// A retry was scheduled in JetStream (after this delay).
    Scheduled(Duration),
    /// Given up: retry budget spent or a final status.
    Dead(DeadReason),
    /// Keep the item and retry in place after the delay (ordered endpoints, or the
    /// schedule could not be published).
    Requeue(Duration),
}

#[derive(Debug, Clone, Default)]
struct Bucket {
    minute: u64,
    ok: u32,
    total: u32,
    /// Bucket i counts latencies below 2^i ms.
    latency: [u32; 17],
}

/// Five one-minute buckets: success rate and p95 over the last five minutes.
#[derive(Debug, Clone, Default)]
struct Window {
    buckets: [Bucket; 5],
}

impl Window {
    fn record(&mut self, now_ms: u64, ok: bool, latency_ms: u64) {
        let minute = now_ms / 60_000;
        let bucket = &mut self.buckets[(minute % 5) as usize];
        if bucket.minute != minute {
            *bucket = Bucket {
                minute,
                ..Default::default()
            };
        }
        bucket.total += 1;
        bucket.ok += u32::from(ok);
        let index = (64 - latency_ms.leading_zeros()).min(16) as usize;
        bucket.latency[index] += 1;
    }

    fn live(&self, now_ms: u64) -> impl Iterator<Item = &Bucket> {
        let minute = now_ms / 60_000;
        self.buckets
            .iter()
            .filter(move |b| b.total > 0 && minute.saturating_sub(b.minute) < 5)
    }

    fn success_permille(&self, now_ms: u64) -> Option<u32> {
        let (ok, total) = self.live(now_ms).fold((0u64, 0u64), |(o, t), b| {
            (o + u64::from(b.ok), t + u64::from(b.total))
        });
        (total > 0).then(|| (ok * 1000 / total) as u32)
    }

    fn p95_ms(&self, now_ms: u64) -> Option<u64> {
        let mut counts = [0u64; 17];
        for b in self.live(now_ms) {
            for (c, l) in counts.iter_mut().zip(b.latency) {
                *c += u64::from(l);
            }
        }
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let target = (total * 95).div_ceil(100);
        let mut seen = 0;
        for (i, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= target {
                return Some(1u64 << i);
            }
        }
        None
    }
}

/// Why and since when an endpoint is disabled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disabled {
    pub reason: DisabledReason,
    pub message: String,
    /// The enable token in force when it was disabled; a new one re-enables.
    pub token: Option<String>,
}

/// Everything the dispatcher keeps about one endpoint of an owned shard.
#[derive(Debug)]
pub struct EndpointState {
    /// `None` while the configuration is unknown: work is held, nothing is sent.
    pub ep: Option<Arc<index::Endpoint>>,
    pub keys: Option<Arc<[SigningKey]>>,
    pub lanes: [LaneQueue; 2],
    next_lane: usize,
    pub in_flight: u32,
    /// Ordering keys with an attempt in flight (ordered endpoints; unkeyed items share 0).
    keys_in_flight: Vec<u64>,
    pub limit: u32,
    success_run: u32,
    slow_run: u32,
    pub failure_streak: u32,
    pub circuit: CircuitState,
    probe_at: Option<Instant>,
    pub not_before: Option<Instant>,
    pub first_failure_ms: Option<u64>,
    pub disabled: Option<Disabled>,
    window: Option<Box<Window>>,
    pub last: Option<LastAttempt>,
    pub records: Vec<AttemptRecord>,
    pub health_written: Option<EndpointHealth>,
    pub health_at: Option<Instant>,
    /// In the shard's ready ring.
    pub queued: bool,
    tokens: f64,
    tokens_at: Option<Instant>,
}

fn lane_index(lane: Lane) -> usize {
    match lane {
        Lane::New => 0,
        Lane::Retry => 1,
    }
}

impl EndpointState {
    pub fn new(ep: Option<Arc<index::Endpoint>>, keys: Option<Arc<[SigningKey]>>) -> Self {
        let limit = ep.as_ref().map_or(INITIAL_LIMIT, |e| {
            INITIAL_LIMIT.min(e.config.delivery.max_in_flight.max(1))
        });
        Self {
            ep,
            keys,
            lanes: Default::default(),
            next_lane: 0,
            in_flight: 0,
            keys_in_flight: Vec::new(),
            limit,
            success_run: 0,
            slow_run: 0,
            failure_streak: 0,
            circuit: CircuitState::Closed,
            probe_at: None,
            not_before: None,
            first_failure_ms: None,
            disabled: None,
            window: None,
            last: None,
            records: Vec::new(),
            health_written: None,
            health_at: None,
            queued: false,
            tokens: 0.0,
            tokens_at: None,
        }
    }

    /// Applies a new configuration, keeping delivery state. Returns whether the endpoint
    /// was re-enabled by a new enable token.
    pub fn configure(&mut self, ep: Option<Arc<index::Endpoint>>) -> bool {
        let token = ep.as_ref().and_then(|e| e.config.enable_token.clone());
        if let Some(ep) = &ep {
            self.limit = self.limit.clamp(1, ep.config.delivery.max_in_flight.max(1));
        }
        self.ep = ep;
        match &self.disabled {
            Some(d) if token.is_some() && d.token != token => {
                self.disabled = None;
                self.first_failure_ms = None;
                self.failure_streak = 0;
                self.circuit = CircuitState::Closed;
                true
            }
            _ => false,
        }
    }

    pub fn lane(&mut self, lane: Lane) -> &mut LaneQueue {
        &mut self.lanes[lane_index(lane)]
    }

    /// Buffer size per lane: enough to keep the limit busy, never more than 64.
    pub fn buffer_cap(&self) -> usize {
        let max = self
            .ep
            .as_ref()
            .map_or(8, |e| e.config.delivery.max_in_flight as usize);
        (2 * max).clamp(4, 64)
    }

    fn is_ordered(&self) -> bool {
        self.ep.as_ref().is_some_and(|e| e.config.ordered)
    }

    pub fn readiness(&mut self, now: Instant) -> Readiness {
        let Some(ep) = &self.ep else {
            return Readiness::Idle;
        };
        if ep.config.paused || self.disabled.is_some() || self.keys.is_none() {
            return Readiness::Idle;
        }
        if let Some(at) = self.not_before {
            if at > now {
                return Readiness::Until(at);
            }
            self.not_before = None;
        }
        let mut limit = self.limit;
        match self.circuit {
            CircuitState::Closed => {}
            CircuitState::HalfOpen => limit = 1,
            CircuitState::Open => match self.probe_at {
                Some(at) if at > now => return Readiness::Until(at),
                _ => limit = 1,
            },
        }
        if self.in_flight >= limit {
            return Readiness::Idle;
        }
        if let Some(rate) = &ep.config.delivery.rate_limit {
            let per_second = f64::from(rate.per_second);
            let burst = f64::from(rate.burst.unwrap_or(rate.per_second));
            let last = self.tokens_at.unwrap_or(now);
            if self.tokens_at.is_none() {
                self.tokens = burst;
            }
            self.tokens =
                (self.tokens + now.duration_since(last).as_secs_f64() * per_second).min(burst);
            self.tokens_at = Some(now);
            if self.tokens < 1.0 {
                let wait = Duration::from_secs_f64((1.0 - self.tokens) / per_second);
                return Readiness::Until(now + wait);
            }
        }
        if ep.config.ordered {
            return match self.next_ordered(now) {
                Ok(_) => Readiness::Ready(Lane::New),
                // Retries scheduled before the endpoint became ordered still go out.
                _ if self.lanes[1].buf.front().is_some() => Readiness::Ready(Lane::Retry),
                Err(Some(at)) => Readiness::Until(at),
                Err(None) => Readiness::Idle,
            };
        }
        let mut wait: Option<Instant> = None;
        for i in 0..2 {
            let index = (self.next_lane + i) % 2;
            if let Some(front) = self.lanes[index].buf.front() {
                match front.not_before {
                    Some(at) if at > now => wait = Some(wait.map_or(at, |w| w.min(at))),
                    _ => return Readiness::Ready(if index == 0 { Lane::New } else { Lane::Retry }),
                }
            }
        }
        wait.map_or(Readiness::Idle, Readiness::Until)
    }

    /// For ordered endpoints: the buffer position of the oldest item whose ordering key
    /// has nothing in flight and no older item waiting, or when to look again. Everything
    /// of an ordered endpoint travels on its fresh lane (retries stay in place).
    fn next_ordered(&self, now: Instant) -> Result<usize, Option<Instant>> {
        let mut blocked: Vec<u64> = self.keys_in_flight.clone();
        let mut wait: Option<Instant> = None;
        for (i, item) in self.lanes[0].buf.iter().enumerate() {
            let key = item.ordering_key.unwrap_or(0);
            if blocked.contains(&key) {
                continue;
            }
            match item.not_before {
                Some(at) if at > now => {
                    wait = Some(wait.map_or(at, |w| w.min(at)));
                    blocked.push(key);
                }
                _ => return Ok(i),
            }
        }
        Err(wait)
    }

    /// Takes the next item of `lane` for an attempt.
    pub fn start(&mut self, lane: Lane, now: Instant) -> Option<Item> {
        let index = lane_index(lane);
        let item = if self.is_ordered() && lane == Lane::New {
            let position = self.next_ordered(now).ok()?;
            let item = self.lanes[index].buf.remove(position)?;
            self.keys_in_flight.push(item.ordering_key.unwrap_or(0));
            item
        } else {
            self.lanes[index].buf.pop_front()?
        };
        self.lanes[index].in_flight.insert(item.seq);
        self.in_flight += 1;
        // Alternate lanes so retries and replays share capacity with fresh events.
        self.next_lane = (index + 1) % 2;
        if self.circuit == CircuitState::Open {
            self.circuit = CircuitState::HalfOpen;
        }
        if self.tokens_at.is_some() {
            self.tokens -= 1.0;
        }
        Some(item)
    }

    /// Records an attempt's result. `item` comes back for in-place retries.
    pub fn finish(
        &mut self,
        mut item: Item,
        response: &Response,
        disposition: Disposition,
        now: Instant,
        now_ms: u64,
    ) {
        let index = lane_index(item.lane);
        self.lanes[index].in_flight.remove(&item.seq);
        self.in_flight = self.in_flight.saturating_sub(1);
        if let Some(at) = self
            .keys_in_flight
            .iter()
            .position(|k| *k == item.ordering_key.unwrap_or(0))
        {
            self.keys_in_flight.swap_remove(at);
        }
        let Some(ep) = self.ep.clone() else {
            return;
        };
        let delivery = &ep.config.delivery;
        let outcome = response.outcome;
        let latency_ms = response.latency.as_millis() as u64;
        self.window.get_or_insert_with(Default::default).record(
            now_ms,
            outcome == Outcome::Success,
            latency_ms,
        );
        self.last = Some(LastAttempt {
            event_id: item.event_id.to_string(),
            http_status: response.status,
            outcome,
            latency_ms,
            time_ms: now_ms,
        });
        let (state, next_attempt_ms, dead_reason) = match disposition {
            Disposition::Done => (DeliveryState::Succeeded, None, None),
            Disposition::Dead(reason) => (DeliveryState::Dead, None, Some(reason)),
            Disposition::Scheduled(d) | Disposition::Requeue(d) => (
                DeliveryState::Retrying,
                Some(now_ms + d.as_millis() as u64),
                None,
            ),
        };
        self.records.push(AttemptRecord {
            event_id: item.event_id.clone(),
            attempt: item.attempt,
            time_ms: now_ms,
            outcome,
            http_status: response.status,
            latency_ms,
            response: response.snippet.clone(),
            state,
            next_attempt_ms,
            dead_reason,
        });
        if outcome == Outcome::Success {
            if self.circuit != CircuitState::Closed {
                self.limit = INITIAL_LIMIT.min(delivery.max_in_flight.max(1));
            }
            self.circuit = CircuitState::Closed;
            self.failure_streak = 0;
            self.first_failure_ms = None;
            // Slow but successful: lower the limit before anything fails.
            let slow = response.latency.as_secs_f64() > 0.8 * delivery.timeout.get().as_secs_f64();
            if slow {
                self.success_run = 0;
                self.slow_run += 1;
                if self.slow_run >= self.limit {
                    self.slow_run = 0;
                    self.limit = self.limit.saturating_sub(1).max(1);
                }
            } else {
                self.slow_run = 0;
                self.success_run += 1;
                if self.success_run >= self.limit {
                    self.success_run = 0;
                    self.limit = (self.limit + 1).min(delivery.max_in_flight.max(1));
                }
            }
        } else {
            self.failure_streak += 1;
            self.success_run = 0;
            let first = *self.first_failure_ms.get_or_insert(now_ms);
            if matches!(outcome, Outcome::Timeout | Outcome::RateLimited)
                || response.status.is_some_and(|s| s >= 500)
            {
                self.limit = (self.limit / 2).max(1);
            }
            let probe = delivery.circuit_breaker.probe_interval.get();
            if self.circuit == CircuitState::HalfOpen
                || (self.circuit == CircuitState::Closed
                    && self.failure_streak >= delivery.circuit_breaker.failure_threshold)
            {
                self.circuit = CircuitState::Open;
                self.probe_at = Some(now + probe);
            }
            if outcome == Outcome::RateLimited
                && let Some(after) = response.retry_after
            {
                let until = now + after.min(crate::retry::MAX_RETRY_AFTER);
                self.not_before = Some(self.not_before.map_or(until, |t| t.max(until)));
            }
            if outcome == Outcome::Gone && delivery.disable_on_gone {
                self.disable(DisabledReason::Gone, "the receiver answered 410 Gone".to_owned());
            } else if now_ms.saturating_sub(first)
                >= delivery.disable_after.get().as_millis() as u64
            {
                self.disable(
                    DisabledReason::SustainedFailure,
                    format!(
                        "no successful delivery for {} (spec.delivery.disableAfter)",
                        delivery.disable_after
                    ),
                );
            }
        }
        if let Disposition::Requeue(delay) = disposition {
            item.not_before = Some(now + delay);
            item.attempt += 1;
            item.first_attempt_ms
                .get_or_insert(now_ms.saturating_sub(latency_ms));
            self.lanes[index].buf.push_front(item);
        }
        for lane in &mut self.lanes {
            lane.release_idle_memory();
        }
    }

    fn disable(&mut self, reason: DisabledReason, message: String) {
        if self.disabled.is_none() {
            let token = self.ep.as_ref().and_then(|e| e.config.enable_token.clone());
            self.disabled = Some(Disabled {
                reason,
                message,
                token,
            });
        }
    }

    pub fn pending(&self) -> u64 {
        self.lanes.iter().map(LaneQueue::pending).sum()
    }

    /// The health record to report, given the current time.
    pub fn health(&self, now_ms: u64) -> Option<EndpointHealth> {
        let ep = self.ep.as_ref()?;
        let success = self
            .window
            .as_ref()
            .and_then(|w| w.success_permille(now_ms));
        let p95 = self.window.as_ref().and_then(|w| w.p95_ms(now_ms));
        let timeout_ms = ep.config.delivery.timeout.get().as_millis() as u64;
        let state = if self.disabled.is_some() {
            State::Disabled
        } else if ep.config.paused {
            State::Paused
        } else if self.circuit != CircuitState::Closed
            || self.failure_streak > 0
            || success.is_some_and(|s| s < 950)
            || p95.is_some_and(|p| p * 10 > timeout_ms * 8)
        {
            State::Degraded
        } else {
            State::Active
        };
        Some(EndpointHealth {
            uid: ep.config.uid.clone(),
            generation: ep.config.generation,
            shard: ep.config.shard,
            state: Some(state),
            circuit: Some(self.circuit),
            concurrency_limit: Some(if ep.config.ordered && ep.config.ordering_key.is_none() {
                1
            } else {
                self.limit
            }),
            backlog: Some(self.pending()),
            oldest_pending_ms: self
                .lanes
                .iter()
                .filter_map(LaneQueue::oldest_published_ms)
                .min(),
            last_delivery: self.last.clone(),
            success_permille: success,
            p95_latency_ms: p95,
            first_failure_ms: self.first_failure_ms,
            disabled_reason: self.disabled.as_ref().map(|d| d.reason),
            disabled_message: self.disabled.as_ref().map(|d| d.message.clone()),
            enable_token: self.disabled.as_ref().and_then(|d| d.token.clone()),
        })
    }

    /// Whether the state holds nothing worth keeping beyond the configuration.
    pub fn is_idle(&self) -> bool {
        self.in_flight == 0 && self.pending() == 0 && self.records.is_empty()
    }

    pub fn is_ordered_endpoint(&self) -> bool {
        self.is_ordered()
    }
}

#[cfg(test)]
mod tests;
