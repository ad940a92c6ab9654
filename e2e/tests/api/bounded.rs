//! What one tenant's reads of a long delivery log cost the shared API: an endpoint with
//! 100,000 attempt records of 1 KiB each (a busy endpoint's weeks), then the requests
//! that used to read it whole — a lookup by an id from 1970, a lookup of a real event, a
//! list of one, a list of the dead, a redrive of the dead. Each answers in bounded time,
//! and the process's peak memory grows by less than [`BOUND_MIB`] while they run (it
//! grew by the log's size before: 173 MiB for 60,000 records).

use std::time::{Duration, Instant};

use herald_core::api::{DeliveryDetail, Limit, Page, Redrive};
use herald_core::dataplane::{AttemptRecord, DeliveryState, EVENTS_STREAM, attempt_log, event_id};
use herald_e2e::dataplane::{DataPlane, endpoint, failed_record};
use herald_e2e::{env, unique_name};
use reqwest::Method;
use serde_json::json;

use super::support::{ApiProcess, heavy};

/// Records in the log.
const RECORDS: usize = 100_000;
/// Growth of herald-api's peak memory allowed while the requests run, MiB: the fold
/// keeps about 150 bytes an event, not the records (100 MiB of them).
const BOUND_MIB: u64 = 48;
/// The longest any one request may take (its scan stops at `--max-scan-seconds`).
const ANSWER_WITHIN: Duration = Duration::from_secs(30);

fn record(id: String, state: DeliveryState) -> AttemptRecord {
    failed_record(id, 1, state, "order.created")
}

async fn timed<T>(what: &str, request: impl Future<Output = T>) -> T {
    let started = Instant::now();
    let answer = request.await;
    let took = started.elapsed();
    assert!(took < ANSWER_WITHIN, "{what} took {took:?}");
    println!("{what}: {took:?}");
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_of_a_long_log_are_bounded_in_memory_and_time() {
    let _heavy = heavy().await;
    herald_api::install_crypto_provider();
    let dp = DataPlane::new(env().nats().await).await;
    let ns = unique_name("bounded");
    // It takes no type the real event has, so a dispatcher running in this process
    // (other tests') adds nothing to the log written here.
    let config = endpoint(
        &ns,
        "busy",
        json!({"url": "http://127.0.0.1:9/", "eventTypes": ["never.*"]}),
    );
    dp.put_endpoint(&config).await;
    // One real event, its delivery retried and then succeeded; the rest only in the log.
    let seq = dp.publish(&ns, "order.created", json!(1)).await;
    let stored = dp.js.get_stream(EVENTS_STREAM).await.unwrap();
    let message = stored.direct_get(seq).await.expect("the stored event");
    let real = event_id(
        (message.time.unix_timestamp_nanos() / 1_000_000) as u64,
        seq,
    );
    let subject = config.key().attempts_subject();
    let day = 86_400_000;
    let first_ms = herald_core::clock::now_ms() - 20 * day;
    let mut records: Vec<AttemptRecord> = (0..RECORDS as u64)
        .map(|i| {
            let state = if i % 3 == 0 {
                DeliveryState::Dead
            } else {
                DeliveryState::Succeeded
            };
            let ms = first_ms + i * (20 * day / RECORDS as u64);
            record(event_id(ms, 1_000_000_000 + i), state)
        })
        .collect();
    records.insert(RECORDS / 2, record(real.clone(), DeliveryState::Retrying));
    records.push(record(real.clone(), DeliveryState::Succeeded));
    for batch in attempt_log::encode(&records) {
        dp.js
            .publish(subject.clone(), batch.into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    drop(records);

    let api = ApiProcess::start(&["--insecure-dev-no-auth", "--max-scan-seconds", "25"]).await;
    let before = api.peak_rss_kib();
    let base = format!("/v1/namespaces/{ns}/endpoints/busy");
    let forged = event_id(0, 5);
    let (status, body) = timed(
        "a lookup by an id from 1970",
        api.send(
            Method::GET,
            &format!("{base}/deliveries/{forged}"),
            None,
            None,
            &[],
        ),
    )
    .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (404, &json!("DeliveryNotFound")),
        "{body}"
    );

    let (status, body) = timed(
        "a lookup of the real event",
        api.send(
            Method::GET,
            &format!("{base}/deliveries/{real}"),
            None,
            None,
            &[],
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let detail: DeliveryDetail = serde_json::from_value(body).unwrap();
    assert_eq!(detail.attempts.len(), 2, "both of its records are found");
    assert_eq!(
        detail.state.known(),
        Some(&herald_core::api::State::Succeeded)
    );
    assert_eq!(detail.truncated, None);

    let (status, body) = timed(
        "a list of one",
        api.send(
            Method::GET,
            &format!("{base}/deliveries?limit=1"),
            None,
            None,
            &[],
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let page: Page = serde_json::from_value(body).unwrap();
    assert_eq!(page.items.len(), 1);
    assert_eq!(*page.items[0].event_id, *real, "the newest event first");
    assert_eq!(page.truncated, None, "the whole log is within the bound");

    let (status, body) = timed(
        "a list of the dead",
        api.send(
            Method::GET,
            &format!("{base}/deliveries?status=dead&limit=500"),
            None,
            None,
            &[],
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let page: Page = serde_json::from_value(body).unwrap();
    assert_eq!(page.items.len(), 500);
    assert!(page.next_cursor.is_some());

    let (status, body) = timed(
        "a redrive of the dead",
        api.send(
            Method::POST,
            &format!("{base}/redrive-dead"),
            None,
            None,
            &[],
        ),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let redrive: Redrive = serde_json::from_value(body).unwrap();
    // Only in the log, not in the event store: none can be sent, 1,000 are tried.
    assert_eq!((redrive.count, redrive.skipped.len()), (0, 1_000));
    assert_eq!(
        redrive.truncated.map(|t| t.limit),
        Some(Limit::Count.into()),
        "more are dead than one redrive queues"
    );

    let grew_mib = api.peak_rss_kib().saturating_sub(before) / 1024;
    println!("herald-api peak memory grew by {grew_mib} MiB for {RECORDS} records of 1 KiB");
    assert!(
        grew_mib < BOUND_MIB,
        "herald-api's peak memory grew by {grew_mib} MiB reading a log of {RECORDS} records"
    );

    // One namespace gets two reads at once; a third is refused at once, not queued.
    let list = format!("{base}/deliveries?limit=1");
    let answers =
        futures::future::join_all((0..3).map(|_| api.send(Method::GET, &list, None, None, &[])))
            .await;
    let mut statuses: Vec<u16> = answers.iter().map(|(status, _)| *status).collect();
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 200, 429], "{answers:?}");
    assert!(
        answers
            .iter()
            .any(|(_, body)| body["error"]["code"] == "TooManyReads")
    );

    // With a bound below the log: the answer says how far back it read.
    let small = ApiProcess::start(&["--insecure-dev-no-auth", "--max-scan-records", "20000"]).await;
    let (status, body) = timed(
        "a list of the dead under a small bound",
        small.send(
            Method::GET,
            &format!("{base}/deliveries?status=dead&limit=500"),
            None,
            None,
            &[],
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let page: Page = serde_json::from_value(body).unwrap();
    let truncated = page.truncated.expect("the bound is reported");
    assert_eq!(truncated.limit, Limit::Records.into());
    let from = truncated.read_back_to.expect("how far back it read");
    // Every record was logged just now: the read covers only events published since.
    assert!(page.items.iter().all(|d| {
        herald_core::dataplane::event_published_ms(&d.event_id)
            .is_some_and(|ms| ms as i64 >= from.as_millisecond())
    }));
}
