//! Which replicas hold a unit's prefix: the window's own index of the blocks it placed
//! ([`WindowHolders`]), walked block by block beside the memory's models ([`Matches::walk`]).

use std::collections::{HashMap, HashSet};

use super::answer::HeldList;
use super::block_keys::BuildBlockHasher;
use super::prefix_holders::{PrefixHolders, NO_HOLDERS};
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
    /// Every (block, replica) recorded, for `holds` (a holder list is as long as the fleet
    /// once every replica holds a system prompt).
    pairs: HashSet<(BlockHash, u32), BuildBlockHasher>,
}

/// The end of a holder list.
const NO_NODE: u32 = u32::MAX;

impl WindowHolders {
    /// Room for `blocks` distinct blocks in `pairs` (block, replica) pairs (a table sized
    /// for the pairs would be many times the blocks, and its lookups would miss the cache).
    pub(super) fn with_capacity(blocks: usize, pairs: usize) -> Self {
        WindowHolders {
            heads: HashMap::with_capacity_and_hasher(blocks, BuildBlockHasher::default()),
            nodes: Vec::with_capacity(pairs),
            // Grown as replicas first hold blocks: `blocks` bounds the pairs recorded, far
            // above them once units find their prefix held, and the lookups of a table sized
            // for the bound miss the cache.
            pairs: HashSet::default(),
        }
    }

    /// Records `blocks` as placed on `replica` in this window.
    pub(super) fn record(&mut self, blocks: &[BlockHash], replica: u32) {
        for &block in blocks {
            self.pairs.insert((block, replica));
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

    /// Whether this window placed the first `need` blocks of `blocks` on `replica`.
    pub(super) fn holds(&self, blocks: &[BlockHash], replica: usize, need: usize) -> bool {
        let r = replica as u32;
        blocks.len() >= need
            && blocks[..need]
                .iter()
                .all(|&block| self.pairs.contains(&(block, r)))
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
/// with memory, in its model); nonzero only for the replicas in `matched`. A unit that starts
/// with the kept prefix (`PrefixHolders`) is walked past it only: a replica outside `matched`
/// then holds what the prefix says.
pub(super) struct Matches {
    blocks: Vec<usize>,
    matched: Vec<usize>,
    prefix: PrefixHolders,
    /// The current unit starts with `prefix` (`Matches::walk_past_prefix`).
    past_prefix: bool,
}

impl Matches {
    pub(super) fn new(replicas: usize) -> Self {
        Matches {
            blocks: vec![0; replicas],
            matched: Vec::new(),
            prefix: PrefixHolders::new(replicas),
            past_prefix: false,
        }
    }

    /// Leading blocks of the current unit that `replica` holds.
    pub(super) fn of(&self, replica: usize) -> usize {
        match self.blocks[replica] {
            0 if self.past_prefix => self.prefix.depth(replica),
            blocks => blocks,
        }
    }

    /// The replicas holding any, past the prefix when the unit starts with it (the others
    /// holding any are `prefix_partial` and `prefix_whole`).
    pub(super) fn matched(&self) -> &[usize] {
        &self.matched
    }

    /// Whether `replica` is in `matched`.
    pub(super) fn is_matched(&self, replica: usize) -> bool {
        self.blocks[replica] > 0
    }

    /// The prefix the current unit starts with, if it was walked past one.
    pub(super) fn prefix(&self) -> Option<&PrefixHolders> {
        self.past_prefix.then_some(&self.prefix)
    }

    /// The kept prefix, whether or not the current unit starts with it.
    pub(super) fn kept_prefix(&mut self) -> &mut PrefixHolders {
        &mut self.prefix
    }

    /// Takes this walk's matches as the kept prefix, `blocks` (the walked ones), and clears
    /// them; returns the replicas holding it whole (`PrefixHolders::start`).
    pub(super) fn keep_as_prefix(
        &mut self,
        blocks: &[BlockHash],
        key: impl Fn(usize) -> (u64, u32),
        logged_in: u32,
    ) -> Vec<usize> {
        let walked = self.matched.iter().map(|&r| (r, self.blocks[r]));
        let whole = self.prefix.start(blocks, walked, key, logged_in);
        self.clear();
        whole
    }

    /// `replica` holds `blocks` leading blocks (a lookup, not a walk); it held none so far.
    pub(super) fn set(&mut self, replica: usize, blocks: usize) {
        if blocks > 0 {
            self.blocks[replica] = blocks;
            self.matched.push(replica);
        }
    }

    /// `replica` now holds `blocks` leading blocks, at least as many as before (a member of the
    /// current unit was placed there).
    pub(super) fn raise(&mut self, replica: usize, blocks: usize) {
        if self.blocks[replica] == 0 {
            self.set(replica, blocks);
        } else {
            self.blocks[replica] = self.blocks[replica].max(blocks);
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
        recall: Option<&mut Recall<'_>>,
        blocks: &[BlockHash],
        shared: usize,
    ) {
        self.past_prefix = false;
        self.walk_from(0, window, recall, blocks, shared);
    }

    /// As `walk`, for a unit that starts with the kept prefix: from the prefix's end on, each
    /// replica holding what the prefix says of it.
    pub(super) fn walk_past_prefix(
        &mut self,
        window: &WindowHolders,
        recall: Option<&mut Recall<'_>>,
        blocks: &[BlockHash],
        shared: usize,
    ) {
        self.past_prefix = true;
        self.walk_from(self.prefix.len(), window, recall, blocks, shared);
    }

    fn walk_from(
        &mut self,
        from: usize,
        window: &WindowHolders,
        mut recall: Option<&mut Recall<'_>>,
        blocks: &[BlockHash],
        shared: usize,
    ) {
        let (matches, matched) = (&mut self.blocks, &mut self.matched);
        let (prefix, past_prefix) = (&self.prefix, self.past_prefix);
        let mut advance = |holder: usize, depth: usize| {
            let held = match matches[holder] {
                0 if past_prefix => prefix.depth(holder),
                held => held,
            };
            if held == depth {
                if matches[holder] == 0 {
                    matched.push(holder);
                }
                matches[holder] = depth + 1;
                true
            } else {
                false
            }
        };
        for (depth, block) in blocks.iter().enumerate().skip(from) {
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

    /// Keeps the matches as the held list of `members`: past a prefix, the replicas holding
    /// it whole are counted, not named.
    pub(super) fn keep_as_held_list(&self, members: &[usize], held: &mut HeldPrefixes) {
        let mut named: Vec<(usize, usize)> =
            self.matched.iter().map(|&r| (r, self.blocks[r])).collect();
        let mut counted = None;
        if let Some(prefix) = self.prefix() {
            named.extend(
                prefix
                    .partial()
                    .filter(|&r| self.blocks[r] == 0)
                    .map(|r| (r, prefix.depth(r))),
            );
            let logged_in = prefix.logged_in();
            if logged_in != NO_HOLDERS && !prefix.whole().is_empty() {
                let count = held.whole_holders[logged_in as usize].joined.len();
                counted = Some((logged_in, count as u32));
            }
        }
        if named.is_empty() && counted.is_none() {
            return;
        }
        named.sort_unstable();
        let index = held.lists.len() as u32;
        held.lists.push(HeldList { named, counted });
        for &member in members {
            held.list_of[member] = index;
        }
    }

    pub(super) fn clear(&mut self) {
        for &replica in &self.matched {
            self.blocks[replica] = 0;
        }
        self.matched.clear();
        self.past_prefix = false;
    }
}
