//! Recovery: an endpoint whose receiver is down (nothing listens on its port: every
//! connection is refused) while a backlog of events is published, then back with a
//! capacity of `rate` requests/s — a token bucket with a small burst that answers 429
//! above it, without `Retry-After` as many real rate limiters do, or asking for a pause
//! with one as others do. Measured from the moment
//! it is back: the drain time against the ideal `(events − burst) / rate`, the requests
//! refused, the delivered count per second against the capacity line, and the
//! endpoint's adaptive concurrency limit over time (from its health record, which the
//! dispatcher of this process writes every second).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;

use super::harness::{Bench, Target};
use super::receiver::{Behavior, Receiver};

/// The receiver that comes back.
#[derive(Clone, Copy, Debug)]
pub struct Capacity {
    pub rate: f64,
    pub burst: f64,
    /// How long an accepted request takes (0: a fast receiver).
    pub delay: Duration,
    /// `Retry-After` (seconds) on its 429s.
    pub retry_after: Option<u32>,
}

/// One recovery.
#[derive(Clone, Debug, Serialize)]
pub struct RecoveryRun {
    /// Milliseconds an accepted request takes.
    pub delay_ms: u64,
    /// `Retry-After` (seconds) on the receiver's 429s.
    pub retry_after_s: Option<u32>,
    pub rate: f64,
    pub burst: f64,
    pub events: usize,
    /// The backlog the endpoint's health reported when the receiver came back.
    pub backlog_at_return: Option<u64>,
    pub delivered: usize,
    /// Back → the first accepted request.
    pub first_accept_seconds: f64,
    /// Back → the last event's first accepted request.
    pub drain_seconds: f64,
    pub ideal_seconds: f64,
    /// Requests after the receiver was back, and those its limiter refused (429).
    pub requests: u64,
    pub refused: u64,
    pub max_in_flight: u64,
    /// Per second since back: (second, events delivered so far, requests refused in it).
    pub curve: Vec<(f64, u64, u64)>,
    /// (seconds since back, concurrency limit, backlog) from the endpoint's health.
    pub limits: Vec<(f64, Option<u32>, Option<u64>)>,
}

impl RecoveryRun {
    /// The receiver, in words: "fast receiver", "receiver taking 75 ms", with ", 429 with
    /// Retry-After: 1" when it asks for pauses.
    pub fn receiver(&self) -> String {
        let speed = if self.delay_ms == 0 {
            "fast receiver".to_owned()
        } else {
            format!("receiver taking {} ms", self.delay_ms)
        };
        match self.retry_after_s {
            Some(s) => format!("{speed}, 429 with Retry-After: {s}"),
            None => speed,
        }
    }

    pub fn ratio(&self) -> f64 {
        self.drain_seconds / self.ideal_seconds.max(1e-3)
    }

    pub fn refused_share(&self) -> f64 {
        self.refused as f64 / self.requests.max(1) as f64
    }

    pub fn complete(&self) -> bool {
        self.delivered == self.events
    }
}

pub async fn recovery(b: &Bench, ns: &str, events: usize, capacity: Capacity) -> RecoveryRun {
    // A port nothing listens on until the receiver comes back.
    let port = crate::free_port();
    let base = format!("http://127.0.0.1:{port}");
    let path = b.rx.path(
        Behavior::rate_limited(capacity.rate, capacity.burst, capacity.delay)
            .asking_pause(capacity.retry_after),
    );
    // Retries within seconds (the down phase fails the few events probed), a probe every
    // 2 s while the circuit is open (30 s by default: detection is not what is measured).
    let delivery = json!({
        "maxInFlight": 64,
        "timeout": "5s",
        "retry": {"exponential": {"base": "1s", "cap": "5s", "deadline": "24h"}},
        "circuitBreaker": {"failureThreshold": 10, "probeInterval": "2s"},
    });
    let target = Target::new("recovering", "r", delivery, Receiver::url_at(&base, path));
    b.endpoints(ns, vec![target]).await;
    b.publish(ns, events, 0.0, |_| "r".into(), |_| String::new())
        .await;
    // The whole backlog in the endpoint's lane (fanned out) before it comes back.
    let backlog = super::harness::poll(
        Duration::from_secs(120),
        || async {
            b.dp.health(ns, "recovering")
                .await
                .and_then(|h| h.backlog)
                .unwrap_or(0)
        },
        |n| *n >= events as u64,
    )
    .await;

    let back = Instant::now();
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (dp, ns, sampling) = (b.dp.clone(), ns.to_owned(), sampling.clone());
        tokio::spawn(async move {
            let mut out = Vec::new();
            while sampling.load(Ordering::Relaxed) {
                let health = dp.health(&ns, "recovering").await;
                out.push((
                    back.elapsed().as_secs_f64(),
                    health.as_ref().and_then(|h| h.concurrency_limit),
                    health.as_ref().and_then(|h| h.backlog),
                ));
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            out
        })
    };
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("binding the receiver's port again");
    let serving = b.rx.serve(listener);
    let ideal = (events as f64 - capacity.burst).max(0.0) / capacity.rate;
    let limit = Duration::from_secs_f64(ideal * 4.0 + 120.0);
    b.wait(&[path], events, limit).await;
    sampling.store(false, Ordering::Relaxed);
    let limits = sampler.await.unwrap_or_default();
    serving.abort();

    let arrivals = b.rx.arrivals(path);
    let firsts = b.rx.first_accepted(path);
    let since = |at: Instant| at.saturating_duration_since(back).as_secs_f64();
    let seconds = firsts.iter().map(|(_, at)| since(*at)).fold(0.0, f64::max);
    let mut curve = Vec::new();
    let (mut delivered, mut refused, mut f, mut a) = (0u64, 0u64, 0, 0);
    for second in 1..=seconds.ceil() as usize {
        let until = second as f64;
        while f < firsts.len() && since(firsts[f].1) < until {
            delivered += 1;
            f += 1;
        }
        let mut refused_now = 0;
        while a < arrivals.len() && since(arrivals[a].at) < until {
            refused_now += u64::from(!arrivals[a].accepted);
            a += 1;
        }
        refused += refused_now;
        curve.push((until, delivered, refused_now));
    }
    let refused_total = arrivals.iter().filter(|a| !a.accepted).count() as u64;
    debug_assert!(refused <= refused_total);
    RecoveryRun {
        delay_ms: capacity.delay.as_millis() as u64,
        retry_after_s: capacity.retry_after,
        rate: capacity.rate,
        burst: capacity.burst,
        events,
        backlog_at_return: backlog,
        delivered: firsts.len(),
        first_accept_seconds: firsts.first().map_or(0.0, |(_, at)| since(*at)),
        drain_seconds: seconds,
        ideal_seconds: ideal,
        requests: arrivals.len() as u64,
        refused: refused_total,
        max_in_flight: b.rx.max_in_flight(path),
        curve,
        limits,
    }
}
