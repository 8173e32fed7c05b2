//! The memory as the window's placement reads it: which candidates' cache models hold a block,
//! looked up once per block the window shares.

use std::collections::HashMap;

use super::block_keys::BuildBlockHasher;
use super::BatchRequest;
use crate::memory::Memory;
use crate::prefixhash::BlockHash;

/// The memory: planning reads the models as the window found them, and touches the blocks of
/// each placed unit (merged into the models by `Memory::settle` after the window).
pub(super) struct Recall<'m> {
    pub(super) memory: &'m mut Memory,
    pub(super) batch: &'m [BatchRequest<'m>],
    /// Per replica, its memory slot (endpoint ids are unique: callers refuse duplicates).
    pub(super) slots: &'m [u32],
    /// Per memory slot, the replica index in this call (`NO_REPLICA`: not a candidate now).
    pub(super) replica_of_slot: Vec<u32>,
    /// Per replica, the load it starts this window with.
    pub(super) carried: Vec<u64>,
    /// The candidates holding each block looked up so far, as a range of `found` (the models
    /// do not change during the window): the warm-single check, the unit order and the walk
    /// would otherwise look up a shared prefix again for every unit, each lookup a cache miss or
    /// two in the memory.
    pub(super) looked_up: HashMap<BlockHash, (u32, u32), BuildBlockHasher>,
    pub(super) found: Vec<u32>,
    /// The last lookup not kept.
    pub(super) once: Vec<u32>,
    /// Some request of the window may use only some replicas (step 7).
    pub(super) restricted: bool,
}

pub(super) const NO_REPLICA: u32 = u32::MAX;

impl Recall<'_> {
    /// The candidate replicas whose models hold `block`, kept for the next lookup when other
    /// units of the window share the block (`shared`); a block of one unit's own is looked up
    /// again rather than kept (keeping costs about a lookup, and most blocks are one unit's).
    pub(super) fn holders(&mut self, block: BlockHash, shared: bool) -> &[u32] {
        let Recall {
            memory,
            replica_of_slot,
            looked_up,
            found,
            once,
            ..
        } = self;
        let candidates = |memory: &Memory, found: &mut Vec<u32>| {
            found.extend(
                memory
                    .holders(block)
                    .map(|slot| replica_of_slot[slot as usize])
                    .filter(|&replica| replica != NO_REPLICA),
            )
        };
        if !shared {
            if let Some(&(from, to)) = looked_up.get(&block) {
                return &found[from as usize..to as usize];
            }
            once.clear();
            candidates(memory, once);
            return once;
        }
        let (from, to) = *looked_up.entry(block).or_insert_with(|| {
            let from = found.len() as u32;
            candidates(memory, found);
            (from, found.len() as u32)
        });
        &found[from as usize..to as usize]
    }

    /// Whether some candidate's model holds the first `need` blocks of `blocks`. A holder of
    /// block `need - 1` nearly always holds its prefix too, so the first one checked decides.
    pub(super) fn holds_leading(&mut self, blocks: &[BlockHash], need: usize) -> bool {
        if blocks.len() < need {
            return false;
        }
        let holders = self.holders(blocks[need - 1], true).to_vec();
        holders.into_iter().any(|replica| {
            let slot = self.slots[replica as usize];
            blocks[..need - 1]
                .iter()
                .all(|&block| self.memory.holds(slot, block))
        })
    }

    /// Whether request `request` may use `replica` (step 7).
    pub(super) fn may_use(&self, request: usize, replica: usize) -> bool {
        !self.restricted
            || self.batch[request]
                .allowed_replicas
                .is_none_or(|allowed| allowed.contains(&replica))
    }
}
