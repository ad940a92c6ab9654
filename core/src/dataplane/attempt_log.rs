//! The attempt log on the wire, encoded and decoded only here: a batch is one message on
//! `herald.attempts.<ns>.<name>` holding [`AttemptRecord`]s as JSON lines, at most
//! [`MAX_BATCH_BYTES`] (NATS refuses payloads over its `max_payload`, 1 MiB by default,
//! so a busy endpoint can never lose a batch to the size limit).
//!
//! [`Newest`] is the one fold of "where does each delivery stand": the newest record of
//! each event by attempt-log sequence, whatever order the records are read in. Replay's
//! only-failed selection and its tally, and the HTTP API's redrive of the dead, all ask
//! it.

use std::collections::HashMap;
use std::sync::Arc;

use serde::de::DeserializeOwned;

use super::{AttemptRecord, DeliveryState};

/// Largest attempt-log message.
pub const MAX_BATCH_BYTES: usize = 256 * 1024;

/// Records as JSON lines, split so that no payload exceeds [`MAX_BATCH_BYTES`] (a single
/// record is at most a few KiB: its response snippet is capped).
pub fn encode(records: &[AttemptRecord]) -> Vec<Vec<u8>> {
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

/// The records of one batch, oldest first. A line that does not decode (written by a
/// newer version with a state this one does not know) is skipped.
pub fn decode(payload: &[u8]) -> impl Iterator<Item = AttemptRecord> + '_ {
    decode_as(payload).filter_map(Result::ok)
}

/// The lines of one batch decoded as `T` (a record, or any JSON value for a reader that
/// wants the record as it was written).
pub fn decode_as<'a, T: DeserializeOwned + 'a>(
    payload: &'a [u8],
) -> impl Iterator<Item = serde_json::Result<T>> + 'a {
    payload
        .split(|b| *b == b'\n')
        .filter(|line| !line.is_empty())
        .map(serde_json::from_slice)
}

/// The newest state of each delivery (one event to one endpoint): the record logged last
/// for an event says where it stands. Records come with their attempt-log sequence and
/// may be folded in any order (a reader going back through the log window by window
/// meets newer windows first); of two records of one event, the one with the higher
/// sequence wins, and within one batch (one sequence) the later line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Newest {
    by_event: HashMap<Arc<str>, (u64, DeliveryState)>,
}

/// How many deliveries stand in each state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StateCounts {
    pub succeeded: u64,
    pub retrying: u64,
    pub dead: u64,
}

impl Newest {
    /// Folds in a record logged at attempt-log sequence `seq`.
    pub fn add(&mut self, seq: u64, record: &AttemptRecord) {
        match self.by_event.get_mut(&record.event_id) {
            Some(known) if known.0 > seq => {}
            Some(known) => *known = (seq, record.state),
            None => {
                self.by_event
                    .insert(record.event_id.clone(), (seq, record.state));
            }
        }
    }

    /// Folds in every record of one attempt-log message.
    pub fn add_batch(&mut self, seq: u64, records: impl IntoIterator<Item = AttemptRecord>) {
        records.into_iter().for_each(|r| self.add(seq, &r));
    }

    /// Where `event_id`'s delivery stands, if it has a record.
    pub fn state(&self, event_id: &str) -> Option<DeliveryState> {
        self.by_event.get(event_id).map(|(_, state)| *state)
    }

    /// The events whose newest record is in one of `states`, in no particular order.
    pub fn events_in<'a>(
        &'a self,
        states: &'a [DeliveryState],
    ) -> impl Iterator<Item = &'a Arc<str>> + 'a {
        self.by_event
            .iter()
            .filter(|(_, (_, state))| states.contains(state))
            .map(|(id, _)| id)
    }

    /// The deliveries in each state.
    pub fn counts(&self) -> StateCounts {
        let mut counts = StateCounts::default();
        for (_, state) in self.by_event.values() {
            match state {
                DeliveryState::Succeeded => counts.succeeded += 1,
                DeliveryState::Retrying => counts.retrying += 1,
                DeliveryState::Dead => counts.dead += 1,
            }
        }
        counts
    }

    /// How many deliveries have a record.
    pub fn len(&self) -> usize {
        self.by_event.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_event.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::{AttemptOutcome, DeadReason};

    fn record(id: &str, state: DeliveryState) -> AttemptRecord {
        AttemptRecord {
            event_id: id.into(),
            attempt: 1,
            time_ms: 1,
            outcome: AttemptOutcome::HttpError,
            http_status: Some(500),
            latency_ms: 3,
            response: String::new(),
            state,
            next_attempt_ms: None,
            dead_reason: None,
            replay: None,
            event_type: None,
            request_headers: vec![("webhook-id".into(), id.into())],
            response_headers: Vec::new(),
        }
    }

    #[test]
    fn a_batch_round_trips_with_every_field() {
        let full = AttemptRecord {
            response: "oops \n \"quoted\"".into(),
            next_attempt_ms: Some(9),
            dead_reason: Some(DeadReason::FinalStatus),
            replay: Some("r-uid".into()),
            event_type: Some("order.created".into()),
            response_headers: vec![("content-type".into(), "text/plain".into())],
            ..record("msg_a", DeliveryState::Dead)
        };
        let records = vec![
            full,
            record("msg_b", DeliveryState::Succeeded),
            record("msg_c", DeliveryState::Retrying),
        ];
        let batches = encode(&records);
        assert_eq!(batches.len(), 1);
        let back: Vec<AttemptRecord> = decode(&batches[0]).collect();
        assert_eq!(back, records);
        let values: Vec<serde_json::Value> = decode_as(&batches[0]).map(Result::unwrap).collect();
        assert_eq!(values[0]["eventId"], "msg_a");
        assert_eq!(values[0]["deadReason"], "FinalStatus");
    }

    #[test]
    fn a_busy_endpoint_is_split_into_messages_under_the_limit() {
        let record = AttemptRecord {
            response: "x".repeat(1024),
            ..record("msg_01ARZ3NDEKTSV4RRFFQ69G5FAV", DeliveryState::Retrying)
        };
        let records = vec![record; 2000];
        let batches = encode(&records);
        assert!(batches.len() > 1);
        assert!(batches.iter().all(|b| b.len() <= MAX_BATCH_BYTES));
        let decoded: usize = batches.iter().map(|b| decode(b).count()).sum();
        assert_eq!(decoded, 2000, "every record is written once");
    }

    #[test]
    fn a_line_that_does_not_decode_is_skipped_not_the_batch() {
        let mut payload = encode(&[record("msg_a", DeliveryState::Dead)]).remove(0);
        payload.extend_from_slice(b"{\"eventId\":\"msg_b\",\"state\":\"someday\"}\n");
        payload.extend_from_slice(&encode(&[record("msg_c", DeliveryState::Dead)])[0]);
        let ids: Vec<Arc<str>> = decode(&payload).map(|r| r.event_id).collect();
        assert_eq!(ids, [Arc::from("msg_a"), Arc::from("msg_c")]);
        assert_eq!(decode(b"").count(), 0);
    }

    #[test]
    fn the_newest_record_of_each_event_says_where_it_stands() {
        use DeliveryState::*;
        let records = [
            record("a", Retrying),
            record("a", Succeeded),
            record("b", Retrying),
            record("c", Retrying),
            record("c", Dead),
            record("d", Succeeded),
            record("e", Dead),
            record("e", Retrying),
        ];
        // Read in log order, one record per message.
        let mut newest = Newest::default();
        for (seq, r) in records.iter().enumerate() {
            newest.add(seq as u64, r);
        }
        assert_eq!(newest.len(), 5);
        assert_eq!(newest.state("a"), Some(Succeeded));
        assert_eq!(newest.state("e"), Some(Retrying));
        assert_eq!(newest.state("z"), None);
        let mut failed: Vec<&str> = newest
            .events_in(&[Retrying, Dead])
            .map(|id| &**id)
            .collect();
        failed.sort_unstable();
        assert_eq!(failed, ["b", "c", "e"]);
        let dead: Vec<&str> = newest.events_in(&[Dead]).map(|id| &**id).collect();
        assert_eq!(dead, ["c"]);
        assert_eq!(
            newest.counts(),
            StateCounts {
                succeeded: 2,
                retrying: 2,
                dead: 1
            }
        );
        // Read back window by window (newest message first): the same answer.
        let mut backwards = Newest::default();
        for (seq, r) in records.iter().enumerate().rev() {
            backwards.add(seq as u64, r);
        }
        assert_eq!(backwards, newest);
        // One batch: its later line is the newer record.
        let mut batched = Newest::default();
        batched.add_batch(7, records.iter().cloned());
        assert_eq!(
            batched,
            Newest {
                by_event: newest
                    .by_event
                    .iter()
                    .map(|(k, (_, st))| (k.clone(), (7, *st)))
                    .collect()
            }
        );
    }
}
