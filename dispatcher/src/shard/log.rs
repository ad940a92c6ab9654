//! The attempt log's write side: records are buffered per endpoint and flushed, one
//! batch per endpoint per flush (split by [`attempt_log::encode`] below NATS's payload
//! limit).

use std::collections::HashMap;

use async_nats::jetstream;
use herald_core::dataplane::{AttemptRecord, EndpointKey, attempt_log};

use crate::supervise::with_retries;

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
            for payload in attempt_log::encode(&records) {
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
