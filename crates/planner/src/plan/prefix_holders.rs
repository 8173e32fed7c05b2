//! When units walk (with memory, and in time mode): the replicas holding a prefix that the
//! units placed in a row share (a system prompt), kept from one unit to the next rather than
//! walked again for each.
//!
//! Why: with a system prompt that every unit shares, every replica soon holds it, and walking
//! its holders and pricing each of them for every unit made a window cost units x replicas.
//! During a window the holders change only where a unit lands, and a unit that starts with the
//! prefix leaves every replica it lands on holding the prefix whole (it records its shared
//! blocks there). So the prefix is walked once, those replicas join as units land, and the ones
//! holding it whole, alike to the next unit but for their load, are kept by step 6's key:
//! `UnitPlacer::cheapest` prices them from the least loaded on, until none can win, and the
//! fair share and `earliest_finish` need only the first of them (`UnitPlacer::holders`).

use std::collections::BTreeSet;

use crate::prefixhash::BlockHash;

/// Step 6's key of a replica: (window load, rank by running requests and id).
pub(super) type Key = (u64, u32);

/// Not kept in the answer (without memory).
pub(super) const NO_HOLDERS: u32 = u32::MAX;

pub(super) struct PrefixHolders {
    /// The prefix; empty when there is none.
    blocks: Vec<BlockHash>,
    /// Per replica, the prefix's leading blocks it holds.
    depth: Vec<usize>,
    /// The replicas holding any of it (to forget it in their number, not the fleet's).
    holders: Vec<usize>,
    /// The replicas that held part of it when it was walked (some may hold it whole since).
    partial: Vec<usize>,
    /// The replicas holding it whole, by their key (kept current by `rekey`).
    whole: BTreeSet<Key>,
    /// With memory, the answer's `WholeHolders` that logs who joined (`NO_HOLDERS`: none).
    logged_in: u32,
}

impl PrefixHolders {
    pub(super) fn new(replicas: usize) -> Self {
        PrefixHolders {
            blocks: Vec::new(),
            depth: vec![0; replicas],
            holders: Vec::new(),
            partial: Vec::new(),
            whole: BTreeSet::new(),
            logged_in: NO_HOLDERS,
        }
    }

    /// The prefix's blocks (0: none).
    pub(super) fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether a unit of `blocks`, whose first `shared` blocks other units share, starts with
    /// the prefix (and so records it whole where it lands).
    pub(super) fn starts(&self, blocks: &[BlockHash], shared: usize) -> bool {
        let len = self.len();
        len > 0 && shared >= len && blocks[..len] == self.blocks[..]
    }

    /// Leading blocks of the prefix that `replica` holds.
    pub(super) fn depth(&self, replica: usize) -> usize {
        self.depth[replica]
    }

    pub(super) fn holds_whole(&self, replica: usize) -> bool {
        self.len() > 0 && self.depth[replica] == self.len()
    }

    /// Takes `blocks` as the prefix, held as `walked` gives it: (replica, leading blocks).
    /// Returns the replicas holding it whole, for the log.
    pub(super) fn start(
        &mut self,
        blocks: &[BlockHash],
        walked: impl Iterator<Item = (usize, usize)>,
        key: impl Fn(usize) -> Key,
        logged_in: u32,
    ) -> Vec<usize> {
        self.forget();
        self.blocks.extend_from_slice(blocks);
        self.logged_in = logged_in;
        let mut whole = Vec::new();
        for (replica, depth) in walked {
            self.depth[replica] = depth;
            self.holders.push(replica);
            if depth == blocks.len() {
                self.whole.insert(key(replica));
                whole.push(replica);
            } else {
                self.partial.push(replica);
            }
        }
        whole
    }

    /// `replica` now holds the prefix whole (a unit starting with it landed there), with key
    /// `key`; true if it did not before.
    pub(super) fn join(&mut self, replica: usize, key: Key) -> bool {
        if self.len() == 0 || self.depth[replica] == self.len() {
            return false;
        }
        if self.depth[replica] == 0 {
            self.holders.push(replica);
        }
        self.depth[replica] = self.len();
        self.whole.insert(key);
        true
    }

    /// A whole holder's key changed from `old` to `new`.
    pub(super) fn rekey(&mut self, old: Key, new: Key) {
        self.whole.remove(&old);
        self.whole.insert(new);
    }

    /// The replicas holding part of the prefix, each once.
    pub(super) fn partial(&self) -> impl Iterator<Item = usize> + Clone + '_ {
        let len = self.len();
        self.partial
            .iter()
            .copied()
            .filter(move |&replica| self.depth[replica] < len)
    }

    /// The keys of the replicas holding it whole, lowest first.
    pub(super) fn whole(&self) -> &BTreeSet<Key> {
        &self.whole
    }

    pub(super) fn logged_in(&self) -> u32 {
        self.logged_in
    }

    /// No prefix: every replica holds none of it.
    pub(super) fn forget(&mut self) {
        for &replica in &self.holders {
            self.depth[replica] = 0;
        }
        self.blocks.clear();
        self.holders.clear();
        self.partial.clear();
        self.whole.clear();
        self.logged_in = NO_HOLDERS;
    }
}
