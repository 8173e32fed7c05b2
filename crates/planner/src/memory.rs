//! Memory across windows (SPEC §7): which prefix blocks each replica probably still caches, and
//! how much work it got recently. A value the caller keeps and passes to
//! [`assign_with_memory`](crate::assign_with_memory); no clock inside (time comes in as
//! `now_ms`).
//!
//! Per replica, an LRU of the blocks placed on it (at most `capacity_blocks`, as vLLM's
//! block-level prefix cache evicts). A request's blocks are touched last block first: its prefix
//! becomes the most recently used, so a prefix outlives its suffixes (vLLM frees a finished
//! request's blocks tail first) and a held block keeps implying its chain's prefix. Memory is
//! bounded by capacity x replicas, never by traffic.
//!
//! The layout serves the planner, which touches tens of thousands of blocks per window, most of
//! them new, so each touch costs one lookup and an eviction none:
//! - one table from each block to its holders, each holder with the stamp of its last use (a
//!   count of its replica's touches);
//! - per replica, a log of its touches in stamp order, a stamp's entry at `stamp - base`. A
//!   touch of a held block crosses out its earlier entry. Eviction pops the log's front (least
//!   recent use first), skipping crossed-out entries: a holder is held while its stamp is within
//!   the log, so an evicted one needs no lookup, and sweeps of the table drop such holders once
//!   they are as many as the held ones.
//!
//! A window records its placements as it makes them (planning then walks one index for this
//! window and the earlier ones), and [`Memory::settle`] evicts afterwards. An LRU holds the
//! `capacity` most recently used distinct blocks whatever the order of its evictions, so
//! evicting once per window holds what evicting at every touch would (the tests check it against
//! such an LRU).

use std::collections::{HashMap, VecDeque};
use std::num::NonZeroUsize;

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
    /// The holders of each block, evicted ones included until the next sweep. Eight bytes per
    /// entry: one holder inline, or the index of a longer list in `lists`.
    blocks: hashbrown::HashMap<BlockHash, Holders, BuildBlockHasher>,
    /// Holder lists of the blocks with more than one (`Holders::many`); `free_lists` are unused.
    lists: Vec<Vec<Holder>>,
    free_lists: Vec<u32>,
    /// Where each holder sits in a list longer than `SCANNED_HOLDERS`, so that a block held by
    /// thousands of replicas (a system prompt) is never scanned for one of them.
    positions: hashbrown::HashMap<(BlockHash, u32), u32, BuildBlockHasher>,
    /// Holders in `blocks` whose replica evicted them.
    evicted: usize,
    /// Touches since the last sweep: a sweep comes before any stamp could wrap around.
    touches_since_sweep: u64,
}

/// One replica holding one block: its slot, and its last use as the low bits of the stamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Holder {
    slot: u32,
    stamp: u32,
}

/// A block's holders, as a table value: one `Holder`, or (`slot == MANY`) a list's index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Holders(Holder);

const MANY: u32 = u32::MAX;

impl Holders {
    fn many(list: u32) -> Self {
        Holders(Holder {
            slot: MANY,
            stamp: list,
        })
    }

    fn list(self) -> Option<usize> {
        (self.0.slot == MANY).then_some(self.0.stamp as usize)
    }
}

/// Holder lists up to this long are scanned for a replica; longer ones are indexed.
const SCANNED_HOLDERS: usize = 8;

#[derive(Clone, Debug)]
struct ReplicaModel {
    id: String,
    /// Blocks held.
    held: usize,
    /// Its touches since the oldest one still held, by stamp from `base`: the block, and
    /// whether a later touch crossed the entry out.
    log: VecDeque<(BlockHash, bool)>,
    /// The stamp of `log[0]`.
    base: u64,
    /// Crossed-out entries in `log`.
    crossed: usize,
    /// Load carried over (in the unit of `balanceBy`), as of `load_at_ms`.
    load: f64,
    load_at_ms: u64,
}

impl ReplicaModel {
    /// Whether a holder with this stamp is still held (its entry is in the log).
    fn holds(&self, stamp: u32) -> bool {
        (stamp.wrapping_sub(self.base as u32) as usize) < self.log.len()
    }

    /// Logs a touch of `block`, returning its stamp.
    fn log(&mut self, block: BlockHash) -> u32 {
        self.log.push_back((block, false));
        (self.base + self.log.len() as u64 - 1) as u32
    }

    fn cross_out(&mut self, stamp: u32) {
        let at = stamp.wrapping_sub(self.base as u32) as usize;
        self.log[at].1 = true;
        self.crossed += 1;
    }
}

impl Memory {
    pub fn new(settings: MemorySettings) -> Self {
        Memory {
            settings,
            slot_of: HashMap::new(),
            models: Vec::new(),
            free_slots: Vec::new(),
            blocks: hashbrown::HashMap::default(),
            lists: Vec::new(),
            free_lists: Vec::new(),
            positions: hashbrown::HashMap::default(),
            evicted: 0,
            touches_since_sweep: 0,
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
            .map(|model| (model.id.as_str(), model.held))
    }

    /// Blocks held in all.
    pub fn held_blocks(&self) -> usize {
        self.models.iter().flatten().map(|m| m.held).sum()
    }

    /// Entries of the block index (one per held block and replica, plus evicted ones not yet
    /// swept): its size.
    pub fn index_entries(&self) -> usize {
        self.blocks
            .values()
            .map(|&holders| holders.list().map_or(1, |list| self.lists[list].len()))
            .sum()
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
        if gone.is_empty() {
            return;
        }
        for &slot in &gone {
            let model = self.models[slot as usize].take().expect("a live slot");
            self.slot_of.remove(&model.id);
        }
        // Their holders go before their slots can be given to newcomers.
        self.sweep();
        self.free_slots.extend(gone);
    }

    /// The slot of `id`, made cold if the memory did not know it.
    pub(crate) fn slot(&mut self, id: &str) -> u32 {
        if let Some(&slot) = self.slot_of.get(id) {
            return slot;
        }
        let model = ReplicaModel {
            id: id.to_string(),
            held: 0,
            log: VecDeque::new(),
            base: 0,
            crossed: 0,
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

    /// Makes room for a window that records at most `blocks` (block, replica) pairs, so that
    /// the table grows at most once per window, before planning reads it.
    pub(crate) fn reserve(&mut self, blocks: usize) {
        self.blocks.reserve(blocks);
    }

    /// The slots holding `block`.
    pub(crate) fn holders(&self, block: BlockHash) -> impl Iterator<Item = u32> + '_ {
        let (one, many): (&[Holder], &[Holder]) = match self.blocks.get(&block) {
            None => (&[], &[]),
            Some(holders) => match holders.list() {
                None => (std::slice::from_ref(&holders.0), &[]),
                Some(list) => (&[], &self.lists[list]),
            },
        };
        one.iter()
            .chain(many)
            .filter(|holder| is_held(&self.models, holder))
            .map(|holder| holder.slot)
    }

    pub(crate) fn holds(&self, slot: u32, block: BlockHash) -> bool {
        self.blocks
            .get(&block)
            .and_then(|&holders| self.find(holders, block, slot))
            .is_some_and(|holder| is_held(&self.models, &holder))
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

    /// Marks `blocks` (one request's) as just used on `slot`; nothing is evicted until
    /// [`Memory::settle`], so the model may hold more than its capacity until then.
    pub(crate) fn record(&mut self, slot: u32, blocks: &[BlockHash]) {
        self.touches_since_sweep += blocks.len() as u64;
        // Independent lookups first: the processor overlaps their cache misses, which the
        // dependent updates below would take one at a time.
        for block in blocks {
            std::hint::black_box(self.blocks.get(block));
        }
        for &block in blocks.iter().rev() {
            let model = self.models[slot as usize].as_mut().expect("a live slot");
            let fresh = Holder {
                slot,
                stamp: model.log(block),
            };
            let earlier = self.put_holder(block, fresh);
            let model = self.models[slot as usize].as_mut().expect("a live slot");
            match earlier {
                Some(stamp) => revive(model, stamp, &mut self.evicted),
                None => model.held += 1,
            }
        }
    }

    /// Puts `fresh` among `block`'s holders, returning the stamp it replaced if its replica was
    /// there already (held or evicted).
    fn put_holder(&mut self, block: BlockHash, fresh: Holder) -> Option<u32> {
        let Memory {
            models,
            blocks,
            lists,
            free_lists,
            positions,
            evicted,
            ..
        } = self;
        let holders = match blocks.entry(block) {
            hashbrown::hash_map::Entry::Vacant(vacant) => {
                vacant.insert(Holders(fresh));
                return None;
            }
            hashbrown::hash_map::Entry::Occupied(occupied) => occupied.into_mut(),
        };
        let list = match holders.list() {
            Some(list) => list,
            None if holders.0.slot == fresh.slot => {
                return Some(std::mem::replace(&mut holders.0, fresh).stamp);
            }
            None if !is_held(models, &holders.0) => {
                // Its one holder was evicted: replaced now rather than swept later.
                holders.0 = fresh;
                *evicted -= 1;
                return None;
            }
            None => {
                // A second holder: the block gets a list.
                let list = free_lists.pop().map_or_else(
                    || {
                        lists.push(Vec::new());
                        lists.len() - 1
                    },
                    |list| list as usize,
                );
                lists[list].push(holders.0);
                *holders = Holders::many(list as u32);
                list
            }
        };
        let list = &mut lists[list];
        match position(list, positions, block, fresh.slot) {
            Some(at) => Some(std::mem::replace(&mut list[at], fresh).stamp),
            None => {
                list.push(fresh);
                index_positions(list, positions, block);
                None
            }
        }
    }

    /// Evicts the least recently used blocks of every replica beyond its capacity, drops logs'
    /// crossed-out entries once they outnumber the capacity, and sweeps the evicted holders out
    /// of the table once they are as many as the held ones.
    pub(crate) fn settle(&mut self) {
        let capacity = self.settings.capacity_blocks.get();
        for slot in 0..self.models.len() {
            let Some(model) = self.models[slot].as_mut() else {
                continue;
            };
            while model.held > capacity {
                let (_, crossed) = model.log.pop_front().expect("every held block is logged");
                model.base += 1;
                if crossed {
                    model.crossed -= 1;
                } else {
                    model.held -= 1;
                    self.evicted += 1;
                }
            }
            if model.crossed > capacity {
                self.compact_log(slot as u32);
            }
        }
        if self.evicted > self.held_blocks() || self.touches_since_sweep > SWEEP_BEFORE_WRAP {
            self.sweep();
        }
    }

    /// Rewrites `slot`'s log without its crossed-out entries, restamping its holders.
    fn compact_log(&mut self, slot: u32) {
        let model = self.models[slot as usize].as_mut().expect("a live slot");
        let old = std::mem::take(&mut model.log);
        model.base += old.len() as u64;
        // The stamps skipped count towards a wrap like touches.
        self.touches_since_sweep += old.len() as u64;
        model.crossed = 0;
        for (block, crossed) in old {
            if crossed {
                continue;
            }
            let stamp = model.log(block);
            let holders = self
                .blocks
                .get_mut(&block)
                .expect("a held block is indexed");
            let holder = match holders.list() {
                None => &mut holders.0,
                Some(list) => {
                    let at = position(&self.lists[list], &self.positions, block, slot)
                        .expect("a held block lists its holder");
                    &mut self.lists[list][at]
                }
            };
            holder.stamp = stamp;
        }
    }

    /// Drops the holders that were evicted or whose replica left.
    fn sweep(&mut self) {
        let Memory {
            models,
            blocks,
            lists,
            free_lists,
            positions,
            ..
        } = self;
        blocks.retain(|_, holders| {
            let Some(list) = holders.list() else {
                return is_held(models, &holders.0);
            };
            let list_holders = &mut lists[list];
            list_holders.retain(|holder| is_held(models, holder));
            match list_holders.len() {
                0 | 1 => {
                    let last = list_holders.pop();
                    free_lists.push(list as u32);
                    match last {
                        Some(holder) => {
                            *holders = Holders(holder);
                            true
                        }
                        None => false,
                    }
                }
                _ => true,
            }
        });
        // Rebuilt rather than patched: positions changed wherever a list lost holders.
        positions.clear();
        for (&block, holders) in blocks.iter() {
            if let Some(list) = holders.list() {
                let list_holders = &lists[list];
                if list_holders.len() > SCANNED_HOLDERS {
                    for (at, holder) in list_holders.iter().enumerate() {
                        positions.insert((block, holder.slot), at as u32);
                    }
                }
            }
        }
        self.evicted = 0;
        self.touches_since_sweep = 0;
    }

    fn find(&self, holders: Holders, block: BlockHash, slot: u32) -> Option<Holder> {
        match holders.list() {
            None => (holders.0.slot == slot).then_some(holders.0),
            Some(list) => {
                let list = &self.lists[list];
                position(list, &self.positions, block, slot).map(|at| list[at])
            }
        }
    }

    fn model(&self, slot: u32) -> &ReplicaModel {
        self.models[slot as usize].as_ref().expect("a live slot")
    }
}

/// Stamps are kept as their low 32 bits: a holder evicted this many touches before a sweep
/// could look held again, so the table is swept long before.
const SWEEP_BEFORE_WRAP: u64 = 1 << 30;

/// Whether `holder`'s replica still holds the block (neither evicted it nor left).
fn is_held(models: &[Option<ReplicaModel>], holder: &Holder) -> bool {
    models[holder.slot as usize]
        .as_ref()
        .is_some_and(|model| model.holds(holder.stamp))
}

/// A touched block's holder was there already with `old_stamp`: its old entry is crossed out if
/// it was still held, else it is held again.
fn revive(model: &mut ReplicaModel, old_stamp: u32, evicted: &mut usize) {
    if model.holds(old_stamp) {
        model.cross_out(old_stamp);
    } else {
        model.held += 1;
        *evicted -= 1;
    }
}

/// Where `slot` sits in a holder list, if it is on it.
fn position(
    list: &[Holder],
    positions: &hashbrown::HashMap<(BlockHash, u32), u32, BuildBlockHasher>,
    block: BlockHash,
    slot: u32,
) -> Option<usize> {
    if list.len() <= SCANNED_HOLDERS {
        list.iter().position(|holder| holder.slot == slot)
    } else {
        positions.get(&(block, slot)).map(|&at| at as usize)
    }
}

/// Indexes the holder just pushed onto `list`, and the whole list when it just outgrew scanning.
fn index_positions(
    list: &[Holder],
    positions: &mut hashbrown::HashMap<(BlockHash, u32), u32, BuildBlockHasher>,
    block: BlockHash,
) {
    if list.len() == SCANNED_HOLDERS + 1 {
        for (at, holder) in list.iter().enumerate() {
            positions.insert((block, holder.slot), at as u32);
        }
    } else if list.len() > SCANNED_HOLDERS + 1 {
        let at = list.len() - 1;
        positions.insert((block, list[at].slot), at as u32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hashlink::LruCache;
    use proptest::prelude::*;

    /// What each replica holds, read from the table (the planner's view).
    fn held_by(memory: &Memory, slot: u32) -> Vec<BlockHash> {
        let mut held: Vec<BlockHash> = memory
            .blocks
            .keys()
            .copied()
            .filter(|&block| memory.holds(slot, block))
            .collect();
        held.sort_unstable();
        held
    }

    /// Counts, logs and the long lists' positions agree with the table.
    fn assert_consistent(memory: &Memory) {
        let mut positions = 0;
        for (&block, &holders) in &memory.blocks {
            if let Some(list) = holders.list() {
                let list = &memory.lists[list];
                assert!(list.len() >= 2);
                for (at, holder) in list.iter().enumerate() {
                    assert_eq!(
                        position(list, &memory.positions, block, holder.slot),
                        Some(at)
                    );
                }
                if list.len() > SCANNED_HOLDERS {
                    positions += list.len();
                }
            }
        }
        assert_eq!(memory.positions.len(), positions);
        let mut evicted = memory.index_entries();
        for (slot, model) in memory.models.iter().enumerate() {
            let Some(model) = model else { continue };
            let held = held_by(memory, slot as u32);
            assert_eq!(model.held, held.len());
            evicted -= held.len();
            let live = model.log.iter().filter(|(_, crossed)| !crossed).count();
            assert_eq!(live, model.held);
            assert_eq!(model.log.len() - live, model.crossed);
        }
        assert_eq!(memory.evicted, evicted);
    }

    /// The blocks an LRU evicting at every touch would hold, for each replica.
    #[derive(Default)]
    struct Oracle(HashMap<String, LruCache<BlockHash, ()>>);

    impl Oracle {
        fn touch(&mut self, id: &str, blocks: &[BlockHash], capacity: usize) {
            let cache = self
                .0
                .entry(id.to_string())
                .or_insert_with(|| LruCache::new(capacity));
            for &block in blocks.iter().rev() {
                cache.insert(block, ());
            }
        }
    }

    proptest! {
        /// Random windows of touches on up to 20 replicas (so that some blocks have long,
        /// indexed holder lists), departures among them: after each window the model holds
        /// exactly what per-touch LRUs hold, and its counts, logs and index stay consistent.
        #[test]
        fn settling_once_per_window_holds_what_an_lru_holds(
            windows in prop::collection::vec(
                prop::collection::vec((0u8..21, prop::collection::vec(0u64..40, 1..8)), 0..30),
                1..12,
            ),
            capacity in 1usize..12,
        ) {
            let mut memory = Memory::new(MemorySettings {
                capacity_blocks: NonZeroUsize::new(capacity).unwrap(),
                load_half_life_ms: 0,
            });
            let mut oracle = Oracle::default();
            for window in windows {
                for (replica, blocks) in window {
                    if replica == 20 {
                        // A departure of whichever replica the first block names.
                        let gone = format!("r{}", blocks[0] % 20);
                        memory.retain_replicas(|id| id != gone);
                        oracle.0.remove(&gone);
                        continue;
                    }
                    let id = format!("r{replica}");
                    let slot = memory.slot(&id);
                    memory.record(slot, &blocks);
                    oracle.touch(&id, &blocks, capacity);
                    prop_assert!(memory.holds(slot, blocks[0]));
                }
                memory.settle();
                assert_consistent(&memory);
                for (id, &slot) in &memory.slot_of {
                    let mut expected: Vec<BlockHash> = oracle
                        .0
                        .get(id)
                        .map(|cache| cache.iter().map(|(&block, _)| block).collect())
                        .unwrap_or_default();
                    expected.sort_unstable();
                    prop_assert_eq!(held_by(&memory, slot), expected);
                    let model = memory.model(slot);
                    prop_assert!(model.log.len() <= 2 * capacity);
                }
            }
        }
    }
}
