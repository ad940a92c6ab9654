//! Tests of Standard Webhooks signing: the published vectors, parsing, and properties.

use super::*;
use proptest::prelude::*;

// The test vector published with the Standard Webhooks specification and used by the
// reference libraries in github.com/standard-webhooks/standard-webhooks (and Svix's).
const VECTOR_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const VECTOR_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const VECTOR_TS: i64 = 1_614_265_330;
const VECTOR_BODY: &[u8] = br#"{"test": 2432232314}"#;
const VECTOR_SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

fn vector_key() -> SigningKey {
    SigningKey::from_whsec(VECTOR_SECRET).unwrap()
}

#[test]
fn signs_the_specification_vector() {
    assert_eq!(
        sign(&[vector_key()], VECTOR_ID, VECTOR_TS, VECTOR_BODY),
        VECTOR_SIGNATURE
    );
}

#[test]
fn verifies_the_specification_vector() {
    let keys = [vector_key()];
    let ts = VECTOR_TS.to_string();
    let check = |now| {
        verify(
            &keys,
            VECTOR_ID,
            &ts,
            VECTOR_SIGNATURE,
            VECTOR_BODY,
            now,
            300,
        )
    };
    assert_eq!(check(VECTOR_TS), Ok(()));
    assert_eq!(check(VECTOR_TS + 300), Ok(()));
    assert_eq!(check(VECTOR_TS + 301), Err(VerifyError::TooOld(1)));
    assert_eq!(check(VECTOR_TS - 302), Err(VerifyError::TooNew(2)));
}

/// Found writing the window property of the `signature` fuzz target (fuzz/): the
/// clock distance saturated at i64::MAX, so with a tolerance of 2^63 s a timestamp
/// 2^64 - 1 s away was accepted.
#[test]
fn the_window_holds_at_the_ends_of_i64() {
    let keys = [vector_key()];
    let header = sign(&keys, VECTOR_ID, i64::MIN, VECTOR_BODY);
    let ts = i64::MIN.to_string();
    let check =
        |now, tolerance| verify(&keys, VECTOR_ID, &ts, &header, VECTOR_BODY, now, tolerance);
    assert_eq!(
        check(i64::MAX, 1 << 63),
        Err(VerifyError::TooOld((1 << 63) - 1))
    );
    assert_eq!(check(i64::MAX, u64::MAX), Ok(()));
    assert_eq!(check(i64::MIN, 0), Ok(()));
    let header = sign(&keys, VECTOR_ID, i64::MAX, VECTOR_BODY);
    let ts = i64::MAX.to_string();
    let check =
        |now, tolerance| verify(&keys, VECTOR_ID, &ts, &header, VECTOR_BODY, now, tolerance);
    assert_eq!(
        check(i64::MIN, 1 << 63),
        Err(VerifyError::TooNew((1 << 63) - 1))
    );
}

#[test]
fn verify_skips_other_versions_and_unknown_keys() {
    let header =
        format!("v1a,aGVsbG8= v1,tFtCZ5RDCPxzWQRWXWPgrCgE2frDBe9gjpbWQxnVfsQ= {VECTOR_SIGNATURE}");
    let ts = VECTOR_TS.to_string();
    let keys = [vector_key()];
    assert_eq!(
        verify(&keys, VECTOR_ID, &ts, &header, VECTOR_BODY, VECTOR_TS, 300),
        Ok(())
    );
    assert_eq!(
        verify(
            &keys,
            VECTOR_ID,
            &ts,
            "v1a,aGVsbG8=",
            VECTOR_BODY,
            VECTOR_TS,
            300
        ),
        Err(VerifyError::NoSignature)
    );
    assert_eq!(
        verify(&keys, VECTOR_ID, &ts, "v1,!!", VECTOR_BODY, VECTOR_TS, 300),
        Err(VerifyError::MalformedSignature("v1,!!".into()))
    );
    assert_eq!(
        verify(
            &keys,
            VECTOR_ID,
            "soon",
            VECTOR_SIGNATURE,
            VECTOR_BODY,
            VECTOR_TS,
            300
        ),
        Err(VerifyError::BadTimestamp("soon".into()))
    );
}

// The Ed25519 vector of the Standard Webhooks reference library's tests (Go,
// libraries/go/webhook_asymmetric_test.go): the seed, then the expected `v1a` entry.
const ED25519_SEED: &str = "VEVTVFNJR05JTkdLRVlET05PVFVTRVRISVNGT1JBTlk=";
const ED25519_SIGNATURE: &str =
    "v1a,tQ9V2XOqn7jL/DQenEFpqIugdBVtiMmER5mhSkXBNwM0mkATuDe6KYYUuxqtaiHeYGb7KaaBRdM5WqyeFiL8Ag==";

fn ed25519_vector_key() -> SigningKey {
    SigningKey::parse(&format!("{PRIVATE_KEY_PREFIX}{ED25519_SEED}")).unwrap()
}

#[test]
fn signs_the_reference_ed25519_vector() {
    let key = ed25519_vector_key();
    assert_eq!(key.scheme(), Scheme::Ed25519);
    assert_eq!(
        sign(&[key], VECTOR_ID, VECTOR_TS, VECTOR_BODY),
        ED25519_SIGNATURE
    );
}

#[test]
fn a_public_key_verifies_v1a_and_nothing_else() {
    let key = ed25519_vector_key();
    let public = key.public_key().expect("Ed25519 keys have a public half");
    let text = public.to_string();
    assert!(text.starts_with(PUBLIC_KEY_PREFIX), "{text}");
    let parsed = VerifyingKey::parse(&text).unwrap();
    assert_eq!(parsed.id(), key.id());
    let ts = VECTOR_TS.to_string();
    let check = |header: &str, body: &[u8]| {
        verify(
            std::slice::from_ref(&parsed),
            VECTOR_ID,
            &ts,
            header,
            body,
            VECTOR_TS,
            300,
        )
    };
    assert_eq!(check(ED25519_SIGNATURE, VECTOR_BODY), Ok(()));
    assert_eq!(
        check(ED25519_SIGNATURE, br#"{"test": 2432232315}"#),
        Err(VerifyError::NoMatch)
    );
    // A v1 entry is not something a public key can check.
    assert_eq!(
        check(VECTOR_SIGNATURE, VECTOR_BODY),
        Err(VerifyError::NoSignature)
    );
    // During a move from HMAC to Ed25519 both sign; each receiver finds its entry.
    let both = sign(
        &[ed25519_vector_key(), vector_key()],
        VECTOR_ID,
        VECTOR_TS,
        VECTOR_BODY,
    );
    assert_eq!(both, format!("{ED25519_SIGNATURE} {VECTOR_SIGNATURE}"));
    assert_eq!(check(&both, VECTOR_BODY), Ok(()));
    let hmac = [VerifyingKey::parse(VECTOR_SECRET).unwrap()];
    assert_eq!(
        verify(&hmac, VECTOR_ID, &ts, &both, VECTOR_BODY, VECTOR_TS, 300),
        Ok(())
    );
    // The private key verifies too (through its public half).
    let private = [VerifyingKey::parse(&format!("{PRIVATE_KEY_PREFIX}{ED25519_SEED}")).unwrap()];
    assert_eq!(
        verify(&private, VECTOR_ID, &ts, &both, VECTOR_BODY, VECTOR_TS, 300),
        Ok(())
    );
}

#[test]
fn ed25519_keys_are_refused_with_reasons_and_never_printed() {
    assert!(matches!(
        SigningKey::parse("whsk_c2hvcnQ="),
        Err(KeyError::BadEd25519Length(5))
    ));
    assert!(matches!(
        PublicKey::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
        Err(KeyError::MissingPrefix)
    ));
    let (whsk, id) = generate(Scheme::Ed25519).unwrap();
    assert!(whsk.starts_with(PRIVATE_KEY_PREFIX));
    let key = SigningKey::parse(&whsk).unwrap();
    assert_eq!(key.id(), id);
    let printed = format!("{key:?}");
    assert!(
        !printed.contains(&whsk[PRIVATE_KEY_PREFIX.len()..]),
        "{printed}"
    );
    assert!(printed.contains("v1a"), "{printed}");
    let (whsec, _) = generate(Scheme::Hmac).unwrap();
    assert_eq!(SigningKey::parse(&whsec).unwrap().scheme(), Scheme::Hmac);
    assert!(SigningKey::parse(&whsec).unwrap().public_key().is_none());
}

#[test]
fn parses_and_refuses_secrets_with_reasons() {
    assert!(matches!(
        SigningKey::from_whsec("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
        Err(KeyError::MissingPrefix)
    ));
    assert!(matches!(
        SigningKey::from_whsec("whsec_not base64!"),
        Err(KeyError::NotBase64(_))
    ));
    assert!(matches!(
        SigningKey::from_whsec("whsec_c2hvcnQ="),
        Err(KeyError::BadLength(5))
    ));
    assert_eq!(vector_key().id().len(), 12);
}

#[test]
fn generated_secrets_are_fresh_and_parse_back() {
    let (a, id_a) = generate_whsec().unwrap();
    let (b, _) = generate_whsec().unwrap();
    assert_ne!(a, b);
    assert!(a.starts_with(SECRET_PREFIX));
    let key = SigningKey::from_whsec(&a).unwrap();
    assert_eq!(key.id(), id_a);
    let decoded = BASE64.decode(&a[SECRET_PREFIX.len()..]).unwrap();
    assert_eq!(decoded.len(), GENERATED_KEY_BYTES);
    assert!(SigningKey::generate().is_ok());
}

#[test]
fn debug_output_hides_the_key() {
    let printed = format!("{:?}", vector_key());
    assert!(!printed.contains("MfKQ9r8"));
    assert!(printed.contains("redacted"));
}

fn key_strategy() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), MIN_KEY_BYTES..=MAX_KEY_BYTES)
}

proptest! {
    #[test]
    fn round_trip(key in key_strategy(), id in "[a-zA-Z0-9_]{1,40}",
                  ts in 0i64..4_000_000_000, body in proptest::collection::vec(any::<u8>(), 0..512)) {
        let key = SigningKey::from_whsec(&to_whsec(&key)).unwrap();
        let header = sign(std::slice::from_ref(&key), &id, ts, &body);
        prop_assert_eq!(verify(&[key], &id, &ts.to_string(), &header, &body, ts, 0), Ok(()));
    }

    // Changing any single byte of the id, the timestamp, the body or the signature
    // makes verification fail.
    #[test]
    fn any_changed_byte_fails(key in key_strategy(), body in proptest::collection::vec(any::<u8>(), 1..256),
                              which in 0usize..4, pos in any::<prop::sample::Index>(), flip in 1u8..=255) {
        let key = SigningKey::from_bytes(&key).unwrap();
        let keys = [key];
        let (mut id, mut ts, mut body) = (b"msg_2a9x0c".to_vec(), b"1700000000".to_vec(), body);
        let mut header = sign(&keys, "msg_2a9x0c", 1_700_000_000, &body).into_bytes();
        match which {
            0 => { let i = pos.index(id.len()); id[i] ^= flip; }
            1 => { let i = pos.index(ts.len()); ts[i] ^= flip; }
            2 => { let i = pos.index(body.len()); body[i] ^= flip; }
            _ => { let i = 3 + pos.index(header.len() - 3); header[i] ^= flip; }
        }
        let id = String::from_utf8_lossy(&id).into_owned();
        let ts = String::from_utf8_lossy(&ts).into_owned();
        let header = String::from_utf8_lossy(&header).into_owned();
        // A huge tolerance isolates the signature check from the clock check.
        prop_assert!(verify(&keys, &id, &ts, &header, &body, 1_700_000_000, u64::MAX / 2).is_err());
    }

    #[test]
    fn ed25519_round_trip(seed in proptest::collection::vec(any::<u8>(), ED25519_KEY_BYTES),
                          ts in 0i64..4_000_000_000, body in proptest::collection::vec(any::<u8>(), 0..512),
                          pos in any::<prop::sample::Index>(), flip in 1u8..=255) {
        let key = SigningKey::ed25519_from_seed(&seed).unwrap();
        let public = [key.public_key().unwrap()];
        let header = sign(std::slice::from_ref(&key), "msg_1", ts, &body);
        prop_assert_eq!(verify(&public, "msg_1", &ts.to_string(), &header, &body, ts, 0), Ok(()));
        let mut tampered = body.clone();
        tampered.push(0);
        let i = pos.index(tampered.len());
        tampered[i] ^= flip;
        prop_assert!(verify(&public, "msg_1", &ts.to_string(), &header, &tampered, ts, 0).is_err());
    }

    // During a rotation both keys sign; a receiver holding either one accepts.
    #[test]
    fn rotation_verifies_with_either_key(old in key_strategy(), new in key_strategy(),
                                        body in proptest::collection::vec(any::<u8>(), 0..256)) {
        prop_assume!(old != new);
        let old = SigningKey::from_bytes(&old).unwrap();
        let new = SigningKey::from_bytes(&new).unwrap();
        let header = sign(&[new.clone(), old.clone()], "msg_1", 42, &body);
        prop_assert_eq!(header.split(' ').count(), 2);
        prop_assert_eq!(verify(&[old], "msg_1", "42", &header, &body, 42, 0), Ok(()));
        prop_assert_eq!(verify(&[new], "msg_1", "42", &header, &body, 42, 0), Ok(()));
        let stranger = SigningKey::generate().unwrap();
        prop_assert_eq!(verify(&[stranger], "msg_1", "42", &header, &body, 42, 0), Err(VerifyError::NoMatch));
    }
}
