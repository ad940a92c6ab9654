//! `herald_core::pattern`: event types and the patterns endpoints subscribe with.
//!
//! - parsing agrees with the regular expressions the CRD schema enforces (so the API
//!   server and Herald accept the same texts) and the length limit;
//! - `matches` agrees with a naive recursive matcher written from the module's contract;
//! - the NATS subject filter selects exactly the types the pattern matches (checked with a
//!   NATS-style matcher for `*` and `>`);
//! - a pattern prints back to its text.
#![no_main]

use std::sync::LazyLock;

use arbitrary::Arbitrary;
use herald_core::pattern::{
    EVENT_TYPE_REGEX, MAX_LEN, PATTERN_REGEX, Pattern, validate_event_type,
};
use libfuzzer_sys::fuzz_target;
use regex::Regex;

static TYPE_RE: LazyLock<Regex> = LazyLock::new(|| Regex::new(EVENT_TYPE_REGEX).unwrap());
static PATTERN_RE: LazyLock<Regex> = LazyLock::new(|| Regex::new(PATTERN_REGEX).unwrap());

#[derive(Arbitrary, Debug)]
struct Input {
    /// Free text, which mostly tests parsing.
    pattern: String,
    ty: String,
    /// Texts from a small alphabet, which mostly parse and so test matching.
    small_pattern: Vec<Token>,
    small_type: Vec<Token>,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Token {
    A,
    B,
    Star,
    Dot,
    Other,
}

fn small(tokens: &[Token]) -> String {
    tokens
        .iter()
        .map(|t| match t {
            Token::A => "a",
            Token::B => "b",
            Token::Star => "*",
            Token::Dot => ".",
            Token::Other => "é",
        })
        .collect()
}

/// The contract: a final `*` matches one or more segments, any other `*` exactly one.
fn reference_matches(pattern: &[&str], ty: &[&str]) -> bool {
    match (pattern, ty) {
        ([], []) => true,
        (["*"], rest) => !rest.is_empty(),
        ([p, pattern @ ..], [t, ty @ ..]) => {
            (*p == "*" || p == t) && reference_matches(pattern, ty)
        }
        _ => false,
    }
}

/// NATS subject matching: `*` is one token, a final `>` one or more.
fn nats_matches(filter: &[&str], subject: &[&str]) -> bool {
    match (filter, subject) {
        ([], []) => true,
        ([">"], rest) => !rest.is_empty(),
        ([f, filter @ ..], [s, subject @ ..]) => {
            (*f == "*" || f == s) && nats_matches(filter, subject)
        }
        _ => false,
    }
}

fn check(pattern_text: &str, ty: &str) {
    let pattern = pattern_text.parse::<Pattern>();
    let pattern_valid = PATTERN_RE.is_match(pattern_text) && pattern_text.len() <= MAX_LEN;
    assert_eq!(
        pattern.is_ok(),
        pattern_valid,
        "{pattern_text:?}: parse gave {pattern:?}, the CRD schema says {pattern_valid}"
    );
    let type_valid = TYPE_RE.is_match(ty) && ty.len() <= MAX_LEN;
    assert_eq!(
        validate_event_type(ty).is_ok(),
        type_valid,
        "{ty:?}: validate gave {:?}, the CRD schema says {type_valid}",
        validate_event_type(ty)
    );
    let Ok(pattern) = pattern else { return };
    assert_eq!(pattern.to_string(), pattern_text);
    assert_eq!(
        pattern.to_string().parse::<Pattern>().as_ref(),
        Ok(&pattern)
    );
    assert_eq!(
        pattern.is_exact(),
        !pattern_text.split('.').any(|s| s == "*")
    );
    if !type_valid {
        return;
    }
    let segments: Vec<&str> = pattern_text.split('.').collect();
    let ty_segments: Vec<&str> = ty.split('.').collect();
    let expected = reference_matches(&segments, &ty_segments);
    assert_eq!(pattern.matches(ty), expected, "{pattern_text:?} on {ty:?}");
    let filter = pattern.subject_filter();
    let filter: Vec<&str> = filter.split('.').collect();
    assert_eq!(
        nats_matches(&filter, &ty_segments),
        expected,
        "subject filter {filter:?} on {ty:?}"
    );
    // An exact pattern matches exactly its own text.
    if pattern.is_exact() {
        assert_eq!(pattern.matches(ty), pattern_text == ty);
    }
}

fuzz_target!(|input: Input| {
    check(&input.pattern, &input.ty);
    check(&small(&input.small_pattern), &small(&input.small_type));
    // A pattern made from the type itself with a segment replaced by `*`.
    let ty = small(&input.small_type);
    if validate_event_type(&ty).is_ok() {
        let segments: Vec<&str> = ty.split('.').collect();
        let i = input.small_pattern.len() % segments.len();
        let mut wild = segments.clone();
        wild[i] = "*";
        let wild = wild.join(".");
        check(&wild, &ty);
        assert!(
            wild.parse::<Pattern>().unwrap().matches(&ty),
            "{wild} on {ty}"
        );
    }
});
