//! A request rate learned from a receiver's refusals (429 or 503 without `Retry-After`):
//! real rate limiters trip on bursts, not on the average, and a concurrency limit alone
//! does not pace a fast receiver (one request at a time to a receiver answering in 1 ms
//! is 1,000 requests/s). A limiter that trips refuses a share of the requests, not one
//! now and then: refusals count only when at least two, and at least 5 % of the
//! requests, came back refused in the last second ([`is_limiter_trip`]) — a receiver
//! that throttles a request here and there (one key of its own, say) must not bring an
//! endpoint down to a few requests a second. Once they count, the endpoint is paced by
//! a token bucket whose
//! rate starts at the throughput the receiver just accepted, grows while nothing is
//! refused — doubling per second until the next refusal (the estimate may come from a
//! burst's first milliseconds), 5 % per second after — and is cut by a quarter on a refusal (once per second, however
//! many requests of one burst come back refused). Its burst is a twentieth of a second's
//! worth, so Herald never sends the bursts that trip limiters. A minute without a
//! refusal forgets it.

use std::time::{Duration, Instant};

const CUT: f64 = 0.75;
const GROWTH_PER_SECOND: f64 = 0.05;
const MIN_RATE: f64 = 1.0;
const CUT_GAP: Duration = Duration::from_secs(1);
const FORGET_AFTER: Duration = Duration::from_secs(60);

/// Whether `refused` refusals beside `accepted` successes in the last second are a rate
/// limiter tripping rather than a refusal now and then.
pub fn is_limiter_trip(refused: f64, accepted: f64) -> bool {
    refused >= 2.0 && refused >= 0.05 * (refused + accepted)
}

/// Whole seconds [`PerSecond::peak`] looks back.
const PEAK_SECONDS: usize = 4;

/// Answers per second (successes, or refusals), counted in whole seconds: the current
/// one and the few before it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PerSecond {
    second: Option<Instant>,
    current: u32,
    /// The whole seconds before the current one, the latest first.
    previous: [u32; PEAK_SECONDS],
}

impl PerSecond {
    fn roll(&mut self, now: Instant) {
        let start = *self.second.get_or_insert(now);
        let whole = now.saturating_duration_since(start).as_secs();
        if whole == 0 {
            return;
        }
        for _ in 0..whole.min(PEAK_SECONDS as u64 + 1) {
            self.previous.rotate_right(1);
            self.previous[0] = std::mem::take(&mut self.current);
        }
        self.second = Some(start + Duration::from_secs(whole));
    }

    pub fn add(&mut self, now: Instant) {
        self.roll(now);
        self.current = self.current.saturating_add(1);
    }

    /// Answers in about the last second.
    pub fn per_second(&mut self, now: Instant) -> f64 {
        self.roll(now);
        let into = self
            .second
            .map_or(0.0, |s| now.saturating_duration_since(s).as_secs_f64());
        // The previous second's part that is still within the last second.
        f64::from(self.current) + f64::from(self.previous[0]) * (1.0 - into).max(0.0)
    }

    /// The most answers in one second of the last few: what the other side took while
    /// this side kept it busy. A second this side was stalled in (a busy machine, a
    /// slow disk) counts low, and a rate cut from it alone fell far below what the
    /// receiver takes.
    pub fn peak(&mut self, now: Instant) -> f64 {
        let last = self.per_second(now);
        self.previous
            .iter()
            .map(|&n| f64::from(n))
            .fold(last, f64::max)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Learned {
    rate: f64,
    tokens: f64,
    counted: Instant,
    last_cut: Instant,
    slow_start: bool,
}

impl Learned {
    /// The first refusal: start at what the receiver accepted (`accepted_per_second`,
    /// the best of the last few seconds).
    pub fn new(accepted_per_second: f64, now: Instant) -> Self {
        let rate = (accepted_per_second * CUT).max(MIN_RATE);
        Self {
            rate,
            tokens: 0.0,
            counted: now,
            last_cut: now,
            slow_start: true,
        }
    }

    pub fn rate(&self) -> f64 {
        self.rate
    }

    fn burst(&self) -> f64 {
        (self.rate / 20.0).max(1.0)
    }

    /// `Some(at)` when the next request must wait until `at`; `None` also once it is
    /// forgotten (`forget` then says so).
    pub fn wait(&mut self, now: Instant) -> Option<Instant> {
        let dt = now.saturating_duration_since(self.counted).as_secs_f64();
        self.counted = now;
        self.tokens = (self.tokens + dt * self.rate).min(self.burst());
        (self.tokens < 1.0).then(|| now + Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
    }

    /// A request started: it spends a token, and the rate grows with the time spent
    /// sending at it — never beyond twice what the receiver accepted in the last second
    /// (`accepted`), so a rate that is not what holds the requests back (the concurrency
    /// limit or the receiver's latency is) cannot grow out of reach.
    pub fn on_start(&mut self, since_last_start: Duration, accepted: f64) {
        self.tokens -= 1.0;
        let dt = since_last_start.min(Duration::from_secs(1)).as_secs_f64();
        let growth = if self.slow_start {
            2f64.powf(dt)
        } else {
            1.0 + GROWTH_PER_SECOND * dt
        };
        let ceiling = (2.0 * accepted).max(MIN_RATE * 20.0);
        self.rate = (self.rate * growth).min(ceiling.max(self.rate));
    }

    /// The receiver refused a request (429 or 503 without `Retry-After`) after accepting
    /// `accepted` a second at best recently: the rate goes a quarter below the lower of
    /// the two.
    pub fn on_refused(&mut self, now: Instant, accepted: f64) {
        if now.saturating_duration_since(self.last_cut) < CUT_GAP {
            return;
        }
        self.last_cut = now;
        self.slow_start = false;
        let base = if accepted >= MIN_RATE {
            self.rate.min(accepted)
        } else {
            self.rate
        };
        self.rate = (base * CUT).max(MIN_RATE);
        self.tokens = self.tokens.min(0.0);
    }

    /// Whether nothing was refused for long enough to stop pacing.
    pub fn forget(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last_cut) >= FORGET_AFTER
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_second_counts_the_last_second_and_peaks_over_the_last_few() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut p = PerSecond::default();
        for i in 0..100 {
            p.add(at(i * 10)); // 100 in the first second
        }
        for i in 0..10 {
            p.add(at(1000 + i * 100)); // 10 in the second
        }
        assert_eq!(p.per_second(at(2000)), 10.0);
        assert_eq!(p.peak(at(2000)), 100.0);
        // Half a second on: half of the previous second still counts.
        p.add(at(2500));
        assert_eq!(p.per_second(at(2500)), 6.0);
        // The busy second is forgotten once four whole seconds follow it.
        assert_eq!(p.peak(at(4999)), 100.0);
        assert_eq!(p.peak(at(5000)), 10.0);
        assert_eq!(p.peak(at(60_000)), 0.0);
    }

    #[test]
    fn the_rate_is_cut_once_per_burst_and_forgotten_when_quiet() {
        let now = Instant::now();
        let mut l = Learned::new(200.0, now);
        assert_eq!(l.rate(), 150.0);
        l.on_refused(now + Duration::from_millis(100), 200.0);
        assert_eq!(l.rate(), 150.0, "the same burst");
        l.on_refused(now + Duration::from_secs(2), 200.0);
        assert_eq!(l.rate(), 112.5);
        // A rate above what was accepted is cut from what was accepted.
        let mut l = Learned::new(100.0, now);
        l.rate = 400.0;
        l.on_refused(now + Duration::from_secs(2), 200.0);
        assert_eq!(l.rate(), 150.0);
        assert!(!l.forget(now + Duration::from_secs(30)));
        assert!(l.forget(now + Duration::from_secs(62)));
    }
}
