//! `herald_core::duration`: Go-style durations (`30s`, `1h30m`, `1.5h`).
//!
//! - parse → display → parse round-trips (text and value);
//! - the parser accepts exactly Go's `time.ParseDuration` grammar restricted to the units
//!   `ms`, `s`, `m` and `h` and without a sign (a reference parser here, written from Go's),
//!   and everything the CRD schema's regular expression accepts;
//! - the value agrees with an exact integer computation to within the precision of `f64`;
//! - the durations Herald writes itself (`from_secs`, `from_mins`, `from_hours`) parse back
//!   to their value.
#![no_main]

use std::sync::LazyLock;

use arbitrary::Arbitrary;
use herald_core::duration::{Duration, PATTERN, ParseDurationError};
use libfuzzer_sys::fuzz_target;
use regex::Regex;

static PATTERN_RE: LazyLock<Regex> = LazyLock::new(|| Regex::new(PATTERN).unwrap());

/// Largest value a `std::time::Duration` holds, in nanoseconds.
const MAX_NANOS: f64 = u64::MAX as f64 * 1e9;

#[derive(Arbitrary, Debug)]
struct Input {
    text: String,
    /// A text from the duration alphabet, which mostly parses.
    small: Vec<Token>,
    whole: u32,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Token {
    Digit(u8),
    Dot,
    Ms,
    S,
    M,
    H,
    Other(char),
}

fn small(tokens: &[Token]) -> String {
    let mut text = String::new();
    for token in tokens {
        match token {
            Token::Digit(d) => text.push(char::from(b'0' + d % 10)),
            Token::Dot => text.push('.'),
            Token::Ms => text.push_str("ms"),
            Token::S => text.push('s'),
            Token::M => text.push('m'),
            Token::H => text.push('h'),
            Token::Other(c) => text.push(*c),
        }
    }
    text
}

/// Go's grammar, `([0-9]*(\.[0-9]*)?[a-z]+)+` with a digit on at least one side of the
/// point, units ms/s/m/h, no sign. Returns the exact value in nanoseconds (saturating at
/// `f64` range) and the number of components, or `None` when Go would refuse the text.
fn reference(text: &str) -> Option<(f64, u32)> {
    let bytes = text.as_bytes();
    if bytes.is_empty() {
        return None;
    }
    let (mut pos, mut total, mut components) = (0, 0f64, 0);
    while pos < bytes.len() {
        let digits = |pos: &mut usize| {
            let start = *pos;
            while *pos < bytes.len() && bytes[*pos].is_ascii_digit() {
                *pos += 1;
            }
            &text[start..*pos]
        };
        let whole = digits(&mut pos);
        let fraction = if bytes.get(pos) == Some(&b'.') {
            pos += 1;
            Some(digits(&mut pos))
        } else {
            None
        };
        if whole.is_empty() && fraction.is_none_or(str::is_empty) {
            return None;
        }
        let unit_start = pos;
        while pos < bytes.len() && bytes[pos] != b'.' && !bytes[pos].is_ascii_digit() {
            pos += 1;
        }
        let unit_nanos: u128 = match &text[unit_start..pos] {
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return None,
        };
        // Exact integer arithmetic while it fits; beyond that only "huge" matters.
        let whole_nanos = whole
            .trim_start_matches('0')
            .parse::<u128>()
            .ok()
            .and_then(|w| w.checked_mul(unit_nanos))
            .map_or(f64::INFINITY, |n| n as f64);
        let fraction_nanos = fraction.map_or(0.0, |f| {
            let f = &f[..f.len().min(24)];
            let numerator: u128 = f.parse().unwrap_or(0);
            let denominator = 10u128.pow(f.len() as u32);
            (numerator * unit_nanos / denominator) as f64
        });
        total += whole_nanos + fraction_nanos;
        components += 1;
    }
    Some((total, components))
}

fn check(text: &str) {
    let parsed = text.parse::<Duration>();
    let expected = reference(text);
    match (&parsed, expected) {
        (Ok(duration), Some((nanos, components))) => {
            assert_eq!(duration.to_string(), text);
            assert_eq!(
                duration.to_string().parse::<Duration>().as_ref(),
                Ok(duration)
            );
            let got = duration.get().as_nanos() as f64;
            // Each component's f64 parse, unit scaling and sum round once or twice.
            let tolerance = f64::from(components + 1) * (2.0 + nanos * 2f64.powi(-50));
            assert!(
                (got - nanos).abs() <= tolerance,
                "{text:?}: {got} ns, exactly {nanos} ns"
            );
        }
        (Err(ParseDurationError::Overflow(_)), Some((nanos, _))) => {
            assert!(
                nanos >= MAX_NANOS * (1.0 - 1e-9),
                "{text:?}: overflow at {nanos} ns"
            );
        }
        (Err(e), Some((nanos, _))) => {
            panic!("{text:?} is a Go duration of {nanos} ns, refused: {e}")
        }
        (Ok(duration), None) => panic!("{text:?} is not a Go duration, parsed as {duration:?}"),
        (Err(_), None) => {}
    }
    if PATTERN_RE.is_match(text) {
        assert!(
            matches!(parsed, Ok(_) | Err(ParseDurationError::Overflow(_))),
            "{text:?} matches the CRD pattern, refused: {parsed:?}"
        );
    }
}

fuzz_target!(|input: Input| {
    check(&input.text);
    check(&small(&input.small));
    let n = u64::from(input.whole);
    for (written, secs) in [
        (Duration::from_secs(n), n),
        (Duration::from_mins(n), n * 60),
        (Duration::from_hours(n), n * 3600),
    ] {
        assert_eq!(written.get().as_secs(), secs);
        let again: Duration = written
            .to_string()
            .parse()
            .expect("Herald's own text parses");
        assert_eq!(again.get(), written.get(), "{written}");
    }
});
