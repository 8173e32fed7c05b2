//! Which replicas hold a unit's prefix: the window's own index of the blocks it placed, walked
//! block by block beside the memory's models.

use std::collections::HashMap;

use super::block_keys::BuildBlockHasher;
use super::placer::Placer;
use super::HeldPrefixes;
use crate::prefixhash::BlockHash;

impl Placer<'_> {
    /// Records `blocks` as held by `replica` in this window; its leading `matches` blocks
    /// already are.
    pub(super) fn record(&mut self, blocks: &[BlockHash], replica: usize) {
        let r = replica as u32;
        if self.recall.is_none() {
            let key = self.key(replica);
            self.held.record(self.matches[replica], r, key);
            return;
        }
        for &block in blocks.get(self.matches[replica]..).unwrap_or_default() {
            // Walked, not looked up: a replica may appear twice on a list (a later prompt's
            // chain held without the earlier one), which the walk's marker ignores; the same
            // replica twice in a row is skipped here.
            let node = self.holder_nodes.len() as u32;
            let head = self.holders.get(&block).copied().unwrap_or(NO_NODE);
            if self
                .holder_nodes
                .get(head as usize)
                .is_some_and(|&(h, _)| h == r)
            {
                continue;
            }
            self.holders.insert(block, node);
            self.holder_nodes.push((r, head));
        }
    }

    /// Whether this window placed the first `need` blocks of `blocks` on `replica` (walked:
    /// their holder lists are short).
    pub(super) fn window_holds(&self, blocks: &[BlockHash], replica: usize, need: usize) -> bool {
        let r = replica as u32;
        blocks.len() >= need
            && blocks[..need].iter().all(|block| {
                window_holders(&self.holders, &self.holder_nodes, block).any(|h| h == r)
            })
    }

    /// `matches[r]` = leading blocks of `blocks` held by r (in this window or, with memory, in
    /// its model), for every replica holding any: a holder of block i advances only if it held
    /// blocks 0..i, so each holder of each walked block is visited once; the walk stops at the
    /// first block on which no holder advanced. The memory's lookups of the first `shared`
    /// blocks (those other units of the window share) are kept for their walks.
    pub(super) fn walk_holders(&mut self, blocks: &[BlockHash], shared: usize) {
        let (matches, matched) = (&mut self.matches, &mut self.matched);
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
            for holder in window_holders(&self.holders, &self.holder_nodes, block) {
                advanced |= advance(holder as usize, depth);
            }
            if let Some(recall) = &mut self.recall {
                for &holder in recall.holders(*block, depth < shared) {
                    advanced |= advance(holder as usize, depth);
                }
            }
            if !advanced {
                break;
            }
        }
    }

    /// Keeps the walk's matches as the held list of `members`.
    pub(super) fn keep_held_list(&self, members: &[usize], held: &mut HeldPrefixes) {
        if self.matched.is_empty() {
            return;
        }
        let mut list: Vec<(usize, usize)> =
            self.matched.iter().map(|&r| (r, self.matches[r])).collect();
        list.sort_unstable();
        let index = held.lists.len() as u32;
        held.lists.push(list);
        for &member in members {
            held.list_of[member] = index;
        }
    }

    pub(super) fn clear_matches(&mut self) {
        for &replica in &self.matched {
            self.matches[replica] = 0;
        }
        self.matched.clear();
    }
}

/// The replicas the window placed `block` on: its list in `Placer::holder_nodes`, from its head
/// in `Placer::holders`.
fn window_holders<'a>(
    heads: &'a HashMap<BlockHash, u32, BuildBlockHasher>,
    nodes: &'a [(u32, u32)],
    block: &BlockHash,
) -> impl Iterator<Item = u32> + 'a {
    let mut node = heads.get(block).copied().unwrap_or(NO_NODE);
    std::iter::from_fn(move || {
        let &(holder, next) = nodes.get(node as usize)?;
        node = next;
        Some(holder)
    })
}

/// The end of a holder list.
const NO_NODE: u32 = u32::MAX;
