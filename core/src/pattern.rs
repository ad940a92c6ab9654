//! Event types and the patterns endpoints subscribe with.
//!
//! An event type is a dot-separated list of segments made of `A-Z a-z 0-9 _ -`, such as
//! `order.created` or `invoice.payment-failed`. Each segment becomes one token of the NATS
//! subject `herald.events.<namespace>.<type>`, which is why the character set is narrow.
//!
//! A pattern is an event type in which any segment may be `*`:
//! - `*` in the middle matches exactly one segment (`order.*.shipped`);
//! - `*` as the last segment matches one or more segments (`order.*` matches
//!   `order.created` and `order.item.added`, not `order`);
//! - a lone `*` matches every event type except Herald's own operational events
//!   (`herald.…`, `crate::operational`): those are matched only by patterns whose first
//!   segment is the literal `herald` (`herald.*`, `herald.endpoint.disabled`), so an
//!   endpoint that takes everything does not start receiving them unasked.

use std::fmt;
use std::str::FromStr;

/// The first segment of Herald's operational event types.
const OPERATIONAL_SEGMENT: &str = "herald";

/// The regular expression the CRD schema enforces on event types.
pub const EVENT_TYPE_REGEX: &str = r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$";
/// The regular expression the CRD schema enforces on event-type patterns.
pub const PATTERN_REGEX: &str = r"^(\*|[A-Za-z0-9_-]+)(\.(\*|[A-Za-z0-9_-]+))*$";
/// Longest event type or pattern accepted.
pub const MAX_LEN: usize = 253;

/// Why an event type or pattern was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("is empty")]
    Empty,
    #[error("is {0} characters long; at most {MAX_LEN} are allowed")]
    TooLong(usize),
    #[error("segment {0} is empty (two dots in a row, or a leading or trailing dot)")]
    EmptySegment(usize),
    #[error("segment {index} {segment:?} has characters other than A-Z, a-z, 0-9, '_' and '-'")]
    BadCharacter { index: usize, segment: String },
    #[error("segment {index} {segment:?}: '*' must be a whole segment")]
    PartialWildcard { index: usize, segment: String },
    #[error("'*' is not allowed in an event type, only in patterns")]
    WildcardInType,
}

/// Checks that `ty` is a valid event type (no wildcards).
pub fn validate_event_type(ty: &str) -> Result<(), PatternError> {
    for (index, segment) in segments(ty)? {
        if segment == "*" {
            return Err(PatternError::WildcardInType);
        }
        check_literal(index, segment)?;
    }
    Ok(())
}

fn segments(text: &str) -> Result<impl Iterator<Item = (usize, &str)>, PatternError> {
    if text.is_empty() {
        return Err(PatternError::Empty);
    }
    if text.len() > MAX_LEN {
        return Err(PatternError::TooLong(text.len()));
    }
    if let Some((index, _)) = text.split('.').enumerate().find(|(_, s)| s.is_empty()) {
        return Err(PatternError::EmptySegment(index));
    }
    Ok(text.split('.').enumerate())
}

fn check_literal(index: usize, segment: &str) -> Result<(), PatternError> {
    let valid = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if segment.chars().all(valid) {
        Ok(())
    } else if segment.contains('*') {
        Err(PatternError::PartialWildcard {
            index,
            segment: segment.to_owned(),
        })
    } else {
        Err(PatternError::BadCharacter {
            index,
            segment: segment.to_owned(),
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Wildcard,
}

/// A compiled event-type pattern.
#[derive(Clone, PartialEq, Eq)]
pub struct Pattern {
    segments: Vec<Segment>,
}

impl FromStr for Pattern {
    type Err = PatternError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let segments = segments(text)?
            .map(|(index, segment)| {
                if segment == "*" {
                    Ok(Segment::Wildcard)
                } else {
                    check_literal(index, segment).map(|()| Segment::Literal(segment.to_owned()))
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { segments })
    }
}

impl Pattern {
    /// Whether the event type `ty` matches this pattern. `ty` is assumed valid.
    pub fn matches(&self, ty: &str) -> bool {
        let mut parts = ty.split('.');
        let last = self.segments.len() - 1;
        for (i, segment) in self.segments.iter().enumerate() {
            let Some(part) = parts.next() else {
                return false;
            };
            // Herald's operational events (`herald.…`) are matched only by patterns
            // that name them, never by a wildcard first segment.
            if i == 0 && part == OPERATIONAL_SEGMENT && matches!(segment, Segment::Wildcard) {
                return false;
            }
            match segment {
                Segment::Wildcard if i == last => return true,
                Segment::Wildcard => {}
                Segment::Literal(literal) if literal == part => {}
                Segment::Literal(_) => return false,
            }
        }
        parts.next().is_none()
    }

    /// Whether the pattern is a plain event type without wildcards.
    pub fn is_exact(&self) -> bool {
        self.segments
            .iter()
            .all(|s| matches!(s, Segment::Literal(_)))
    }

    /// The NATS subject filter (relative to `herald.events.<namespace>.`) that selects
    /// exactly the event types this pattern matches.
    pub fn subject_filter(&self) -> String {
        let last = self.segments.len() - 1;
        let tokens: Vec<&str> = self
            .segments
            .iter()
            .enumerate()
            .map(|(i, s)| match s {
                Segment::Literal(l) => l.as_str(),
                Segment::Wildcard if i == last => ">",
                Segment::Wildcard => "*",
            })
            .collect();
        tokens.join(".")
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, segment) in self.segments.iter().enumerate() {
            if i > 0 {
                f.write_str(".")?;
            }
            match segment {
                Segment::Literal(l) => f.write_str(l)?,
                Segment::Wildcard => f.write_str("*")?,
            }
        }
        Ok(())
    }
}

impl fmt::Debug for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pattern({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn p(text: &str) -> Pattern {
        text.parse().unwrap()
    }

    #[test]
    fn exact_patterns_match_only_themselves() {
        assert!(p("order.created").matches("order.created"));
        assert!(!p("order.created").matches("order.created.v2"));
        assert!(!p("order.created").matches("order"));
        assert!(p("order.created").is_exact());
    }

    #[test]
    fn trailing_wildcard_matches_one_or_more_segments() {
        let pattern = p("order.*");
        assert!(pattern.matches("order.created"));
        assert!(pattern.matches("order.item.added"));
        assert!(!pattern.matches("order"));
        assert!(!pattern.matches("invoice.created"));
        assert!(p("*").matches("anything.at.all"));
    }

    #[test]
    fn inner_wildcard_matches_exactly_one_segment() {
        let pattern = p("order.*.shipped");
        assert!(pattern.matches("order.eu.shipped"));
        assert!(!pattern.matches("order.shipped"));
        assert!(!pattern.matches("order.eu.west.shipped"));
    }

    #[test]
    fn operational_events_are_matched_only_by_patterns_that_name_them() {
        for (pattern, ty, matched) in [
            ("*", "herald.endpoint.disabled", false),
            ("*.endpoint.disabled", "herald.endpoint.disabled", false),
            ("herald.*", "herald.endpoint.disabled", true),
            ("herald.endpoint.*", "herald.delivery.dead", false),
            ("herald.endpoint.disabled", "herald.endpoint.disabled", true),
            ("*", "heralds.x", true),
            ("*", "order.herald", true),
        ] {
            assert_eq!(p(pattern).matches(ty), matched, "{pattern} {ty}");
        }
    }

    #[test]
    fn subject_filters_follow_nats_wildcards() {
        assert_eq!(p("order.*").subject_filter(), "order.>");
        assert_eq!(p("order.*.shipped").subject_filter(), "order.*.shipped");
        assert_eq!(p("*").subject_filter(), ">");
    }

    #[test]
    fn refuses_malformed_patterns_saying_where() {
        assert_eq!("".parse::<Pattern>(), Err(PatternError::Empty));
        assert_eq!(
            "order..x".parse::<Pattern>(),
            Err(PatternError::EmptySegment(1))
        );
        assert_eq!(
            ".order".parse::<Pattern>(),
            Err(PatternError::EmptySegment(0))
        );
        assert_eq!(
            "order.cre*".parse::<Pattern>(),
            Err(PatternError::PartialWildcard {
                index: 1,
                segment: "cre*".into()
            })
        );
        assert_eq!(
            "order.new item".parse::<Pattern>(),
            Err(PatternError::BadCharacter {
                index: 1,
                segment: "new item".into()
            })
        );
        assert!(matches!(
            "a".repeat(300).parse::<Pattern>(),
            Err(PatternError::TooLong(300))
        ));
        assert_eq!(
            validate_event_type("order.*"),
            Err(PatternError::WildcardInType)
        );
        assert_eq!(validate_event_type("order.created"), Ok(()));
    }

    proptest! {
        // Every valid event type matches itself, `*`, and its own prefix wildcard.
        #[test]
        fn types_match_themselves_and_their_prefix_wildcards(
            segs in proptest::collection::vec("[a-z0-9_-]{1,8}", 1..5)
        ) {
            let ty = segs.join(".");
            prop_assert!(validate_event_type(&ty).is_ok());
            prop_assert!(p(&ty).matches(&ty));
            prop_assert!(p("*").matches(&ty));
            let prefix_wildcard = format!("{}.*", segs[0]);
            prop_assert_eq!(p(&prefix_wildcard).matches(&ty), segs.len() > 1);
            prop_assert_eq!(p(&ty).to_string(), ty);
        }
    }
}
