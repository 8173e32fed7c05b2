//! What answers took (docs/behaviour.md §4, "Time"): the time cost prices a request's decode by
//! the answers its prompt got before (RL prompts come back every epoch, and a prompt's samples
//! tend to be long or short together), else by what answers here take overall, else by the
//! config's `time.outputTokens`.
//!
//! Learned from the answers a front-end saw end (their token counts), robustly: each count is
//! clamped to [1, [`MAX_TOKENS`]], averaged in log space (one answer a hundred times longer moves
//! a prompt's figure by a fraction of that), over at most the last [`WINDOW`] answers; at most
//! [`PROMPTS`] prompts are kept, the least recently answered forgotten first. A value in, a
//! value out: no clock, no I/O.

use std::collections::{HashMap, VecDeque};

use crate::prefixhash::BlockHash;

/// Prompts whose answers are kept; beyond, the least recently answered are forgotten.
pub const PROMPTS: usize = 65_536;

/// An average weighs the last this-many answers (an exponential average of that length).
pub const WINDOW: u32 = 8;

/// The longest answer counted: a count above it (a bad report) counts as this.
pub const MAX_TOKENS: u32 = 1 << 20;

/// The overall figure is used once this many answers were seen (fewer say little).
const OVERALL_AFTER: u32 = 16;

/// An average of answer lengths in log space.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct LogMean {
    mean: f64,
    count: u32,
}

impl LogMean {
    fn add(&mut self, tokens: u32, window: u32) {
        let x = f64::from(tokens.clamp(1, MAX_TOKENS)).ln();
        self.count = self.count.saturating_add(1);
        let weight = 1.0 / f64::from(self.count.min(window));
        self.mean += weight * (x - self.mean);
    }

    fn tokens(&self) -> f64 {
        self.mean.exp()
    }
}

/// The answers learned, per prompt and overall.
#[derive(Clone, Debug, Default)]
pub struct AnswerBook {
    prompts: HashMap<BlockHash, (LogMean, u64)>,
    /// Prompts by when they were last answered (with that answer's sequence number: an older
    /// entry of a prompt answered since is skipped when forgetting).
    order: VecDeque<(BlockHash, u64)>,
    next: u64,
    overall: LogMean,
}

impl AnswerBook {
    /// Records an answer of `tokens` tokens to the prompt `prompt` (its last block hash).
    pub fn learn(&mut self, prompt: BlockHash, tokens: u32) {
        self.next += 1;
        let seq = self.next;
        let entry = self.prompts.entry(prompt).or_default();
        entry.0.add(tokens, WINDOW);
        entry.1 = seq;
        self.order.push_back((prompt, seq));
        self.overall.add(tokens, 1 << 10);
        while self.prompts.len() > PROMPTS {
            let Some((old, at)) = self.order.pop_front() else {
                break;
            };
            if self.prompts.get(&old).is_some_and(|(_, last)| *last == at) {
                self.prompts.remove(&old);
            }
        }
        // The queue holds stale entries of prompts answered again; keep it near the map's size.
        if self.order.len() > 2 * PROMPTS.max(self.prompts.len()) {
            let prompts = &self.prompts;
            self.order
                .retain(|(prompt, at)| prompts.get(prompt).is_some_and(|(_, last)| last == at));
        }
    }

    /// The answer length expected of a request for `prompt`: its earlier answers', else the
    /// overall figure once enough answers were seen; `None`: nothing learned yet.
    pub fn expect(&self, prompt: BlockHash) -> Option<f64> {
        match self.prompts.get(&prompt) {
            Some((mean, _)) => Some(mean.tokens()),
            None if self.overall.count >= OVERALL_AFTER => Some(self.overall.tokens()),
            None => None,
        }
    }

    /// Prompts whose answers are known.
    pub fn len(&self) -> usize {
        self.prompts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.prompts.is_empty()
    }

    /// Forgets everything (a reset, new weights).
    pub fn clear(&mut self) {
        *self = AnswerBook::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompt_is_expected_to_answer_as_it_did_and_others_as_answers_do_overall() {
        let mut book = AnswerBook::default();
        assert_eq!(book.expect(1), None, "nothing learned");
        for _ in 0..8 {
            book.learn(1, 2_000);
        }
        assert!((book.expect(1).unwrap() - 2_000.0).abs() < 1e-6);
        assert_eq!(
            book.expect(2),
            None,
            "too few answers for an overall figure"
        );
        for prompt in 10..30 {
            book.learn(prompt, 100);
        }
        let overall = book.expect(2).unwrap();
        assert!(overall > 100.0 && overall < 2_000.0, "{overall}");
    }

    #[test]
    fn one_wild_count_moves_a_prompts_figure_by_a_fraction_and_recent_answers_weigh_most() {
        let mut book = AnswerBook::default();
        for _ in 0..8 {
            book.learn(1, 200);
        }
        book.learn(1, u32::MAX);
        let after = book.expect(1).unwrap();
        assert!(after.is_finite() && after < 200.0 * 6.0, "{after}");
        // The prompt now answers short: within a window its figure follows.
        for _ in 0..3 * WINDOW {
            book.learn(1, 50);
        }
        assert!(book.expect(1).unwrap() < 60.0);
        book.learn(2, 0);
        assert!(book.expect(2).unwrap() >= 1.0, "a count of 0 counts as 1");
    }

    #[test]
    fn the_least_recently_answered_prompts_are_forgotten_beyond_the_bound() {
        let mut book = AnswerBook::default();
        for prompt in 0..(PROMPTS as u64 + 10) {
            book.learn(prompt, 10);
            // The first prompt keeps being answered: it is never the oldest.
            book.learn(0, 10);
        }
        assert_eq!(book.len(), PROMPTS);
        assert!(book.expect(0).is_some());
        assert!(!book.prompts.contains_key(&1), "the oldest went first");
        assert!(book.order.len() <= 2 * PROMPTS + 1);
        book.clear();
        assert!(book.is_empty() && book.expect(0).is_none());
    }
}
