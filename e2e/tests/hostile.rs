//! Hostile producers and receivers against a real nats-server and a dispatcher running in
//! this process: every bad event is dead-lettered once with a bounded reason and never
//! holds up the next one; every hostile receiver costs one bounded, recorded attempt and
//! never holds up the endpoint's next attempt or another endpoint.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use herald_core::dataplane::{
    DEADLETTER_STREAM, EVENTS_STREAM, dead_letter as letter, partition_of,
};
use herald_core::envelope::{MAX_EVENT_HEADERS, MAX_REASON_BYTES};
use herald_dispatcher::fanout::{CONSUMER, Source};
use herald_e2e::dataplane::{
    DataPlane, TEST_SECRET, TEST_SHARDS, endpoint, shared_dispatcher, until_applied,
};
use herald_e2e::receiver::Receiver;
use herald_e2e::{env, eventually, unique_name};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const WAIT: Duration = Duration::from_secs(30);

/// One dead letter: the reason token of its subject, its reason text, the subject the
/// event was published to, its payload size and the `Herald-Truncated` header.
#[derive(Debug)]
struct DeadLetter {
    reason: String,
    text: String,
    subject: String,
    payload: usize,
    truncated: Option<String>,
}

/// The dead letters of events published to `herald.events.<ns>` or below (or to one of
/// `extra` subjects).
async fn dead_letters(dp: &DataPlane, ns: &str, extra: &[String]) -> Vec<DeadLetter> {
    let stream = dp.js.get_stream(DEADLETTER_STREAM).await.expect("stream");
    let mine = |subject: &str| {
        subject == format!("herald.events.{ns}")
            || subject.starts_with(&format!("herald.events.{ns}."))
            || extra.iter().any(|e| e == subject)
    };
    let mut out = Vec::new();
    let mut seq = 1;
    // Bounded: each turn moves past one stored message.
    while let Ok(message) = stream
        .direct_get_next_for_subject(letter::DeadLetter::filter(), Some(seq))
        .await
    {
        seq = message.sequence + 1;
        let letter = letter::DeadLetter::decode(&message.subject, &message.headers)
            .expect("every message of the dead-letter stream is a dead letter");
        if !mine(letter.subject) {
            continue;
        }
        out.push(DeadLetter {
            reason: letter.reason.to_owned(),
            text: letter.text.to_owned(),
            subject: letter.subject.to_owned(),
            payload: message.payload.len(),
            truncated: letter.truncated.map(|size| size.to_string()),
        });
    }
    out
}

#[tokio::test]
async fn hostile_events_are_dead_lettered_once_each_and_never_block_the_next() {
    let index = shared_dispatcher(env());
    let nats = env().nats().await;
    let max_payload = nats.server_info().max_payload;
    let dp = DataPlane::new(nats).await;
    let ns = unique_name("hostile-prod");
    dp.put_keys(&ns, "signing", &[TEST_SECRET]).await;
    let rx = Receiver::start().await;
    let config = endpoint(
        &ns,
        "hook",
        json!({"url": rx.url("hook"), "eventTypes": ["a"]}),
    );
    dp.put_endpoint(&config).await;
    until_applied(index, &config).await;

    let subject = format!("herald.events.{ns}.a");
    let unknown_tenant = format!("herald.events.{ns}-nobody.a");
    let event = |ty: &str| serde_json::to_vec(&json!({"type": ty, "data": 1})).unwrap();
    let publish = |subject: String, headers: HeaderMap, payload: Vec<u8>| {
        let js = dp.js.clone();
        async move {
            js.publish_with_headers(subject, headers, payload.into())
                .await
                .expect("publish")
                .await
                .expect("publish ack")
                .sequence
        }
    };
    let mut huge_header = HeaderMap::new();
    // JetStream stores at most 64 KiB of headers: with them, a payload under the limit
    // makes an event over it.
    huge_header.insert("X-Huge", "h".repeat(60 * 1024).as_str());
    let under_limit = format!(
        r#"{{"type":"a","data":"{}"}}"#,
        "d".repeat(256 * 1024 - 40 * 1024)
    )
    .into_bytes();
    let mut many_headers = HeaderMap::new();
    for i in 0..=MAX_EVENT_HEADERS {
        many_headers.insert(format!("X-H{i}").as_str(), "1");
    }
    // A valid JSON event as large as NATS allows: its dead letter, with Herald's own
    // headers, would be over `max_payload` if it were copied whole.
    let filler = "x".repeat(max_payload - 200);
    let at_max_payload = format!(r#"{{"type":"a","data":"{filler}"}}"#).into_bytes();
    let at_max_payload_len = at_max_payload.len().to_string();
    let huge_type = "t".repeat(200 * 1024);
    let cases: Vec<(&str, String, HeaderMap, Vec<u8>)> = vec![
        (
            "NotJson",
            subject.clone(),
            HeaderMap::new(),
            b"not json".to_vec(),
        ),
        ("NotJson", subject.clone(), HeaderMap::new(), Vec::new()),
        (
            "NotJson",
            subject.clone(),
            HeaderMap::new(),
            br#"{"data":1}"#.to_vec(),
        ),
        (
            "NotJson",
            subject.clone(),
            HeaderMap::new(),
            br#"{"type":7,"data":1}"#.to_vec(),
        ),
        (
            "BadSubject",
            format!("herald.events.{ns}.Order!"),
            HeaderMap::new(),
            event("Order!"),
        ),
        (
            "BadSubject",
            format!("herald.events.{ns}"),
            HeaderMap::new(),
            event("a"),
        ),
        (
            "TypeMismatch",
            subject.clone(),
            HeaderMap::new(),
            event(&huge_type),
        ),
        (
            "TooLarge",
            subject.clone(),
            HeaderMap::new(),
            at_max_payload,
        ),
        ("TooLarge", subject.clone(), huge_header, under_limit),
        ("TooManyHeaders", subject.clone(), many_headers, event("a")),
        (
            "UnknownTenant",
            unknown_tenant.clone(),
            HeaderMap::new(),
            event("a"),
        ),
    ];
    let mut expected: Vec<&str> = Vec::new();
    for (reason, subject, headers, payload) in cases {
        publish(subject, headers, payload).await;
        expected.push(reason);
    }
    let published = Instant::now();
    let good = dp.publish(&ns, "a", json!("after")).await;

    // Fan-out is in order: the good event arrives only after every bad one was handled.
    let got = eventually("the good event", WAIT, || {
        let got = rx.received("hook");
        async move { (!got.is_empty()).then_some(got) }
    })
    .await;
    assert_eq!(got[0].json()["data"], "after");
    assert!(
        published.elapsed() < Duration::from_secs(20),
        "the good event took {:?} behind the bad ones",
        published.elapsed()
    );

    let extra = [unknown_tenant];
    let dead = eventually("every dead letter", WAIT, || {
        let dp = dp.clone();
        let (ns, extra) = (ns.clone(), extra.clone());
        let n = expected.len();
        async move {
            let dead = dead_letters(&dp, &ns, &extra).await;
            (dead.len() >= n).then_some(dead)
        }
    })
    .await;
    let mut reasons: Vec<&str> = dead.iter().map(|d| d.reason.as_str()).collect();
    reasons.sort();
    expected.sort();
    assert_eq!(reasons, expected, "{dead:#?}");
    for letter in &dead {
        assert!(!letter.text.is_empty(), "{letter:?}");
        assert!(
            letter.text.len() <= MAX_REASON_BYTES,
            "a reason of {} bytes",
            letter.text.len()
        );
        assert!(letter.payload <= 256 * 1024, "{letter:?}");
        assert!(!letter.subject.is_empty(), "{letter:?}");
        if letter.reason == "TooLarge" && letter.truncated.is_some() {
            assert!(letter.payload <= 4096, "{letter:?}");
        }
    }
    assert!(
        dead.iter()
            .any(|d| d.truncated.as_deref() == Some(at_max_payload_len.as_str())),
        "the event at max_payload is not dead-lettered truncated: {dead:#?}"
    );
    assert!(
        dead.iter()
            .any(|d| d.reason == "TooLarge" && d.text.contains("headers included")),
        "{dead:#?}"
    );

    // Never redelivered: fan-out acknowledged everything up to the good event, and
    // nothing else arrives meanwhile.
    let events = dp
        .js
        .get_stream(EVENTS_STREAM)
        .await
        .expect("events stream");
    // The good event's partition; the bad ones are in it too, or (no type in the subject)
    // stored without a partition: both consumers must have acknowledged them.
    let partition = Source::Partition(partition_of(&ns, TEST_SHARDS)).consumer();
    let consumers: Vec<async_nats::jetstream::consumer::PullConsumer> = vec![
        events
            .get_consumer(&partition)
            .await
            .expect("partition's consumer"),
        events
            .get_consumer(CONSUMER)
            .await
            .expect("unpartitioned consumer"),
    ];
    eventually("fan-out to acknowledge the events", WAIT, || {
        let consumers = consumers.clone();
        async move {
            for consumer in consumers {
                let info = consumer.get_info().await.ok()?;
                let done = info.num_ack_pending == 0 && info.num_pending == 0;
                (done || info.ack_floor.stream_sequence >= good).then_some(())?;
            }
            Some(())
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(dead_letters(&dp, &ns, &extra).await.len(), expected.len());
    assert_eq!(rx.received("hook").len(), 1, "an event was delivered twice");
}

/// What a hostile server does with the first connection it accepts; later connections
/// get a plain `200 OK`.
#[derive(Clone, Copy, Debug)]
enum Hostility {
    /// `500` with a 1 GiB body, sent as fast as it is read.
    GigabyteBody,
    /// `500` announcing 1 GiB, then one byte every 50 ms.
    TricklingBody,
    /// A status line, then one header byte every 50 ms, never the end of the headers.
    EndlessHeaders,
    /// A status line, then header lines as fast as they are read.
    HeaderFlood,
    /// Bytes that are not HTTP.
    Garbage,
    /// Takes the TLS ClientHello and never answers.
    StalledTls,
}

#[derive(Default)]
struct Seen {
    /// Bytes written to the hostile connection before the dispatcher closed it.
    written: AtomicU64,
    /// Milliseconds from accepting the hostile connection to seeing it closed.
    closed_after_ms: AtomicU64,
    closed: AtomicBool,
    /// The first byte the hostile connection received (0x16 for a TLS ClientHello).
    first_byte: AtomicU64,
    /// Plain requests answered `200 OK` afterwards.
    answered: AtomicUsize,
}

async fn hostile_server(hostility: Hostility) -> (u16, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Seen::default());
    let theirs = seen.clone();
    tokio::spawn(async move {
        let mut first = true;
        while let Ok((stream, _)) = listener.accept().await {
            let seen = theirs.clone();
            if std::mem::take(&mut first) {
                tokio::spawn(hostile(stream, hostility, seen));
            } else {
                tokio::spawn(answer_ok(stream, seen));
            }
        }
    });
    (port, seen)
}

/// Reads one request's head and body (content-length), bounded.
async fn read_request(stream: &mut TcpStream) -> Option<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        if buf.len() > 64 * 1024 {
            return None;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut have = buf.len() - head_end;
    while have < length {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        have += n;
    }
    Some(())
}

async fn answer_ok(mut stream: TcpStream, seen: Arc<Seen>) {
    if read_request(&mut stream).await.is_some() {
        let _ = stream
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
            .await;
        seen.answered.fetch_add(1, Ordering::SeqCst);
    }
}

async fn hostile(mut stream: TcpStream, hostility: Hostility, seen: Arc<Seen>) {
    let accepted = Instant::now();
    // Every hostile act ends after 30 s whatever the client does.
    let deadline = accepted + Duration::from_secs(30);
    let mut written = 0u64;
    let result: std::io::Result<()> = async {
        if let Hostility::StalledTls = hostility {
            let mut byte = [0u8; 1];
            stream.read_exact(&mut byte).await?;
            seen.first_byte.store(byte[0].into(), Ordering::SeqCst);
            // Drain whatever else comes until the client gives up.
            let mut rest = [0u8; 4096];
            while Instant::now() < deadline {
                if stream.read(&mut rest).await? == 0 {
                    return Ok(());
                }
            }
            return Ok(());
        }
        read_request(&mut stream).await;
        let (head, body): (&[u8], &[u8]) = match hostility {
            Hostility::GigabyteBody => (
                b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 1073741824\r\n\r\n",
                &[b'x'; 64 * 1024],
            ),
            Hostility::TricklingBody => (
                b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 1073741824\r\n\r\n",
                b"y",
            ),
            Hostility::EndlessHeaders => (b"HTTP/1.1 200 OK\r\nx-never-ends: ", b"z"),
            Hostility::HeaderFlood => (b"HTTP/1.1 200 OK\r\n", b"x-flood: 0123456789abcdef\r\n"),
            Hostility::Garbage => (
                b"\x00\xffSSH-2.0-OpenSSH_9.6 this is not HTTP\r\n\r\n",
                b"\x00\x01\x02 garbage ",
            ),
            Hostility::StalledTls => unreachable!(),
        };
        stream.write_all(head).await?;
        let slow = matches!(
            hostility,
            Hostility::TricklingBody | Hostility::EndlessHeaders
        );
        while written < (1 << 30) && Instant::now() < deadline {
            stream.write_all(body).await?;
            written += body.len() as u64;
            if slow {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(())
    }
    .await;
    seen.written.store(written, Ordering::SeqCst);
    if result.is_err() || Instant::now() < deadline {
        seen.closed_after_ms
            .store(accepted.elapsed().as_millis() as u64, Ordering::SeqCst);
        seen.closed.store(true, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn hostile_receivers_cost_one_bounded_recorded_attempt_each() {
    let index = shared_dispatcher(env());
    let dp = DataPlane::new(env().nats().await).await;
    let ns = unique_name("hostile-rx");
    dp.put_keys(&ns, "signing", &[TEST_SECRET]).await;
    let rx = Receiver::start().await;
    let healthy = endpoint(
        &ns,
        "healthy",
        json!({"url": rx.url("healthy"), "eventTypes": ["ok"]}),
    );
    dp.put_endpoint(&healthy).await;
    let cases = [
        ("gigabyte", Hostility::GigabyteBody),
        ("trickle", Hostility::TricklingBody),
        ("endless-headers", Hostility::EndlessHeaders),
        ("header-flood", Hostility::HeaderFlood),
        ("garbage", Hostility::Garbage),
        ("stalled-tls", Hostility::StalledTls),
    ];
    let mut servers = Vec::new();
    for (name, hostility) in cases {
        let (port, seen) = hostile_server(hostility).await;
        let scheme = match hostility {
            Hostility::StalledTls => "https",
            _ => "http",
        };
        let config = endpoint(
            &ns,
            name,
            json!({
                "url": format!("{scheme}://127.0.0.1:{port}/{name}"),
                "eventTypes": [name],
                "delivery": {"timeout": "1s", "retry": {"schedule": ["1s", "1h"]}},
            }),
        );
        dp.put_endpoint(&config).await;
        until_applied(index, &config).await;
        servers.push((name, hostility, seen));
    }
    until_applied(index, &healthy).await;

    let started = Instant::now();
    for (name, ..) in &servers {
        dp.publish(&ns, name, json!({"hostile": name})).await;
    }
    // A healthy neighbour is served at once meanwhile.
    for i in 0..20 {
        dp.publish(&ns, "ok", json!(i)).await;
    }
    eventually("20 deliveries to the healthy endpoint", WAIT, || {
        let n = rx.received("healthy").len();
        async move { (n >= 20).then_some(()) }
    })
    .await;
    let healthy_took = started.elapsed();
    // Generous for a loaded 2-core machine (7.9 s seen with two fuzzers running); a
    // healthy endpoint that waited for the hostile ones' reads would take far longer.
    assert!(
        healthy_took < Duration::from_secs(15),
        "the healthy endpoint took {healthy_took:?}"
    );

    for (name, hostility, seen) in &servers {
        let records = eventually(&format!("two attempts on {name}"), WAIT, || {
            let (dp, ns) = (dp.clone(), ns.clone());
            async move {
                let records = dp.attempts(&ns, name).await;
                (records.len() >= 2).then_some(records)
            }
        })
        .await;
        let first = &records[0];
        let outcome = first["outcome"].as_str().unwrap_or_default();
        let response = first["response"].as_str().unwrap_or_default();
        let latency = first["latencyMs"].as_u64().unwrap_or(u64::MAX);
        let context = format!("{name}: {records:#?}");
        assert_eq!(first["attempt"], 1, "{context}");
        assert_eq!(first["state"], "retrying", "{context}");
        assert!(response.len() <= 1024, "{context}");
        assert!(latency <= 3000, "{context}");
        match hostility {
            Hostility::GigabyteBody => {
                assert_eq!(outcome, "HttpError", "{context}");
                assert_eq!(first["httpStatus"], 500, "{context}");
                assert_eq!(response, "x".repeat(1024), "{context}");
            }
            Hostility::TricklingBody => {
                assert_eq!(outcome, "HttpError", "{context}");
                assert!(response.chars().all(|c| c == 'y'), "{context}");
            }
            Hostility::EndlessHeaders | Hostility::StalledTls => {
                assert_eq!(outcome, "Timeout", "{context}");
                assert!(latency >= 900, "{context}");
            }
            Hostility::HeaderFlood | Hostility::Garbage => {
                assert!(
                    ["RequestError", "ConnectError"].contains(&outcome),
                    "{context}"
                );
                assert!(!response.is_empty(), "the error is not recorded: {context}");
            }
        }
        // The hostile connection was let go within the attempt's time limit, having
        // taken far less than the gigabyte offered.
        eventually(&format!("{name}'s connection closed"), WAIT, || {
            let closed = seen.closed.load(Ordering::SeqCst);
            async move { closed.then_some(()) }
        })
        .await;
        let closed_after = seen.closed_after_ms.load(Ordering::SeqCst);
        assert!(closed_after < 5000, "{name}: held for {closed_after} ms");
        let written = seen.written.load(Ordering::SeqCst);
        assert!(written < 64 << 20, "{name}: {written} bytes were taken");
        let second = &records[1];
        match hostility {
            Hostility::StalledTls => {
                assert_eq!(
                    seen.first_byte.load(Ordering::SeqCst),
                    0x16,
                    "no ClientHello"
                );
            }
            // The retry, on a new connection, goes through.
            _ => {
                assert_eq!(second["outcome"], "Success", "{context}");
                assert_eq!(second["state"], "succeeded", "{context}");
                assert_eq!(seen.answered.load(Ordering::SeqCst), 1, "{name}");
            }
        }
    }
}
