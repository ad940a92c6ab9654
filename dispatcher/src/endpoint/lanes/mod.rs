//! An endpoint's two lanes (fresh events, due retries) as small in-memory windows onto
//! their JetStream subjects, and the choice of what to start next: lanes alternate so
//! retries and replays share capacity with fresh events; ordered endpoints start the
//! oldest item whose ordering key has nothing in flight.
//!
//! Contract: a lane never forgets a sequence it has seen and not finished — the
//! low-water mark (lowest sequence not done) is what the shard purges below, so a
//! sequence that is neither buffered, in flight nor remembered as unbuffered backlog
//! would be deleted undelivered. A lane knows the bytes it buffers
//! ([`LaneQueue::bytes`]: bodies plus [`ITEM_BYTES`] each), so the shard can bound what
//! all its lanes hold ([`LaneQueue::shed`] gives back the newest items to JetStream).

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use herald_core::dataplane::Lane;

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
    /// The uid of the endpoint the message was written for, when the message says:
    /// FNV-1a of that uid (no allocation per delivery).
    pub endpoint_uid: Option<u64>,
    /// The uid of the `WebhookReplay` that enqueued the item (`Herald-Replay`), carried
    /// forward by its retries.
    pub replay: Option<Arc<str>>,
}

impl Item {
    /// Whether the item is a retry schedule that fired (it counts down the endpoint's
    /// waiting schedules): a retry-lane item after a first attempt. A replay's own
    /// enqueue lands on the retry lane as attempt 1 and was never scheduled.
    pub fn fired_retry(&self) -> bool {
        self.lane == Lane::Retry && self.attempt > 1
    }
}

/// One lane of an endpoint: a small in-memory window onto its JetStream subject.
#[derive(Debug, Default)]
pub struct LaneQueue {
    buf: VecDeque<Item>,
    /// What `buf` holds, as [`weight`]s.
    bytes: usize,
    /// First sequence not buffered (the rest of the backlog waits in JetStream).
    overflow_from: Option<u64>,
    unbuffered: u64,
    last_seen: u64,
    in_flight: BTreeSet<u64>,
    fetching: bool,
    purged_below: u64,
    /// Items finished since the last purge: a busy lane is purged early (see
    /// [`LaneQueue::early_purge_point`]), so a crash redelivers little of it.
    done_since_purge: u32,
}

/// A busy lane is purged once this many of its items are done (and at least
/// [`EARLY_PURGE_GAP`] after its last purge) instead of waiting for the once-a-second
/// purge: what a crash delivers again is then what was in flight plus at most this many
/// items per lane (or a second's worth, whichever is less), at a cost of at most one purge
/// per this many deliveries.
pub const EARLY_PURGE_ITEMS: u32 = 256;
/// The shortest time between two purges of one lane.
pub const EARLY_PURGE_GAP: std::time::Duration = std::time::Duration::from_millis(100);

/// What an item costs in memory besides its body: the `Item` itself, its event id and
/// the buffer's slot (a round figure; the shard's budget is in these units).
pub const ITEM_BYTES: usize = 192;

/// The memory an item holds while buffered.
fn weight(item: &Item) -> usize {
    item.body.len() + ITEM_BYTES
}

/// A refill to run: read the lane's subject from `from` up to `until`, at most `room`
/// items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefillRange {
    pub from: u64,
    pub until: u64,
    pub room: usize,
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
        self.bytes += weight(&item);
        self.buf.push_back(item);
        true
    }

    /// Bytes of the buffered items (see [`ITEM_BYTES`]).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Items buffered.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Keeps at most `cap` items in memory: the newest of the others go back to
    /// JetStream (read again by a refill when there is room). Only when the buffer is in
    /// sequence order, so that everything from the first item given back on is
    /// unbuffered, as a refill expects; an in-place retry at the head can break that
    /// order, and the lane then keeps its items until it is in order again.
    pub fn shed(&mut self, cap: usize) {
        if self.buf.len() <= cap || self.fetching {
            return;
        }
        let in_order = self
            .buf
            .iter()
            .zip(self.buf.iter().skip(1))
            .all(|(a, b)| a.seq < b.seq);
        if !in_order {
            return;
        }
        let mut first_shed = None;
        while self.buf.len() > cap {
            let Some(item) = self.buf.pop_back() else {
                break;
            };
            self.bytes = self.bytes.saturating_sub(weight(&item));
            self.unbuffered += 1;
            first_shed = Some(item.seq);
        }
        if let Some(seq) = first_shed {
            self.overflow_from = Some(self.overflow_from.map_or(seq, |from| from.min(seq)));
        }
    }

    /// What to read back from JetStream, if it is time to (the buffer is at most half
    /// full and no refill is running).
    pub fn refill(&mut self, cap: usize) -> Option<RefillRange> {
        let from = self.overflow_from?;
        if self.fetching || self.buf.len() > cap / 2 {
            return None;
        }
        self.fetching = true;
        // Room in memory, not in the backlog (which is what is being read).
        let room = cap.saturating_sub(self.buf.len()).max(1);
        Some(RefillRange {
            from,
            until: self.last_seen,
            room,
        })
    }

    /// Adds what a refill of `range` read; `next` is where it stopped, `None` when it
    /// read everything up to `range.until`. Messages that arrived while it ran (beyond
    /// `range.until`) stay remembered as backlog.
    pub fn refilled(&mut self, range: RefillRange, items: Vec<Item>, next: Option<u64>) {
        self.fetching = false;
        let Some(from) = self.overflow_from else {
            return;
        };
        for item in items.into_iter().filter(|i| i.seq >= from) {
            self.unbuffered = self.unbuffered.saturating_sub(1);
            self.bytes += weight(&item);
            self.buf.push_back(item);
        }
        let resume = next.unwrap_or(range.until + 1);
        self.overflow_from = (resume <= self.last_seen).then_some(resume);
        if self.overflow_from.is_none() {
            self.unbuffered = 0;
        }
    }

    /// A refill failed: try again later from the same place.
    pub fn refill_failed(&mut self) {
        self.fetching = false;
    }

    /// The newest sequence seen on this lane.
    pub fn last_seen(&self) -> u64 {
        self.last_seen
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

    /// Where the lane of a deleted endpoint whose uid was `uid` may be purged up to
    /// (exclusive): everything it has seen, up to the first item it cannot tell was the
    /// deleted endpoint's — one written for a re-created endpoint of the same name (another
    /// uid), or one still unread in JetStream. An item of the deleted endpoint beyond it is
    /// dropped when it is read (its uid is not the endpoint's).
    pub fn removal_bound(&self, uid: Option<u64>) -> u64 {
        let mut bound = self.last_seen + 1;
        if let Some(from) = self.overflow_from {
            bound = bound.min(from);
        }
        let foreign = self
            .buf
            .iter()
            .filter(|i| uid.is_none() || i.endpoint_uid != uid)
            .map(|i| i.seq)
            .min();
        bound.min(foreign.unwrap_or(u64::MAX))
    }

    /// `Some(seq)` when the lane should be purged below `seq` (and records it as done).
    pub fn purge_point(&mut self) -> Option<u64> {
        let low = self.low_water();
        (low > self.purged_below && self.last_seen > 0).then(|| {
            self.purged_below = low;
            self.done_since_purge = 0;
            low
        })
    }

    /// [`Self::purge_point`] when enough items are done since the last purge.
    pub fn early_purge_point(&mut self) -> Option<u64> {
        if self.done_since_purge < EARLY_PURGE_ITEMS {
            return None;
        }
        self.purge_point()
    }

    /// Deliveries waiting or in flight on this lane.
    pub fn pending(&self) -> u64 {
        self.buf.len() as u64 + self.in_flight.len() as u64 + self.unbuffered
    }

    fn oldest_published_ms(&self) -> Option<u64> {
        self.buf.iter().map(|i| i.published_ms).min()
    }

    fn release_idle_memory(&mut self) {
        if self.buf.is_empty() {
            self.bytes = 0;
            if self.buf.capacity() > 0 {
                self.buf = VecDeque::new();
            }
        }
    }
}

/// The earlier of two times to look again.
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn index(lane: Lane) -> usize {
    match lane {
        Lane::New => 0,
        Lane::Retry => 1,
    }
}

/// Both lanes of an endpoint and what is in flight.
#[derive(Debug, Default)]
pub struct Lanes {
    queues: [LaneQueue; 2],
    next: u8,
    /// Ordering keys with an attempt in flight, by the item's sequence (ordered
    /// endpoints; unkeyed items share key 0), whichever lane the item came from.
    keys_in_flight: Vec<(u64, u64)>,
}

impl Lanes {
    pub fn queue(&mut self, lane: Lane) -> &mut LaneQueue {
        &mut self.queues[index(lane)]
    }

    pub fn queue_ref(&self, lane: Lane) -> &LaneQueue {
        &self.queues[index(lane)]
    }

    /// The lane to start from now, or when to look again (`Err(None)`: nothing to do).
    ///
    /// An ordered endpoint has one attempt in flight per ordering key (one in all without
    /// keys) across both lanes: a replay, a redelivery, a redrive, a test event or a
    /// retry scheduled before the endpoint became ordered waits like a fresh event for
    /// what is in flight of its key, and keeps its own schedule (`not_before`). Its fresh
    /// events go first; an item of the retry lane goes when no fresh item can. An item
    /// enqueued on the retry lane (not a fired retry) also waits for every fresh item
    /// stored before it: a replay is enqueued only once fan-out has passed its events
    /// (`replay::scan`), so a replayed event reaches the receiver after its own fresh
    /// delivery and every older one — never ahead of events still in the fresh lane.
    pub fn next_ready(&self, ordered: bool, now: Instant) -> Result<Lane, Option<Instant>> {
        if ordered {
            let fresh = self.next_ordered(Lane::New, now);
            let Err(fresh_wait) = fresh else {
                return Ok(Lane::New);
            };
            return match self.next_ordered(Lane::Retry, now) {
                Ok(_) => Ok(Lane::Retry),
                Err(retry_wait) => Err(earliest(fresh_wait, retry_wait)),
            };
        }
        let mut wait: Option<Instant> = None;
        for i in 0..2 {
            let at = (usize::from(self.next) + i) % 2;
            if let Some(front) = self.queues[at].buf.front() {
                match front.not_before {
                    Some(t) if t > now => wait = earliest(wait, Some(t)),
                    _ => return Ok(if at == 0 { Lane::New } else { Lane::Retry }),
                }
            }
        }
        Err(wait)
    }

    /// For ordered endpoints: the position in `lane`'s buffer of the oldest item whose
    /// ordering key has nothing in flight (in either lane) and no older item of the lane
    /// waiting, or when to look again.
    fn next_ordered(&self, lane: Lane, now: Instant) -> Result<usize, Option<Instant>> {
        let mut blocked: Vec<u64> = self.keys_in_flight.iter().map(|(_, k)| *k).collect();
        let mut wait: Option<Instant> = None;
        let fresh = self.fresh_pending_from();
        for (i, item) in self.queues[index(lane)].buf.iter().enumerate() {
            let key = item.ordering_key.unwrap_or(0);
            if blocked.contains(&key) {
                continue;
            }
            if lane == Lane::Retry && !item.fired_retry() && fresh.is_some_and(|f| f < item.seq) {
                // Fresh items stored before it go first (it moves when they are done).
                blocked.push(key);
                continue;
            }
            match item.not_before {
                Some(at) if at > now => {
                    wait = earliest(wait, Some(at));
                    blocked.push(key);
                }
                _ => return Ok(i),
            }
        }
        Err(wait)
    }

    /// The lowest sequence the fresh lane still has to start: its first buffered item or
    /// the first of its backlog in JetStream.
    fn fresh_pending_from(&self) -> Option<u64> {
        let fresh = &self.queues[index(Lane::New)];
        match (fresh.buf.front().map(|i| i.seq), fresh.overflow_from) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Takes the next item of `lane` for an attempt and marks it in flight.
    pub fn take(&mut self, lane: Lane, ordered: bool, now: Instant) -> Option<Item> {
        let at = index(lane);
        let item = if ordered {
            let position = self.next_ordered(lane, now).ok()?;
            let item = self.queues[at].buf.remove(position)?;
            self.keys_in_flight
                .push((item.seq, item.ordering_key.unwrap_or(0)));
            item
        } else {
            self.queues[at].buf.pop_front()?
        };
        let queue = &mut self.queues[at];
        queue.bytes = queue.bytes.saturating_sub(weight(&item));
        queue.in_flight.insert(item.seq);
        self.next = ((at + 1) % 2) as u8;
        Some(item)
    }

    /// An attempt of `item` ended.
    pub fn finished(&mut self, item: &Item) {
        let queue = &mut self.queues[index(item.lane)];
        queue.in_flight.remove(&item.seq);
        queue.done_since_purge = queue.done_since_purge.saturating_add(1);
        // Only the key this item held: one taken before the endpoint became ordered
        // held none, and must not free another's.
        if let Some(at) = self
            .keys_in_flight
            .iter()
            .position(|(seq, _)| *seq == item.seq)
        {
            self.keys_in_flight.swap_remove(at);
        }
    }

    /// Puts an item back at the head of its lane (an in-place retry).
    pub fn requeue(&mut self, item: Item) {
        let queue = &mut self.queues[index(item.lane)];
        queue.bytes += weight(&item);
        queue.buf.push_front(item);
    }

    /// Bytes buffered on both lanes.
    pub fn bytes(&self) -> usize {
        self.queues.iter().map(LaneQueue::bytes).sum()
    }

    /// Keeps at most `cap` items buffered per lane ([`LaneQueue::shed`]).
    pub fn shed(&mut self, cap: usize) {
        for queue in &mut self.queues {
            queue.shed(cap);
        }
    }

    /// Deliveries waiting or in flight on both lanes.
    pub fn pending(&self) -> u64 {
        self.queues.iter().map(LaneQueue::pending).sum()
    }

    pub fn in_flight(&self) -> u64 {
        self.queues.iter().map(|q| q.in_flight.len() as u64).sum()
    }

    pub fn oldest_published_ms(&self) -> Option<u64> {
        self.queues
            .iter()
            .filter_map(LaneQueue::oldest_published_ms)
            .min()
    }

    pub fn release_idle_memory(&mut self) {
        for queue in &mut self.queues {
            queue.release_idle_memory();
        }
        if self.keys_in_flight.is_empty() && self.keys_in_flight.capacity() > 0 {
            self.keys_in_flight = Vec::new();
        }
    }
}

#[cfg(test)]
mod tests;
