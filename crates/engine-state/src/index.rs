//! The engine block index: per replica, the blocks its engine holds, from its KV events.
//!
//! Pure: no I/O, no clock. Blocks are keyed by our own chain key over token ids at the engine's
//! block size ([`chain_keys`]): a `BlockStored`'s first block is keyed from its parent's key (or
//! the root seed), each next block from the one before. The engine's hashes are kept per replica
//! only to map a `BlockRemoved` (which carries nothing but hashes) and a child's parent back to our
//! key, so the index works whatever hash algorithm the engine runs.
//!
//! What is not indexed (counted in [`ApplyReport`]): blocks whose hash depends on more than the
//! token ids (a LoRA adapter, multimodal inputs or a cache salt: `lora_name` or non-null
//! `extra_keys`), blocks of a KV-cache group other than the first (`group_idx` > 0, hybrid
//! models), a `BlockStored` whose token ids are not `block_size` per hash, and one whose parent
//! this replica's index does not hold (a missed event, or a parent the index evicted).
//!
//! Bounded: each replica holds at most [`IndexConfig::capacity_per_replica`] engine blocks (one
//! per (hash, medium)); a store past it evicts the replica's oldest *stored* block first (FIFO by
//! store, as the engine's own LRU order is not in its events). Set the capacity at or above the
//! engine's KV block count and the index never evicts: the engine's `BlockRemoved`s do.
//!
//! Lookup ([`EngineIndex::held`]): a request's chain keys at each block size in use, then for
//! every replica holding the first block, how many leading blocks in a row it holds. The work is
//! the blocks walked times the replicas still in the run, found from a map of root keys to
//! holders and each replica's own key set.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hasher};

use crate::decode::{Batch, BlockHash, BlockRemoved, BlockStored, Event};

/// Maps keyed by hashes (ours and the engine's, already uniform): a multiply-and-rotate hasher
/// with a per-process random seed instead of SipHash, which the lookup's cost is mostly made of.
#[derive(Clone, Copy)]
struct HashKeyed {
    seed: u64,
}

impl Default for HashKeyed {
    fn default() -> Self {
        static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        let seed =
            *SEED.get_or_init(|| std::collections::hash_map::RandomState::new().hash_one(0u64));
        HashKeyed { seed }
    }
}

impl BuildHasher for HashKeyed {
    type Hasher = HashKeyedHasher;
    fn build_hasher(&self) -> HashKeyedHasher {
        HashKeyedHasher(self.seed)
    }
}

struct HashKeyedHasher(u64);

impl Hasher for HashKeyedHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u8(&mut self, v: u8) {
        self.write_u64(u64::from(v));
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(29);
    }
    fn finish(&self) -> u64 {
        let x = self.0 ^ (self.0 >> 32);
        x.wrapping_mul(0xd6e8_feb8_6659_fd93) ^ (x >> 29)
    }
}

type KeyMap<K, V> = HashMap<K, V, HashKeyed>;

/// Our key for a block: a chain hash over the token ids of it and of every block before it.
pub type BlockKey = u64;

/// The seed of a prompt's first block's key.
const ROOT_SEED: u64 = 0x6275_7273_742d_7078; // "burst-px"

/// Media names beyond this many distinct ones share one id (`"other"`).
const MAX_MEDIA: usize = 8;

/// The key of one block from its parent's key and its token ids.
pub fn block_key(parent: Option<BlockKey>, block_tokens: &[u32]) -> BlockKey {
    let mut bytes = Vec::with_capacity(block_tokens.len() * 4);
    for t in block_tokens {
        bytes.extend_from_slice(&t.to_le_bytes());
    }
    xxhash_rust::xxh3::xxh3_64_with_seed(&bytes, parent.unwrap_or(ROOT_SEED))
}

/// The keys of a prompt's full blocks of `block_size` tokens, in order (none when 0).
pub fn chain_keys(token_ids: &[u32], block_size: usize) -> Vec<BlockKey> {
    if block_size == 0 {
        return Vec::new();
    }
    let mut parent = None;
    token_ids
        .chunks_exact(block_size)
        .map(|block| {
            let key = block_key(parent, block);
            parent = Some(key);
            key
        })
        .collect()
}

/// The index's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexConfig {
    /// Engine blocks kept per replica (one per hash and medium); the oldest stored goes first.
    pub capacity_per_replica: usize,
}

impl Default for IndexConfig {
    /// 262,144 blocks per replica (4 M tokens at 16 a block; about 40 MB of index at the ~150
    /// bytes a block the `index_memory` example measures).
    fn default() -> Self {
        IndexConfig {
            capacity_per_replica: 1 << 18,
        }
    }
}

/// What applying a batch did (counts of blocks unless said otherwise), for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApplyReport {
    /// Blocks newly held (or stored again).
    pub stored: u64,
    /// Blocks dropped by `BlockRemoved`.
    pub removed: u64,
    /// `BlockRemoved` hashes this replica's index did not hold.
    pub removed_unknown: u64,
    /// `AllBlocksCleared` events.
    pub cleared: u64,
    /// Blocks of a `BlockStored` whose parent the index does not hold (skipped).
    pub unknown_parent: u64,
    /// Blocks not indexed because their hash depends on more than token ids (LoRA, extra keys).
    pub skipped_extra_keys: u64,
    /// Blocks not indexed because they belong to a KV-cache group other than the first.
    pub skipped_other_group: u64,
    /// Blocks of a `BlockStored` whose token ids are not `block_size` per hash (skipped).
    pub malformed: u64,
    /// Blocks the index evicted to stay within its capacity.
    pub evicted_at_capacity: u64,
    /// Events of a type the decoder does not know (ignored).
    pub unknown_events: u64,
}

impl ApplyReport {
    fn add(&mut self, o: &ApplyReport) {
        self.stored += o.stored;
        self.removed += o.removed;
        self.removed_unknown += o.removed_unknown;
        self.cleared += o.cleared;
        self.unknown_parent += o.unknown_parent;
        self.skipped_extra_keys += o.skipped_extra_keys;
        self.skipped_other_group += o.skipped_other_group;
        self.malformed += o.malformed;
        self.evicted_at_capacity += o.evicted_at_capacity;
        self.unknown_events += o.unknown_events;
    }
}

/// One replica's leading run of engine blocks for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held<'a> {
    /// The replica (endpoint) id.
    pub replica: &'a str,
    /// How many of the request's leading blocks the replica's engine holds.
    pub blocks: usize,
    /// The engine's block size.
    pub block_size: usize,
}

impl Held<'_> {
    /// The held run in tokens.
    pub fn tokens(&self) -> usize {
        self.blocks * self.block_size
    }
}

type Slot = u32;
/// A block's identity on one replica: the engine's 64-bit hash, the medium's id, and the
/// data-parallel rank that holds it (ranks past 255 share 255).
type EngineBlock = (u64, u8, u8);

#[derive(Debug, Clone, Copy)]
struct Entry {
    key: BlockKey,
    stamp: u64,
    root: bool,
}

#[derive(Debug)]
struct Replica {
    id: String,
    block_size: Option<usize>,
    entries: KeyMap<EngineBlock, Entry>,
    /// Store order, oldest first, for eviction at capacity.
    order: BTreeMap<u64, EngineBlock>,
    /// Our keys held, with how many engine blocks (media) hold each.
    keys: KeyMap<BlockKey, u32>,
    next_stamp: u64,
}

impl Replica {
    fn new(id: String) -> Self {
        Replica {
            id,
            block_size: None,
            entries: KeyMap::default(),
            order: BTreeMap::new(),
            keys: KeyMap::default(),
            next_stamp: 0,
        }
    }
}

/// Per replica, the engine blocks it holds; see the module docs.
#[derive(Debug, Default)]
pub struct EngineIndex {
    config: IndexConfig,
    slots: Vec<Option<Replica>>,
    free: Vec<Slot>,
    by_id: HashMap<String, Slot>,
    /// First blocks (keyed from the root seed) → the replicas holding them, sorted.
    roots: KeyMap<BlockKey, Vec<Slot>>,
    /// Replicas per block size in use.
    block_sizes: BTreeMap<usize, usize>,
    media: Vec<String>,
}

impl EngineIndex {
    /// An empty index with these bounds (a capacity of 0 is taken as 1).
    pub fn new(config: IndexConfig) -> Self {
        EngineIndex {
            config: IndexConfig {
                capacity_per_replica: config.capacity_per_replica.max(1),
            },
            ..EngineIndex::default()
        }
    }

    /// Applies one decoded batch from `replica`'s engine, in order; the replica is added when new.
    /// With data parallelism, each rank's blocks are kept apart (the rank is in the batch) and
    /// the replica holds a block while any rank does.
    pub fn apply(&mut self, replica: &str, batch: &Batch) -> ApplyReport {
        let slot = self.slot_for(replica);
        let rank = batch
            .data_parallel_rank
            .map_or(0, |r| r.clamp(0, 255) as u8);
        let mut report = ApplyReport::default();
        for event in &batch.events {
            let r = match event {
                Event::BlockStored(s) => self.store(slot, rank, s),
                Event::BlockRemoved(r) => self.remove(slot, rank, r),
                Event::AllBlocksCleared => {
                    self.clear_slot(slot);
                    ApplyReport {
                        cleared: 1,
                        ..ApplyReport::default()
                    }
                }
                Event::Unknown(_) => ApplyReport {
                    unknown_events: 1,
                    ..ApplyReport::default()
                },
            };
            report.add(&r);
        }
        report
    }

    /// Drops everything `replica` holds (`AllBlocksCleared`, a reset, a restarted engine, a weight
    /// update); the replica stays known. Returns how many engine blocks were dropped.
    pub fn clear(&mut self, replica: &str) -> usize {
        match self.by_id.get(replica) {
            Some(&slot) => self.clear_slot(slot),
            None => 0,
        }
    }

    /// Drops what every replica holds (a weight update fleet-wide). Returns the blocks dropped.
    pub fn clear_all(&mut self) -> usize {
        let slots: Vec<Slot> = self.by_id.values().copied().collect();
        slots.into_iter().map(|s| self.clear_slot(s)).sum()
    }

    /// Forgets `replica` entirely (it left the fleet).
    pub fn remove_replica(&mut self, replica: &str) {
        if let Some(slot) = self.by_id.remove(replica) {
            self.clear_slot(slot);
            if let Some(r) = self.slots[slot as usize].take() {
                if let Some(bs) = r.block_size {
                    self.forget_block_size(bs);
                }
            }
            self.free.push(slot);
        }
    }

    /// The replicas known to the index.
    pub fn replicas(&self) -> impl Iterator<Item = &str> {
        self.slots.iter().flatten().map(|r| r.id.as_str())
    }

    /// How many engine blocks `replica` holds (0 when unknown).
    pub fn blocks_held(&self, replica: &str) -> usize {
        self.replica(replica).map_or(0, |r| r.entries.len())
    }

    /// `replica`'s engine block size, once a `BlockStored` has told it.
    pub fn block_size(&self, replica: &str) -> Option<usize> {
        self.replica(replica).and_then(|r| r.block_size)
    }

    /// For a request's token ids, every replica holding at least its first block, with how many
    /// leading blocks in a row it holds (in no particular order).
    pub fn held(&self, token_ids: &[u32]) -> Vec<Held<'_>> {
        let mut out = Vec::new();
        for &bs in self.block_sizes.keys() {
            let keys = chain_keys(token_ids, bs);
            self.held_keys_into(bs, &keys, &mut out);
        }
        out
    }

    /// As [`EngineIndex::held`] with the request's chain keys at `block_size` already computed
    /// (only replicas of that block size are answered).
    pub fn held_keys(&self, block_size: usize, keys: &[BlockKey]) -> Vec<Held<'_>> {
        let mut out = Vec::new();
        self.held_keys_into(block_size, keys, &mut out);
        out
    }

    /// The block sizes of the replicas known to the index.
    pub fn block_sizes(&self) -> impl Iterator<Item = usize> + '_ {
        self.block_sizes.keys().copied()
    }

    fn held_keys_into<'a>(&'a self, bs: usize, keys: &[BlockKey], out: &mut Vec<Held<'a>>) {
        let Some(first) = keys.first() else {
            return;
        };
        let Some(holders) = self.roots.get(first) else {
            return;
        };
        let mut alive: Vec<&Replica> = holders
            .iter()
            .filter_map(|&s| self.slots[s as usize].as_ref())
            .filter(|r| r.block_size == Some(bs))
            .collect();
        for (i, key) in keys.iter().enumerate().skip(1) {
            if alive.is_empty() {
                return;
            }
            alive.retain(|r| {
                let holds = r.keys.contains_key(key);
                if !holds {
                    out.push(Held {
                        replica: &r.id,
                        blocks: i,
                        block_size: bs,
                    });
                }
                holds
            });
        }
        out.extend(alive.into_iter().map(|r| Held {
            replica: &r.id,
            blocks: keys.len(),
            block_size: bs,
        }));
    }

    fn replica(&self, id: &str) -> Option<&Replica> {
        self.by_id
            .get(id)
            .and_then(|&s| self.slots[s as usize].as_ref())
    }

    fn slot_for(&mut self, id: &str) -> Slot {
        if let Some(&s) = self.by_id.get(id) {
            return s;
        }
        let replica = Replica::new(id.to_owned());
        let slot = match self.free.pop() {
            Some(s) => {
                self.slots[s as usize] = Some(replica);
                s
            }
            None => {
                self.slots.push(Some(replica));
                Slot::try_from(self.slots.len() - 1).expect("fewer than 2^32 replicas")
            }
        };
        self.by_id.insert(id.to_owned(), slot);
        slot
    }

    fn medium_id(&mut self, medium: Option<&str>) -> u8 {
        // Absent and "GPU" are the same medium (vLLM's default).
        let name = match medium {
            None | Some("GPU") => return 0,
            Some(m) => m,
        };
        if let Some(i) = self.media.iter().position(|m| m == name) {
            return (i + 1) as u8;
        }
        if self.media.len() < MAX_MEDIA {
            self.media.push(name.to_owned());
            return self.media.len() as u8;
        }
        (MAX_MEDIA + 1) as u8
    }

    fn forget_block_size(&mut self, bs: usize) {
        if let Some(n) = self.block_sizes.get_mut(&bs) {
            *n -= 1;
            if *n == 0 {
                self.block_sizes.remove(&bs);
            }
        }
    }

    fn store(&mut self, slot: Slot, rank: u8, ev: &BlockStored) -> ApplyReport {
        let n = ev.block_hashes.len() as u64;
        let mut report = ApplyReport::default();
        if ev.lora_name.is_some() || ev.has_extra_keys {
            report.skipped_extra_keys = n;
            return report;
        }
        if ev.group_idx.unwrap_or(0) != 0 {
            report.skipped_other_group = n;
            return report;
        }
        let bs = ev.block_size as usize;
        if ev.token_ids.len() != ev.block_hashes.len() * bs {
            report.malformed = n;
            return report;
        }
        let medium = self.medium_id(ev.medium.as_deref());
        let cap = self.config.capacity_per_replica;
        let old_bs = self.slot_ref(slot).block_size;
        if old_bs != Some(bs) {
            if let Some(old) = old_bs {
                // The engine changed its block size (restarted with new flags): what it held was
                // keyed at the old size.
                self.clear_slot(slot);
                self.forget_block_size(old);
            }
            self.slots[slot as usize]
                .as_mut()
                .expect("live slot")
                .block_size = Some(bs);
            *self.block_sizes.entry(bs).or_insert(0) += 1;
        }
        let mut parent = match &ev.parent_block_hash {
            None => None,
            Some(h) => match self.key_of(slot, h.as_u64(), rank) {
                Some(key) => Some(key),
                None => {
                    report.unknown_parent = n;
                    return report;
                }
            },
        };
        for (hash, block) in ev.block_hashes.iter().zip(ev.token_ids.chunks_exact(bs)) {
            let key = block_key(parent, block);
            let root = parent.is_none();
            parent = Some(key);
            let evicted = self.insert(slot, (hash.as_u64(), medium, rank), key, root, cap);
            report.evicted_at_capacity += evicted;
            report.stored += 1;
        }
        report
    }

    /// Holds one block; returns how many blocks were evicted to make room.
    fn insert(
        &mut self,
        slot: Slot,
        eb: EngineBlock,
        key: BlockKey,
        root: bool,
        cap: usize,
    ) -> u64 {
        // Stored again (a re-store after a missed remove, or a replayed batch): drop the old
        // entry first so that counts and order stay exact.
        if self.slot_ref(slot).entries.contains_key(&eb) {
            self.drop_block(slot, eb);
        }
        let mut evicted = 0;
        while self.slot_ref(slot).entries.len() >= cap {
            let oldest = self
                .slot_ref(slot)
                .order
                .first_key_value()
                .map(|(_, &eb)| eb);
            match oldest {
                Some(old) => {
                    self.drop_block(slot, old);
                    evicted += 1;
                }
                None => break,
            }
        }
        let replica = self.slots[slot as usize].as_mut().expect("live slot");
        let stamp = replica.next_stamp;
        replica.next_stamp += 1;
        replica.entries.insert(eb, Entry { key, stamp, root });
        replica.order.insert(stamp, eb);
        let count = replica.keys.entry(key).or_insert(0);
        *count += 1;
        if *count == 1 && root {
            let holders = self.roots.entry(key).or_default();
            if let Err(i) = holders.binary_search(&slot) {
                holders.insert(i, slot);
            }
        }
        evicted
    }

    /// Our key for an engine hash this replica's `rank` holds, in whichever medium (the key is
    /// the same in each).
    fn key_of(&self, slot: Slot, hash: u64, rank: u8) -> Option<BlockKey> {
        let replica = self.slot_ref(slot);
        (0..=(MAX_MEDIA + 1) as u8)
            .find_map(|m| replica.entries.get(&(hash, m, rank)).map(|e| e.key))
    }

    fn slot_ref(&self, slot: Slot) -> &Replica {
        self.slots[slot as usize].as_ref().expect("live slot")
    }

    /// Drops one held block; false when the replica did not hold it.
    fn drop_block(&mut self, slot: Slot, eb: EngineBlock) -> bool {
        let replica = self.slots[slot as usize].as_mut().expect("live slot");
        let Some(entry) = replica.entries.remove(&eb) else {
            return false;
        };
        replica.order.remove(&entry.stamp);
        let gone = match replica.keys.get_mut(&entry.key) {
            Some(c) if *c > 1 => {
                *c -= 1;
                false
            }
            _ => {
                replica.keys.remove(&entry.key);
                true
            }
        };
        if gone && entry.root {
            if let Some(holders) = self.roots.get_mut(&entry.key) {
                if let Ok(i) = holders.binary_search(&slot) {
                    holders.remove(i);
                }
                if holders.is_empty() {
                    self.roots.remove(&entry.key);
                }
            }
        }
        true
    }

    fn remove(&mut self, slot: Slot, rank: u8, ev: &BlockRemoved) -> ApplyReport {
        let mut report = ApplyReport::default();
        if ev.group_idx.unwrap_or(0) != 0 {
            report.skipped_other_group = ev.block_hashes.len() as u64;
            return report;
        }
        let medium = self.medium_id(ev.medium.as_deref());
        for h in &ev.block_hashes {
            if self.drop_block(slot, (h.as_u64(), medium, rank)) {
                report.removed += 1;
            } else {
                report.removed_unknown += 1;
            }
        }
        report
    }

    fn clear_slot(&mut self, slot: Slot) -> usize {
        let replica = self.slots[slot as usize].as_mut().expect("live slot");
        let n = replica.entries.len();
        let roots: Vec<BlockKey> = replica
            .entries
            .values()
            .filter(|e| e.root)
            .map(|e| e.key)
            .collect();
        replica.entries = KeyMap::default();
        replica.order = BTreeMap::new();
        replica.keys = KeyMap::default();
        for key in roots {
            if let Some(holders) = self.roots.get_mut(&key) {
                if let Ok(i) = holders.binary_search(&slot) {
                    holders.remove(i);
                }
                if holders.is_empty() {
                    self.roots.remove(&key);
                }
            }
        }
        n
    }
}

/// Convenience for tests and callers holding raw hashes: a `BlockHash` from an integer.
impl From<u64> for BlockHash {
    fn from(v: u64) -> Self {
        BlockHash::Int(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{BlockRemoved, BlockStored};
    use proptest::prelude::*;
    use std::collections::{HashMap, HashSet};

    /// The engine's hash of a block in these tests: any deterministic function of the whole
    /// prefix will do (the index never recomputes it).
    fn engine_hash(prefix: &[u32]) -> u64 {
        let bytes: Vec<u8> = prefix.iter().flat_map(|t| t.to_le_bytes()).collect();
        xxhash_rust::xxh3::xxh3_64(&bytes)
    }

    /// A `BlockStored` for blocks `from..` of `tokens` (full blocks only), as an engine sends it.
    fn stored(tokens: &[u32], bs: usize, from: usize) -> Event {
        let full = tokens.len() / bs;
        let hashes = (from..full)
            .map(|i| BlockHash::Int(engine_hash(&tokens[..(i + 1) * bs])))
            .collect();
        Event::BlockStored(BlockStored {
            block_hashes: hashes,
            parent_block_hash: (from > 0)
                .then(|| BlockHash::Int(engine_hash(&tokens[..from * bs]))),
            token_ids: tokens[from * bs..full * bs].to_vec(),
            block_size: bs as u32,
            lora_name: None,
            medium: None,
            has_extra_keys: false,
            group_idx: None,
        })
    }

    fn removed(prefixes: &[&[u32]], medium: Option<&str>) -> Event {
        Event::BlockRemoved(BlockRemoved {
            block_hashes: prefixes
                .iter()
                .map(|p| BlockHash::Int(engine_hash(p)))
                .collect(),
            medium: medium.map(str::to_owned),
            group_idx: None,
        })
    }

    fn batch(events: Vec<Event>) -> Batch {
        Batch {
            events,
            ..Batch::default()
        }
    }

    fn runs(index: &EngineIndex, tokens: &[u32]) -> HashMap<String, usize> {
        index
            .held(tokens)
            .into_iter()
            .map(|h| (h.replica.to_owned(), h.blocks))
            .collect()
    }

    fn prompt(seed: u32, len: usize) -> Vec<u32> {
        (0..len as u32).map(|i| seed * 1000 + i).collect()
    }

    #[test]
    fn a_stored_prompt_is_held_in_full_and_its_prefixes_in_part() {
        let mut index = EngineIndex::new(IndexConfig::default());
        let p = prompt(1, 10); // 2 full blocks of 4, 2 tokens left over
        let report = index.apply("a", &batch(vec![stored(&p, 4, 0)]));
        assert_eq!(report.stored, 2);
        assert_eq!(runs(&index, &p), HashMap::from([("a".to_owned(), 2)]));
        assert_eq!(runs(&index, &p[..6]), HashMap::from([("a".to_owned(), 1)]));
        let mut other = p.clone();
        other[5] = 999_999; // differs in the second block
        assert_eq!(runs(&index, &other), HashMap::from([("a".to_owned(), 1)]));
        other[0] = 999_999;
        assert!(index.held(&other).is_empty());
        assert_eq!(index.held(&p)[0].tokens(), 8);
    }

    #[test]
    fn a_child_stored_later_extends_the_run_from_its_parent() {
        let mut index = EngineIndex::new(IndexConfig::default());
        let p = prompt(2, 16);
        index.apply("a", &batch(vec![stored(&p[..8], 4, 0)]));
        index.apply("a", &batch(vec![stored(&p, 4, 2)]));
        assert_eq!(runs(&index, &p), HashMap::from([("a".to_owned(), 4)]));
        assert_eq!(index.blocks_held("a"), 4);
    }

    #[test]
    fn a_store_whose_parent_is_unknown_is_counted_and_skipped() {
        let mut index = EngineIndex::new(IndexConfig::default());
        let p = prompt(3, 16);
        let report = index.apply("a", &batch(vec![stored(&p, 4, 2)]));
        assert_eq!(report.unknown_parent, 2);
        assert_eq!(report.stored, 0);
        assert!(index.held(&p).is_empty());
        assert_eq!(index.blocks_held("a"), 0);
    }

    #[test]
    fn a_removed_block_ends_the_run_before_it() {
        let mut index = EngineIndex::new(IndexConfig::default());
        let p = prompt(4, 16);
        index.apply("a", &batch(vec![stored(&p, 4, 0)]));
        let report = index.apply("a", &batch(vec![removed(&[&p[..12], &prompt(9, 4)], None)]));
        assert_eq!((report.removed, report.removed_unknown), (1, 1));
        assert_eq!(runs(&index, &p), HashMap::from([("a".to_owned(), 2)]));
        index.apply("a", &batch(vec![removed(&[&p[..4]], None)]));
        assert!(
            index.held(&p).is_empty(),
            "the first block gone, nothing leads"
        );
    }

    #[test]
    fn all_blocks_cleared_and_clear_drop_only_that_replica() {
        let mut index = EngineIndex::new(IndexConfig::default());
        let p = prompt(5, 8);
        index.apply("a", &batch(vec![stored(&p, 4, 0)]));
        index.apply("b", &batch(vec![stored(&p, 4, 0)]));
        let report = index.apply("a", &batch(vec![Event::AllBlocksCleared]));
        assert_eq!(report.cleared, 1);
        assert_eq!(runs(&index, &p), HashMap::from([("b".to_owned(), 2)]));
        assert_eq!(index.clear("b"), 2);
        index.apply("b", &batch(vec![stored(&p, 4, 0)]));
        assert_eq!(index.clear_all(), 2);
        assert!(index.held(&p).is_empty());
        assert_eq!(index.replicas().count(), 2, "cleared replicas stay known");
        index.remove_replica("a");
        assert_eq!(index.replicas().collect::<Vec<_>>(), vec!["b"]);
        assert_eq!(index.block_sizes().collect::<Vec<_>>(), vec![4]);
        index.remove_replica("b");
        assert_eq!(index.block_sizes().count(), 0);
    }

    #[test]
    fn each_replica_gets_its_own_run_and_replicas_without_the_first_block_are_absent() {
        let mut index = EngineIndex::new(IndexConfig::default());
        let p = prompt(6, 16);
        index.apply("full", &batch(vec![stored(&p, 4, 0)]));
        index.apply("half", &batch(vec![stored(&p[..8], 4, 0)]));
        index.apply("other", &batch(vec![stored(&prompt(7, 16), 4, 0)]));
        assert_eq!(
            runs(&index, &p),
            HashMap::from([("full".to_owned(), 4), ("half".to_owned(), 2)])
        );
    }

    #[test]
    fn replicas_of_another_block_size_are_matched_at_their_own_size() {
        let mut index = EngineIndex::new(IndexConfig::default());
        let p = prompt(8, 16);
        index.apply("four", &batch(vec![stored(&p, 4, 0)]));
        index.apply("eight", &batch(vec![stored(&p, 8, 0)]));
        let held = index.held(&p);
        let got: HashSet<_> = held
            .iter()
            .map(|h| (h.replica, h.blocks, h.tokens()))
            .collect();
        assert_eq!(got, HashSet::from([("four", 4, 16), ("eight", 2, 16)]));
        assert_eq!(index.held_keys(8, &chain_keys(&p, 8)).len(), 1);
    }

    #[test]
    fn at_capacity_the_oldest_stored_block_is_evicted_first() {
        let mut index = EngineIndex::new(IndexConfig {
            capacity_per_replica: 3,
        });
        let old = prompt(10, 8);
        let new = prompt(11, 8);
        index.apply("a", &batch(vec![stored(&old, 4, 0)]));
        let report = index.apply("a", &batch(vec![stored(&new, 4, 0)]));
        assert_eq!(report.evicted_at_capacity, 1);
        assert_eq!(index.blocks_held("a"), 3);
        // The old prompt's first block went first: nothing of it leads any more.
        assert!(index.held(&old).is_empty());
        assert_eq!(runs(&index, &new), HashMap::from([("a".to_owned(), 2)]));
    }

    #[test]
    fn blocks_whose_hash_needs_more_than_tokens_or_another_group_are_not_indexed() {
        let mut index = EngineIndex::new(IndexConfig::default());
        let p = prompt(12, 8);
        type Change = Box<dyn Fn(&mut BlockStored)>;
        let variants: Vec<Change> = vec![
            Box::new(|s| s.lora_name = Some("adapter".into())),
            Box::new(|s| s.has_extra_keys = true),
            Box::new(|s| s.group_idx = Some(1)),
            Box::new(|s| s.token_ids.pop().map(drop).unwrap_or(())),
        ];
        let mut total = ApplyReport::default();
        for change in &variants {
            let Event::BlockStored(mut s) = stored(&p, 4, 0) else {
                unreachable!()
            };
            change(&mut s);
            total.add(&index.apply("a", &batch(vec![Event::BlockStored(s)])));
        }
        assert_eq!(
            (
                total.skipped_extra_keys,
                total.skipped_other_group,
                total.malformed
            ),
            (4, 2, 2)
        );
        assert_eq!(total.stored, 0);
        assert!(index.held(&p).is_empty());
    }

    #[test]
    fn a_block_evicted_from_one_medium_stays_held_while_another_medium_has_it() {
        let mut index = EngineIndex::new(IndexConfig::default());
        let p = prompt(13, 8);
        index.apply("a", &batch(vec![stored(&p, 4, 0)]));
        let Event::BlockStored(mut cpu) = stored(&p, 4, 0) else {
            unreachable!()
        };
        cpu.medium = Some("CPU".into());
        index.apply("a", &batch(vec![Event::BlockStored(cpu)]));
        index.apply("a", &batch(vec![removed(&[&p[..4], &p[..8]], Some("GPU"))]));
        assert_eq!(runs(&index, &p), HashMap::from([("a".to_owned(), 2)]));
        index.apply("a", &batch(vec![removed(&[&p[..4]], Some("CPU"))]));
        assert!(index.held(&p).is_empty());
    }

    #[test]
    fn data_parallel_ranks_hold_their_blocks_apart_and_the_replica_holds_what_any_rank_does() {
        let mut index = EngineIndex::new(IndexConfig::default());
        let p = prompt(14, 8);
        let on_rank = |rank, events| Batch {
            data_parallel_rank: Some(rank),
            ..batch(events)
        };
        index.apply("a", &on_rank(0, vec![stored(&p, 4, 0)]));
        index.apply("a", &on_rank(1, vec![stored(&p, 4, 0)]));
        assert_eq!(index.blocks_held("a"), 4);
        // Rank 0 evicts the second block; rank 1 still has it.
        index.apply("a", &on_rank(0, vec![removed(&[&p[..8]], None)]));
        assert_eq!(runs(&index, &p), HashMap::from([("a".to_owned(), 2)]));
        index.apply("a", &on_rank(1, vec![removed(&[&p[..8]], None)]));
        assert_eq!(runs(&index, &p), HashMap::from([("a".to_owned(), 1)]));
        // A child on rank 1 whose parent only rank 0 holds is an unknown parent on rank 1.
        index.apply("a", &on_rank(1, vec![removed(&[&p[..4]], None)]));
        let report = index.apply("a", &on_rank(1, vec![stored(&p, 4, 1)]));
        assert_eq!(report.unknown_parent, 1);
    }

    #[test]
    fn unknown_events_are_counted_and_ignored() {
        let mut index = EngineIndex::new(IndexConfig::default());
        let report = index.apply("a", &batch(vec![Event::Unknown("NewKind".into())]));
        assert_eq!(report.unknown_events, 1);
    }

    /// One step of the parity property.
    #[derive(Debug, Clone)]
    enum Op {
        /// Replica, prompt (tokens from a small alphabet so prompts share prefixes), and how many
        /// leading blocks to leave out of the store (their parent then may or may not be held).
        Store(usize, Vec<u32>, usize),
        /// Replica, which held block (by position in its list) to remove.
        Remove(usize, usize),
        Clear(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..3usize, prop::collection::vec(0..3u32, 0..14), 0..3usize)
                .prop_map(|(r, p, s)| Op::Store(r, p, s)),
            2 => (0..3usize, 0..20usize).prop_map(|(r, i)| Op::Remove(r, i)),
            1 => (0..3usize).prop_map(Op::Clear),
        ]
    }

    proptest! {
        /// Against a naive model (per replica, the set of full-prefix token sequences held), the
        /// index answers the same run for every replica, under stores, removes and clears.
        #[test]
        fn held_runs_equal_a_naive_model(ops in prop::collection::vec(op(), 1..40),
                                         queries in prop::collection::vec(
                                             prop::collection::vec(0..3u32, 0..14), 1..6)) {
            const BS: usize = 2;
            let names = ["r0", "r1", "r2"];
            let mut index = EngineIndex::new(IndexConfig::default());
            let mut model: Vec<Vec<Vec<u32>>> = vec![Vec::new(); 3];
            for op in ops {
                match op {
                    Op::Store(r, p, skip) => {
                        let full = p.len() / BS;
                        let from = skip.min(full);
                        let parent_held = from == 0 || model[r].contains(&p[..from * BS].to_vec());
                        index.apply(names[r], &batch(vec![stored(&p, BS, from)]));
                        if parent_held {
                            for i in from..full {
                                let pre = p[..(i + 1) * BS].to_vec();
                                if !model[r].contains(&pre) {
                                    model[r].push(pre);
                                }
                            }
                        }
                    }
                    Op::Remove(r, i) => {
                        if model[r].is_empty() { continue; }
                        let at = i % model[r].len();
                        let pre = model[r].remove(at);
                        index.apply(names[r], &batch(vec![removed(&[&pre], None)]));
                    }
                    Op::Clear(r) => {
                        model[r].clear();
                        index.apply(names[r], &batch(vec![Event::AllBlocksCleared]));
                    }
                }
            }
            for q in queries {
                let got = runs(&index, &q);
                let mut want = HashMap::new();
                for (r, held) in model.iter().enumerate() {
                    let n = (1..=q.len() / BS).take_while(|&i| held.contains(&q[..i * BS].to_vec())).count();
                    if n > 0 { want.insert(names[r].to_owned(), n); }
                }
                prop_assert_eq!(got, want);
            }
            for (r, held) in model.iter().enumerate() {
                prop_assert_eq!(index.blocks_held(names[r]), held.len());
            }
        }
    }
}
