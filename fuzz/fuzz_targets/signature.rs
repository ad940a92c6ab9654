//! `herald_core::signing`: what a receiver's `verify` accepts.
//!
//! - `verify(sign(x))` accepts, for any key, id, timestamp and body;
//! - changing any one byte of the id, the timestamp, the body or the signature header
//!   makes it refuse;
//! - on an arbitrary header and timestamp it accepts only when the timestamp is inside the
//!   window (computed here without overflow) and some `v1` entry decodes to the HMAC;
//! - `whsec_` parsing never panics, and what it accepts has the key's id.
#![no_main]

use arbitrary::Arbitrary;
use herald_core::signing::{MAX_KEY_BYTES, MIN_KEY_BYTES, SigningKey, sign, to_whsec, verify};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Field {
    Id,
    Timestamp,
    Body,
    Header,
}

#[derive(Arbitrary, Debug)]
struct Input {
    key: Vec<u8>,
    other_key: Vec<u8>,
    msg_id: String,
    timestamp: i64,
    body: Vec<u8>,
    /// Which byte of which field to change, and how.
    field: Field,
    position: usize,
    flip: u8,
    /// A verifier's clock and tolerance, and a header and timestamp as a sender wrote them.
    now: i64,
    tolerance: u64,
    raw_timestamp: String,
    raw_header: String,
    /// Sign for the raw timestamp, so the clock check is reached with a valid signature.
    sign_raw: bool,
    raw_secret: String,
}

/// A key of a valid length from whatever bytes the fuzzer gave.
fn key_from(bytes: &[u8], fill: u8) -> (Vec<u8>, SigningKey) {
    let mut bytes = bytes[..bytes.len().min(MAX_KEY_BYTES)].to_vec();
    bytes.resize(bytes.len().max(MIN_KEY_BYTES), fill);
    let key = SigningKey::from_bytes(&bytes).expect("a key of a valid length");
    (bytes, key)
}

fuzz_target!(|input: Input| {
    let (key_bytes, key) = key_from(&input.key, 0);
    let keys = std::slice::from_ref(&key);
    let ts = input.timestamp;
    let ts_text = ts.to_string();
    let header = sign(keys, &input.msg_id, ts, &input.body);

    // Round trip, at the edge of a zero tolerance.
    assert_eq!(
        verify(keys, &input.msg_id, &ts_text, &header, &input.body, ts, 0),
        Ok(())
    );
    // A second key signing too (a rotation) still verifies with either.
    let (other_bytes, other) = key_from(&input.other_key, 1);
    let both = sign(
        &[other.clone(), key.clone()],
        &input.msg_id,
        ts,
        &input.body,
    );
    assert_eq!(
        verify(keys, &input.msg_id, &ts_text, &both, &input.body, ts, 0),
        Ok(())
    );
    // HMAC pads keys shorter than its 64-byte block with zeros, so keys that differ only
    // in trailing zero bytes are the same key (and no Standard Webhooks key is longer).
    let unpadded = |k: &[u8]| k.len() - k.iter().rev().take_while(|b| **b == 0).count();
    if other_bytes[..unpadded(&other_bytes)] != key_bytes[..unpadded(&key_bytes)] {
        assert!(
            verify(
                &[other],
                &input.msg_id,
                &ts_text,
                &header,
                &input.body,
                ts,
                0
            )
            .is_err()
        );
    }

    // One changed byte. Text fields are kept only when still UTF-8 (a lossy conversion
    // could turn the change back into the original text).
    let flip = input.flip.max(1);
    let change = |bytes: &[u8], skip: usize| -> Option<Vec<u8>> {
        if bytes.len() <= skip {
            return None;
        }
        let mut bytes = bytes.to_vec();
        let i = skip + input.position % (bytes.len() - skip);
        bytes[i] ^= flip;
        Some(bytes)
    };
    let text = |bytes: Vec<u8>| String::from_utf8(bytes).ok();
    let (mut id, mut ts_changed, mut body, mut header_changed) = (
        input.msg_id.clone(),
        ts_text.clone(),
        input.body.clone(),
        header.clone(),
    );
    let changed = match input.field {
        Field::Id => change(input.msg_id.as_bytes(), 0)
            .and_then(text)
            .map(|t| id = t),
        Field::Timestamp => change(ts_text.as_bytes(), 0)
            .and_then(text)
            .map(|t| ts_changed = t),
        Field::Body => change(&input.body, 0).map(|b| body = b),
        // Past "v1,": a changed version tag is merely an entry of another scheme.
        Field::Header => change(header.as_bytes(), 3)
            .and_then(text)
            .map(|t| header_changed = t),
    };
    if changed.is_some() {
        // A huge tolerance isolates the signature check from the clock check.
        let result = verify(
            keys,
            &id,
            &ts_changed,
            &header_changed,
            &body,
            ts,
            u64::MAX / 4,
        );
        assert!(
            result.is_err(),
            "accepted after changing {:?}: id={id:?} ts={ts_changed:?} header={header_changed:?}",
            input.field
        );
    }

    // Whatever a sender wrote: accepted only inside the window and with a matching entry.
    let raw_header = match input.raw_timestamp.trim().parse::<i64>() {
        Ok(sent) if input.sign_raw => sign(keys, &input.msg_id, sent, &input.body),
        _ => input.raw_header.clone(),
    };
    let result = verify(
        keys,
        &input.msg_id,
        &input.raw_timestamp,
        &raw_header,
        &input.body,
        input.now,
        input.tolerance,
    );
    if result.is_ok() {
        let sent: i64 = input
            .raw_timestamp
            .trim()
            .parse()
            .expect("accepted timestamp");
        let skew = (i128::from(input.now) - i128::from(sent)).unsigned_abs();
        assert!(
            skew <= u128::from(input.tolerance),
            "accepted a timestamp {skew} s away with a tolerance of {} s",
            input.tolerance
        );
        let expected = sign(keys, &input.msg_id, sent, &input.body);
        let expected = expected.strip_prefix("v1,").expect("a v1 entry");
        assert!(
            raw_header
                .split(' ')
                .any(|entry| entry == format!("v1,{expected}")),
            "accepted header {raw_header:?}, expected an entry v1,{expected}"
        );
    }

    // Secrets: no panic, and an accepted one is the key it encodes.
    if let Ok(parsed) = SigningKey::from_whsec(&input.raw_secret) {
        let again = SigningKey::from_whsec(&to_whsec(&key_bytes)).expect("a valid secret");
        assert_eq!(again.id(), key.id());
        assert_eq!(parsed.id().len(), 12);
    }
});
