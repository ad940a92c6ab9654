//! The runtime of one owned shard: one ordered consumer on `herald.q.<shard>.>` feeds
//! per-endpoint lanes; a single task owns every endpoint's state (no locks) and runs a
//! fair round-robin over endpoints that have work and capacity; each attempt is its own
//! task bounded by its endpoint's timeout, so no endpoint can hold another's worker.
//!
//! Retries are published as JetStream schedules before the attempt counts as done;
//! finished work is purged from the lanes below each lane's low-water mark; attempt
//! records are batched per endpoint; health is reported at a bounded rate.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use async_nats::jetstream::message::PublishMessage;
use bytes::Bytes;
use futures::StreamExt;
use herald_core::dataplane::{
    ATTEMPT_HEADER, DeadReason, EVENT_ID_HEADER, EndpointKey, FIRST_ATTEMPT_HEADER, LANE_PREFIX,
    Lane, ORDERING_KEY_HEADER, PUBLISHED_HEADER, SCHEDULE_HEADER, SCHEDULE_TARGET_HEADER,
    parse_lane_subject,
};
use herald_core::ssrf::AddressPolicy;
use herald_core::v1alpha1::CircuitState;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinSet;

use crate::endpoint::{Disposition, EndpointState, Item, Readiness};
use crate::http::{self, Outcome};
use crate::index::{Change, Index};
use crate::metrics::{Metrics, OutcomeLabel, ShardLabel};
use crate::retry;
use crate::setup::Layout;

/// Settings shared by all shards of a dispatcher.
#[derive(Clone, Debug)]
pub struct ShardSettings {
    /// Most attempts in flight per shard, across its endpoints.
    pub max_in_flight: usize,
    /// Minimum time between two health reports of one endpoint.
    pub health_interval: Duration,
    /// How long in-flight attempts may finish at shutdown or handover.
    pub grace: Duration,
}

/// Everything a shard needs, cheap to clone.
#[derive(Clone)]
pub struct Shared {
    pub layout: Layout,
    pub index: Index,
    pub http: reqwest::Client,
    pub policy: Arc<AddressPolicy>,
    pub metrics: Arc<Metrics>,
    pub settings: ShardSettings,
}

struct Completion {
    key: EndpointKey,
    item: Item,
    response: http::Response,
    disposition: Disposition,
}

struct Refill {
    key: EndpointKey,
    lane: Lane,
    items: Vec<Item>,
    next: Option<u64>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

fn header_u64(headers: Option<&HeaderMap>, name: &str) -> Option<u64> {
    headers?.get(name)?.as_str().parse().ok()
}

/// Turns a lane message into an item.
fn item_from(lane: Lane, seq: u64, headers: Option<&HeaderMap>, payload: Bytes) -> Option<Item> {
    let event_id: Arc<str> = headers?.get(EVENT_ID_HEADER)?.as_str().into();
    Some(Item {
        seq,
        lane,
        event_id,
        body: payload,
        published_ms: header_u64(headers, PUBLISHED_HEADER).unwrap_or_default(),
        attempt: header_u64(headers, ATTEMPT_HEADER).unwrap_or(1) as u32,
        first_attempt_ms: header_u64(headers, FIRST_ATTEMPT_HEADER),
        not_before: None,
        ordering_key: headers?
            .get(ORDERING_KEY_HEADER)
            .and_then(|v| u64::from_str_radix(v.as_str(), 16).ok()),
    })
}

/// Runs shard `shard` until `stop` becomes true; then lets in-flight attempts finish
/// (up to the grace period), purges what is done, and returns.
pub async fn run(shared: Shared, shard: u32, mut stop: watch::Receiver<bool>) {
    let mut runtime = Runtime::new(shared, shard);
    if let Err(error) = runtime.run(&mut stop).await {
        tracing::warn!(shard, %error, "shard stopped with an error");
    }
}

struct Runtime {
    shared: Shared,
    shard: u32,
    label: ShardLabel,
    endpoints: HashMap<EndpointKey, EndpointState>,
    ready: VecDeque<EndpointKey>,
    timers: BinaryHeap<Reverse<(Instant, EndpointKey)>>,
    attempts: JoinSet<Completion>,
    refill_tx: mpsc::Sender<Refill>,
    refill_rx: mpsc::Receiver<Refill>,
}

impl Runtime {
    fn new(shared: Shared, shard: u32) -> Self {
        let (refill_tx, refill_rx) = mpsc::channel(1024);
        Self {
            shared,
            shard,
            label: ShardLabel { shard },
            endpoints: HashMap::new(),
            ready: VecDeque::new(),
            timers: BinaryHeap::new(),
            attempts: JoinSet::new(),
            refill_tx,
            refill_rx,
        }
    }

    async fn run(&mut self, stop: &mut watch::Receiver<bool>) -> Result<(), async_nats::Error> {
        let mut changes = self.shared.index.subscribe();
        let consumer = self
            .shared
            .layout
            .deliveries
            .create_consumer(pull::OrderedConfig {
                filter_subject: format!("{LANE_PREFIX}.{}.>", self.shard),
                deliver_policy: DeliverPolicy::All,
                ..Default::default()
            })
            .await?;
        let mut messages = consumer.messages().await?;
        let mut flush = tokio::time::interval(Duration::from_millis(100));
        flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut housekeeping = tokio::time::interval(Duration::from_secs(1));
        housekeeping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tracing::info!(shard = self.shard, "shard started");
        loop {
            let next_timer = self.timers.peek().map(|Reverse((at, _))| *at);
            tokio::select! {
                _ = stop.changed() => if *stop.borrow() { break },
                Some(done) = self.attempts.join_next(), if !self.attempts.is_empty() => {
                    match done {
                        Ok(completion) => self.on_completion(completion),
                        Err(error) => tracing::error!(%error, "attempt task failed"),
                    }
                }
                Some(refill) = self.refill_rx.recv() => self.on_refill(refill),
                change = changes.recv() => self.on_change(change),
                message = messages.next() => match message {
                    Some(Ok(message)) => self.on_message(message),
                    Some(Err(error)) => {
                        tracing::warn!(shard = self.shard, %error, "lane consumer");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    None => return Err("the lane consumer ended".into()),
                },
                _ = sleep_until(next_timer) => self.on_timers(),
                _ = flush.tick() => self.flush_records(),
                _ = housekeeping.tick() => self.housekeeping(),
            }
            self.dispatch();
        }
        self.drain().await;
        Ok(())
    }

    fn state(&mut self, key: &EndpointKey) -> &mut EndpointState {
        let index = &self.shared.index;
        self.endpoints.entry(key.clone()).or_insert_with(|| {
            let ep = index.endpoint(key);
            let keys = ep
                .as_ref()
                .and_then(|e| index.keys(&e.config.namespace, &e.config.secret));
            EndpointState::new(ep, keys)
        })
    }

    fn mark_ready(&mut self, key: &EndpointKey) {
        if let Some(state) = self.endpoints.get_mut(key)
            && !state.queued
        {
            state.queued = true;
            self.ready.push_back(key.clone());
        }
    }

    fn on_message(&mut self, message: async_nats::jetstream::Message) {
        let Ok(info) = message.info() else { return };
        let seq = info.stream_sequence;
        let Some((_, key, lane)) = parse_lane_subject(message.subject.as_str()) else {
            return;
        };
        let Some(item) = item_from(lane, seq, message.headers.as_ref(), message.payload.clone())
        else {
            tracing::warn!(
                seq,
                subject = message.subject.as_str(),
                "lane message without an event id; skipped"
            );
            return;
        };
        let state = self.state(&key);
        let cap = state.buffer_cap();
        state.lane(lane).offer(item, cap);
        self.maybe_refill(&key, lane);
        self.mark_ready(&key);
    }

    fn on_change(&mut self, change: Result<Change, broadcast::error::RecvError>) {
        let keys: Vec<EndpointKey> = match change {
            Ok(Change::Endpoint(key)) => vec![key],
            Ok(Change::Keys { namespace, secret }) => self
                .endpoints
                .iter()
                .filter(|(k, s)| {
                    k.namespace() == namespace
                        && s.ep.as_ref().is_some_and(|e| e.config.secret == secret)
                })
                .map(|(k, _)| k.clone())
                .collect(),
            Err(_) => self.endpoints.keys().cloned().collect(),
        };
        for key in keys {
            // State exists only for endpoints with traffic on this shard; the others pick
            // their configuration up when their first message arrives.
            let ep = self.shared.index.endpoint(&key);
            if ep.is_none() {
                self.remove_endpoint(&key);
                continue;
            }
            if !self.endpoints.contains_key(&key) {
                continue;
            }
            let keys = ep.as_ref().and_then(|e| {
                self.shared
                    .index
                    .keys(&e.config.namespace, &e.config.secret)
            });
            let state = self.state(&key);
            state.keys = keys;
            if state.configure(ep) {
                tracing::info!(endpoint = %key, "endpoint re-enabled");
            }
            self.mark_ready(&key);
        }
    }

    /// The endpoint was deleted: stop delivering, drop its queued work (the events stay
    /// in the event store for replay), and forget its state.
    fn remove_endpoint(&mut self, key: &EndpointKey) {
        self.endpoints.remove(key);
        let stream = self.shared.layout.deliveries.clone();
        let subjects = [Lane::New, Lane::Retry].map(|lane| key.lane_subject(self.shard, lane));
        tokio::spawn(async move {
            for subject in subjects {
                if let Err(error) = stream.purge().filter(subject).await {
                    tracing::warn!(%error, "purging a deleted endpoint's lane");
                }
            }
        });
        tracing::info!(endpoint = %key, "endpoint removed; its pending deliveries were dropped");
    }

    fn maybe_refill(&mut self, key: &EndpointKey, lane: Lane) {
        let state = self.state(key);
        let cap = state.buffer_cap();
        let queue = state.lane(lane);
        let Some(from) = queue.refill_from(cap) else {
            return;
        };
        let until = queue.last_seen();
        let room = cap
            .saturating_sub(queue.pending().min(cap as u64) as usize)
            .max(1);
        let stream = self.shared.layout.deliveries.clone();
        let subject = key.lane_subject(self.shard, lane);
        let tx = self.refill_tx.clone();
        let key = key.clone();
        tokio::spawn(async move {
            let mut items = Vec::new();
            let mut next = Some(from);
            while let Some(seq) = next {
                if items.len() >= room || seq > until {
                    break;
                }
                match stream
                    .direct_get_next_for_subject(subject.as_str(), Some(seq))
                    .await
                {
                    Ok(message) if message.sequence <= until => {
                        next = Some(message.sequence + 1);
                        if let Some(item) = item_from(
                            lane,
                            message.sequence,
                            Some(&message.headers),
                            message.payload,
                        ) {
                            items.push(item);
                        }
                    }
                    Ok(_) => next = None,
                    Err(error) => {
                        tracing::debug!(%error, "refill read");
                        if items.is_empty() {
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                        break;
                    }
                }
            }
            let _ = tx
                .send(Refill {
                    key,
                    lane,
                    items,
                    next,
                })
                .await;
        });
    }

    fn on_refill(&mut self, refill: Refill) {
        let Refill {
            key,
            lane,
            items,
            next,
        } = refill;
        if let Some(state) = self.endpoints.get_mut(&key) {
            state.lane(lane).refilled(items, next);
            self.maybe_refill(&key, lane);
            self.mark_ready(&key);
        }
    }

    fn on_timers(&mut self) {
        let now = Instant::now();
        while let Some(Reverse((at, _))) = self.timers.peek() {
            if *at > now {
                break;
            }
            let Some(Reverse((_, key))) = self.timers.pop() else {
                break;
            };
            self.mark_ready(&key);
        }
    }

    /// Starts attempts round-robin: one per endpoint per turn.
    fn dispatch(&mut self) {
        let now = Instant::now();
        let mut turns = self.ready.len();
        while turns > 0 && self.attempts.len() < self.shared.settings.max_in_flight {
            turns -= 1;
            let Some(key) = self.ready.pop_front() else {
                break;
            };
            let Some(state) = self.endpoints.get_mut(&key) else {
                continue;
            };
            state.queued = false;
            match state.readiness(now) {
                Readiness::Ready(lane) => {
                    let Some(item) = state.start(lane, now) else {
                        continue;
                    };
                    self.spawn_attempt(&key, item);
                    self.maybe_refill(&key, lane);
                    // Back of the ring: the next endpoint gets the next turn.
                    self.mark_ready(&key);
                    turns += 1;
                }
                Readiness::Until(at) => self.timers.push(Reverse((at, key))),
                Readiness::Idle => {}
            }
        }
        self.shared
            .metrics
            .in_flight
            .get_or_create(&self.label)
            .set(self.attempts.len() as i64);
    }

    fn spawn_attempt(&mut self, key: &EndpointKey, item: Item) {
        let Some(state) = self.endpoints.get(key) else {
            return;
        };
        let (Some(ep), Some(keys)) = (state.ep.clone(), state.keys.clone()) else {
            return;
        };
        let ordered = state.is_ordered_endpoint();
        let shared = self.shared.clone();
        let shard = self.shard;
        let key = key.clone();
        self.attempts.spawn(async move {
            let delivery = &ep.config.delivery;
            let response = http::send(
                &shared.http,
                &shared.policy,
                http::Attempt {
                    url: &ep.config.url,
                    event_id: &item.event_id,
                    body: item.body.clone(),
                    keys: &keys,
                    headers: &ep.config.headers,
                    timeout: delivery.timeout.get(),
                },
            )
            .await;
            let disposition = decide(&shared, shard, &key, &ep, &item, &response, ordered).await;
            Completion {
                key,
                item,
                response,
                disposition,
            }
        });
    }

    fn on_completion(&mut self, completion: Completion) {
        let Completion {
            key,
            item,
            response,
            disposition,
        } = completion;
        let metrics = &self.shared.metrics;
        metrics
            .attempts
            .get_or_create(&OutcomeLabel {
                shard: self.shard,
                outcome: response.outcome.as_str(),
            })
            .inc();
        metrics
            .attempt_latency
            .get_or_create(&self.label)
            .observe(response.latency.as_secs_f64());
        if matches!(disposition, Disposition::Dead(_)) {
            metrics.dead_deliveries.get_or_create(&self.label).inc();
        }
        let lane = item.lane;
        let Some(state) = self.endpoints.get_mut(&key) else {
            return;
        };
        let was_disabled = state.disabled.is_some();
        state.finish(item, &response, disposition, Instant::now(), now_ms());
        if !was_disabled && let Some(disabled) = &state.disabled {
            tracing::warn!(endpoint = %key, reason = disabled.reason.as_str(), "endpoint disabled: {}", disabled.message);
            // Report at once, not at the next interval: a tenant should hear about this.
            state.health_at = None;
        }
        if response.outcome != Outcome::Success {
            tracing::debug!(endpoint = %key, outcome = response.outcome.as_str(), status = ?response.status, "attempt failed");
        }
        self.maybe_refill(&key, lane);
        self.mark_ready(&key);
    }

    /// Publishes batched attempt records, one message per endpoint.
    fn flush_records(&mut self) {
        for (key, state) in &mut self.endpoints {
            if state.records.is_empty() {
                continue;
            }
            let mut payload = Vec::with_capacity(state.records.len() * 160);
            for record in state.records.drain(..) {
                serde_json::to_writer(&mut payload, &record).expect("records serialize");
                payload.push(b'\n');
            }
            let js = self.shared.layout.js.clone();
            let subject = key.attempts_subject();
            tokio::spawn(async move {
                match js.publish(subject, payload.into()).await {
                    Ok(ack) => {
                        if let Err(error) = ack.await {
                            tracing::warn!(%error, "attempt log write not acknowledged");
                        }
                    }
                    Err(error) => tracing::warn!(%error, "attempt log write failed"),
                }
            });
        }
    }

    /// Once a second: purge finished work, report health, refresh gauges.
    fn housekeeping(&mut self) {
        let now = Instant::now();
        let ms = now_ms();
        let (mut open, mut disabled, mut oldest) = (0, 0, None::<u64>);
        let mut idle = Vec::new();
        for (key, state) in &mut self.endpoints {
            for lane in [Lane::New, Lane::Retry] {
                if let Some(below) = state.lane(lane).purge_point() {
                    let stream = self.shared.layout.deliveries.clone();
                    let subject = key.lane_subject(self.shard, lane);
                    tokio::spawn(async move {
                        if let Err(error) = stream.purge().filter(subject).sequence(below).await {
                            tracing::debug!(%error, "lane purge");
                        }
                    });
                }
            }
            open += i64::from(state.circuit != CircuitState::Closed);
            disabled += i64::from(state.disabled.is_some());
            if let Some(health) = state.health(ms) {
                if let Some(o) = health.oldest_pending_ms {
                    oldest = Some(oldest.map_or(o, |x| x.min(o)));
                }
                let due = state.health_at.is_none_or(|at| {
                    now.duration_since(at) >= self.shared.settings.health_interval
                });
                if due && state.health_written.as_ref() != Some(&health) {
                    state.health_at = Some(now);
                    state.health_written = Some(health.clone());
                    let kv = self.shared.layout.health.clone();
                    let config_key = key.config_key();
                    let value = serde_json::to_vec(&health).expect("health serializes");
                    tracing::debug!(endpoint = %key, "reporting health");
                    tokio::spawn(async move {
                        if let Err(error) = kv.put(config_key, value.into()).await {
                            tracing::warn!(%error, "health write failed; retried at the next change");
                        }
                    });
                }
            } else if state.is_idle() {
                idle.push(key.clone());
            }
        }
        // State of endpoints whose configuration is gone and that hold nothing.
        for key in idle {
            self.endpoints.remove(&key);
        }
        let metrics = &self.shared.metrics;
        metrics.open_circuits.get_or_create(&self.label).set(open);
        metrics
            .disabled_endpoints
            .get_or_create(&self.label)
            .set(disabled);
        metrics
            .oldest_pending_seconds
            .get_or_create(&self.label)
            .set(oldest.map_or(0, |o| (ms.saturating_sub(o) / 1000) as i64));
    }

    /// Stop: no new attempts; let in-flight ones finish within the grace period (their
    /// retries get scheduled), abort the rest (they stay in the lanes and are delivered
    /// again by the next owner), write what is done.
    async fn drain(&mut self) {
        let deadline = tokio::time::Instant::now() + self.shared.settings.grace;
        while !self.attempts.is_empty() {
            match tokio::time::timeout_at(deadline, self.attempts.join_next()).await {
                Ok(Some(Ok(completion))) => self.on_completion(completion),
                Ok(Some(Err(_))) => {}
                Ok(None) => break,
                Err(_) => {
                    self.attempts.abort_all();
                    break;
                }
            }
        }
        self.flush_records();
        for (key, state) in &mut self.endpoints {
            for lane in [Lane::New, Lane::Retry] {
                if let Some(below) = state.lane(lane).purge_point() {
                    let subject = key.lane_subject(self.shard, lane);
                    let purge = self
                        .shared
                        .layout
                        .deliveries
                        .purge()
                        .filter(subject)
                        .sequence(below);
                    let _ = tokio::time::timeout(Duration::from_secs(2), purge.into_future()).await;
                }
            }
        }
        tracing::info!(shard = self.shard, "shard stopped");
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => futures::future::pending().await,
    }
}

/// After an attempt: done, retry (scheduled in JetStream, or in place for ordered
/// endpoints) or dead.
async fn decide(
    shared: &Shared,
    shard: u32,
    key: &EndpointKey,
    ep: &crate::index::Endpoint,
    item: &Item,
    response: &http::Response,
    ordered: bool,
) -> Disposition {
    let delivery = &ep.config.delivery;
    if response.outcome == Outcome::Success {
        return Disposition::Done;
    }
    if let Some(status) = response.status
        && delivery.final_status_codes.contains(&status)
    {
        return Disposition::Dead(DeadReason::FinalStatus);
    }
    let now = now_ms();
    let first = item.first_attempt_ms.unwrap_or(now);
    let elapsed = Duration::from_millis(now.saturating_sub(first));
    let delay = match retry::next(
        &delivery.retry,
        item.attempt,
        elapsed,
        fastrand::f64(),
        response.retry_after,
    ) {
        None => return Disposition::Dead(DeadReason::RetriesExhausted),
        Some(delay) => delay,
    };
    if ordered {
        return Disposition::Requeue(delay);
    }
    match schedule_retry(shared, shard, key, item, first, delay).await {
        Ok(()) => Disposition::Scheduled(delay),
        Err(error) => {
            tracing::warn!(%error, endpoint = %key, "could not schedule a retry; retrying in place");
            Disposition::Requeue(delay)
        }
    }
}

/// Publishes the retry as a JetStream schedule that fires onto the endpoint's retry lane.
async fn schedule_retry(
    shared: &Shared,
    shard: u32,
    key: &EndpointKey,
    item: &Item,
    first_attempt_ms: u64,
    delay: Duration,
) -> Result<(), async_nats::Error> {
    // Schedules have whole-second resolution: round up so a retry never comes early.
    let at = jiff::Timestamp::now().checked_add(jiff::SignedDuration::try_from(delay)?)?;
    let at = if at.subsec_nanosecond() > 0 {
        jiff::Timestamp::from_second(at.as_second() + 1)?
    } else {
        at
    };
    let mut headers = HeaderMap::new();
    headers.insert(
        SCHEDULE_HEADER,
        format!("@at {}", at.strftime("%Y-%m-%dT%H:%M:%SZ")).as_str(),
    );
    headers.insert(
        SCHEDULE_TARGET_HEADER,
        key.lane_subject(shard, Lane::Retry).as_str(),
    );
    headers.insert(EVENT_ID_HEADER, &*item.event_id);
    headers.insert(PUBLISHED_HEADER, item.published_ms.to_string().as_str());
    headers.insert(ATTEMPT_HEADER, (item.attempt + 1).to_string().as_str());
    headers.insert(FIRST_ATTEMPT_HEADER, first_attempt_ms.to_string().as_str());
    let subject = key.schedule_subject(shard, &item.event_id);
    shared
        .layout
        .js
        .send_publish(
            subject,
            PublishMessage::build()
                .payload(item.body.clone())
                .headers(headers),
        )
        .await?
        .await?;
    Ok(())
}
