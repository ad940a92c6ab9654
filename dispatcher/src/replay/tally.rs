//! Following a replay's deliveries: the endpoint's attempt log from when the replay began
//! enqueueing, counting the replay's events by their newest record (`succeeded` →
//! delivered, `dead` → failed) until every enqueued event has one of the two. Read from
//! the log rather than counted where attempts finish, so the replay's progress keeps one
//! writer and a new owner of the shard recounts exactly what happened.

use std::collections::HashMap;
use std::sync::Arc;

use async_nats::jetstream::consumer::pull;
use futures::StreamExt;
use herald_core::dataplane::{ATTEMPTS_STREAM, DeliveryState, EndpointKey, ReplayProgress};

use super::{PROGRESS_INTERVAL, Replay, by_start_time, records};

/// Pure: delivered and failed among the newest states of a replay's events.
pub fn counts(newest: &HashMap<Arc<str>, DeliveryState>) -> (u64, u64) {
    newest
        .values()
        .fold((0, 0), |(ok, dead), state| match state {
            DeliveryState::Succeeded => (ok + 1, dead),
            DeliveryState::Dead => (ok, dead + 1),
            DeliveryState::Retrying => (ok, dead),
        })
}

impl Replay<'_> {
    /// Counts until the replay is finished, writing its progress when the counts move.
    pub(super) async fn tally(
        &self,
        progress: &mut ReplayProgress,
    ) -> Result<(), async_nats::Error> {
        let key = EndpointKey::new(&self.request.namespace, &self.request.endpoint);
        let stream = self.shared.layout.js.get_stream(ATTEMPTS_STREAM).await?;
        let mut messages = stream
            .create_consumer(pull::OrderedConfig {
                filter_subject: key.attempts_subject(),
                deliver_policy: by_start_time(progress.started_ms),
                ..Default::default()
            })
            .await?
            .messages()
            .await?;
        let uid = self.request.uid.as_str();
        let mut newest: HashMap<Arc<str>, DeliveryState> = HashMap::new();
        loop {
            let deadline = tokio::time::sleep(PROGRESS_INTERVAL);
            tokio::pin!(deadline);
            // Everything that arrives within an interval, then one write if it changed.
            loop {
                tokio::select! {
                    () = &mut deadline => break,
                    message = messages.next() => {
                        let Some(message) = message else {
                            return Err("the attempt log consumer ended".into());
                        };
                        for record in records(&message?.payload) {
                            if record.replay.as_deref() == Some(uid) {
                                newest.insert(record.event_id, record.state);
                            }
                        }
                    }
                }
            }
            let (delivered, failed) = counts(&newest);
            if (delivered, failed) != (progress.delivered, progress.failed) {
                progress.delivered = delivered;
                progress.failed = failed;
                self.write_progress(progress).await?;
            }
            if progress.finished(false) {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_state_of_each_event_counts_once() {
        let mut newest = HashMap::new();
        newest.insert(Arc::from("a"), DeliveryState::Succeeded);
        newest.insert(Arc::from("b"), DeliveryState::Dead);
        newest.insert(Arc::from("c"), DeliveryState::Retrying);
        newest.insert(Arc::from("d"), DeliveryState::Succeeded);
        assert_eq!(counts(&newest), (2, 1));
        newest.insert(Arc::from("c"), DeliveryState::Dead);
        assert_eq!(counts(&newest), (2, 2));
    }
}
