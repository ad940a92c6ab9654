//! Success rate and p95 latency over the last five minutes, in five one-minute buckets
//! of counters and a latency histogram (powers of two milliseconds). Allocated on an
//! endpoint's first attempt, so idle endpoints do not pay for it.

#[derive(Debug, Clone, Default)]
struct Bucket {
    minute: u64,
    ok: u32,
    total: u32,
    /// Bucket i counts latencies below 2^i ms.
    latency: [u32; 17],
}

#[derive(Debug, Clone, Default)]
pub struct Window {
    buckets: [Bucket; 5],
}

impl Window {
    pub fn record(&mut self, now_ms: u64, ok: bool, latency_ms: u64) {
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

    /// Successful attempts per mille, or `None` without attempts in the window.
    pub fn success_permille(&self, now_ms: u64) -> Option<u32> {
        let (ok, total) = self.live(now_ms).fold((0u64, 0u64), |(o, t), b| {
            (o + u64::from(b.ok), t + u64::from(b.total))
        });
        (total > 0).then(|| (ok * 1000 / total) as u32)
    }

    /// The p95 latency rounded up to a power of two milliseconds.
    pub fn p95_ms(&self, now_ms: u64) -> Option<u64> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_percentiles_over_five_minutes() {
        let mut w = Window::default();
        assert_eq!(w.success_permille(0), None);
        for i in 0..100 {
            w.record(60_000, i % 10 != 0, if i < 95 { 3 } else { 900 });
        }
        assert_eq!(w.success_permille(60_000), Some(900));
        assert_eq!(w.p95_ms(60_000), Some(4), "95 of 100 under 4 ms");
        assert_eq!(
            w.success_permille(6 * 60_000),
            None,
            "five minutes later it is gone"
        );
    }
}
