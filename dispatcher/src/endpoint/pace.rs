//! When an endpoint may start its next attempt, apart from its concurrency: the
//! receiver's `Retry-After`, the endpoint's optional rate limit (a token bucket of
//! `perSecond` with `burst`) and the rate learned from the receiver's refusals
//! ([`super::learned`]).

use std::time::{Duration, Instant};

use herald_core::v1alpha1::RateLimit;

use super::learned::{Learned, PerSecond, is_limiter_trip};

/// Longest `Retry-After` honoured; a receiver cannot park an endpoint for days.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pace {
    not_before: Option<Instant>,
    /// Tokens and when they were counted; `None` until the first attempt of an endpoint
    /// with a rate limit.
    bucket: Option<(f64, Instant)>,
    /// Successes per second, the start of a learned rate.
    throughput: PerSecond,
    /// Refusals per second: a learned rate starts, or is cut, only when they are a
    /// limiter tripping.
    refusals: PerSecond,
    /// Set by refusals without `Retry-After`; forgotten after a quiet minute.
    learned: Option<Box<Learned>>,
    last_start: Option<Instant>,
}

impl Pace {
    /// `Some(at)` when nothing may start before `at`.
    pub fn wait(&mut self, rate: Option<&RateLimit>, now: Instant) -> Option<Instant> {
        if let Some(at) = self.not_before {
            if at > now {
                return Some(at);
            }
            self.not_before = None;
        }
        if let Some(learned) = &mut self.learned {
            if learned.forget(now) {
                self.learned = None;
            } else if let Some(at) = learned.wait(now) {
                return Some(at);
            }
        }
        let rate = rate?;
        let per_second = f64::from(rate.per_second.max(1));
        let burst = f64::from(rate.burst.unwrap_or(rate.per_second).max(1));
        let (tokens, at) = self.bucket.unwrap_or((burst, now));
        let tokens =
            (tokens + now.saturating_duration_since(at).as_secs_f64() * per_second).min(burst);
        self.bucket = Some((tokens, now));
        (tokens < 1.0).then(|| now + Duration::from_secs_f64((1.0 - tokens) / per_second))
    }

    /// An attempt started: it spends a token (of each bucket in force).
    pub fn on_start(&mut self, now: Instant) {
        if let Some((tokens, _)) = &mut self.bucket {
            *tokens -= 1.0;
        }
        if let Some(learned) = &mut self.learned {
            let since = self.last_start.map_or(Duration::ZERO, |t| now - t);
            learned.on_start(since, self.throughput.per_second(now));
        }
        self.last_start = Some(now);
    }

    /// Nothing to keep: no `Retry-After` in force and no attempt started for `quiet`
    /// (a learned rate is forgotten after a quiet minute anyway).
    pub fn settled(&self, now: Instant, quiet: Duration) -> bool {
        self.not_before.is_none_or(|at| at <= now)
            && self
                .last_start
                .is_none_or(|at| now.saturating_duration_since(at) >= quiet)
    }

    pub fn on_success(&mut self, now: Instant) {
        self.throughput.add(now);
    }

    /// The receiver refused a request: pace by a learned rate from now on (or cut it),
    /// once the refusals are a limiter tripping.
    pub fn on_refused(&mut self, now: Instant) {
        self.refusals.add(now);
        if !is_limiter_trip(
            self.refusals.per_second(now),
            self.throughput.per_second(now),
        ) {
            return;
        }
        let accepted = self.throughput.peak(now);
        match &mut self.learned {
            Some(learned) => learned.on_refused(now, accepted),
            None => self.learned = Some(Box::new(Learned::new(accepted, now))),
        }
    }

    /// The receiver refused a request and asked for a pause (`Retry-After`, held by
    /// [`Pace::hold_for`]): after the pause the endpoint is paced by a learned rate,
    /// started at what the receiver accepted in the last few seconds, or cut by a
    /// quarter if one is in force. An explicit pause is a limiter's answer, so a single
    /// refusal counts (a refusal without one counts only as part of a trip). A receiver
    /// that accepted nothing (down for maintenance, answering 503 with `Retry-After`)
    /// gives no rate to learn: the pause is all it asked for.
    pub fn on_refused_with_pause(&mut self, now: Instant) {
        self.refusals.add(now);
        let accepted = self.throughput.peak(now);
        match &mut self.learned {
            Some(learned) => learned.on_refused(now, accepted),
            None if accepted >= 1.0 => {
                self.learned = Some(Box::new(Learned::new(accepted, now)));
            }
            None => {}
        }
    }

    /// The rate learned from refusals, if one is in force.
    pub fn learned_rate(&self) -> Option<f64> {
        self.learned.as_ref().map(|l| l.rate())
    }

    /// The receiver asked for a pause (`Retry-After` on 429/503), capped.
    pub fn hold_for(&mut self, after: Duration, now: Instant) {
        let until = now + after.min(MAX_RETRY_AFTER);
        self.not_before = Some(self.not_before.map_or(until, |t| t.max(until)));
    }

    /// The instant the receiver's pause ends, if one is in force.
    pub fn held_until(&self) -> Option<Instant> {
        self.not_before
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_holds_and_is_capped() {
        let now = Instant::now();
        let mut p = Pace::default();
        assert_eq!(p.wait(None, now), None);
        p.hold_for(Duration::from_secs(3), now);
        assert_eq!(p.wait(None, now), Some(now + Duration::from_secs(3)));
        p.hold_for(Duration::from_secs(1), now);
        assert_eq!(
            p.held_until(),
            Some(now + Duration::from_secs(3)),
            "the longer wins"
        );
        assert_eq!(p.wait(None, now + Duration::from_secs(3)), None);
        p.hold_for(Duration::from_secs(86_400), now);
        assert_eq!(p.held_until(), Some(now + MAX_RETRY_AFTER));
    }

    #[test]
    fn the_bucket_allows_a_burst_then_the_rate() {
        let rate = RateLimit {
            per_second: 10,
            burst: Some(2),
        };
        let now = Instant::now();
        let mut p = Pace::default();
        for _ in 0..2 {
            assert_eq!(p.wait(Some(&rate), now), None);
            p.on_start(now);
        }
        let at = p.wait(Some(&rate), now).expect("the burst is spent");
        assert_eq!(at, now + Duration::from_millis(100));
        assert_eq!(p.wait(Some(&rate), at), None);
    }

    /// A receiver that accepts `per_second` with bursts of `burst` (a token bucket),
    /// refuses the rest without `Retry-After` — and, at random, a `sporadic` share of
    /// what its bucket let through — and answers in `latency`; Herald with `concurrency`
    /// requests at a time and an endless backlog, paced as the endpoint paces.
    /// Returns (accepted, refused) over 30 s.
    fn simulate(
        per_second: f64,
        burst: f64,
        latency: Duration,
        concurrency: usize,
        sporadic: f64,
    ) -> (u32, u32) {
        simulate_receiver(
            per_second,
            burst,
            latency,
            concurrency,
            sporadic,
            None,
            None,
        )
    }

    /// [`simulate`], where Herald `stalls` for a while every so often (a busy machine:
    /// nothing sent, no answer read), and each refusal carries `Retry-After:
    /// retry_after` when it is set.
    fn simulate_receiver(
        per_second: f64,
        burst: f64,
        latency: Duration,
        concurrency: usize,
        sporadic: f64,
        stalls: Option<(Duration, Duration)>,
        retry_after: Option<Duration>,
    ) -> (u32, u32) {
        let mut dice = fastrand::Rng::with_seed(7);
        let start = Instant::now();
        let step = Duration::from_micros(500);
        let (mut accepted, mut refused) = (0, 0);
        let mut receiver = (burst, start);
        let mut pace = Pace::default();
        let mut in_flight: Vec<(Instant, bool)> = Vec::new();
        let mut now = start;
        while now < start + Duration::from_secs(30) {
            if let Some((every, stall)) = stalls {
                let into = (now - start).as_nanos() % every.as_nanos();
                if into < stall.as_nanos() {
                    now += step;
                    continue;
                }
            }
            // Answers that are due.
            in_flight.retain(|(at, ok)| {
                if *at > now {
                    return true;
                }
                match (*ok, retry_after) {
                    (true, _) => pace.on_success(now),
                    (false, None) => pace.on_refused(now),
                    (false, Some(after)) => {
                        pace.hold_for(after, now);
                        pace.on_refused_with_pause(now);
                    }
                }
                false
            });
            while in_flight.len() < concurrency && pace.wait(None, now).is_none() {
                pace.on_start(now);
                let (tokens, at) = receiver;
                let tokens = (tokens + (now - at).as_secs_f64() * per_second).min(burst);
                let admitted = tokens >= 1.0;
                receiver = (if admitted { tokens - 1.0 } else { tokens }, now);
                let ok = admitted && dice.f64() >= sporadic;
                if ok {
                    accepted += 1;
                } else {
                    refused += 1;
                }
                in_flight.push((now + latency, ok));
            }
            now += step;
        }
        println!(
            "accepted {accepted}, refused {refused} (ideal {})",
            per_second * 30.0
        );
        (accepted, refused)
    }

    /// Within 1.5x of the ideal and under 5 % refused.
    fn near_its_rate((accepted, refused): (u32, u32), per_second: f64) {
        let ideal = per_second * 30.0;
        assert!(f64::from(accepted) >= ideal / 1.5, "{accepted} of {ideal}");
        let share = f64::from(refused) / f64::from(accepted + refused);
        assert!(share < 0.05, "{refused} refused ({:.1}%)", share * 100.0);
    }

    #[test]
    fn a_fast_receiver_limited_to_200_per_second_is_drained_near_its_rate() {
        // 1 ms answers: a single request at a time would be 1,000 requests/s.
        near_its_rate(
            simulate(200.0, 20.0, Duration::from_millis(1), 4, 0.0),
            200.0,
        );
    }

    #[test]
    fn a_slow_receiver_limited_to_200_per_second_is_drained_near_its_rate() {
        // 100 ms answers: 20 at a time are needed for 200/s.
        near_its_rate(
            simulate(200.0, 20.0, Duration::from_millis(100), 64, 0.0),
            200.0,
        );
    }

    #[test]
    fn a_sender_that_stalls_now_and_then_keeps_the_receivers_rate() {
        // Stalled for 1 s every 5 s, Herald's own throughput of the last second is low
        // when a refusal follows a stall: a rate cut from it alone fell far below the
        // receiver's and took tens of seconds to grow back at 5 % a second (half of what
        // the receiver could take; cut from the best recent second, 0.83).
        let stalling = Some((Duration::from_secs(5), Duration::from_secs(1)));
        let (accepted, refused) = simulate_receiver(
            200.0,
            20.0,
            Duration::from_millis(1),
            4,
            0.0,
            stalling,
            None,
        );
        // What the receiver can take while Herald runs: 4 of every 5 s.
        near_its_rate((accepted, refused), 200.0 * 0.8);
    }

    #[test]
    fn a_receiver_that_asks_for_a_pause_is_paced_after_it() {
        // 429 with `Retry-After: 1` beyond 200/s: waiting and then coming back at full
        // concurrency tripped the limiter again after every pause (21 % refused, the
        // drain 9.5x the ideal, in a run against the real dispatcher).
        let pause = Some(Duration::from_secs(1));
        for (latency, concurrency) in [(1, 4), (100, 64)] {
            let latency = Duration::from_millis(latency);
            let run = simulate_receiver(200.0, 20.0, latency, concurrency, 0.0, None, pause);
            near_its_rate(run, 200.0);
        }
    }

    #[test]
    fn a_pause_from_a_receiver_that_accepted_nothing_learns_no_rate() {
        // Down for maintenance: 503 with `Retry-After` from the first request on.
        let now = Instant::now();
        let mut p = Pace::default();
        for i in 0..10 {
            let at = now + Duration::from_millis(i);
            p.hold_for(Duration::from_secs(30), at);
            p.on_refused_with_pause(at);
        }
        assert_eq!(p.learned_rate(), None, "only the pause");
        assert_eq!(p.wait(None, now + Duration::from_secs(31)), None);
        // A receiver that was taking requests and now asks for pauses is paced.
        for i in 0..50 {
            p.on_success(now + Duration::from_secs(31) + Duration::from_millis(i * 10));
        }
        let later = now + Duration::from_millis(31_600);
        for i in 0..5 {
            p.hold_for(Duration::from_secs(1), later);
            p.on_refused_with_pause(later + Duration::from_millis(i));
        }
        assert!(p.learned_rate().is_some(), "paced after the pause");
    }

    #[test]
    fn a_refusal_now_and_then_is_not_a_limiter() {
        // No limit, 1 % of the requests refused at random: four at a time at 1 ms each
        // is about 4,000 requests/s, and a learned rate must not bring it down (cut by a
        // quarter at every refusal, it fell to a few requests a second).
        let (accepted, refused) = simulate(1e9, 1e9, Duration::from_millis(1), 4, 0.01);
        assert!(accepted > 100_000, "{accepted} accepted, {refused} refused");
        // A limiter behind the same noise is still found.
        near_its_rate(
            simulate(200.0, 20.0, Duration::from_millis(1), 4, 0.01),
            200.0 * 0.99,
        );
    }
}
