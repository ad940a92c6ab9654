//! Percentiles of one run, the spread of a figure over several runs, and what one
//! repetition of a scenario measured ([`Run`]). Pure.

use std::time::Duration;

use serde::Serialize;

/// The `p`-quantile (0 < p ≤ 1) of sorted values by the nearest-rank method; 0 for none.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((sorted.len() as f64) * p).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Latency percentiles of one run, in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub count: usize,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    pub fn of(latencies: &[Duration]) -> Self {
        Self::of_ms(latencies.iter().map(|d| d.as_secs_f64() * 1e3))
    }

    /// Of latencies given in milliseconds.
    pub fn of_ms(latencies: impl IntoIterator<Item = f64>) -> Self {
        let mut ms: Vec<f64> = latencies.into_iter().collect();
        ms.sort_by(f64::total_cmp);
        Self {
            count: ms.len(),
            p50: percentile(&ms, 0.50),
            p90: percentile(&ms, 0.90),
            p99: percentile(&ms, 0.99),
            max: ms.last().copied().unwrap_or(0.0),
        }
    }
}

/// One figure over several runs: its median and range.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub runs: usize,
}

impl Spread {
    /// The median (of an even count, the mean of the middle two), min and max.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Self {
        let mut v: Vec<f64> = values.into_iter().collect();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = match n {
            0 => 0.0,
            _ if n % 2 == 1 => v[n / 2],
            _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        };
        Self {
            median,
            min: v.first().copied().unwrap_or(0.0),
            max: v.last().copied().unwrap_or(0.0),
            runs: n,
        }
    }

    /// `median (min–max)` with `decimals`, or just the value of a single run.
    pub fn show(&self, decimals: usize, unit: &str) -> String {
        let f = |x: f64| format!("{x:.decimals$}");
        if self.runs > 1 {
            format!("{}{unit} ({}–{})", f(self.median), f(self.min), f(self.max))
        } else {
            format!("{}{unit}", f(self.median))
        }
    }
}

/// What one repetition of a scenario measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Run {
    /// Events published.
    pub events: usize,
    /// Deliveries the measured endpoints should receive.
    pub expected: usize,
    /// Distinct deliveries they received.
    pub delivered: usize,
    /// Publish start → last delivery.
    pub seconds: f64,
    /// `delivered / seconds`.
    pub rate: f64,
    pub publish_seconds: f64,
    /// Publish sent → first arrival, of every delivery (includes the publish round trip).
    pub latency: Percentiles,
    /// Publish acknowledged → first arrival, of every delivery: the brief's latency.
    pub acked: Percentiles,
    /// The same, every sample in milliseconds, for figures pooled over runs (not in
    /// `benchmark.json`).
    #[serde(skip)]
    pub samples: Vec<f32>,
    /// Fan-out: publish sent → the arrival at the event's last endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion: Option<Percentiles>,
    /// Ordered endpoints: first arrivals that came before an earlier event's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inversions: Option<usize>,
}

impl Run {
    pub fn complete(&self) -> bool {
        self.expected > 0 && self.delivered == self.expected
    }
}

/// How a case's p99 differs from its baseline's, over rounds in which both ran (the
/// cases of a round run back to back, so a pair shares the machine's state): the median
/// of the rounds' relative changes, with a 95 % bootstrap confidence interval of that
/// median (10,000 resamples of the rounds, seeded: the same runs give the same interval).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Change {
    /// Percent.
    pub median: f64,
    pub low: f64,
    pub high: f64,
    pub rounds: usize,
}

/// What a [`Change`] shows against a limit on the rise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The whole interval is under the limit.
    Met,
    /// The whole interval is over it.
    NotMet,
    /// The interval holds 0: the case cannot be told apart from the baseline's own
    /// round-to-round noise at this many rounds.
    WithinNoise,
    /// A rise is shown (the interval is above 0) but not whether it passes the limit.
    Undecided,
}

impl Change {
    const RESAMPLES: usize = 10_000;

    /// Pairs `base[i]` with `case[i]` (round `i`); `None` without a pair.
    pub fn paired(base: &[f64], case: &[f64]) -> Option<Self> {
        let changes: Vec<f64> = base
            .iter()
            .zip(case)
            .filter(|(b, _)| **b > 0.0)
            .map(|(b, c)| (c / b - 1.0) * 100.0)
            .collect();
        if changes.is_empty() {
            return None;
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            Spread::of(v.iter().copied()).median
        };
        let mut rng = fastrand::Rng::with_seed(0x4e52_414c_4448);
        let n = changes.len();
        let mut sample = Vec::with_capacity(n);
        let mut medians: Vec<f64> = (0..Self::RESAMPLES)
            .map(|_| {
                sample.clear();
                sample.extend((0..n).map(|_| changes[rng.usize(..n)]));
                median(&mut sample)
            })
            .collect();
        medians.sort_by(f64::total_cmp);
        Some(Self {
            median: median(&mut changes.clone()),
            low: percentile(&medians, 0.025),
            high: percentile(&medians, 0.975),
            rounds: n,
        })
    }

    /// Against a limit of `limit` percent on the rise.
    pub fn verdict(&self, limit: f64) -> Verdict {
        if self.high < limit {
            Verdict::Met
        } else if self.low > limit {
            Verdict::NotMet
        } else if self.low <= 0.0 {
            Verdict::WithinNoise
        } else {
            Verdict::Undecided
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&v, 1.0), 100.0);
        assert_eq!(percentile(&[7.0], 0.99), 7.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
        let p = Percentiles::of(&[
            Duration::from_millis(3),
            Duration::from_millis(1),
            Duration::from_millis(2),
        ]);
        assert_eq!((p.count, p.p50, p.max), (3, 2.0, 3.0));
    }

    #[test]
    fn spread_is_the_median_and_the_range() {
        let s = Spread::of([3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max, s.runs), (2.0, 1.0, 3.0, 3));
        assert_eq!(Spread::of([1.0, 4.0]).median, 2.5);
        assert_eq!(s.show(1, " ms"), "2.0 ms (1.0–3.0)");
        assert_eq!(Spread::of([5.0]).show(0, "/s"), "5/s");
        assert_eq!(Spread::of([]).runs, 0);
    }

    #[test]
    fn a_change_is_judged_by_its_interval() {
        // The same every round: a point interval.
        let same = Change::paired(&[1.0; 8], &[1.02; 8]).expect("pairs");
        assert!((same.median - 2.0).abs() < 1e-9 && (same.low - 2.0).abs() < 1e-9);
        assert_eq!(same.verdict(5.0), Verdict::Met);
        let worse = Change::paired(&[1.0; 8], &[1.2; 8]).expect("pairs");
        assert_eq!(worse.verdict(5.0), Verdict::NotMet);
        // Noise both ways around 0.
        let base = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0];
        let noisy = [0.8, 1.3, 0.9, 1.2, 1.0, 0.85, 1.25, 1.05];
        let noise = Change::paired(&base, &noisy).expect("pairs");
        assert!(noise.low < 0.0 && noise.high > 5.0, "{noise:?}");
        assert_eq!(noise.verdict(5.0), Verdict::WithinNoise);
        // A rise that is certain, but not whether it passes 5 %.
        let rise = Change::paired(&base, &[1.01, 1.08, 1.02, 1.09, 1.03, 1.07, 1.04, 1.06])
            .expect("pairs");
        assert!(
            rise.low > 0.0 && rise.low < 5.0 && rise.high > 5.0,
            "{rise:?}"
        );
        assert_eq!(rise.verdict(5.0), Verdict::Undecided);
        assert_eq!(Change::paired(&[], &[]), None);
        assert_eq!(Change::paired(&[0.0], &[1.0]), None);
    }
}
