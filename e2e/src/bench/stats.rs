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
}
