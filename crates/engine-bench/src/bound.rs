//! The lower bound on prompt tokens an engine must compute, at token granularity.
//!
//! Every distinct prefix (a node of the token trie of all prompts) is computed at least once, on
//! the step it first appears in; earlier steps' prefixes are taken as cached (an unbounded cache
//! on the right replica). And an engine computes at least one token of every request, even on a
//! full hit (llama.cpp re-evaluates the last prompt token to get its logits), so each extra copy
//! of a prompt within a step, and a prompt wholly seen before its step, costs one more token.

use std::collections::{HashMap, HashSet};

/// The prefixes seen so far, as a trie of token IDs.
#[derive(Debug, Default)]
pub struct PrefixTrie {
    /// (parent node, token) -> child node; node 0 is the empty prefix.
    children: HashMap<(u32, u32), u32>,
}

impl PrefixTrie {
    /// Distinct non-empty prefixes held.
    pub fn len(&self) -> usize {
        self.children.len()
    }

    pub fn is_empty(&self) -> bool {
        self.children.is_empty()
    }

    /// Whether every prefix of `prompt` (the prompt itself included) is held.
    pub fn contains(&self, prompt: &[u32]) -> bool {
        let mut node = 0;
        prompt
            .iter()
            .all(|&token| match self.children.get(&(node, token)) {
                Some(&child) => {
                    node = child;
                    true
                }
                None => false,
            })
    }

    /// Adds every prefix of `prompt`; returns how many were new.
    pub fn insert(&mut self, prompt: &[u32]) -> u64 {
        let mut node = 0;
        let mut added = 0;
        for &token in prompt {
            let next = self.children.len() as u32 + 1;
            node = *self.children.entry((node, token)).or_insert_with(|| {
                added += 1;
                next
            });
        }
        added
    }
}

/// The bound per step, in tokens (see the module doc). Empty prompts cost nothing.
pub fn lower_bound_per_step(steps: &[Vec<Vec<u32>>]) -> Vec<u64> {
    let mut trie = PrefixTrie::default();
    steps
        .iter()
        .map(|step| {
            let mut copies: HashMap<&[u32], u64> = HashMap::new();
            for prompt in step.iter().filter(|p| !p.is_empty()) {
                *copies.entry(prompt).or_default() += 1;
            }
            let seen_before: HashSet<&[u32]> = copies
                .keys()
                .copied()
                .filter(|prompt| trie.contains(prompt))
                .collect();
            let extra: u64 = copies
                .iter()
                .map(|(prompt, &n)| n - 1 + u64::from(seen_before.contains(prompt)))
                .sum();
            let new: u64 = copies.keys().map(|prompt| trie.insert(prompt)).sum();
            new + extra
        })
        .collect()
}
