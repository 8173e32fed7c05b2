//! Step 5 of the spec's placement: each unit's first replica, filled up to k, then spilled to
//! the next least-loaded replica; the load it adds.

use std::collections::{BTreeSet, HashMap};

use super::balance::Balance;
use super::block_keys::BuildBlockHasher;
use super::held_blocks::HeldBlocks;
use super::recall::Recall;
use super::units::Unit;
use super::{BalanceBy, Plan, PlanParams, Replica, Source};
use crate::prefixhash::BlockHash;

/// Step 5: the state of one window's placement.
///
/// Cost: with memory, each unit walks the holders of its leading blocks once (a per-replica
/// marker, never a scan of a holder list per replica), since its answer lists them all; without
/// it, the replicas a unit lands on look up what they hold, and with the prefix preference
/// (N > 0) the unit's first replica comes from the holders of its deepest held block by load
/// (`HeldBlocks`). The least-loaded replica comes from an ordered index, not a scan of the
/// replicas.
pub(super) struct Placer<'a> {
    pub(super) params: &'a PlanParams,
    /// With memory: the walk reads its models beside the window's own index.
    pub(super) recall: Option<Recall<'a>>,
    /// k, with unlimited as `usize::MAX`.
    pub(super) k: usize,
    pub(super) balance: Balance,
    /// The prefix preference: replicas need at least this many leading blocks.
    pub(super) prefer_from: Option<usize>,
    pub(super) load: Vec<u64>,
    /// The sum of `load`.
    pub(super) total_load: u64,
    /// The static part of the tie-break: rank by (running requests, id bytes).
    pub(super) order: Vec<u32>,
    /// Replicas under k for the current unit, by (load, order): the least-loaded is the first.
    pub(super) under_k: BTreeSet<(u64, u32)>,
    /// Replica by `order`, to read `under_k`'s entries.
    pub(super) by_order: Vec<u32>,
    /// Replicas that reached k in the current unit, out of `under_k` until the unit is placed.
    pub(super) full: Vec<usize>,
    /// Placing members beyond k x replicas: every replica stays a candidate.
    pub(super) overflowing: bool,
    /// Without memory: what this window placed where.
    pub(super) held: HeldBlocks<'a>,
    /// With memory: the replicas this window placed each block another unit of the window
    /// shares on, walked beside the models.
    /// As the head of a list in `holder_nodes` (one arena per window, not a `Vec` per block:
    /// allocating one per block was most of the time of a 10,000-request window).
    pub(super) holders: HashMap<BlockHash, u32, BuildBlockHasher>,
    /// Singly linked lists of the replicas holding a block: (replica, next node or `NO_NODE`).
    pub(super) holder_nodes: Vec<(u32, u32)>,
    /// Scratch, per replica: leading blocks of the current unit it holds; nonzero only for the
    /// replicas in `matched`.
    pub(super) matches: Vec<usize>,
    pub(super) matched: Vec<usize>,
    /// Scratch, per replica: members of the current unit placed on it.
    pub(super) members_here: Vec<usize>,
    /// Scratch: replicas the current unit touched, in placement order.
    pub(super) touched: Vec<usize>,
    /// Scratch, per replica, with memory: a member of the current unit placed on it may use it
    /// (step 7), so its model records the unit.
    pub(super) usable: Vec<bool>,
    /// Scratch for `Placer::earliest_finish`.
    pub(super) price_from: Vec<f64>,
}

impl<'a> Placer<'a> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        replicas: &'a [Replica<'a>],
        params: &'a PlanParams,
        balance: Balance,
        prefer_from: Option<usize>,
        load: Vec<u64>,
        recall: Option<Recall<'a>>,
        walked_blocks: usize,
        held: HeldBlocks<'a>,
    ) -> Self {
        let mut by_order: Vec<u32> = (0..replicas.len() as u32).collect();
        // Stable: equal ids (never in practice) keep index order.
        by_order.sort_by(|&a, &b| {
            let key = |r: u32| {
                let replica = &replicas[r as usize];
                (replica.running_requests, replica.id.as_bytes())
            };
            key(a).cmp(&key(b))
        });
        let mut order = vec![0; replicas.len()];
        for (rank, &replica) in by_order.iter().enumerate() {
            order[replica as usize] = rank as u32;
        }
        Placer {
            params,
            k: params.max_per_replica.unwrap_or(usize::MAX),
            balance,
            prefer_from,
            under_k: (0..replicas.len()).map(|r| (load[r], order[r])).collect(),
            total_load: load.iter().sum(),
            load,
            order,
            by_order,
            full: Vec::new(),
            overflowing: false,
            held,
            holders: HashMap::with_capacity_and_hasher(walked_blocks, BuildBlockHasher::default()),
            holder_nodes: Vec::with_capacity(walked_blocks),
            matches: vec![0; replicas.len()],
            matched: Vec::new(),
            members_here: vec![0; replicas.len()],
            touched: Vec::new(),
            usable: vec![false; if recall.is_some() { replicas.len() } else { 0 }],
            price_from: Vec::new(),
            recall,
        }
    }

    pub(super) fn place(&mut self, unit: &Unit<'a>, plan: &mut Plan) {
        if self.recall.is_some() {
            self.walk_holders(unit.blocks, unit.shared());
        } else {
            self.held.start_unit(unit.blocks);
        }
        if self.recall.is_some() {
            self.keep_held_list(&unit.members, &mut plan.held);
        }
        let k = self.k;
        let members = &unit.members;
        let mut next = 0;
        let (mut target, mut source) = self.first_replica(unit);
        // Fill one replica up to k, then spill to the next least-loaded replica under k.
        loop {
            let take = k.min(members.len() - next);
            self.put(unit, &members[next..next + take], target, source, plan);
            next += take;
            if next == members.len() {
                break;
            }
            source = Source::LeastLoaded;
            match self.least_loaded() {
                Some(replica) => target = replica,
                None => break,
            }
        }
        // Members beyond k x replicas: one at a time on the least-loaded replica, all of them
        // candidates again.
        if next < members.len() {
            self.restore_full();
            self.overflowing = true;
            for member in next..members.len() {
                let replica = self.least_loaded().expect("at least one replica");
                let one = &members[member..=member];
                self.put(unit, one, replica, Source::LeastLoaded, plan);
            }
            self.overflowing = false;
        }
        self.restore_full();
        if let Some(recall) = &mut self.recall {
            // The unit is recorded where a member may stay (step 7 takes the others back).
            for &member in members {
                if let Some(replica) = plan.assignments[member] {
                    if recall.may_use(member, replica) {
                        self.usable[replica] = true;
                    }
                }
            }
            for &replica in &self.touched {
                if std::mem::take(&mut self.usable[replica]) {
                    recall.memory.touch(recall.slots[replica], unit.blocks);
                }
            }
        }
        // The window's own index needs only the blocks its other units walk: with memory, a
        // unit's blocks past the prefix it shares with another unit go to the memory alone.
        let recorded = match self.recall {
            Some(_) => &unit.blocks[..unit.shared()],
            None => unit.blocks,
        };
        for i in 0..self.touched.len() {
            let replica = self.touched[i];
            self.record(recorded, replica);
            self.members_here[replica] = 0;
        }
        self.touched.clear();
        self.clear_matches();
    }

    /// The replica a unit starts on, and why: the longest held prefix (at least the
    /// preference's blocks) among replicas under the fair share, else the least-loaded replica
    /// (every replica is under k when a unit starts).
    pub(super) fn first_replica(&mut self, unit: &Unit<'_>) -> (usize, Source) {
        let preferred = match &self.balance {
            Balance::FairShare { max_share } if self.recall.is_none() => {
                let max_share = *max_share;
                let (load, order, by_order) = (&self.load, &self.order, &self.by_order);
                self.prefer_from.and_then(|need| {
                    self.held.longest_prefix_under_share(
                        need,
                        max_share,
                        |replica| (load[replica], order[replica]),
                        |rank| by_order[rank as usize] as usize,
                    )
                })
            }
            Balance::FairShare { max_share } => self.prefer_from.and_then(|need| {
                let by_match = |&a: &usize, &b: &usize| {
                    self.matches[a]
                        .cmp(&self.matches[b])
                        .then_with(|| self.key(b).cmp(&self.key(a)))
                };
                self.matched
                    .iter()
                    .copied()
                    .filter(|&r| self.matches[r] >= need && self.load[r] < *max_share)
                    .max_by(by_match)
            }),
            Balance::EarliestFinish => self.earliest_finish(unit),
        };
        match preferred {
            Some(best) => {
                let need = self.prefer_from.unwrap_or(1);
                // From memory when this window's placements alone would not have preferred it.
                let source = if self.recall.is_some() && !self.window_holds(unit.blocks, best, need)
                {
                    Source::Memory
                } else {
                    Source::Window
                };
                (best, source)
            }
            None => {
                let replica = self.least_loaded().expect("at least one replica");
                (replica, Source::LeastLoaded)
            }
        }
    }

    /// Places `members` (of one unit) on `replica`.
    pub(super) fn put(
        &mut self,
        unit: &Unit<'_>,
        members: &[usize],
        replica: usize,
        source: Source,
        plan: &mut Plan,
    ) {
        let indexed = self.under_k.remove(&self.key(replica));
        if self.members_here[replica] == 0 {
            self.touched.push(replica);
            if self.recall.is_none() {
                // Not walked: look up only what this replica holds.
                let held = self.held.held_prefix(replica);
                if held > 0 {
                    self.matches[replica] = held;
                    self.matched.push(replica);
                }
            }
            if self.params.balance_by == BalanceBy::Tokens {
                // A prefix already held on this replica is not prefilled again.
                let prefill = (unit.blocks.len() - self.matches[replica]) as u64;
                self.load[replica] += prefill;
                self.total_load += prefill;
            }
        }
        if self.params.balance_by == BalanceBy::Requests {
            self.load[replica] += members.len() as u64;
            self.total_load += members.len() as u64;
        }
        self.members_here[replica] += members.len();
        for &member in members {
            plan.assignments[member] = Some(replica);
            plan.sources[member] = Some(source);
        }
        if indexed {
            if self.overflowing || self.members_here[replica] < self.k {
                self.under_k.insert(self.key(replica));
            } else {
                self.full.push(replica);
            }
        }
    }

    /// Puts the replicas that reached k in this unit back among the candidates.
    pub(super) fn restore_full(&mut self) {
        for i in 0..self.full.len() {
            let replica = self.full[i];
            self.under_k.insert(self.key(replica));
        }
        self.full.clear();
    }

    /// Step 6's order: lower window load, then fewer running requests, then the lower id.
    pub(super) fn key(&self, replica: usize) -> (u64, u32) {
        (self.load[replica], self.order[replica])
    }

    /// The least-loaded replica under k for the current unit.
    pub(super) fn least_loaded(&self) -> Option<usize> {
        self.under_k
            .first()
            .map(|&(_, rank)| self.by_order[rank as usize] as usize)
    }
}
