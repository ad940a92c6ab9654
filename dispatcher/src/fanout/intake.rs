//! A worker's intake: what a message must wait for before it joins the read-ahead (a
//! worker's first message, or one after events of its source were lost on the way, is
//! preceded by the events to re-publish), and the claim on every endpoint that events
//! without a partition need.

use std::collections::VecDeque;
use std::ops::{ControlFlow, RangeInclusive};

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
    /// What this worker's catch-ups re-published without taking the messages in.
    pub(super) republished: Republished,
}

/// Stream sequences a worker re-published by catch-up (a predecessor's unacknowledged
/// events, or a gap its own pull lost) whose messages it never took in. When JetStream
/// redelivers one of them after its ack wait, its lanes already hold it (a catch-up
/// returns once every lane publish is stored), so the message is acknowledged and not
/// fanned out a second time. Without this a take-over re-published everything above the
/// ack floor, then fanned out each of those redeliveries again, acknowledging them only
/// behind everything newer: the floor stayed put, the next take-over re-published the
/// same range again, and a partition behind an ordered endpoint fell further behind at
/// every round (the chaos soak's seed 1639072407: fan-out of one partition 19,000
/// events behind after 10,900 such redeliveries).
#[derive(Default)]
pub(super) struct Republished {
    ranges: VecDeque<RangeInclusive<u64>>,
}

impl Republished {
    /// Ranges kept; the oldest go first (a redelivery of one of those is fanned out
    /// again, as before: correct, only slower).
    const MAX_RANGES: usize = 64;

    /// Records `from..=to` as re-published, but for `taken` (a message the worker takes
    /// in itself, which it acknowledges once fanned out).
    pub(super) fn record(&mut self, from: u64, to: u64, taken: Option<u64>) {
        let mut push = |range: RangeInclusive<u64>| {
            if !range.is_empty() {
                self.ranges.push_back(range);
            }
        };
        match taken {
            Some(seq) if (from..=to).contains(&seq) => {
                if seq > from {
                    push(from..=seq - 1);
                }
                push(seq + 1..=to);
            }
            _ => push(from..=to),
        }
        while self.ranges.len() > Self::MAX_RANGES {
            self.ranges.pop_front();
        }
    }

    /// Whether `seq` was re-published and never taken in.
    pub(super) fn covers(&self, seq: u64) -> bool {
        self.ranges.iter().any(|range| range.contains(&seq))
    }
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
        if intake.expected.is_some_and(|next| stored.seq < next)
            && intake.republished.covers(stored.seq)
        {
            tracing::debug!(source = ?self.source, seq = stored.seq, "a redelivery of an event re-published by catch-up: acknowledged");
            if let Err(error) = message.ack().await {
                tracing::debug!(%error, seq = stored.seq, "acknowledging a re-published event's redelivery");
            }
            return ControlFlow::Continue(());
        }
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
        if let Err(error) = self.fill_gaps(consumer, stored.seq, intake, stop).await {
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

#[cfg(test)]
mod tests {
    use super::Republished;

    #[test]
    fn a_catch_up_range_covers_its_redeliveries_but_the_message_taken_in() {
        let mut republished = Republished::default();
        republished.record(899, 13_507, Some(5_491));
        assert!(republished.covers(899));
        assert!(republished.covers(5_490));
        assert!(!republished.covers(5_491), "the worker's own first message");
        assert!(republished.covers(5_492));
        assert!(republished.covers(13_507));
        assert!(!republished.covers(898));
        assert!(!republished.covers(13_508));
        // The taken message at an edge, or outside the range.
        let mut edges = Republished::default();
        edges.record(10, 20, Some(10));
        edges.record(30, 40, Some(40));
        edges.record(50, 60, Some(70));
        assert!(!edges.covers(10) && edges.covers(11) && edges.covers(20));
        assert!(edges.covers(30) && edges.covers(39) && !edges.covers(40));
        assert!(edges.covers(50) && edges.covers(60));
    }

    #[test]
    fn only_the_newest_ranges_are_kept() {
        let mut republished = Republished::default();
        for k in 0..(Republished::MAX_RANGES as u64 + 10) {
            republished.record(k * 10, k * 10 + 5, None);
        }
        assert!(!republished.covers(0), "the oldest range was dropped");
        let newest = (Republished::MAX_RANGES as u64 + 9) * 10;
        assert!(republished.covers(newest));
    }
}
