//! Memory across windows (docs/behaviour.md §7): which prefix blocks each replica probably still
//! caches, and how much work it got recently. A value the caller keeps and passes to
//! [`assign_with_memory`](crate::assign_with_memory); no clock inside (time comes in as
//! `now_ms`).
//!
//! Per replica, an LRU of the blocks placed on it (at most `capacity_blocks`, as vLLM's
//! block-level prefix cache evicts). A request's blocks are touched last block first: its prefix
//! becomes the most recently used, so a prefix outlives its suffixes (vLLM frees a finished
//! request's blocks tail first) and a held block keeps implying its chain's prefix. Memory is
//! bounded by capacity x replicas, never by traffic (the index also keeps, until its level's
//! next merge, the entries evicted or superseded since: at most a sixteenth of it more, besides
//! the last window's touches).
//!
//! The layout serves the planner, which touches tens of thousands of blocks per window, most of
//! them new, and evicts as many; one at a time, in a hash table, each is a cache miss, and they
//! cost several times the memoryless window. So the model changes once per window, in
//! sequential passes:
//! - the held (block, replica) pairs are sorted arrays by block, each with a radix index on
//!   the blocks' leading bits (block hashes are uniform), so a lookup reads two places: the
//!   settled level, and the recent one that windows much smaller than the memory merge into
//!   (so that a small window does not pay a pass over a large memory);
//! - per replica, a log of its touches in use order (the entry of a stamp at `stamp - base`);
//!   an entry of the index is held while its stamp is in its replica's log;
//! - during a window a touch only appends to its replica's log;
//! - `Memory::settle` sorts the window's touches (one count and one scatter by leading bits,
//!   then an insertion pass), crossing out a replica's earlier touches of a block the window
//!   touched again; settles the replicas whose window used their capacity in distinct blocks
//!   from their logs alone (they hold those blocks, whatever they held before); merges the
//!   touches into a level, crossing out the earlier uses they supersede and dropping the
//!   entries no longer held; then pops each other log's front (least recent use first) past
//!   crossed-out entries while its replica holds more than its capacity. An LRU holds the
//!   `capacity` most recently used distinct blocks whatever the order of its evictions, so
//!   evicting once per window holds what evicting at every touch would (the tests check it
//!   against such an LRU).
//!
//! Planning reads the model as the window found it; the window's own placements are the
//! planner's to index.

use std::cmp::Ordering;
use std::collections::{HashMap, VecDeque};
use std::num::NonZeroUsize;
use std::ops::Range;

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
    /// Every held (block, replica) with the stamp of its last use, in two levels: `settled`, as
    /// of the last full merge, and `recent`, the windows merged since. A window much smaller
    /// than the memory merges into `recent` alone, so that it costs about its own touches, not
    /// the memory's size (`Memory::merge_pending`). A key in both levels is held by its entry
    /// in `recent` (the later use; the other is crossed out in the log). Both also keep the
    /// entries evicted since their last merge (an entry is held while its stamp is in its
    /// replica's log: `Memory::live`).
    settled: Level,
    recent: Level,
    /// `RECENT_SHARE` (the tests vary it, to reach both ways of merging).
    recent_share: usize,
    /// Calls of [`Memory::retain_replicas`] that dropped a replica (freed slots are reused).
    departures: u64,
    scratch: Scratch,
}

/// (block, replica) entries sorted by (block, slot), with a radix index on the blocks' leading
/// bits (block hashes are uniform), so a lookup reads two places.
#[derive(Clone, Debug)]
struct Level {
    entries: Vec<Held>,
    /// `entries[starts[b]..starts[b + 1]]` are the blocks whose leading `bits` are `b`.
    starts: Vec<u32>,
    bits: u32,
}

/// Which of `Memory`'s two levels.
#[derive(Clone, Copy, Debug)]
enum LevelName {
    Settled,
    Recent,
}

impl Default for Level {
    fn default() -> Self {
        Level {
            entries: Vec::new(),
            starts: vec![0, 0],
            bits: 0,
        }
    }
}

impl Level {
    /// The entries of `block`, one per slot, by slot.
    fn run(&self, block: BlockHash) -> &[Held] {
        let bucket = &self.entries[self.bucket(block)];
        let from = bucket.partition_point(|held| held.block < block);
        let to = from + bucket[from..].partition_point(|held| held.block == block);
        &bucket[from..to]
    }

    /// Where `slot`'s entry for `block` is, if there is one.
    fn position(&self, block: BlockHash, slot: u32) -> Option<usize> {
        let bucket = self.bucket(block);
        self.entries[bucket.clone()]
            .binary_search_by_key(&(block, slot), Held::key)
            .ok()
            .map(|at| bucket.start + at)
    }

    /// The range of `entries` whose blocks share `block`'s leading bits (the radix index's
    /// bucket).
    fn bucket(&self, block: BlockHash) -> Range<usize> {
        let bucket = leading_bits(block, self.bits);
        self.starts[bucket] as usize..self.starts[bucket + 1] as usize
    }

    /// Rebuilds the radix index over `entries`: about one block per bucket.
    fn reindex(&mut self) {
        let bits = index_bits(self.entries.len());
        self.bits = bits;
        self.starts.clear();
        self.starts.resize((1 << bits) + 1, 0);
        let buckets = self
            .entries
            .iter()
            .map(|held| leading_bits(held.block, bits));
        bucket_starts(buckets, &mut self.starts);
    }
}

/// Buffers `Memory::settle` reuses from window to window (allocating megabytes every window
/// cost page faults).
#[derive(Debug, Default)]
struct Scratch {
    touches: Vec<Held>,
    /// Per bucket of the merged index (by the blocks' leading bits), where its touches go.
    buckets: Vec<u32>,
    merged: Vec<Held>,
}

impl Clone for Scratch {
    /// Empty: a copy's buffers fill on its own first window.
    fn clone(&self) -> Self {
        Scratch::default()
    }
}

/// A block held by a replica, and the low 32 bits of the stamp of its last use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Held {
    block: BlockHash,
    slot: u32,
    stamp: u32,
}

impl Held {
    fn key(&self) -> (BlockHash, u32) {
        (self.block, self.slot)
    }
}

#[derive(Clone, Debug)]
struct ReplicaModel {
    id: String,
    /// Blocks held.
    held: usize,
    /// Its touches since the oldest one still held, by stamp from `base`, each with whether a
    /// later touch of the same block crossed it out.
    log: VecDeque<(BlockHash, bool)>,
    /// The stamp of `log[0]`.
    base: u64,
    /// Crossed-out entries in `log`.
    crossed: usize,
    /// Entries at the end of `log` that the window being planned added (not merged yet).
    pending: usize,
    /// Load carried over (in the unit of `balanceBy`), as of `load_at_ms`.
    load: f64,
    load_at_ms: u64,
}

impl ReplicaModel {
    fn stamp(&self, at: usize) -> u32 {
        (self.base + at as u64) as u32
    }

    /// The log's entries the window being planned added.
    fn pending_touches(&self) -> std::collections::vec_deque::Iter<'_, (BlockHash, bool)> {
        self.log.range(self.log.len() - self.pending..)
    }

    /// The stamps in the log.
    fn span(&self) -> Span {
        Span {
            base: self.base as u32,
            len: self.log.len() as u32,
        }
    }

    /// Keeps only the log's last `capacity` uses not crossed out (the window's): the model is
    /// the blocks the window used last, whatever it held before.
    fn keep_last(&mut self, capacity: usize) {
        let (mut from, mut kept, mut crossed) = (self.log.len(), 0, 0);
        while kept < capacity {
            from -= 1;
            if self.log[from].1 {
                crossed += 1;
            } else {
                kept += 1;
            }
        }
        self.log.drain(..from);
        self.base += from as u64;
        self.pending = self.log.len();
        self.crossed = crossed;
        self.held = capacity;
    }

    /// A stamp not in the log (as it is now, or later).
    fn dead_stamp(&self) -> u32 {
        (self.base as u32).wrapping_sub(1)
    }

    /// Whether `stamp` is in the log: a use not evicted yet.
    fn logs(&self, stamp: u32) -> bool {
        self.span().holds(stamp)
    }

    fn cross_out(&mut self, stamp: u32) {
        let at = stamp.wrapping_sub(self.base as u32) as usize;
        self.log[at].1 = true;
        self.crossed += 1;
    }
}

/// The stamps a log holds: `len` of them from `base` (low 32 bits, compared wrapping).
#[derive(Clone, Copy, Debug, Default)]
struct Span {
    base: u32,
    len: u32,
}

impl Span {
    fn holds(self, stamp: u32) -> bool {
        stamp.wrapping_sub(self.base) < self.len
    }
}

impl Memory {
    pub fn new(settings: MemorySettings) -> Self {
        Memory {
            settings,
            slot_of: HashMap::new(),
            models: Vec::new(),
            free_slots: Vec::new(),
            settled: Level::default(),
            recent: Level::default(),
            recent_share: RECENT_SHARE,
            departures: 0,
            scratch: Scratch::default(),
        }
    }

    pub fn settings(&self) -> MemorySettings {
        self.settings
    }

    /// Blocks held per replica, for every replica the memory knows (as of the last
    /// [`Memory::settle`]).
    pub fn replica_blocks(&self) -> impl Iterator<Item = (&str, usize)> + '_ {
        self.models
            .iter()
            .flatten()
            .map(|model| (model.id.as_str(), model.held))
    }

    /// Blocks held in all (as of the last [`Memory::settle`]).
    pub fn held_blocks(&self) -> usize {
        self.models.iter().flatten().map(|m| m.held).sum()
    }

    /// Entries of the block index (one per held block and replica, and the ones evicted or
    /// superseded since the last full merge): its size.
    pub fn index_entries(&self) -> usize {
        self.settled.entries.len() + self.recent.entries.len()
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
        // A departure within a window (not from the planner) keeps the others' touches.
        self.merge_pending();
        for &slot in &gone {
            let model = self.models[slot as usize].take().expect("a live slot");
            self.slot_of.remove(&model.id);
        }
        // Gone slots' entries are not held (`spans` gives them an empty span).
        let spans = spans(&self.models);
        let live = |held: &Held| spans[held.slot as usize].holds(held.stamp);
        fold(
            &mut self.settled,
            &mut self.recent,
            live,
            &mut self.scratch.merged,
        );
        self.free_slots.extend(gone);
        self.departures += 1;
    }

    /// How many times replicas were dropped: slots cached by a caller are stale once it grows.
    pub(crate) fn departures(&self) -> u64 {
        self.departures
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
            pending: 0,
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

    /// The slots holding `block` (as of the last [`Memory::settle`]), by slot.
    pub(crate) fn holders(&self, block: BlockHash) -> impl Iterator<Item = u32> + '_ {
        // Both runs are by slot: merged in one pass (a block every replica holds has a run of
        // every slot in each), a slot's recent entry superseding its settled one.
        let mut recent = self.recent.run(block).iter().peekable();
        let mut earlier = self.settled.run(block).iter().peekable();
        std::iter::from_fn(move || loop {
            let held = match (recent.peek(), earlier.peek()) {
                (Some(later), Some(held)) if held.slot < later.slot => earlier.next(),
                (Some(later), Some(held)) if held.slot == later.slot => {
                    earlier.next();
                    recent.next()
                }
                (Some(_), _) => recent.next(),
                (None, _) => earlier.next(),
            }?;
            if self.live(held) {
                return Some(held.slot);
            }
        })
    }

    pub(crate) fn holds(&self, slot: u32, block: BlockHash) -> bool {
        self.last_use(block, slot)
            .is_some_and(|held| self.live(held))
    }

    /// The entry of `slot`'s last use of `block` (held or evicted), if the index has one.
    fn last_use(&self, block: BlockHash, slot: u32) -> Option<&Held> {
        let (level, at) = self.last_use_at(block, slot)?;
        Some(&self.level(level).entries[at])
    }

    /// Where the entry of `slot`'s last use of `block` is: the recent level's entry of a key
    /// supersedes the settled one's.
    fn last_use_at(&self, block: BlockHash, slot: u32) -> Option<(LevelName, usize)> {
        match self.recent.position(block, slot) {
            Some(at) => Some((LevelName::Recent, at)),
            None => (self.settled.position(block, slot)).map(|at| (LevelName::Settled, at)),
        }
    }

    fn level(&self, name: LevelName) -> &Level {
        match name {
            LevelName::Settled => &self.settled,
            LevelName::Recent => &self.recent,
        }
    }

    fn level_mut(&mut self, name: LevelName) -> &mut Level {
        match name {
            LevelName::Settled => &mut self.settled,
            LevelName::Recent => &mut self.recent,
        }
    }

    /// Whether the last use an entry records is still held: its stamp is in its replica's log
    /// (the entries a settle evicts stay in the index until their level's next merge).
    fn live(&self, held: &Held) -> bool {
        self.model(held.slot).logs(held.stamp)
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

    /// Marks `blocks` (one request's) as just used on `slot`. It shows in the model from the
    /// next [`Memory::settle`] on; nothing is evicted before.
    /// Records that replica `id` holds `blocks` (a leading run of one prompt's chain) from
    /// outside the planner: the engine itself said so (its KV events). Seen from the next
    /// [`Memory::settle`], like a placement's touches.
    pub fn touch_replica(&mut self, id: &str, blocks: &[BlockHash]) {
        if !blocks.is_empty() {
            let slot = self.slot(id);
            self.touch(slot, blocks);
        }
    }

    pub(crate) fn touch(&mut self, slot: u32, blocks: &[BlockHash]) {
        let model = self.models[slot as usize].as_mut().expect("a live slot");
        model
            .log
            .extend(blocks.iter().rev().map(|&block| (block, false)));
        model.pending += blocks.len();
    }

    /// Merges the last window's touches into the models (nothing to do if there are none):
    /// until then the counts ([`Memory::replica_blocks`], [`Memory::held_blocks`]) are those of
    /// the window before. [`assign_with_memory`](crate::assign_with_memory) runs it first
    /// unless the caller did after the last window.
    ///
    /// Evicts the least recently used blocks of every replica beyond its capacity (their
    /// entries stay in the index, not held, until the next merge drops them), and drops logs'
    /// crossed-out entries once they outnumber the capacity (so a log stays within twice the
    /// capacity plus one window's touches, and each touch pays for its entry once).
    pub fn settle(&mut self) {
        self.merge_pending();
        let capacity = self.settings.capacity_blocks.get();
        for model in self.models.iter_mut().flatten() {
            while model.held > capacity {
                let (_, crossed) = model.log.pop_front().expect("every held block is logged");
                model.base += 1;
                if crossed {
                    model.crossed -= 1;
                } else {
                    model.held -= 1;
                }
            }
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

    /// Merges the logs' pending touches into the index and drops the entries evicted before:
    /// the last touch of each (block, replica) stays, and the touches it supersedes (an earlier
    /// window's, or an earlier one of this window) are crossed out in the log.
    ///
    /// A window that, with the recent level, stays under `1 / RECENT_SHARE` of the settled
    /// level merges into the recent level alone, looking each touch up in the settled one (a
    /// cache miss or two each, instead of a pass over the whole memory: with 1,024 replicas at
    /// the default capacity, a window of 200 requests took 41 ms to merge into one level).
    /// Otherwise the recent level is folded into the settled one and the window merged into
    /// that, in one pass each.
    fn merge_pending(&mut self) {
        let pending: usize = self
            .models
            .iter()
            .flatten()
            .map(|model| model.pending)
            .sum();
        if pending == 0 {
            return;
        }
        let capacity = self.settings.capacity_blocks.get();
        let bits = index_bits(pending);
        let Memory {
            models,
            settled,
            recent,
            recent_share,
            scratch,
            ..
        } = self;
        let Scratch {
            touches,
            buckets,
            merged,
        } = scratch;
        // The touches by their leading bits: one count and one scatter, straight from the logs.
        buckets.clear();
        buckets.resize((1 << bits) + 1, 0);
        let pending_buckets = models
            .iter()
            .flatten()
            .flat_map(ReplicaModel::pending_touches)
            .map(|&(block, _)| leading_bits(block, bits));
        bucket_starts(pending_buckets, buckets);
        touches.clear();
        touches.resize(pending, Held::default());
        for (slot, model) in models.iter().enumerate() {
            let Some(model) = model else { continue };
            let first = model.log.len() - model.pending;
            for (at, &(block, _)) in model.pending_touches().enumerate() {
                let next = &mut buckets[leading_bits(block, bits)];
                touches[*next as usize] = Held {
                    block,
                    slot: slot as u32,
                    stamp: model.stamp(first + at),
                };
                *next += 1;
            }
        }
        // In order but within buckets (about one touch each): an insertion sort finishes it in
        // about one pass, and keeps a replica's touches of a block in use order, so each
        // lands right after the one it supersedes, which is crossed out and dead to the merge.
        let mut repeats = vec![0; models.len()];
        for at in 1..touches.len() {
            let mut at = at;
            while at > 0 && touches[at].key() < touches[at - 1].key() {
                touches.swap(at, at - 1);
                at -= 1;
            }
            if at > 0 && touches[at].key() == touches[at - 1].key() {
                let earlier = &mut touches[at - 1];
                let model = models[earlier.slot as usize].as_mut().expect("a live slot");
                model.cross_out(earlier.stamp);
                earlier.stamp = model.dead_stamp();
                repeats[earlier.slot as usize] += 1;
            }
        }
        // A replica whose window used `capacity` distinct blocks or more is settled here from
        // its log alone: its earlier entries and the touches it pushed out are dead to the
        // merge, which skips them.
        let ahead: Vec<bool> = models
            .iter_mut()
            .zip(repeats)
            .map(|(model, repeats)| match model {
                Some(model) if model.pending - repeats >= capacity => {
                    model.keep_last(capacity);
                    true
                }
                _ => false,
            })
            .collect();
        let spans = spans(models);
        let live = |held: &Held| spans[held.slot as usize].holds(held.stamp);
        let added = if (recent.entries.len() + pending) * *recent_share <= settled.entries.len() {
            // A touch with no entry in the recent level is new to its replica unless the
            // settled level holds its block there, which it then supersedes.
            let new_to_replica = |models: &mut [Option<ReplicaModel>], touch: &Held| {
                let earlier = settled.position(touch.block, touch.slot);
                match earlier.map(|at| settled.entries[at]).filter(live) {
                    Some(earlier) => {
                        let model = models[touch.slot as usize].as_mut();
                        model.expect("a live slot").cross_out(earlier.stamp);
                        false
                    }
                    None => true,
                }
            };
            merge_touches(recent, touches, models, live, new_to_replica, merged)
        } else {
            if !recent.entries.is_empty() {
                fold(settled, recent, live, merged);
            }
            merge_touches(settled, touches, models, live, |_, _| true, merged)
        };
        for ((model, added), ahead) in models.iter_mut().zip(added).zip(ahead) {
            if let Some(model) = model.as_mut().filter(|_| !ahead) {
                model.held += added;
            }
        }
        for model in models.iter_mut().flatten() {
            model.pending = 0;
        }
    }

    /// Rewrites `slot`'s log without its crossed-out entries, restamping its last uses in the
    /// index (the uses they superseded keep stamps from before the log's new base: dead).
    fn compact_log(&mut self, slot: u32) {
        let model = self.models[slot as usize].as_mut().expect("a live slot");
        debug_assert_eq!(model.pending, 0);
        let old = std::mem::take(&mut model.log);
        model.base += old.len() as u64;
        model.crossed = 0;
        model
            .log
            .extend(old.into_iter().filter(|&(_, crossed)| !crossed));
        for at in 0..model.log.len() {
            let model = self.model(slot);
            let (block, stamp) = (model.log[at].0, model.stamp(at));
            let (level, at) = self
                .last_use_at(block, slot)
                .expect("a held block is indexed");
            self.level_mut(level).entries[at].stamp = stamp;
        }
    }

    fn model(&self, slot: u32) -> &ReplicaModel {
        self.models[slot as usize].as_ref().expect("a live slot")
    }
}

/// A window merges into the recent level alone while that level, with the window's touches,
/// stays within 1 / `RECENT_SHARE` of the settled level (`Memory::merge_pending`). Each small
/// merge copies the recent level (on average 1 / (2 x share) of the memory), and each fold
/// copies the whole memory once per (1 / share of it) touches: share x touches per window, on
/// average. The two balance at share = sqrt(memory / (2 x touches)), about 18 for 4.2 million
/// entries and windows of 6,400 touches (the bench `memory_1024_replicas_200_requests`).
const RECENT_SHARE: usize = 16;

/// Per slot, the stamps its log holds (none for a freed slot).
fn spans(models: &[Option<ReplicaModel>]) -> Vec<Span> {
    models
        .iter()
        .map(|model| model.as_ref().map_or(Span::default(), ReplicaModel::span))
        .collect()
}

/// Merges `recent` into `settled` (a key in both keeps `recent`'s entry, the later use),
/// dropping the entries `live` says are no longer held; `recent` is left empty.
fn fold(
    settled: &mut Level,
    recent: &mut Level,
    live: impl Fn(&Held) -> bool,
    merged: &mut Vec<Held>,
) {
    merged.clear();
    let (earlier, later) = (&settled.entries, &recent.entries);
    let (mut next_earlier, mut next_later) = (0, 0);
    while let (Some(&old), Some(&new)) = (earlier.get(next_earlier), later.get(next_later)) {
        let order = old.key().cmp(&new.key());
        let kept = if order == Ordering::Less { old } else { new };
        if live(&kept) {
            merged.push(kept);
        }
        next_earlier += (order != Ordering::Greater) as usize;
        next_later += (order != Ordering::Less) as usize;
    }
    merged.extend(earlier[next_earlier..].iter().filter(|held| live(held)));
    merged.extend(later[next_later..].iter().filter(|held| live(held)));
    std::mem::swap(&mut settled.entries, merged);
    settled.reindex();
    recent.entries.clear();
    recent.reindex();
}

/// Merges the sorted `touches` into `level`, dropping the entries `live` says are no longer
/// held (touches too: pushed out, or superseded within the window). A touch of a key `level`
/// has supersedes its entry, which is crossed out in the log if still held; a touch of a key
/// it lacks is new to its replica if `new_to_replica` says so. Returns the blocks each slot
/// gained.
fn merge_touches(
    level: &mut Level,
    touches: &[Held],
    models: &mut [Option<ReplicaModel>],
    live: impl Fn(&Held) -> bool,
    mut new_to_replica: impl FnMut(&mut [Option<ReplicaModel>], &Held) -> bool,
    merged: &mut Vec<Held>,
) -> Vec<usize> {
    let held = &level.entries;
    let mut added = vec![0usize; models.len()];
    // Every entry is written before it is read: no need to clear it first.
    merged.resize(held.len() + touches.len(), Held::default());
    // One pass over both, choosing each output entry without a branch where it can: which
    // side comes first and whether an earlier entry is still held are a coin toss each.
    let (mut next_held, mut next_touch, mut out) = (0, 0, 0);
    while let Some(&touch) = touches.get(next_touch) {
        if !live(&touch) {
            next_touch += 1;
            continue;
        }
        let Some(&earlier) = held.get(next_held) else {
            merged[out] = touch;
            out += 1;
            added[touch.slot as usize] += new_to_replica(models, &touch) as usize;
            next_touch += 1;
            continue;
        };
        if earlier.key() == touch.key() {
            if live(&earlier) {
                let model = models[touch.slot as usize].as_mut();
                model.expect("a live slot").cross_out(earlier.stamp);
            } else {
                added[touch.slot as usize] += 1;
            }
            merged[out] = touch;
            out += 1;
            next_held += 1;
            next_touch += 1;
            continue;
        }
        let (held_first, still_held) = (earlier.key() < touch.key(), live(&earlier));
        merged[out] = if held_first { earlier } else { touch };
        out += (held_first & still_held | !held_first) as usize;
        added[touch.slot as usize] += (!held_first && new_to_replica(models, &touch)) as usize;
        next_held += held_first as usize;
        next_touch += !held_first as usize;
    }
    for &earlier in &held[next_held..] {
        merged[out] = earlier;
        out += live(&earlier) as usize;
    }
    merged.truncate(out);
    std::mem::swap(&mut level.entries, merged);
    level.reindex();
    added
}

/// Buckets for `entries` sorted entries: about one each, at most 2^24.
fn index_bits(entries: usize) -> u32 {
    entries.max(1).ilog2().min(24)
}

/// The leading `bits` of a block hash.
fn leading_bits(block: BlockHash, bits: u32) -> usize {
    block.checked_shr(64 - bits).unwrap_or(0) as usize
}

/// Where each bucket starts once entries in these `buckets` are ordered by bucket:
/// `starts[b]`, with `starts` one longer than the buckets and zeroed.
fn bucket_starts(buckets: impl Iterator<Item = usize>, starts: &mut [u32]) {
    for bucket in buckets {
        starts[bucket + 1] += 1;
    }
    for at in 1..starts.len() {
        starts[at] += starts[at - 1];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hashlink::LruCache;
    use proptest::prelude::*;

    /// The entries of the index still held: each key's last use (its entry in the recent
    /// level, else in the settled one) if it is live, by key.
    fn live_entries(memory: &Memory) -> Vec<Held> {
        let superseded = |held: &&Held| memory.recent.position(held.block, held.slot).is_some();
        let settled = memory
            .settled
            .entries
            .iter()
            .filter(|held| !superseded(held));
        let mut entries: Vec<Held> = memory
            .recent
            .entries
            .iter()
            .chain(settled)
            .filter(|held| memory.live(held))
            .copied()
            .collect();
        entries.sort_unstable_by_key(Held::key);
        entries
    }

    /// Counts, logs, both levels of the index and its lookups agree with each other.
    fn assert_consistent(memory: &Memory, touches_since_full_merge: usize) {
        for level in [&memory.settled, &memory.recent] {
            assert!(level
                .entries
                .windows(2)
                .all(|pair| pair[0].key() < pair[1].key()));
        }
        let live = live_entries(memory);
        for held in &live {
            let model = memory.model(held.slot);
            let at = held.stamp.wrapping_sub(model.base as u32) as usize;
            assert_eq!(model.log[at], (held.block, false));
            assert!(memory.holds(held.slot, held.block));
            let mut holders: Vec<u32> = memory.holders(held.block).collect();
            holders.sort_unstable();
            let expected: Vec<u32> = live
                .iter()
                .filter(|other| other.block == held.block)
                .map(|other| other.slot)
                .collect();
            assert_eq!(holders, expected);
        }
        for (slot, model) in memory.models.iter().enumerate() {
            let Some(model) = model else { continue };
            let held = live.iter().filter(|h| h.slot == slot as u32).count();
            assert_eq!(model.held, held);
            let logged = model.log.iter().filter(|(_, crossed)| !crossed).count();
            assert_eq!(logged, model.held);
            assert_eq!(model.log.len() - logged, model.crossed);
        }
        // Besides the held ones, at most an entry per touch since the last full merge (evicted
        // or superseded), counting the touches of the window merged then (which its settle
        // may have pushed out).
        assert!(memory.index_entries() <= memory.held_blocks() + touches_since_full_merge);
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
        /// Random windows of touches on up to 20 replicas (some blocks held by many), as small
        /// numbers or as hashes spread over the index, departures among them: after each window
        /// the model holds exactly what per-touch LRUs hold, and its counts, logs and index
        /// stay consistent. Drawn from few distinct blocks too, so that replicas use their
        /// blocks again and again and their logs are compacted; windows merge into the recent
        /// level, or fold it into the settled one, as `recent_share` has them.
        #[test]
        fn settling_once_per_window_holds_what_an_lru_holds(
            windows in prop::collection::vec(
                prop::collection::vec((0u8..21, prop::collection::vec(0u64..40, 1..8)), 0..30),
                1..12,
            ),
            capacity in 1usize..12,
            distinct in 1u64..40,
            spread in any::<bool>(),
            recent_share in 0usize..20,
        ) {
            let mut memory = Memory::new(MemorySettings {
                capacity_blocks: NonZeroUsize::new(capacity).unwrap(),
                load_half_life_ms: 0,
            });
            // 0: every window merges into the recent level (folded only on departures).
            memory.recent_share = recent_share;
            let mut oracle = Oracle::default();
            let hash = |block: u64| {
                let block = block % distinct;
                if spread { block.wrapping_mul(0x9e37_79b9_7f4a_7c15) } else { block }
            };
            let mut touches_since_full_merge = 0;
            for window in windows {
                let mut touches = 0;
                for (replica, blocks) in window {
                    let blocks: Vec<BlockHash> = blocks.into_iter().map(hash).collect();
                    if replica == 20 {
                        // A departure of whichever replica the first block names.
                        let gone = format!("r{}", blocks[0] % 20);
                        memory.retain_replicas(|id| id != gone);
                        oracle.0.remove(&gone);
                        continue;
                    }
                    let id = format!("r{replica}");
                    let slot = memory.slot(&id);
                    memory.touch(slot, &blocks);
                    touches += blocks.len();
                    oracle.touch(&id, &blocks, capacity);
                }
                memory.settle();
                touches_since_full_merge += touches;
                if touches > 0 && memory.recent.entries.is_empty() {
                    touches_since_full_merge = touches;
                }
                assert_consistent(&memory, touches_since_full_merge);
                for (id, &slot) in &memory.slot_of {
                    let mut expected: Vec<BlockHash> = oracle
                        .0
                        .get(id)
                        .map(|cache| cache.iter().map(|(&block, _)| block).collect())
                        .unwrap_or_default();
                    expected.sort_unstable();
                    let held: Vec<BlockHash> = live_entries(&memory)
                        .into_iter()
                        .filter(|held| held.slot == slot)
                        .map(|held| held.block)
                        .collect();
                    prop_assert_eq!(held, expected);
                    let model = memory.model(slot);
                    prop_assert!(model.log.len() <= 2 * capacity);
                }
            }
        }
    }
}
