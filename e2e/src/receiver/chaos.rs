//! Seeded random faults: which fault, if any, a request meets is a function of the seed,
//! the path, the event and how many requests of it came before.

use std::time::Duration;

/// Random faults, reproducible: the answer to a request is a function of the seed, the
/// path, the event's `data` (or its `webhook-id` when `data` is not a number) and how
/// many requests of that event the path has had before — not of arrival order or time,
/// so the same run of events meets the same faults whatever the timing.
#[derive(Debug, Clone)]
pub struct Chaos {
    pub seed: u64,
    /// Each fault with its probability in permille; what is left answers 200.
    pub faults: Vec<(Fault, u32)>,
    /// After this many faulty answers to one event, it gets 200: every event succeeds
    /// within `max_faults + 1` attempts, so a finite retry schedule suffices.
    pub max_faults: u32,
    /// How long [`Fault::Hang`] holds a request before answering 200 (make it longer
    /// than the endpoint's timeout).
    pub hang: Duration,
    /// How long [`Fault::SlowBody`] takes to send its body.
    pub slow_body: Duration,
}

impl Chaos {
    /// Every fault kind at `permille_each`, at most `max_faults` per event.
    pub fn uniform(seed: u64, permille_each: u32, max_faults: u32) -> Self {
        Self {
            seed,
            faults: vec![
                (Fault::Status(500), permille_each),
                (Fault::Hang, permille_each),
                (Fault::Reset, permille_each),
                (Fault::SlowBody, permille_each),
                (Fault::RetryAfter(1), permille_each),
            ],
            max_faults,
            hang: Duration::from_secs(3),
            slow_body: Duration::from_millis(300),
        }
    }

    /// The fault for the `nth` request (0-based) of `event` on `path`, if any.
    pub(super) fn draw(&self, path: &str, event: &str, nth: u32) -> Option<Fault> {
        let mut h = splitmix(self.seed ^ fnv(path.as_bytes()));
        h = splitmix(h ^ fnv(event.as_bytes()));
        h = splitmix(h ^ u64::from(nth));
        let roll = (h % 1000) as u32;
        let mut acc = 0;
        for (fault, permille) in &self.faults {
            acc += permille;
            if roll < acc {
                return Some(*fault);
            }
        }
        None
    }
}

/// One kind of random fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Answer this status.
    Status(u16),
    /// Hold the request (past the sender's timeout), then answer 200 if anyone still
    /// listens.
    Hang,
    /// Reset the connection (TCP RST) without answering.
    Reset,
    /// Answer 200, sending the body slowly (a success, just a slow one).
    SlowBody,
    /// Answer 429 with `Retry-After: <seconds>`.
    RetryAfter(u64),
}

impl Fault {
    /// Whether the sender sees a failure (everything but a slow success).
    pub fn fails(self) -> bool {
        !matches!(self, Fault::SlowBody)
    }
}

/// SplitMix64: a tiny, good-enough mixer for seeded decisions (no RNG dependency).
fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn fnv(bytes: &[u8]) -> u64 {
    herald_core::dataplane::fnv1a(bytes.iter().copied())
}
