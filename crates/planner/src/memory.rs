//! Memory across windows (SPEC §7): which prefix blocks each replica probably still caches, and
//! how much work it got recently. A value the caller keeps and passes to
//! [`assign_with_memory`](crate::assign_with_memory); no clock inside (time comes in as
//! `now_ms`).
//!
//! Per replica, an LRU of the blocks placed on it (at most `capacity_blocks`, as vLLM's
//! block-level prefix cache evicts), and one index from each block to the replicas holding it,
//! so that planning walks holders as it does within a window. A request's blocks are touched
//! last block first: its prefix becomes the most recently used, so a prefix outlives its
//! suffixes (vLLM frees a finished request's blocks tail first) and a held block keeps implying
//! its chain's prefix. Memory is bounded by capacity x replicas, never by traffic.

use std::collections::HashMap;
use std::num::NonZeroUsize;

use hashlink::lru_cache::Entry;
use hashlink::LruCache;
use smallvec::SmallVec;

use crate::plan::BuildBlockHasher;
use crate::prefixhash::BlockHash;

/// The knobs of the model, already validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemorySettings {
    /// Blocks one replica's prefix cache holds (`cacheTokensPerReplica / blockSizeTokens`).
    pub capacity_blocks: NonZeroUsize,
    /// The load a replica got in earlier windows counts on, halving every this many ms; 0
    /// carries nothing over.
    pub load_half_life_ms: u64,
}

/// The replicas' cache models and recent loads, keyed by endpoint id.
#[derive(Clone, Debug)]
pub struct Memory {
    settings: MemorySettings,
    slot_of: HashMap<String, u32>,
    /// By slot; `None` for a slot freed by [`Memory::retain_replicas`].
    models: Vec<Option<ReplicaModel>>,
    free_slots: Vec<u32>,
    /// The slots holding each block (most blocks have one or two: inline, no allocation).
    holders: HashMap<BlockHash, SmallVec<[u32; 4]>, BuildBlockHasher>,
}

#[derive(Clone, Debug)]
struct ReplicaModel {
    id: String,
    /// Held blocks, least recently used first; each with its position in `holders[block]`.
    cache: LruCache<BlockHash, u32, BuildBlockHasher>,
    /// Load carried over (in the unit of `balanceBy`), as of `load_at_ms`.
    load: f64,
    load_at_ms: u64,
}

impl Memory {
    pub fn new(settings: MemorySettings) -> Self {
        Memory {
            settings,
            slot_of: HashMap::new(),
            models: Vec::new(),
            free_slots: Vec::new(),
            holders: HashMap::default(),
        }
    }

    pub fn settings(&self) -> MemorySettings {
        self.settings
    }

    /// Blocks held per replica, for every replica the memory knows.
    pub fn replica_blocks(&self) -> impl Iterator<Item = (&str, usize)> + '_ {
        self.models
            .iter()
            .flatten()
            .map(|model| (model.id.as_str(), model.cache.len()))
    }

    /// Blocks held in all.
    pub fn held_blocks(&self) -> usize {
        self.models.iter().flatten().map(|m| m.cache.len()).sum()
    }

    /// Entries of the block index (one per held block and replica): its size.
    pub fn index_entries(&self) -> usize {
        self.holders.values().map(|list| list.len()).sum()
    }

    /// Keeps only the replicas `keep` says are still there; the others' models are dropped (a
    /// replica that comes back starts cold).
    pub fn retain_replicas(&mut self, mut keep: impl FnMut(&str) -> bool) {
        let gone: Vec<u32> = self
            .slot_of
            .iter()
            .filter(|(id, _)| !keep(id))
            .map(|(_, &slot)| slot)
            .collect();
        for slot in gone {
            let model = self.models[slot as usize].take().expect("a live slot");
            self.slot_of.remove(&model.id);
            for (&block, &position) in model.cache.iter() {
                self.unhold(block, position);
            }
            self.free_slots.push(slot);
        }
    }

    /// The slot of `id`, made cold if the memory did not know it.
    pub(crate) fn slot(&mut self, id: &str) -> u32 {
        if let Some(&slot) = self.slot_of.get(id) {
            return slot;
        }
        let model = ReplicaModel {
            id: id.to_string(),
            cache: LruCache::with_hasher(usize::MAX, BuildBlockHasher::default()),
            load: 0.0,
            load_at_ms: 0,
        };
        let slot = match self.free_slots.pop() {
            Some(slot) => {
                self.models[slot as usize] = Some(model);
                slot
            }
            None => {
                self.models.push(Some(model));
                (self.models.len() - 1) as u32
            }
        };
        self.slot_of.insert(id.to_string(), slot);
        slot
    }

    /// The number of slots (live or free): slot numbers are below it.
    pub(crate) fn slot_count(&self) -> usize {
        self.models.len()
    }

    /// The slots holding `block`.
    pub(crate) fn holders(&self, block: BlockHash) -> &[u32] {
        self.holders.get(&block).map_or(&[], |list| list.as_slice())
    }

    pub(crate) fn holds(&self, slot: u32, block: BlockHash) -> bool {
        self.model(slot).cache.contains_key(&block)
    }

    /// The load `slot` carries into a window planned at `now_ms`.
    pub(crate) fn carried_load(&self, slot: u32, now_ms: u64) -> f64 {
        let model = self.model(slot);
        if self.settings.load_half_life_ms == 0 {
            return 0.0;
        }
        let elapsed = now_ms.saturating_sub(model.load_at_ms) as f64;
        model.load * 0.5f64.powf(elapsed / self.settings.load_half_life_ms as f64)
    }

    /// Sets what `slot` carries from `now_ms` on.
    pub(crate) fn set_load(&mut self, slot: u32, load: f64, now_ms: u64) {
        let model = self.models[slot as usize].as_mut().expect("a live slot");
        model.load = load;
        model.load_at_ms = now_ms;
    }

    /// Marks `blocks` (one request's) as just used on `slot`, evicting the least recently used
    /// blocks beyond capacity.
    pub(crate) fn touch(&mut self, slot: u32, blocks: &[BlockHash]) {
        let capacity = self.settings.capacity_blocks.get();
        for &block in blocks.iter().rev() {
            let model = self.models[slot as usize].as_mut().expect("a live slot");
            // One lookup: promoted if held, else inserted at the back (one over capacity for a
            // moment, then the least recently used block goes).
            match model.cache.entry(block) {
                Entry::Occupied(mut held) => {
                    held.to_back();
                    continue;
                }
                Entry::Vacant(new) => {
                    let list = self.holders.entry(block).or_default();
                    new.insert(list.len() as u32);
                    list.push(slot);
                }
            }
            if model.cache.len() > capacity {
                if let Some((evicted, position)) = model.cache.remove_lru() {
                    self.unhold(evicted, position);
                }
            }
        }
    }

    /// Takes the holder at `position` out of `holders[block]`.
    fn unhold(&mut self, block: BlockHash, position: u32) {
        let list = self.holders.get_mut(&block).expect("a held block");
        list.swap_remove(position as usize);
        if let Some(&moved) = list.get(position as usize) {
            let model = self.models[moved as usize].as_mut().expect("a live slot");
            *model.cache.peek_mut(&block).expect("the holder holds it") = position;
        } else if list.is_empty() {
            self.holders.remove(&block);
        }
    }

    fn model(&self, slot: u32) -> &ReplicaModel {
        self.models[slot as usize].as_ref().expect("a live slot")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every (block, slot) of the index is in that slot's cache at the position it names, and
    /// the other way round.
    fn assert_consistent(memory: &Memory) {
        let mut entries = 0;
        for (&block, list) in &memory.holders {
            assert!(!list.is_empty());
            for (position, &slot) in list.iter().enumerate() {
                let model = memory.models[slot as usize].as_ref().unwrap();
                assert_eq!(model.cache.peek(&block), Some(&(position as u32)));
                entries += 1;
            }
        }
        assert_eq!(entries, memory.held_blocks());
    }

    proptest! {
        #[test]
        fn the_index_follows_touches_evictions_and_departures(
            ops in prop::collection::vec((0u8..5, prop::collection::vec(0u64..30, 1..8)), 1..200),
            capacity in 1usize..10,
        ) {
            let mut memory = Memory::new(MemorySettings {
                capacity_blocks: NonZeroUsize::new(capacity).unwrap(),
                load_half_life_ms: 0,
            });
            for (replica, blocks) in ops {
                if replica == 4 {
                    // A departure of whichever replica the first block names.
                    let gone = format!("r{}", blocks[0] % 4);
                    memory.retain_replicas(|id| id != gone);
                } else {
                    let slot = memory.slot(&format!("r{replica}"));
                    memory.touch(slot, &blocks);
                    // The request's first block is the most recently used: it is held.
                    prop_assert!(memory.holds(slot, blocks[0]));
                }
                assert_consistent(&memory);
                for (_, held) in memory.replica_blocks() {
                    prop_assert!(held <= capacity);
                }
            }
        }
    }
}
