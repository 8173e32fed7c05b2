//! Sequence tracking per publisher: which live messages are in order, which reveal a gap (and the
//! missing range to replay), and which reveal a restarted publisher. Pure.
//!
//! vLLM numbers each publisher's batches 0, 1, 2, … from its start and never goes backwards
//! except when the engine restarts, so a live sequence number below the expected one means a new
//! publisher (whose cache starts empty), not a duplicate.

use std::ops::Range;

/// What one live sequence number means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeqStatus {
    /// The next one expected: apply it.
    InOrder,
    /// The first message heard from this publisher; `missed` is what it published before
    /// (`0..seq`, empty when it is 0), replayable to start warm.
    First {
        /// Sequence numbers published before we listened.
        missed: Range<u64>,
    },
    /// Sequence numbers `missing` never arrived: replay them, then apply this one.
    Gap {
        /// The missing sequence numbers.
        missing: Range<u64>,
    },
    /// The sequence went backwards: the publisher restarted (its engine's cache is new). Drop
    /// what it held, then apply this one; `missed` is `0..seq`, what the new publisher sent
    /// before this.
    Restarted {
        /// Sequence numbers the new publisher sent before this one.
        missed: Range<u64>,
    },
}

/// One publisher's expected next sequence number.
#[derive(Debug, Clone, Default)]
pub struct SeqTracker {
    next: Option<u64>,
}

impl SeqTracker {
    /// A tracker that has heard nothing yet.
    pub fn new() -> Self {
        SeqTracker::default()
    }

    /// The next sequence number expected, once one has been heard.
    pub fn expected(&self) -> Option<u64> {
        self.next
    }

    /// Takes one live message's sequence number.
    pub fn observe(&mut self, seq: u64) -> SeqStatus {
        let status = match self.next {
            None => SeqStatus::First { missed: 0..seq },
            Some(next) if seq == next => SeqStatus::InOrder,
            Some(next) if seq > next => SeqStatus::Gap { missing: next..seq },
            Some(_) => SeqStatus::Restarted { missed: 0..seq },
        };
        self.next = Some(seq.saturating_add(1));
        status
    }
}

/// What a replay brought back, judged against the range asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayOutcome {
    /// Every missing sequence number came back.
    Complete,
    /// The publisher's buffer no longer held `lost` (or the replay failed): those batches are
    /// gone, so what the index holds for the replica may be wrong.
    Lost {
        /// The sequence numbers that did not come back.
        lost: Range<u64>,
    },
}

/// Judges a replay of `asked` from the sequence numbers that came back (sorted, as vLLM sends
/// them): complete when they are exactly `asked`; otherwise the first hole is reported lost.
pub fn judge_replay(asked: &Range<u64>, got: &[u64]) -> ReplayOutcome {
    let mut want = asked.start;
    for &s in got.iter().filter(|s| asked.contains(s)) {
        if s != want {
            return ReplayOutcome::Lost { lost: want..s };
        }
        want += 1;
    }
    if want < asked.end {
        ReplayOutcome::Lost {
            lost: want..asked.end,
        }
    } else {
        ReplayOutcome::Complete
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_messages_are_applied_and_a_skip_reports_the_missing_range() {
        let mut t = SeqTracker::new();
        assert_eq!(t.observe(0), SeqStatus::First { missed: 0..0 });
        assert_eq!(t.observe(1), SeqStatus::InOrder);
        assert_eq!(t.observe(5), SeqStatus::Gap { missing: 2..5 });
        assert_eq!(t.observe(6), SeqStatus::InOrder);
        assert_eq!(t.expected(), Some(7));
    }

    #[test]
    fn joining_late_reports_what_was_published_before() {
        let mut t = SeqTracker::new();
        assert_eq!(t.observe(42), SeqStatus::First { missed: 0..42 });
        assert_eq!(t.observe(43), SeqStatus::InOrder);
    }

    #[test]
    fn a_sequence_going_backwards_is_a_restarted_publisher() {
        let mut t = SeqTracker::new();
        t.observe(10);
        assert_eq!(t.observe(0), SeqStatus::Restarted { missed: 0..0 });
        assert_eq!(t.observe(1), SeqStatus::InOrder);
        t.observe(9);
        assert_eq!(t.observe(3), SeqStatus::Restarted { missed: 0..3 });
    }

    #[test]
    fn a_replay_is_complete_only_when_every_missing_number_came_back() {
        assert_eq!(judge_replay(&(2..5), &[2, 3, 4]), ReplayOutcome::Complete);
        assert_eq!(
            judge_replay(&(2..5), &[0, 1, 2, 3, 4, 5, 6]),
            ReplayOutcome::Complete
        );
        assert_eq!(
            judge_replay(&(2..5), &[3, 4]),
            ReplayOutcome::Lost { lost: 2..3 }
        );
        assert_eq!(
            judge_replay(&(2..5), &[2, 4]),
            ReplayOutcome::Lost { lost: 3..4 }
        );
        assert_eq!(
            judge_replay(&(2..5), &[]),
            ReplayOutcome::Lost { lost: 2..5 }
        );
        assert_eq!(judge_replay(&(2..2), &[]), ReplayOutcome::Complete);
    }
}
