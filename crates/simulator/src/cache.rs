//! A replica's block-level prefix cache with LRU eviction, in the manner of vLLM's.
//!
//! The same structure serves as a router's approximate per-replica index of what it routed there.

use std::collections::{BTreeMap, HashMap};

use burst_prefix_planner::BlockHash;

/// A set of at most `capacity` blocks, evicting the least recently used first.
///
/// Like vLLM, a lookup walks a request's blocks from the start and stops at the first miss (a
/// block is only reusable together with its whole prefix), and when a request's blocks are
/// touched its *last* block becomes the first to evict and its first block the last, so that an
/// eviction shortens cached prefixes from their tail instead of punching holes at their head.
#[derive(Clone, Debug)]
pub struct BlockCache {
    capacity: usize,
    clock: u64,
    /// Block -> its last-use stamp.
    stamps: HashMap<BlockHash, u64>,
    /// Stamp -> block: the eviction order, oldest first.
    by_age: BTreeMap<u64, BlockHash>,
}

impl BlockCache {
    pub fn new(capacity: usize) -> Self {
        BlockCache {
            capacity,
            clock: 0,
            stamps: HashMap::new(),
            by_age: BTreeMap::new(),
        }
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.stamps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.stamps.is_empty()
    }

    pub fn contains(&self, block: BlockHash) -> bool {
        self.stamps.contains_key(&block)
    }

    /// Leading blocks of `blocks` held (the walk stops at the first miss). Does not touch them.
    pub fn prefix_hits(&self, blocks: &[BlockHash]) -> usize {
        blocks
            .iter()
            .take_while(|block| self.stamps.contains_key(block))
            .count()
    }

    /// Marks all of `blocks` as just used (inserting the missing ones), then evicts down to the
    /// capacity. A request longer than the whole cache keeps only its leading blocks.
    pub fn touch(&mut self, blocks: &[BlockHash]) {
        for &block in blocks.iter().rev() {
            self.clock += 1;
            if let Some(old) = self.stamps.insert(block, self.clock) {
                self.by_age.remove(&old);
            }
            self.by_age.insert(self.clock, block);
        }
        while self.stamps.len() > self.capacity {
            let (_, block) = self.by_age.pop_first().expect("stamps and ages agree");
            self.stamps.remove(&block);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_stops_at_the_first_miss() {
        let mut cache = BlockCache::new(10);
        cache.touch(&[1, 2, 3]);
        assert_eq!(cache.prefix_hits(&[1, 2, 3, 4]), 3);
        assert_eq!(cache.prefix_hits(&[1, 9, 3]), 1);
        assert_eq!(cache.prefix_hits(&[9, 1]), 0);
        assert_eq!(cache.len(), 3);
    }

    #[test]
    fn evicts_least_recently_used_tail_first() {
        let mut cache = BlockCache::new(4);
        cache.touch(&[1, 2, 3]);
        cache.touch(&[7, 8]);
        // 5 blocks for 4 places: the tail of the older request goes.
        assert_eq!(cache.len(), 4);
        assert!(!cache.contains(3));
        assert_eq!(cache.prefix_hits(&[1, 2, 3]), 2);
        // Using 1, 2 again makes 7, 8's tail the oldest.
        cache.touch(&[1, 2]);
        cache.touch(&[5]);
        assert!(!cache.contains(8));
        assert_eq!(cache.prefix_hits(&[1, 2]), 2);
        assert_eq!(cache.prefix_hits(&[7, 8]), 1);
    }

    #[test]
    fn a_request_longer_than_the_cache_keeps_its_head() {
        let mut cache = BlockCache::new(2);
        cache.touch(&[1, 2, 3, 4]);
        assert_eq!(cache.prefix_hits(&[1, 2, 3, 4]), 2);
        let mut empty = BlockCache::new(0);
        empty.touch(&[1]);
        assert!(empty.is_empty());
    }
}
