//! The attempt log's write side: records are buffered per endpoint and flushed as JSON
//! lines, one message per endpoint per flush, each message under [`MAX_BATCH_BYTES`]
//! (NATS refuses payloads over its `max_payload`, 1 MiB by default), so a busy endpoint
//! can never lose a batch to the size limit.

use std::collections::HashMap;

use async_nats::jetstream;
use herald_core::dataplane::{AttemptRecord, EndpointKey};

use crate::supervise::with_retries;

/// Largest attempt-log message.
pub const MAX_BATCH_BYTES: usize = 256 * 1024;

#[derive(Default)]
pub struct AttemptLog {
    pending: HashMap<EndpointKey, Vec<AttemptRecord>>,
}

impl AttemptLog {
    pub fn push(&mut self, key: &EndpointKey, record: AttemptRecord) {
        match self.pending.get_mut(key) {
            Some(records) => records.push(record),
            None => {
                self.pending.insert(key.clone(), vec![record]);
            }
        }
    }

    /// Publishes everything buffered, acknowledged in the background and retried through
    /// a NATS restart (about a minute); only a longer outage loses records — the
    /// attempts themselves are done either way.
    pub fn flush(&mut self, js: &jetstream::Context) {
        for (key, records) in self.pending.drain() {
            let subject = key.attempts_subject();
            for payload in batches(&records) {
                let js = js.clone();
                let subject = subject.clone();
                let payload = bytes::Bytes::from(payload);
                tokio::spawn(async move {
                    let write = || async {
                        js.publish(subject.clone(), payload.clone())
                            .await
                            .map_err(async_nats::Error::from)?
                            .await
                            .map_err(async_nats::Error::from)
                    };
                    let _ = with_retries("writing attempt records", 8, write).await;
                });
            }
        }
    }
}

/// JSON lines, split so that no payload exceeds [`MAX_BATCH_BYTES`] (a single record is
/// at most a few KiB: its response snippet is capped).
pub fn batches(records: &[AttemptRecord]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut payload = Vec::with_capacity((records.len() * 160).min(MAX_BATCH_BYTES));
    for record in records {
        let mut line = serde_json::to_vec(record).expect("records serialize");
        line.push(b'\n');
        if !payload.is_empty() && payload.len() + line.len() > MAX_BATCH_BYTES {
            out.push(std::mem::take(&mut payload));
        }
        payload.extend_from_slice(&line);
    }
    if !payload.is_empty() {
        out.push(payload);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_core::dataplane::{AttemptOutcome, DeliveryState};

    #[test]
    fn a_busy_endpoint_is_split_into_messages_under_the_limit() {
        let record = AttemptRecord {
            event_id: "msg_01ARZ3NDEKTSV4RRFFQ69G5FAV".into(),
            attempt: 1,
            time_ms: 1,
            outcome: AttemptOutcome::HttpError,
            http_status: Some(500),
            latency_ms: 3,
            response: "x".repeat(1024),
            state: DeliveryState::Retrying,
            next_attempt_ms: Some(5),
            dead_reason: None,
            replay: None,
            event_type: Some("order.created".into()),
        };
        let records = vec![record; 2000];
        let batches = batches(&records);
        assert!(batches.len() > 1);
        assert!(batches.iter().all(|b| b.len() <= MAX_BATCH_BYTES));
        let lines: usize = batches
            .iter()
            .map(|b| b.split(|c| *c == b'\n').filter(|l| !l.is_empty()).count())
            .sum();
        assert_eq!(lines, 2000, "every record is written once");
    }
}
