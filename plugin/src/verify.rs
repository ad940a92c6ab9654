//! `verify --secret whsec_... < request` (or `--secret whpk_...` for Ed25519): checks a Standard Webhooks signature locally,
//! the way a receiver does, from a raw HTTP request (request line, headers, blank line,
//! body) on stdin — what `nc -l`, a proxy's dump or a receiver's log captured.
//!
//! The check itself is `herald_core::signing::verify`, the code Herald's own tests hold
//! to the published vector; this module only takes the request apart ([`parse`]) and
//! says which key matched or why none did ([`check`]). Both are pure.

use std::collections::BTreeMap;
use std::time::Duration;

use herald_core::signing::{self, VerifyingKey};

/// Flags of `verify`.
#[derive(Clone, Debug, clap::Args)]
pub struct VerifyArgs {
    /// A signing secret (`whsec_...`) or, for a SigningSecret of algorithm Ed25519, its
    /// public key (`whpk_...`, from `status.activePublicKey`); repeat for every key that
    /// may sign (during a rotation both do). Also taken from WEBHOOK_SECRET
    /// (comma-separated), which keeps it out of the shell history and the process list.
    #[arg(
        long = "secret",
        value_name = "KEY",
        env = "WEBHOOK_SECRET",
        value_delimiter = ',',
        hide_env_values = true,
        required = true
    )]
    pub secrets: Vec<String>,
    /// How far `webhook-timestamp` may be from the clock of this machine (Standard
    /// Webhooks receivers use 5 minutes); a large value checks an old captured request.
    #[arg(long, default_value = "5m", value_parser = crate::time::parse_duration)]
    pub tolerance: Duration,
}

/// A request taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Header names in lower case; a repeated header's values joined with `, `.
    pub headers: BTreeMap<String, String>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// Why a request could not be checked, or was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error(
        "no blank line after the headers: give the whole request (request line, headers, blank line, body)"
    )]
    NoBlankLine,
    #[error("header line {0:?} is not \"name: value\"")]
    BadHeader(String),
    #[error("the request has no {0} header")]
    Missing(&'static str),
    #[error("the body has {got} bytes but Content-Length says {want}")]
    ShortBody { want: usize, got: usize },
    #[error("Transfer-Encoding {0:?} is not supported: give the decoded body")]
    Encoded(String),
    #[error("secret #{index}: {reason}")]
    BadSecret { index: usize, reason: String },
    #[error("{0}")]
    Signature(#[from] signing::VerifyError),
}

/// Takes a raw HTTP/1 request apart. Lines may end in CRLF or LF; the request line may
/// be missing (headers first). The body is `Content-Length` bytes when that header is
/// there (trailing bytes after it are ignored), else everything after the blank line.
pub fn parse(raw: &[u8]) -> Result<Request, Invalid> {
    let (head, body) = split_head(raw).ok_or(Invalid::NoBlankLine)?;
    let head = String::from_utf8_lossy(head);
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    for (i, text) in head.lines().enumerate() {
        let text = text.trim_end_matches('\r');
        if i == 0 && is_request_line(text) {
            continue;
        }
        let (name, value) = text
            .split_once(':')
            .filter(|(n, _)| !n.trim().is_empty() && !n.contains(' '))
            .ok_or_else(|| Invalid::BadHeader(text.to_owned()))?;
        let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
        headers
            .entry(name)
            .and_modify(|v| {
                v.push_str(", ");
                v.push_str(value);
            })
            .or_insert_with(|| value.to_owned());
    }
    if let Some(te) = headers.get("transfer-encoding")
        && !te.eq_ignore_ascii_case("identity")
    {
        return Err(Invalid::Encoded(te.clone()));
    }
    let body = match headers
        .get("content-length")
        .and_then(|l| l.parse::<usize>().ok())
    {
        Some(want) if body.len() < want => {
            return Err(Invalid::ShortBody {
                want,
                got: body.len(),
            });
        }
        Some(want) => body[..want].to_vec(),
        None => body.to_vec(),
    };
    Ok(Request { headers, body })
}

fn is_request_line(text: &str) -> bool {
    let mut parts = text.split(' ');
    let method = parts.next().unwrap_or("");
    !method.is_empty() && method.bytes().all(|b| b.is_ascii_uppercase()) && text.contains(" HTTP/")
}

/// The headers and the body: split at the first empty line (CRLF CRLF or LF LF).
fn split_head(raw: &[u8]) -> Option<(&[u8], &[u8])> {
    let crlf = find(raw, b"\r\n\r\n").map(|i| (i, 4));
    let lf = find(raw, b"\n\n").map(|i| (i, 2));
    let (at, len) = match (crlf, lf) {
        (Some(a), Some(b)) => {
            if a.0 <= b.0 {
                a
            } else {
                b
            }
        }
        (a, b) => a.or(b)?,
    };
    Some((&raw[..at], &raw[at + len..]))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The outcome of a valid request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Valid {
    pub webhook_id: String,
    pub timestamp: i64,
    /// The id (12 hex digits of its SHA-256) of the first key that matches.
    pub key_id: String,
    /// `now - timestamp`, in seconds.
    pub age_secs: i64,
}

/// Checks `request` against `secrets` at `now` (Unix seconds).
pub fn check(
    request: &Request,
    secrets: &[String],
    now: i64,
    tolerance: Duration,
) -> Result<Valid, Invalid> {
    let keys = secrets
        .iter()
        .enumerate()
        .map(|(i, s)| {
            VerifyingKey::parse(s).map_err(|e| Invalid::BadSecret {
                index: i + 1,
                reason: e.to_string(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let id = request
        .header("webhook-id")
        .ok_or(Invalid::Missing("webhook-id"))?;
    let timestamp = request
        .header("webhook-timestamp")
        .ok_or(Invalid::Missing("webhook-timestamp"))?;
    let signature = request
        .header("webhook-signature")
        .ok_or(Invalid::Missing("webhook-signature"))?;
    let tolerance = tolerance.as_secs();
    let verify = |keys: &[VerifyingKey]| {
        signing::verify(
            keys,
            id,
            timestamp,
            signature,
            &request.body,
            now,
            tolerance,
        )
    };
    // Which key: the first that verifies on its own; with none, the reason all of them
    // together give.
    let Some(key) = keys
        .iter()
        .find(|k| verify(std::slice::from_ref(k)).is_ok())
    else {
        let reason = verify(&keys).err().unwrap_or(signing::VerifyError::NoMatch);
        return Err(reason.into());
    };
    let ts: i64 = timestamp.trim().parse().unwrap_or_default();
    Ok(Valid {
        webhook_id: id.to_owned(),
        timestamp: ts,
        key_id: key.id().to_owned(),
        age_secs: now - ts,
    })
}

/// `verify`: reads stdin, prints the verdict. Returns whether the signature is valid.
pub fn run(args: &VerifyArgs, raw: &[u8], now: i64) -> bool {
    let outcome =
        parse(raw).and_then(|request| check(&request, &args.secrets, now, args.tolerance));
    match outcome {
        Ok(valid) => {
            println!(
                "valid: webhook-id {} signed by key {} at {} ({} s ago)",
                valid.webhook_id,
                valid.key_id,
                jiff::Timestamp::from_second(valid.timestamp)
                    .map(|t| t.to_string())
                    .unwrap_or_else(|_| valid.timestamp.to_string()),
                valid.age_secs
            );
            true
        }
        Err(reason) => {
            println!("invalid: {reason}");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_core::signing::SigningKey;

    // The Standard Webhooks specification's test vector (as in herald_core::signing).
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const TS: i64 = 1_614_265_330;
    const BODY: &str = r#"{"test": 2432232314}"#;
    const SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    fn raw(eol: &str, signature: &str, body: &str) -> Vec<u8> {
        let lines = [
            "POST /hooks/orders HTTP/1.1".to_owned(),
            "Host: example.com".to_owned(),
            "Content-Type: application/json".to_owned(),
            format!("Content-Length: {}", body.len()),
            format!("Webhook-Id: {ID}"),
            format!("webhook-timestamp: {TS}"),
            format!("webhook-signature: {signature}"),
        ];
        format!("{}{eol}{eol}{body}", lines.join(eol)).into_bytes()
    }

    fn secrets(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    const MIN5: Duration = Duration::from_secs(300);

    #[test]
    fn the_specification_vector_verifies_from_a_raw_request() {
        for eol in ["\r\n", "\n"] {
            let request = parse(&raw(eol, SIGNATURE, BODY)).unwrap();
            assert_eq!(request.body, BODY.as_bytes());
            let valid = check(&request, &secrets(&[SECRET]), TS + 10, MIN5).unwrap();
            assert_eq!(valid.webhook_id, ID);
            assert_eq!(valid.age_secs, 10);
            assert_eq!(valid.key_id, SigningKey::from_whsec(SECRET).unwrap().id());
        }
    }

    #[test]
    fn an_ed25519_public_key_verifies_v1a() {
        // The reference library's Ed25519 vector (as in herald_core::signing).
        let key = SigningKey::parse("whsk_VEVTVFNJR05JTkdLRVlET05PVFVTRVRISVNGT1JBTlk=").unwrap();
        let public = key.public_key().unwrap().to_string();
        let signature = signing::sign(&[key], ID, TS, BODY.as_bytes());
        let request = parse(&raw("\r\n", &format!("{SIGNATURE} {signature}"), BODY)).unwrap();
        let valid = check(&request, &secrets(&[&public]), TS, MIN5).unwrap();
        assert_eq!(
            valid.key_id,
            SigningKey::parse("whsk_VEVTVFNJR05JTkdLRVlET05PVFVTRVRISVNGT1JBTlk=")
                .unwrap()
                .id()
        );
        let tampered = parse(&raw("\r\n", &signature, r#"{"test": 2432232315}"#)).unwrap();
        assert_eq!(
            check(&tampered, &secrets(&[&public]), TS, MIN5).unwrap_err(),
            Invalid::Signature(signing::VerifyError::NoMatch)
        );
    }

    #[test]
    fn any_changed_byte_of_the_body_fails() {
        let request = parse(&raw("\r\n", SIGNATURE, r#"{"test": 2432232315}"#)).unwrap();
        let err = check(&request, &secrets(&[SECRET]), TS, MIN5).unwrap_err();
        assert_eq!(err, Invalid::Signature(signing::VerifyError::NoMatch));
        assert_eq!(err.to_string(), "no signature matches any of the keys");
    }

    #[test]
    fn during_a_rotation_either_key_verifies_and_the_matching_one_is_named() {
        let other = signing::to_whsec(&[7u8; 32]);
        let signature = format!("v1,bm90IHRoaXMgb25l {SIGNATURE}");
        let request = parse(&raw("\r\n", &signature, BODY)).unwrap();
        let valid = check(&request, &secrets(&[&other, SECRET]), TS, MIN5).unwrap();
        assert_eq!(valid.key_id, SigningKey::from_whsec(SECRET).unwrap().id());
        let err = check(&request, &secrets(&[&other]), TS, MIN5).unwrap_err();
        assert_eq!(err, Invalid::Signature(signing::VerifyError::NoMatch));
    }

    #[test]
    fn old_requests_fail_unless_the_tolerance_covers_them() {
        let request = parse(&raw("\r\n", SIGNATURE, BODY)).unwrap();
        let err = check(&request, &secrets(&[SECRET]), TS + 3_600, MIN5).unwrap_err();
        assert!(
            matches!(err, Invalid::Signature(signing::VerifyError::TooOld(_))),
            "{err}"
        );
        check(
            &request,
            &secrets(&[SECRET]),
            TS + 3_600,
            Duration::from_secs(7_200),
        )
        .unwrap();
    }

    #[test]
    fn what_is_missing_or_malformed_is_named() {
        let no_sig = format!("webhook-id: {ID}\nwebhook-timestamp: {TS}\n\n{BODY}");
        let request = parse(no_sig.as_bytes()).unwrap();
        assert_eq!(
            request.body,
            BODY.as_bytes(),
            "no request line, no Content-Length"
        );
        assert_eq!(
            check(&request, &secrets(&[SECRET]), TS, MIN5).unwrap_err(),
            Invalid::Missing("webhook-signature")
        );
        assert_eq!(
            parse(b"POST / HTTP/1.1\r\nwebhook-id: x\r\n").unwrap_err(),
            Invalid::NoBlankLine
        );
        assert!(matches!(
            parse(b"garbage line\n\n{}"),
            Err(Invalid::BadHeader(_))
        ));
        let short = "Content-Length: 10\n\n{}";
        assert_eq!(
            parse(short.as_bytes()).unwrap_err(),
            Invalid::ShortBody { want: 10, got: 2 }
        );
        let chunked = "Transfer-Encoding: chunked\n\n2\r\n{}\r\n0\r\n\r\n";
        assert!(matches!(
            parse(chunked.as_bytes()),
            Err(Invalid::Encoded(_))
        ));
        let request = parse(&raw("\r\n", SIGNATURE, BODY)).unwrap();
        let err = check(&request, &secrets(&["whsec_short"]), TS, MIN5).unwrap_err();
        assert!(err.to_string().starts_with("secret #1:"), "{err}");
    }

    #[test]
    fn the_body_is_exactly_content_length_bytes() {
        let mut bytes = raw("\r\n", SIGNATURE, BODY);
        bytes.extend_from_slice(b"\r\n");
        let request = parse(&bytes).unwrap();
        assert_eq!(request.body, BODY.as_bytes());
        check(&request, &secrets(&[SECRET]), TS, MIN5).unwrap();
    }
}
