//! Go-style durations (`500ms`, `30s`, `5m`, `1h30m`, `1.5h`) as they appear in specs.
//!
//! Kubernetes users know this format from every core API, and CEL's `duration()` in the
//! CRD validation rules parses the same syntax, so the API server and Herald agree on
//! what a value means. The original text is kept so a spec round-trips unchanged.

use std::fmt;
use std::str::FromStr;
use std::time::Duration as StdDuration;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The regular expression the CRD schema enforces on every duration field.
pub const PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$";

/// A duration written the Go way, e.g. `30s` or `1h30m`.
#[derive(Clone, PartialEq, Eq)]
pub struct Duration {
    text: String,
    value: StdDuration,
}

/// Why a duration string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseDurationError {
    #[error("empty duration; write e.g. \"30s\", \"5m\" or \"1h30m\"")]
    Empty,
    #[error("duration {0:?}: expected a number at byte {1}")]
    ExpectedNumber(String, usize),
    #[error("duration {0:?}: missing or unknown unit at byte {1}; use ms, s, m or h")]
    BadUnit(String, usize),
    #[error("duration {0:?} is too large")]
    Overflow(String),
}

impl Duration {
    /// The parsed value.
    pub fn get(&self) -> StdDuration {
        self.value
    }

    /// A duration from whole seconds, written as `<n>s`.
    pub fn from_secs(secs: u64) -> Self {
        Self {
            text: format!("{secs}s"),
            value: StdDuration::from_secs(secs),
        }
    }

    /// A duration from whole minutes, written as `<n>m`.
    pub fn from_mins(mins: u64) -> Self {
        Self {
            text: format!("{mins}m"),
            value: StdDuration::from_secs(mins * 60),
        }
    }

    /// A duration from whole hours, written as `<n>h`.
    pub fn from_hours(hours: u64) -> Self {
        Self {
            text: format!("{hours}h"),
            value: StdDuration::from_secs(hours * 3600),
        }
    }

    /// The text as written in the spec.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

/// Parses a Go-style duration into a `std` one; the value parser of both binaries'
/// duration flags.
pub fn parse_std(text: &str) -> Result<StdDuration, String> {
    text.parse::<Duration>()
        .map(|d| d.get())
        .map_err(|e| e.to_string())
}

impl FromStr for Duration {
    type Err = ParseDurationError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.is_empty() {
            return Err(ParseDurationError::Empty);
        }
        let bytes = text.as_bytes();
        let mut pos = 0;
        let mut total = 0f64;
        while pos < bytes.len() {
            let start = pos;
            while pos < bytes.len() && (bytes[pos].is_ascii_digit() || bytes[pos] == b'.') {
                pos += 1;
            }
            let number: f64 = text[start..pos]
                .parse()
                .map_err(|_| ParseDurationError::ExpectedNumber(text.to_owned(), start))?;
            let unit_start = pos;
            while pos < bytes.len() && bytes[pos].is_ascii_alphabetic() {
                pos += 1;
            }
            let seconds_per_unit = match &text[unit_start..pos] {
                "ms" => 0.001,
                "s" => 1.0,
                "m" => 60.0,
                "h" => 3600.0,
                _ => return Err(ParseDurationError::BadUnit(text.to_owned(), unit_start)),
            };
            total += number * seconds_per_unit;
        }
        let value = StdDuration::try_from_secs_f64(total)
            .map_err(|_| ParseDurationError::Overflow(text.to_owned()))?;
        Ok(Self {
            text: text.to_owned(),
            value,
        })
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Duration({})", self.text)
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for Duration {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "maxLength": 32,
            "pattern": PATTERN,
            "x-kubernetes-validations": [{
                "rule": "duration(self) > duration('0s')",
                "message": "must be a positive duration such as \"30s\", \"5m\" or \"1h30m\""
            }]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(text: &str) -> f64 {
        text.parse::<Duration>().unwrap().get().as_secs_f64()
    }

    #[test]
    fn parses_go_style_durations() {
        assert_eq!(secs("500ms"), 0.5);
        assert_eq!(secs("30s"), 30.0);
        assert_eq!(secs("5m"), 300.0);
        assert_eq!(secs("1h30m"), 5400.0);
        assert_eq!(secs("1.5h"), 5400.0);
        assert_eq!(secs("72h"), 259_200.0);
    }

    #[test]
    fn refuses_malformed_durations_with_position() {
        assert_eq!("".parse::<Duration>(), Err(ParseDurationError::Empty));
        assert_eq!(
            "10".parse::<Duration>(),
            Err(ParseDurationError::BadUnit("10".into(), 2))
        );
        assert_eq!(
            "5d".parse::<Duration>(),
            Err(ParseDurationError::BadUnit("5d".into(), 1))
        );
        assert_eq!(
            "s".parse::<Duration>(),
            Err(ParseDurationError::ExpectedNumber("s".into(), 0))
        );
        assert!("-5s".parse::<Duration>().is_err());
    }

    #[test]
    fn keeps_the_text_through_serde() {
        let d: Duration = serde_json::from_str("\"1h30m\"").unwrap();
        assert_eq!(serde_json::to_string(&d).unwrap(), "\"1h30m\"");
        assert!(serde_json::from_str::<Duration>("\"soon\"").is_err());
    }
}
