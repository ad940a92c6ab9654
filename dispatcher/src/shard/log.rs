//! The attempt log's write side. Records are buffered per endpoint (the log is read per
//! endpoint, one subject each) and an endpoint's batch is written once its oldest record
//! is [`FLUSH_AGE`] old or it holds [`FLUSH_RECORDS`]. The age is what a reader waits
//! for a record at most (the delivery log, an `onlyFailed` replay started right after
//! failures), so it stays short. The batches due at a tick go out together from one task
//! (split by [`attempt_log::encode`] below NATS's payload limit), published back to back
//! and acknowledged together.

use std::collections::HashMap;
use std::future::IntoFuture;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use bytes::Bytes;
use herald_core::dataplane::{AttemptRecord, EndpointKey, attempt_log};

use crate::supervise::Backoff;

/// How long a record waits for others of its endpoint, at most.
pub const FLUSH_AGE: Duration = Duration::from_millis(100);
/// Records of one endpoint written at once without waiting for [`FLUSH_AGE`].
pub const FLUSH_RECORDS: usize = 1024;
/// Tries of one batch before it is given up (about a minute: a NATS restart).
const TRIES: u32 = 8;

struct Batch {
    since: Instant,
    records: Vec<AttemptRecord>,
}

#[derive(Default)]
pub struct AttemptLog {
    pending: HashMap<EndpointKey, Batch>,
}

impl AttemptLog {
    pub fn push(&mut self, key: &EndpointKey, record: AttemptRecord, now: Instant) {
        match self.pending.get_mut(key) {
            Some(batch) => batch.records.push(record),
            None => {
                let batch = Batch {
                    since: now,
                    records: vec![record],
                };
                self.pending.insert(key.clone(), batch);
            }
        }
    }

    /// Writes the batches that are due at `now` (all of them with `everything`, at the
    /// shard's end), acknowledged in the background and retried through a NATS restart
    /// (about a minute); only a longer outage loses records — the attempts themselves
    /// are done either way.
    pub fn flush(&mut self, js: &jetstream::Context, now: Instant, everything: bool) {
        let payloads = self.take_due(now, everything);
        if !payloads.is_empty() {
            tokio::spawn(write(js.clone(), payloads));
        }
    }

    /// The messages of the batches due at `now`, taken out: an endpoint's records once
    /// the oldest is [`FLUSH_AGE`] old or there are [`FLUSH_RECORDS`] of them.
    fn take_due(&mut self, now: Instant, everything: bool) -> Vec<(String, Bytes)> {
        let mut payloads = Vec::new();
        self.pending.retain(|key, batch| {
            let due = everything
                || batch.records.len() >= FLUSH_RECORDS
                || now.duration_since(batch.since) >= FLUSH_AGE;
            if !due {
                return true;
            }
            let subject = key.attempts_subject();
            for payload in attempt_log::encode(&batch.records) {
                payloads.push((subject.clone(), Bytes::from(payload)));
            }
            false
        });
        payloads
    }
}

/// Publishes every payload, then awaits their acks together; what was not stored is
/// sent again after a pause, up to [`TRIES`] times.
async fn write(js: jetstream::Context, mut payloads: Vec<(String, Bytes)>) {
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(10));
    for tried in 1..=TRIES {
        let mut acks = Vec::with_capacity(payloads.len());
        let mut failed = Vec::new();
        for (subject, payload) in payloads {
            match js.publish(subject.clone(), payload.clone()).await {
                Ok(ack) => acks.push(async move {
                    match ack.into_future().await {
                        Ok(_) => None,
                        Err(error) => Some((subject, payload, error.to_string())),
                    }
                }),
                Err(error) => failed.push((subject, payload, error.to_string())),
            }
        }
        failed.extend(futures::future::join_all(acks).await.into_iter().flatten());
        let Some((_, _, error)) = failed.first() else {
            return;
        };
        if tried == TRIES {
            tracing::warn!(%error, batches = failed.len(), "giving up writing attempt records");
            return;
        }
        tracing::debug!(%error, batches = failed.len(), tried, "writing attempt records failed; retrying");
        payloads = failed.into_iter().map(|(s, p, _)| (s, p)).collect();
        tokio::time::sleep(backoff.next_delay(fastrand::f64())).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_core::dataplane::DeliveryState;

    fn record(event: &str) -> AttemptRecord {
        serde_json::from_value(serde_json::json!({
            "eventId": event, "attempt": 1, "timeMs": 1,
            "outcome": herald_core::dataplane::AttemptOutcome::Success,
            "latencyMs": 1, "state": DeliveryState::Succeeded,
        }))
        .unwrap()
    }

    fn events(payloads: &[(String, Bytes)]) -> Vec<String> {
        payloads
            .iter()
            .flat_map(|(_, p)| {
                attempt_log::decode(p)
                    .map(|r| r.event_id.to_string())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn a_batch_waits_for_its_age_or_its_size() {
        let mut log = AttemptLog::default();
        let (quiet, busy) = (
            EndpointKey::new("ns", "quiet"),
            EndpointKey::new("ns", "busy"),
        );
        let start = Instant::now();
        log.push(&quiet, record("q"), start);
        for i in 0..FLUSH_RECORDS {
            log.push(&busy, record(&i.to_string()), start);
        }
        // The busy endpoint is written at once, on its own subject and in order.
        let due = log.take_due(start, false);
        assert!(due.iter().all(|(s, _)| *s == busy.attempts_subject()));
        let expected: Vec<String> = (0..FLUSH_RECORDS).map(|i| i.to_string()).collect();
        assert_eq!(events(&due), expected);
        // The quiet one waits for its age, then goes whole.
        log.push(&quiet, record("r"), start);
        assert!(log.take_due(start, false).is_empty());
        let due = log.take_due(start + FLUSH_AGE, false);
        assert_eq!(events(&due), ["q", "r"]);
        assert!(due.iter().all(|(s, _)| *s == quiet.attempts_subject()));
        // At the shard's end everything goes, due or not.
        log.push(&quiet, record("s"), start);
        assert_eq!(events(&log.take_due(start, true)), ["s"]);
        assert!(log.pending.is_empty());
    }
}
