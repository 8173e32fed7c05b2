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
//! them new, and evicts as many:
//! - one table from each block to its holders, each holder with the stamp of its last use (a
//!   count of its replica's touches), so that a touch is one lookup;
//! - per replica, a log of its touches in stamp order (the entry of a stamp at `stamp - base`).
//!   A touch of a held block crosses out its earlier entry; eviction pops the log's front (least
//!   recent use first) past crossed-out entries, so it never searches for its victim, and looks
//!   the next victims up ahead of time so that their cache misses overlap.
//!
//! A window records its placements as it makes them (planning then walks one index for this
//! window and the earlier ones), and [`Memory::settle`] evicts afterwards. An LRU holds the
//! `capacity` most recently used distinct blocks whatever the order of its evictions, so
//! evicting once per window holds what evicting at every touch would (the tests check it against
//! such an LRU).

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
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
    /// The holders of each block. Eight bytes per
    /// entry: one holder inline, or the index of a longer list in `lists`.
    blocks: hashbrown::HashMap<BlockHash, Holders, BuildBlockHasher>,
    /// Holder lists of the blocks with more than one (`Holders::many`); `free_lists` are unused.
    lists: Vec<Vec<Holder>>,
    free_lists: Vec<u32>,
    /// Where each holder sits in a list longer than `SCANNED_HOLDERS`, so that a block held by
    /// thousands of replicas (a system prompt) is never scanned for one of them.
    positions: hashbrown::HashMap<(BlockHash, u32), u32, BuildBlockHasher>,
    /// This window's touches that no other unit of the window walks (see [`Memory::record`]),
    /// put in the table by [`Memory::settle`].
    deferred: Vec<(BlockHash, Holder)>,
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
            deferred: Vec::new(),
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

    /// Entries of the block index (one per held block and replica): its size.
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
        // A departure within a window (not from the planner) finds all its touches in the table.
        self.put_deferred();
        for slot in gone {
            let model = self.models[slot as usize].take().expect("a live slot");
            self.slot_of.remove(&model.id);
            for &(block, crossed) in &model.log {
                if !crossed {
                    self.unhold(block, slot);
                }
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
        one.iter().chain(many).map(|holder| holder.slot)
    }

    pub(crate) fn holds(&self, slot: u32, block: BlockHash) -> bool {
        self.blocks
            .get(&block)
            .and_then(|&holders| self.find(holders, block, slot))
            .is_some()
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

    /// Marks `blocks` (one request's) as just used on `slot`. The first `shared` blocks go in
    /// the table at once, where the window's other units walk them; the rest, which no other
    /// unit of the window shares (its chain diverged), at [`Memory::settle`], in table order, as
    /// do the evictions. Nothing is evicted before, so the model may hold more than its capacity
    /// until then.
    pub(crate) fn record(&mut self, slot: u32, blocks: &[BlockHash], shared: usize) {
        for (depth, &block) in blocks.iter().enumerate().rev() {
            let model = self.models[slot as usize].as_mut().expect("a live slot");
            let fresh = Holder {
                slot,
                stamp: model.log(block),
            };
            if depth >= shared {
                self.deferred.push((block, fresh));
            } else {
                self.put(block, fresh);
            }
        }
    }

    /// Puts a touch in the table: the replica's earlier entry for the block is crossed out, or
    /// it holds one block more.
    fn put(&mut self, block: BlockHash, fresh: Holder) {
        let base = self.model(fresh.slot).base as u32;
        let put = self.put_holder(block, fresh, base);
        let model = self.models[fresh.slot as usize]
            .as_mut()
            .expect("a live slot");
        match put {
            Put::New => model.held += 1,
            Put::Replaced(stamp) => model.cross_out(stamp),
            // A deferred touch that a later one, put at once, already superseded.
            Put::Superseded => model.cross_out(fresh.stamp),
        }
    }

    /// Puts `fresh` among `block`'s holders, unless its replica's holder there is a later
    /// touch (`base`: the replica's log base, to compare stamps).
    fn put_holder(&mut self, block: BlockHash, fresh: Holder, base: u32) -> Put {
        let Memory {
            blocks,
            lists,
            free_lists,
            positions,
            ..
        } = self;
        let holders = match blocks.entry(block) {
            hashbrown::hash_map::Entry::Vacant(vacant) => {
                vacant.insert(Holders(fresh));
                return Put::New;
            }
            hashbrown::hash_map::Entry::Occupied(occupied) => occupied.into_mut(),
        };
        let list = match holders.list() {
            Some(list) => list,
            None if holders.0.slot == fresh.slot => return replace(&mut holders.0, fresh, base),
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
            Some(at) => replace(&mut list[at], fresh, base),
            None => {
                list.push(fresh);
                index_positions(list, positions, block);
                Put::New
            }
        }
    }

    /// Puts the window's deferred touches in the table, evicts the least recently used blocks
    /// of every replica beyond its capacity, and drops logs' crossed-out entries once they
    /// outnumber the capacity (so a log stays within twice the capacity plus one window's
    /// touches, and each touch pays for its entry once).
    pub(crate) fn settle(&mut self) {
        self.put_deferred();
        let capacity = self.settings.capacity_blocks.get();
        let mut victims = Vec::new();
        for (slot, model) in self.models.iter_mut().enumerate() {
            let Some(model) = model else { continue };
            while model.held > capacity {
                let (block, crossed) = model.log.pop_front().expect("every held block is logged");
                model.base += 1;
                if crossed {
                    model.crossed -= 1;
                } else {
                    model.held -= 1;
                    victims.push((block, slot as u32));
                }
            }
        }
        for (block, slot) in self.in_table_order(victims, |&(block, _)| block) {
            self.unhold(block, slot);
        }
        for slot in 0..self.models.len() as u32 {
            if self.models[slot as usize]
                .as_ref()
                .is_some_and(|model| model.crossed > capacity)
            {
                self.compact_log(slot);
            }
        }
    }

    fn put_deferred(&mut self) {
        let deferred = std::mem::take(&mut self.deferred);
        for (block, holder) in self.in_table_order(deferred, |&(block, _)| block) {
            self.put(block, holder);
        }
    }

    /// `items` in the order their blocks sit in the table (by the leading bits of the bucket
    /// the table's hash gives them, a stable counting sort), so that going through them walks
    /// the table front to back instead of at random: tens of thousands of cache misses become
    /// one sequential pass. Only speed depends on it matching the table's layout.
    fn in_table_order<T>(&self, items: Vec<T>, block: impl Fn(&T) -> BlockHash) -> Vec<T> {
        let buckets = (self.blocks.capacity() / 7 * 8).next_power_of_two().max(1);
        let bits = buckets.trailing_zeros().min(TABLE_ORDER_BITS);
        if items.len() < 2 || bits == 0 {
            return items;
        }
        let hasher = self.blocks.hasher();
        let shift = buckets.trailing_zeros() - bits;
        let region = |item: &T| (hasher.hash_one(block(item)) as usize & (buckets - 1)) >> shift;
        let mut starts = vec![0usize; (1 << bits) + 1];
        for item in &items {
            starts[region(item) + 1] += 1;
        }
        for at in 1..starts.len() {
            starts[at] += starts[at - 1];
        }
        let mut ordered: Vec<Option<T>> = (0..items.len()).map(|_| None).collect();
        for item in items {
            let at = &mut starts[region(&item)];
            ordered[*at] = Some(item);
            *at += 1;
        }
        ordered
            .into_iter()
            .map(|item| item.expect("every slot filled"))
            .collect()
    }

    /// Takes `slot` off `block`'s holders.
    fn unhold(&mut self, block: BlockHash, slot: u32) {
        let hashbrown::hash_map::Entry::Occupied(mut entry) = self.blocks.entry(block) else {
            unreachable!("a held block is indexed");
        };
        let Some(list) = entry.get().list() else {
            debug_assert_eq!(entry.get().0.slot, slot);
            entry.remove();
            return;
        };
        let holders = &mut self.lists[list];
        let at = position(holders, &self.positions, block, slot).expect("a holder is listed");
        let indexed = holders.len() > SCANNED_HOLDERS;
        holders.swap_remove(at);
        if indexed {
            self.positions.remove(&(block, slot));
            if holders.len() > SCANNED_HOLDERS {
                if let Some(moved) = holders.get(at) {
                    self.positions.insert((block, moved.slot), at as u32);
                }
            } else {
                for holder in holders.iter() {
                    self.positions.remove(&(block, holder.slot));
                }
            }
        }
        if holders.len() == 1 {
            // Back to one holder, inline.
            let last = holders.pop().expect("one holder");
            self.free_lists.push(list as u32);
            *entry.get_mut() = Holders(last);
        }
    }

    /// Rewrites `slot`'s log without its crossed-out entries, restamping its holders.
    fn compact_log(&mut self, slot: u32) {
        let model = self.models[slot as usize].as_mut().expect("a live slot");
        let old = std::mem::take(&mut model.log);
        model.base += old.len() as u64;
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

/// Regions `Memory::in_table_order` sorts by: 4,096, a few kilobytes of a large table each.
const TABLE_ORDER_BITS: u32 = 12;

/// What putting a touch in the table found.
enum Put {
    /// The replica did not hold the block.
    New,
    /// It did, with this earlier touch.
    Replaced(u32),
    /// It did, with a later touch (put at once while this one was deferred).
    Superseded,
}

/// Replaces `holder` (the same replica's) by `fresh` if `fresh` is the later touch.
fn replace(holder: &mut Holder, fresh: Holder, base: u32) -> Put {
    if fresh.stamp.wrapping_sub(base) > holder.stamp.wrapping_sub(base) {
        Put::Replaced(std::mem::replace(holder, fresh).stamp)
    } else {
        Put::Superseded
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
        for (slot, model) in memory.models.iter().enumerate() {
            let Some(model) = model else { continue };
            let held = held_by(memory, slot as u32);
            assert_eq!(model.held, held.len());
            let live = model.log.iter().filter(|(_, crossed)| !crossed).count();
            assert_eq!(live, model.held);
            assert_eq!(model.log.len() - live, model.crossed);
        }
        assert_eq!(memory.index_entries(), memory.held_blocks());
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
        /// indexed holder lists), some of their blocks put in the table at once and the others
        /// at the end of the window, departures among them: after each window the model holds
        /// exactly what per-touch LRUs hold, and its counts, logs and index stay consistent.
        #[test]
        fn settling_once_per_window_holds_what_an_lru_holds(
            windows in prop::collection::vec(
                prop::collection::vec(
                    (0u8..21, prop::collection::vec(0u64..40, 1..8), 0usize..8),
                    0..30,
                ),
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
                for (replica, blocks, shared) in window {
                    if replica == 20 {
                        // A departure of whichever replica the first block names.
                        let gone = format!("r{}", blocks[0] % 20);
                        memory.retain_replicas(|id| id != gone);
                        oracle.0.remove(&gone);
                        continue;
                    }
                    let id = format!("r{replica}");
                    let slot = memory.slot(&id);
                    // The first `shared` blocks are in the table at once, the others at the end
                    // of the window.
                    memory.record(slot, &blocks, shared);
                    oracle.touch(&id, &blocks, capacity);
                    for &block in blocks.iter().take(shared) {
                        prop_assert!(memory.holds(slot, block));
                    }
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
