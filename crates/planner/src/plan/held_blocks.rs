//! Without memory: the blocks this window placed on each replica, looked up one (block,
//! replica) at a time, and with the prefix preference each block's holders ordered by step 6's
//! key, so that a unit finds the least-loaded replica holding its longest prefix without
//! visiting every holder. Only blocks that two units of the window contain are kept: a unit
//! looks up only its own blocks, so a block of one unit alone is never asked for again (and
//! most blocks are one unit's own: a prompt's suffix).
//!
//! Why not walk every holder of every leading block: with a system prompt that every unit
//! shares, every replica soon holds it, and each unit would visit all of them at every block of
//! the prompt (quadratic in the fleet). A chained block hash held by a replica nearly always
//! means it holds the whole prefix before it, so the deepest block with any holder bounds every
//! match, and the least-loaded holder of the deepest block that one holds in full is the
//! answer. "Nearly": a request's second prompt starts a chain of its own, so a replica may hold
//! a block without the blocks before it; every candidate is checked block by block, which keeps
//! the answer exactly the spec's whatever the hashes.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};

use super::block_keys::BuildBlockHasher;
use super::units::Unit;
use crate::prefixhash::BlockHash;

/// Step 6's key of a replica: (window load, rank by running requests and id).
pub(super) type Key = (u64, u32);

pub(super) struct HeldBlocks<'a> {
    /// The blocks that two or more units of the window contain.
    shared: HashSet<BlockHash, BuildBlockHasher>,
    /// The current unit's blocks, and how many of them lead up to its first block of its own:
    /// no replica holds more of them (no other unit contains that block).
    unit_blocks: &'a [BlockHash],
    unit_reach: usize,
    /// The current unit's blocks in `shared`, with their depth.
    unit_shared: Vec<(usize, BlockHash)>,
    recorded: Recorded<'a>,
    /// With the prefix preference: per block, its holders by their key when recorded. Loads
    /// only grow within a window, so a key read from here is at most the replica's current one,
    /// and `least_loaded_holder` refreshes the stale ones it meets on top.
    by_key: Option<HashMap<BlockHash, Holders, BuildBlockHasher>>,
}

/// What was recorded on each replica.
struct Recorded<'a> {
    /// Every (block in `shared`, replica) recorded in this window.
    held: HashSet<(BlockHash, u32), BuildBlockHasher>,
    /// Per replica, the leading blocks of the last unit recorded on it, which it holds in full:
    /// the part the current unit has in common with them needs no lookup (with a system prompt
    /// that every unit shares, that saves a cache miss per block of the prompt per replica).
    last: Vec<&'a [BlockHash]>,
}

/// A block's holders: one without an allocation (most blocks are one unit's own), or a heap.
enum Holders {
    One(Key),
    Many(BinaryHeap<Reverse<Key>>),
}

impl<'a> HeldBlocks<'a> {
    /// For the window of `units` on `replicas`; `ranked` keeps holders by key (the prefix
    /// preference).
    pub(super) fn new(units: &[Unit<'_>], replicas: usize, ranked: bool) -> Self {
        let all_blocks = units.iter().map(|unit| unit.blocks.len()).sum();
        let mut seen: HashSet<BlockHash, BuildBlockHasher> =
            HashSet::with_capacity_and_hasher(all_blocks, BuildBlockHasher::default());
        // A block twice in one unit (a prompt sent twice in one request) counts as shared too:
        // recording a block nobody asks for again costs a little, never an answer.
        let shared: HashSet<BlockHash, BuildBlockHasher> = units
            .iter()
            .flat_map(|unit| unit.blocks)
            .filter(|&&block| !seen.insert(block))
            .copied()
            .collect();
        // Sized for each shared block on one replica, and grown as they spread: a table sized
        // for the most they could be on would be mostly empty, and its lookups would miss the
        // cache for nothing.
        let pairs = shared.len();
        HeldBlocks {
            by_key: ranked.then(|| {
                HashMap::with_capacity_and_hasher(shared.len(), BuildBlockHasher::default())
            }),
            shared,
            unit_blocks: &[],
            unit_reach: 0,
            unit_shared: Vec::new(),
            recorded: Recorded {
                held: HashSet::with_capacity_and_hasher(pairs, BuildBlockHasher::default()),
                last: vec![&[]; replicas],
            },
        }
    }

    /// Takes `blocks` as the blocks of the unit that the next calls are about.
    pub(super) fn start_unit(&mut self, blocks: &'a [BlockHash]) {
        let shared = &self.shared;
        self.unit_blocks = blocks;
        self.unit_shared.clear();
        self.unit_shared.extend(
            blocks
                .iter()
                .enumerate()
                .filter(|(_, block)| shared.contains(*block))
                .map(|(depth, &block)| (depth, block)),
        );
        // The shared blocks before the first one of its own are at their own depths.
        self.unit_reach = self
            .unit_shared
            .iter()
            .enumerate()
            .take_while(|&(index, &(depth, _))| index == depth)
            .count();
    }

    /// Records the current unit's blocks from depth `from` on as held by `replica`, whose key
    /// is now `key`.
    pub(super) fn record(&mut self, from: usize, replica: u32, key: Key) {
        self.recorded.last[replica as usize] = &self.unit_blocks[..self.unit_reach];
        let start = self.unit_shared.partition_point(|&(depth, _)| depth < from);
        for &(_, block) in &self.unit_shared[start..] {
            if !self.recorded.held.insert((block, replica)) {
                continue;
            }
            if let Some(by_key) = &mut self.by_key {
                by_key
                    .entry(block)
                    .and_modify(|holders| match holders {
                        Holders::One(first) => {
                            *holders =
                                Holders::Many(BinaryHeap::from([Reverse(*first), Reverse(key)]))
                        }
                        Holders::Many(heap) => heap.push(Reverse(key)),
                    })
                    .or_insert(Holders::One(key));
            }
        }
    }

    /// Leading blocks of the current unit that this window placed on `replica`.
    pub(super) fn held_prefix(&self, replica: usize) -> usize {
        self.recorded
            .held_prefix(&self.unit_blocks[..self.unit_reach], replica)
    }

    /// The replica holding the longest prefix of the current unit, at least `need` blocks,
    /// among those whose load is under `max_share`; ties to the lower key. `key_of` gives a
    /// replica's current key, `replica_of` the replica of a rank. Needs the preference
    /// (`ranked`).
    pub(super) fn longest_prefix_under_share(
        &mut self,
        need: usize,
        max_share: u64,
        key_of: impl Fn(usize) -> Key,
        replica_of: impl Fn(u32) -> usize,
    ) -> Option<usize> {
        let blocks = self.unit_blocks;
        let by_key = self.by_key.as_mut().expect("ranked for the preference");
        // The first block nobody holds ends every match.
        let reach = blocks
            .iter()
            .take_while(|block| by_key.contains_key(block))
            .count();
        // Deepest first: a replica holding `depth + 1` leading blocks is a holder of the block
        // at `depth`, so the first depth with a candidate under the share has the longest.
        (need.max(1) - 1..reach).rev().find_map(|depth| {
            let holders = by_key.get_mut(&blocks[depth]).expect("within reach");
            least_loaded_holder(holders, max_share, &key_of, &replica_of, |replica| {
                self.recorded.holds_all(&blocks[..depth], replica)
            })
        })
    }
}

impl Recorded<'_> {
    /// Leading blocks of `blocks` that `replica` holds.
    fn held_prefix(&self, blocks: &[BlockHash], replica: usize) -> usize {
        let known = self.known(blocks, replica);
        known
            + blocks[known..]
                .iter()
                .take_while(|&&block| self.held.contains(&(block, replica as u32)))
                .count()
    }

    /// Whether `replica` holds every block of `blocks`.
    fn holds_all(&self, blocks: &[BlockHash], replica: usize) -> bool {
        let known = self.known(blocks, replica);
        blocks[known..]
            .iter()
            .all(|&block| self.held.contains(&(block, replica as u32)))
    }

    /// Leading blocks of `blocks` that `replica` holds as the last unit recorded on it did.
    fn known(&self, blocks: &[BlockHash], replica: usize) -> usize {
        blocks
            .iter()
            .zip(self.last[replica])
            .take_while(|(a, b)| a == b)
            .count()
    }
}

/// The holder with the lowest current key under `max_share` that `holds_before` accepts.
fn least_loaded_holder(
    holders: &mut Holders,
    max_share: u64,
    key_of: impl Fn(usize) -> Key,
    replica_of: impl Fn(u32) -> usize,
    mut holds_before: impl FnMut(usize) -> bool,
) -> Option<usize> {
    let heap = match holders {
        Holders::One(key) => {
            let replica = replica_of(key.1);
            // Refreshed here too, though a single holder needs no order.
            *key = key_of(replica);
            return (key.0 < max_share && holds_before(replica)).then_some(replica);
        }
        Holders::Many(heap) => heap,
    };
    // Entries taken off the top that another prompt's chain put there (held without the
    // blocks before): back on the heap once the answer is found.
    let mut passed = Vec::new();
    let found = loop {
        let Some(mut top) = heap.peek_mut() else {
            break None;
        };
        let Reverse(recorded) = *top;
        let replica = replica_of(recorded.1);
        let current = key_of(replica);
        if current != recorded {
            // Loaded since: back in at its current key (never lower), sifted down once.
            *top = Reverse(current);
            continue;
        }
        if current.0 >= max_share {
            break None;
        }
        if holds_before(replica) {
            break Some(replica);
        }
        passed.push(std::collections::binary_heap::PeekMut::pop(top));
    };
    heap.extend(passed);
    found
}
