//! Which replicas hold a unit's prefix: the window's own index of the blocks it placed
//! ([`WindowHolders`]), walked block by block beside the memory's models ([`Matches::walk`]).

use std::collections::HashMap;

use super::block_keys::BuildBlockHasher;
use super::recall::Recall;
use super::HeldPrefixes;
use crate::prefixhash::BlockHash;

/// With memory: the replicas this window placed each block another unit of the window shares
/// on, walked beside the models. Each block's holders are a singly linked list in one arena per
/// window (not a `Vec` per block: allocating one per block was most of the time of a
/// 10,000-request window).
pub(super) struct WindowHolders {
    /// Per block, the head of its list in `nodes`.
    heads: HashMap<BlockHash, u32, BuildBlockHasher>,
    /// (replica, next node or `NO_NODE`).
    nodes: Vec<(u32, u32)>,
}

/// The end of a holder list.
const NO_NODE: u32 = u32::MAX;

impl WindowHolders {
    /// Room for `blocks` (block, replica) pairs.
    pub(super) fn with_capacity(blocks: usize) -> Self {
        WindowHolders {
            heads: HashMap::with_capacity_and_hasher(blocks, BuildBlockHasher::default()),
            nodes: Vec::with_capacity(blocks),
        }
    }

    /// Records `blocks` as placed on `replica` in this window.
    pub(super) fn record(&mut self, blocks: &[BlockHash], replica: u32) {
        for &block in blocks {
            // Walked, not looked up: a replica may appear twice on a list (a later prompt's
            // chain held without the earlier one), which the walk's marker ignores; the same
            // replica twice in a row is skipped here.
            let node = self.nodes.len() as u32;
            let head = self.heads.get(&block).copied().unwrap_or(NO_NODE);
            if self
                .nodes
                .get(head as usize)
                .is_some_and(|&(h, _)| h == replica)
            {
                continue;
            }
            self.heads.insert(block, node);
            self.nodes.push((replica, head));
        }
    }

    /// Whether this window placed the first `need` blocks of `blocks` on `replica` (walked:
    /// their holder lists are short).
    pub(super) fn holds(&self, blocks: &[BlockHash], replica: usize, need: usize) -> bool {
        let r = replica as u32;
        blocks.len() >= need
            && blocks[..need]
                .iter()
                .all(|block| self.of(block).any(|h| h == r))
    }

    /// The replicas this window placed `block` on.
    fn of<'a>(&'a self, block: &BlockHash) -> impl Iterator<Item = u32> + 'a {
        let mut node = self.heads.get(block).copied().unwrap_or(NO_NODE);
        std::iter::from_fn(move || {
            let &(holder, next) = self.nodes.get(node as usize)?;
            node = next;
            Some(holder)
        })
    }
}

/// Scratch, per replica: the leading blocks of the current unit it holds (in this window or,
/// with memory, in its model); nonzero only for the replicas in `matched`.
pub(super) struct Matches {
    blocks: Vec<usize>,
    matched: Vec<usize>,
}

impl Matches {
    pub(super) fn new(replicas: usize) -> Self {
        Matches {
            blocks: vec![0; replicas],
            matched: Vec::new(),
        }
    }

    /// Leading blocks of the current unit that `replica` holds.
    pub(super) fn of(&self, replica: usize) -> usize {
        self.blocks[replica]
    }

    /// The replicas holding any.
    pub(super) fn matched(&self) -> &[usize] {
        &self.matched
    }

    /// `replica` holds `blocks` leading blocks (a lookup, not a walk); it held none so far.
    pub(super) fn set(&mut self, replica: usize, blocks: usize) {
        if blocks > 0 {
            self.blocks[replica] = blocks;
            self.matched.push(replica);
        }
    }

    /// The leading blocks of `blocks` each replica holds, for every replica holding any: a
    /// holder of block i advances only if it held blocks 0..i, so each holder of each walked
    /// block is visited once; the walk stops at the first block on which no holder advanced.
    /// The memory's lookups of the first `shared` blocks (those other units of the window
    /// share) are kept for their walks.
    pub(super) fn walk(
        &mut self,
        window: &WindowHolders,
        mut recall: Option<&mut Recall<'_>>,
        blocks: &[BlockHash],
        shared: usize,
    ) {
        let (matches, matched) = (&mut self.blocks, &mut self.matched);
        let mut advance = |holder: usize, depth: usize| {
            if matches[holder] == depth {
                matches[holder] = depth + 1;
                if depth == 0 {
                    matched.push(holder);
                }
                true
            } else {
                false
            }
        };
        for (depth, block) in blocks.iter().enumerate() {
            let mut advanced = false;
            for holder in window.of(block) {
                advanced |= advance(holder as usize, depth);
            }
            if let Some(recall) = recall.as_deref_mut() {
                for &holder in recall.holders(*block, depth < shared) {
                    advanced |= advance(holder as usize, depth);
                }
            }
            if !advanced {
                break;
            }
        }
    }

    /// Keeps the matches as the held list of `members`.
    pub(super) fn keep_as_held_list(&self, members: &[usize], held: &mut HeldPrefixes) {
        if self.matched.is_empty() {
            return;
        }
        let mut list: Vec<(usize, usize)> =
            self.matched.iter().map(|&r| (r, self.blocks[r])).collect();
        list.sort_unstable();
        let index = held.lists.len() as u32;
        held.lists.push(list);
        for &member in members {
            held.list_of[member] = index;
        }
    }

    pub(super) fn clear(&mut self) {
        for &replica in &self.matched {
            self.blocks[replica] = 0;
        }
        self.matched.clear();
    }
}
