//! A worker's intake: what a message must wait for before it joins the read-ahead (a
//! worker's first message, or one after events of its source were lost on the way, is
//! preceded by the events to re-publish), and the claim on every endpoint that events
//! without a partition need.

use std::ops::ControlFlow;

use async_nats::jetstream::Message;
use async_nats::jetstream::consumer::{self, pull};
use herald_core::dataplane;
use tokio::sync::watch;

use super::turns::Turns;
use super::{FanOut, Source, Stored};
use crate::index::{Claim, Cover};

/// Where a worker's intake stands.
#[derive(Default)]
pub(super) struct Intake {
    /// The sequence the next new message should have: a message beyond it means the
    /// ones between were handed to a pull of ours that never arrived.
    pub(super) expected: Option<u64>,
    /// Events stored without a partition may be any namespace's: while such events are
    /// fanned out, the index keeps every endpoint (see `index::scope`).
    pub(super) everything: Option<Cover>,
    /// The last message taken in was the last one pending.
    pub(super) drained: bool,
}

impl FanOut {
    /// Whether `message` must wait until the read-ahead is fanned out: it is a worker's
    /// first, or events of this source were lost on the way before it (they are
    /// re-published first, and are older than what is queued). A message beyond the
    /// expected sequence with nothing lost in between (another partition's events) moves
    /// `expected` on.
    pub(super) async fn catch_up_first(
        &self,
        message: &Message,
        intake: &mut Intake,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<bool, async_nats::Error> {
        let Ok(info) = message.info() else {
            return Ok(false);
        };
        let seq = info.stream_sequence;
        match intake.expected {
            None => Ok(true),
            Some(next) if seq > next => {
                let lost = self.lost_before(next, seq, stop).await?;
                tracing::debug!(source = ?self.source, seq, expected = next, lost, "a message beyond the expected sequence");
                if !lost {
                    intake.expected = Some(seq);
                }
                Ok(lost)
            }
            Some(next) => {
                if seq < next {
                    tracing::debug!(source = ?self.source, seq, expected = next, delivered = info.delivered, "a message below the expected sequence");
                }
                Ok(false)
            }
        }
    }

    /// Takes `message` into the read-ahead: first, for a worker's first message or one
    /// after a gap, the events to re-publish before it (with `turns` empty, so they are
    /// older than anything queued). `Break` ends the worker with the result.
    pub(super) async fn admit(
        &self,
        message: Message,
        intake: &mut Intake,
        turns: &mut Turns<(Stored, Message)>,
        consumer: &consumer::Consumer<pull::Config>,
        stop: &mut watch::Receiver<bool>,
    ) -> ControlFlow<Result<(), async_nats::Error>> {
        let Some(stored) = Stored::from_message(&message) else {
            return ControlFlow::Continue(());
        };
        // The last message pending: a claim on every endpoint can go once it is out.
        intake.drained = message.info().is_ok_and(|info| info.pending == 0);
        if self.source == Source::Unpartitioned
            && intake.everything.is_none()
            && needs_every_endpoint(&stored, intake.expected)
        {
            match self.index.cover(Claim::Everything, stop).await {
                Some(cover) => intake.everything = Some(cover),
                None => return ControlFlow::Break(Ok(())),
            }
        }
        if intake.expected.is_none()
            && let Err(error) = self.after_unpartitioned(stored.seq, stop).await
        {
            return ControlFlow::Break(Err(error));
        }
        if let Err(error) = self
            .fill_gaps(consumer, stored.seq, &mut intake.expected, stop)
            .await
        {
            return ControlFlow::Break(Err(error));
        }
        let namespace = dataplane::parse_event_subject(&stored.subject)
            .map_or("", |(ns, _)| ns)
            .to_owned();
        let bytes = stored.payload.len();
        turns.push(&namespace, (stored, message), bytes);
        ControlFlow::Continue(())
    }
}

/// Whether fanning out `stored` (and the catch-up or gap before it) may match any
/// namespace's endpoints: an event with a type, or a worker's first event or one after
/// a gap, which republish earlier events. Without a type an event is dead-lettered.
fn needs_every_endpoint(stored: &Stored, expected: Option<u64>) -> bool {
    dataplane::parse_event_subject(&stored.subject).is_some()
        || expected.is_none_or(|next| stored.seq > next)
}
