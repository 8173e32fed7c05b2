//! The lower bound on prompt tokens an engine must compute, for an engine that caches whole
//! blocks of `block_size` tokens (vLLM: its KV block size; llama.cpp: 1, a token).
//!
//! Every request computes at least its *tail*: the tokens after its last full block, or its last
//! full block when its length is a multiple of the block size, because an engine recomputes at
//! least the last prompt token to get its logits (vLLM caps a hit below the prompt's length, so
//! a whole block goes; llama.cpp re-evaluates one token). Every other distinct block prefix (a
//! node of the block trie of all prompts) is computed at least once, on the step it first
//! appears in, unless some request's tail is that very block; earlier steps' blocks are taken as
//! cached (an unbounded cache on the right replica). Copies of a prompt in one step share all but
//! their tails: 8 copies of a 1,000-token prompt on 128-token blocks cost 7 x 128 + 8 x 104 =
//! 1,728 tokens, what one vLLM replica computes for them.

use std::collections::{HashMap, HashSet};

/// The distinct block prefixes seen so far: (parent node, block's tokens) -> node; node 0 is
/// the empty prefix.
#[derive(Debug, Default)]
struct BlockTrie {
    children: HashMap<(u32, Vec<u32>), u32>,
}

impl BlockTrie {
    /// The nodes of `blocks` (a prompt's full blocks, in order), added when missing; each node
    /// with whether it was new.
    fn insert<'a>(&mut self, blocks: impl Iterator<Item = &'a [u32]>) -> Vec<(u32, bool)> {
        let mut node = 0;
        blocks
            .map(|block| {
                let next = self.children.len() as u32 + 1;
                let mut new = false;
                node = *self
                    .children
                    .entry((node, block.to_vec()))
                    .or_insert_with(|| {
                        new = true;
                        next
                    });
                (node, new)
            })
            .collect()
    }
}

/// Tokens of a `len`-token prompt that are never a cache hit (see the module doc).
pub fn tail_tokens(len: usize, block_size: usize) -> usize {
    if len == 0 {
        0
    } else {
        len - (len - 1) / block_size * block_size
    }
}

/// The bound per step, in tokens (see the module doc). Empty prompts cost nothing.
pub fn lower_bound_per_step(steps: &[Vec<Vec<u32>>], block_size: usize) -> Vec<u64> {
    assert!(block_size >= 1, "a block of {block_size} tokens");
    let mut trie = BlockTrie::default();
    steps
        .iter()
        .map(|step| {
            let mut tails = 0u64;
            let mut new_nodes = HashSet::new();
            // Nodes some request of this step computes as its tail anyway.
            let mut computed_as_tails = HashSet::new();
            for prompt in step.iter().filter(|p| !p.is_empty()) {
                let tail = tail_tokens(prompt.len(), block_size);
                tails += tail as u64;
                let full_blocks = prompt.len() / block_size;
                let nodes = trie.insert(prompt.chunks_exact(block_size).take(full_blocks));
                new_nodes.extend(nodes.iter().filter(|(_, new)| *new).map(|(n, _)| *n));
                if tail == block_size {
                    let (last, _) = nodes.last().expect("a full block");
                    computed_as_tails.insert(*last);
                }
            }
            let others = new_nodes.difference(&computed_as_tails).count() as u64;
            tails + others * block_size as u64
        })
        .collect()
}
