//! Following a replay's deliveries: the endpoint's attempt log from when the replay began
//! enqueueing, counting the replay's events by their newest record ([`Newest`]:
//! `succeeded` → delivered, `dead` → failed) until every enqueued event has one of the
//! two. Read from
//! the log rather than counted where attempts finish, so the replay's progress keeps one
//! writer and a new owner of the shard recounts exactly what happened.

use async_nats::jetstream::consumer::pull;
use futures::StreamExt;
use herald_core::dataplane::{ATTEMPTS_STREAM, EndpointKey, Newest, ReplayProgress, attempt_log};

use super::{PROGRESS_INTERVAL, Replay, by_start_time};

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
                max_batch: herald_core::dataplane::READ_BATCH,
                ..Default::default()
            })
            .await?
            .messages()
            .await?;
        let uid = self.request.uid.as_str();
        let mut newest = Newest::default();
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
                        let message = message?;
                        let seq = message.info()?.stream_sequence;
                        let ours = attempt_log::decode(&message.payload)
                            .filter(|record| record.replay.as_deref() == Some(uid));
                        newest.add_batch(seq, ours);
                    }
                }
            }
            let counts = newest.counts();
            let (delivered, failed) = (counts.succeeded, counts.dead);
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
