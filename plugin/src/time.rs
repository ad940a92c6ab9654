//! Times on the command line and in tables.
//!
//! Flags such as `--since 2h` or `--from 2026-11-30T10:00:00Z` take either an RFC 3339
//! time or a Go-style duration counted back from now (`herald_core::duration`, the
//! syntax of every duration in Herald's specs, plus whole days such as `7d`). Tables show
//! ages the way kubectl's `AGE` column does (`45s`, `3m20s`, `5h`, `2d3h`). Pure: `now`
//! is passed in.

use jiff::{SignedDuration, Timestamp};

/// A time on the command line: an RFC 3339 time, or a duration ago.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeArg {
    At(Timestamp),
    Ago(std::time::Duration),
}

impl TimeArg {
    /// The time meant, `now` being the present.
    pub fn resolve(self, now: Timestamp) -> Timestamp {
        match self {
            Self::At(t) => t,
            Self::Ago(d) => SignedDuration::try_from(d)
                .ok()
                .and_then(|d| now.checked_sub(d).ok())
                .unwrap_or(Timestamp::MIN),
        }
    }
}

impl std::str::FromStr for TimeArg {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if let Ok(t) = text.parse::<Timestamp>() {
            return Ok(Self::At(t));
        }
        parse_duration(text).map(Self::Ago).map_err(|e| {
            format!("{text:?} is neither an RFC 3339 time (2026-11-30T10:00:00Z) nor a duration (30m, 2h, 7d): {e}")
        })
    }
}

/// A Go-style duration (`500ms`, `30s`, `5m`, `1h30m`) or whole days (`7d`).
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let text = text.trim();
    if let Some(days) = text.strip_suffix('d')
        && let Ok(days) = days.parse::<u64>()
    {
        return days
            .checked_mul(86_400)
            .map(std::time::Duration::from_secs)
            .ok_or_else(|| format!("{text:?} is too large"));
    }
    herald_core::duration::parse_std(text)
}

/// How long ago `then` was, kubectl style (`45s`, `3m20s`, `59m`, `5h30m`, `47h`,
/// `6d2h`, `300d`); a time in the future reads `in 30s`.
pub fn age(then: Timestamp, now: Timestamp) -> String {
    let secs = now.duration_since(then).as_secs();
    if secs < 0 {
        return format!("in {}", human(-secs));
    }
    human(secs)
}

/// A time that may lie either side of now: `in 30s` or `30s ago` (a retry that was due
/// and has not been attempted yet).
pub fn relative(t: Timestamp, now: Timestamp) -> String {
    let secs = now.duration_since(t).as_secs();
    if secs < 0 {
        format!("in {}", human(-secs))
    } else {
        format!("{} ago", human(secs))
    }
}

/// kubectl's `HumanDuration` (k8s.io/apimachinery/pkg/util/duration), in seconds.
fn human(secs: i64) -> String {
    let (m, h, d) = (secs / 60, secs / 3_600, secs / 86_400);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 600 => match s % 60 {
            0 => format!("{m}m"),
            r => format!("{m}m{r}s"),
        },
        s if s < 3 * 3_600 => format!("{m}m"),
        s if s < 8 * 3_600 => match m % 60 {
            0 => format!("{h}h"),
            r => format!("{h}h{r}m"),
        },
        s if s < 48 * 3_600 => format!("{h}h"),
        s if s < 8 * 86_400 => match h % 24 {
            0 => format!("{d}d"),
            r => format!("{d}d{r}h"),
        },
        s if s < 2 * 365 * 86_400 => format!("{d}d"),
        _ => format!("{}y", d / 365),
    }
}

/// Milliseconds as a table shows them: `12ms`, `1.2s`.
pub fn millis(ms: u64) -> String {
    if ms < 1_000 {
        format!("{ms}ms")
    } else {
        format!("{:.1}s", ms as f64 / 1_000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    #[test]
    fn time_args_are_rfc3339_or_durations_ago() {
        let now = at("2026-12-01T12:00:00Z");
        let cases = [
            ("2026-11-30T10:00:00Z", "2026-11-30T10:00:00Z"),
            ("2026-11-30T10:00:00+01:00", "2026-11-30T09:00:00Z"),
            ("2h", "2026-12-01T10:00:00Z"),
            ("1h30m", "2026-12-01T10:30:00Z"),
            ("90s", "2026-12-01T11:58:30Z"),
            ("7d", "2026-11-24T12:00:00Z"),
        ];
        for (arg, want) in cases {
            let got = arg.parse::<TimeArg>().unwrap().resolve(now);
            assert_eq!(got, at(want), "{arg}");
        }
    }

    #[test]
    fn bad_time_args_say_what_is_accepted() {
        for arg in ["", "yesterday", "2h-", "2026-13-01T00:00:00Z", "-5m", "5x"] {
            let err = arg.parse::<TimeArg>().unwrap_err();
            assert!(err.contains("RFC 3339"), "{arg}: {err}");
        }
    }

    #[test]
    fn durations_take_days_too() {
        assert_eq!(parse_duration("5m").unwrap().as_secs(), 300);
        assert_eq!(parse_duration("2d").unwrap().as_secs(), 172_800);
        assert_eq!(parse_duration("500ms").unwrap().as_millis(), 500);
        assert!(parse_duration("d").is_err());
        assert!(parse_duration("99999999999999999d").is_err());
    }

    #[test]
    fn ages_read_like_kubectl() {
        let now = at("2026-12-01T12:00:00Z");
        let ago = |secs: i64| age(now - SignedDuration::from_secs(secs), now);
        let cases = [
            (0, "0s"),
            (45, "45s"),
            (119, "119s"),
            (120, "2m"),
            (200, "3m20s"),
            (900, "15m"),
            (3 * 3_600, "3h"),
            (5 * 3_600 + 1_800, "5h30m"),
            (47 * 3_600, "47h"),
            (6 * 86_400 + 7_200, "6d2h"),
            (300 * 86_400, "300d"),
            (800 * 86_400, "2y"),
        ];
        for (secs, want) in cases {
            assert_eq!(ago(secs), want, "{secs} s");
        }
        assert_eq!(age(now + SignedDuration::from_secs(30), now), "in 30s");
        assert_eq!(relative(now + SignedDuration::from_secs(30), now), "in 30s");
        assert_eq!(
            relative(now - SignedDuration::from_secs(200), now),
            "3m20s ago"
        );
    }

    #[test]
    fn latencies() {
        assert_eq!(millis(0), "0ms");
        assert_eq!(millis(12), "12ms");
        assert_eq!(millis(1_234), "1.2s");
    }
}
