//! Placement of one window of requests on replicas (SPEC §4).
//!
//! Requests with identical prompts form groups; with `min_colocate_blocks` (N) > 0, single requests
//! that share their first N blocks with another request become units too. Units are placed one by
//! one, largest first, preferring the replica that already holds the longest prefix of the unit
//! (bounded by a fair share), and filling one replica up to `max_per_replica` (k) members before
//! spilling to the next least-loaded one.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hash, Hasher};

use crate::prefixhash::BlockHash;

/// What the window load of a replica counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BalanceBy {
    /// Requests placed on the replica.
    #[default]
    Requests,
    /// Blocks to prefill on the replica: a unit's blocks minus the prefix it already holds there.
    Tokens,
}

/// The placement knobs of SPEC §2, already validated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlanParams {
    /// k: at most this many members of one unit on one replica; `None` is unlimited (-1).
    pub max_per_replica: Option<usize>,
    /// N: blocks a single request must share with another request to be co-located with it;
    /// 0 co-locates identical prompts only.
    pub min_colocate_blocks: usize,
    pub balance_by: BalanceBy,
}

/// A candidate replica (one inference endpoint).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replica<'a> {
    /// Endpoint id; the last tie-break compares these byte-wise.
    pub id: &'a str,
    /// Live running-request count, when known (else 0); a tie-break only.
    pub running_requests: u64,
}

/// One request of the window, in arrival order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchRequest<'a> {
    /// All its block hashes (its prompts' chains, concatenated).
    pub blocks: &'a [BlockHash],
    /// Indices of the replicas it may use; `None` means all of them.
    pub allowed_replicas: Option<&'a [usize]>,
}

/// The planner's answer for one window.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Per request (batch order), the index of its replica, or `None` for no affinity.
    pub assignments: Vec<Option<usize>>,
    /// Final window load per replica, in the unit of `balance_by`.
    pub loads: Vec<u64>,
    /// Units formed from groups of identical prompts.
    pub group_units: usize,
    /// Units formed from single requests sharing N blocks with another request.
    pub single_units: usize,
}

/// Places one window of requests (SPEC §4). Pure and deterministic: the result depends only on
/// the arguments, never on hash iteration order; the order of `replicas` only matters through
/// the indices it gives them.
pub fn assign(batch: &[BatchRequest<'_>], replicas: &[Replica<'_>], params: &PlanParams) -> Plan {
    let units = form_units(batch, params.min_colocate_blocks);
    let group_units = units.iter().filter(|u| u.kind == UnitKind::Group).count();
    let mut plan = Plan {
        assignments: vec![None; batch.len()],
        loads: vec![0; replicas.len()],
        group_units,
        single_units: units.len() - group_units,
    };
    if replicas.is_empty() {
        return plan;
    }
    // (block, replica) pairs the window can record: each unit on at most ceil(members / k)
    // replicas.
    let k = params.max_per_replica.unwrap_or(usize::MAX);
    let total_blocks = units
        .iter()
        .map(|unit| unit.blocks.len() * unit.members.len().div_ceil(k).min(replicas.len()))
        .sum();
    let mut placer = Placer::new(
        replicas,
        params,
        max_share(&units, replicas.len(), params),
        total_blocks,
    );
    for unit in &units {
        placer.place(unit, &mut plan.assignments);
    }
    plan.loads = placer.load;
    // A request that may not use its assigned replica gets zero everywhere (step 7).
    for (assigned, request) in plan.assignments.iter_mut().zip(batch) {
        if let (Some(replica), Some(allowed)) = (*assigned, request.allowed_replicas) {
            if !allowed.contains(&replica) {
                *assigned = None;
            }
        }
    }
    plan
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum UnitKind {
    Group,
    Single,
}

/// Requests placed together: a group of identical prompts, or one prefix-sharing single.
#[derive(Debug)]
struct Unit<'a> {
    blocks: &'a [BlockHash],
    /// Batch indices, in arrival order.
    members: Vec<usize>,
    kind: UnitKind,
}

/// Steps 1-3: group identical block sequences, keep the units, order them.
fn form_units<'a>(batch: &[BatchRequest<'a>], min_colocate_blocks: usize) -> Vec<Unit<'a>> {
    let mut group_of: HashMap<Chain<'a>, usize, BuildBlockHasher> =
        HashMap::with_capacity_and_hasher(batch.len(), BuildBlockHasher::default());
    let mut groups: Vec<Unit<'a>> = Vec::new();
    for (index, request) in batch.iter().enumerate() {
        if request.blocks.is_empty() {
            continue;
        }
        let next = groups.len();
        let group = *group_of.entry(Chain(request.blocks)).or_insert(next);
        if group == next {
            groups.push(Unit {
                blocks: request.blocks,
                members: Vec::new(),
                kind: UnitKind::Single,
            });
        }
        groups[group].members.push(index);
    }

    let n = min_colocate_blocks;
    let mut sharing_prefix: HashMap<Chain<'a>, usize, BuildBlockHasher> = HashMap::default();
    if n > 0 {
        for group in groups.iter().filter(|g| g.blocks.len() >= n) {
            *sharing_prefix.entry(Chain(&group.blocks[..n])).or_default() += group.members.len();
        }
    }
    let mut units: Vec<Unit<'a>> = groups
        .into_iter()
        .filter_map(|mut unit| {
            if unit.members.len() >= 2 {
                unit.kind = UnitKind::Group;
                Some(unit)
            } else if n > 0
                && unit.blocks.len() >= n
                && sharing_prefix[&Chain(&unit.blocks[..n])] >= 2
            {
                Some(unit)
            } else {
                None
            }
        })
        .collect();
    // Groups first, then singles; more blocks first; the stable sort keeps arrival order on ties.
    units.sort_by_key(|unit| (unit.kind, Reverse(unit.blocks.len())));
    units
}

/// Step 4: the fair share that bounds the prefix-preference path.
fn max_share(units: &[Unit<'_>], replicas: usize, params: &PlanParams) -> u64 {
    let total: usize = units
        .iter()
        .map(|unit| match params.balance_by {
            BalanceBy::Requests => unit.members.len(),
            BalanceBy::Tokens => unit.blocks.len(),
        })
        .sum();
    total.div_ceil(replicas) as u64
}

/// Step 5: the state of one window's placement.
///
/// Cost: with prefix preference on (N > 0), each unit walks the holders of its leading blocks
/// once (a per-replica marker, never a scan of a holder list per replica); without it, only
/// the replicas a unit lands on look up what they hold. The least-loaded replica comes from an
/// ordered index, not a scan of the replicas.
struct Placer<'a> {
    params: &'a PlanParams,
    /// k, with unlimited as `usize::MAX`.
    k: usize,
    max_share: u64,
    /// The prefix preference of step 5 (N > 0): replicas need at least this many blocks.
    prefer_from: Option<usize>,
    load: Vec<u64>,
    /// The static part of the tie-break: rank by (running requests, id bytes).
    order: Vec<u32>,
    /// Replicas under k for the current unit, by (load, order): the least-loaded is the first.
    under_k: BTreeSet<(u64, u32)>,
    /// Replica by `order`, to read `under_k`'s entries.
    by_order: Vec<u32>,
    /// Replicas that reached k in the current unit, out of `under_k` until the unit is placed.
    full: Vec<usize>,
    /// Placing members beyond k x replicas: every replica stays a candidate.
    overflowing: bool,
    /// Every (block, replica) placed in this window.
    held: HashSet<(BlockHash, u32), BuildBlockHasher>,
    /// The replicas holding each block (only kept when the prefix preference walks them).
    holders: HashMap<BlockHash, Vec<u32>, BuildBlockHasher>,
    /// Scratch, per replica: leading blocks of the current unit it holds; nonzero only for the
    /// replicas in `matched`.
    matches: Vec<usize>,
    matched: Vec<usize>,
    /// Scratch, per replica: members of the current unit placed on it.
    members_here: Vec<usize>,
    /// Scratch: replicas the current unit touched, in placement order.
    touched: Vec<usize>,
}

impl<'a> Placer<'a> {
    fn new(
        replicas: &'a [Replica<'a>],
        params: &'a PlanParams,
        max_share: u64,
        total_blocks: usize,
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
        let n = params.min_colocate_blocks;
        let prefer_from = (n > 0).then_some(n);
        Placer {
            params,
            k: params.max_per_replica.unwrap_or(usize::MAX),
            max_share,
            prefer_from,
            load: vec![0; replicas.len()],
            under_k: order.iter().map(|&rank| (0, rank)).collect(),
            order,
            by_order,
            full: Vec::new(),
            overflowing: false,
            held: HashSet::with_capacity_and_hasher(total_blocks, BuildBlockHasher::default()),
            holders: HashMap::with_capacity_and_hasher(
                if prefer_from.is_some() {
                    total_blocks
                } else {
                    0
                },
                BuildBlockHasher::default(),
            ),
            matches: vec![0; replicas.len()],
            matched: Vec::new(),
            members_here: vec![0; replicas.len()],
            touched: Vec::new(),
        }
    }

    fn place(&mut self, unit: &Unit<'_>, assignments: &mut [Option<usize>]) {
        if self.prefer_from.is_some() {
            self.walk_holders(unit.blocks);
        }
        let k = self.k;
        let members = &unit.members;
        let mut next = 0;
        let mut target = self.first_replica();
        // Fill one replica up to k, then spill to the next least-loaded replica under k.
        loop {
            let take = k.min(members.len() - next);
            self.put(unit, &members[next..next + take], target, assignments);
            next += take;
            if next == members.len() {
                break;
            }
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
                self.put(unit, &members[member..=member], replica, assignments);
            }
            self.overflowing = false;
        }
        self.restore_full();
        for i in 0..self.touched.len() {
            let replica = self.touched[i];
            self.record(unit.blocks, replica);
            self.members_here[replica] = 0;
        }
        self.touched.clear();
        for &replica in &self.matched {
            self.matches[replica] = 0;
        }
        self.matched.clear();
    }

    /// Records `blocks` as held by `replica`; its leading `matches` blocks already are.
    fn record(&mut self, blocks: &[BlockHash], replica: usize) {
        let r = replica as u32;
        for &block in &blocks[self.matches[replica]..] {
            if self.held.insert((block, r)) && self.prefer_from.is_some() {
                self.holders.entry(block).or_default().push(r);
            }
        }
    }

    /// The replica a unit starts on: the longest held prefix (>= N) among replicas under the fair
    /// share, else the least-loaded replica (every replica is under k when a unit starts).
    fn first_replica(&self) -> usize {
        let preferred = self.prefer_from.and_then(|need| {
            self.matched
                .iter()
                .copied()
                .filter(|&r| self.matches[r] >= need && self.load[r] < self.max_share)
                .max_by(|&a, &b| {
                    self.matches[a]
                        .cmp(&self.matches[b])
                        .then_with(|| self.key(b).cmp(&self.key(a)))
                })
        });
        preferred
            .or_else(|| self.least_loaded())
            .expect("at least one replica")
    }

    /// Places `members` (of one unit) on `replica`.
    fn put(
        &mut self,
        unit: &Unit<'_>,
        members: &[usize],
        replica: usize,
        assignments: &mut [Option<usize>],
    ) {
        let indexed = self.under_k.remove(&self.key(replica));
        if self.members_here[replica] == 0 {
            self.touched.push(replica);
            if self.prefer_from.is_none() {
                // Not walked: look up only what this replica holds.
                let held = self.held_prefix(unit.blocks, replica);
                if held > 0 {
                    self.matches[replica] = held;
                    self.matched.push(replica);
                }
            }
            if self.params.balance_by == BalanceBy::Tokens {
                // A prefix already held on this replica is not prefilled again.
                self.load[replica] += (unit.blocks.len() - self.matches[replica]) as u64;
            }
        }
        if self.params.balance_by == BalanceBy::Requests {
            self.load[replica] += members.len() as u64;
        }
        self.members_here[replica] += members.len();
        for &member in members {
            assignments[member] = Some(replica);
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
    fn restore_full(&mut self) {
        for i in 0..self.full.len() {
            let replica = self.full[i];
            self.under_k.insert(self.key(replica));
        }
        self.full.clear();
    }

    /// Leading blocks of `blocks` that `replica` holds.
    fn held_prefix(&self, blocks: &[BlockHash], replica: usize) -> usize {
        let r = replica as u32;
        blocks
            .iter()
            .take_while(|&&block| self.held.contains(&(block, r)))
            .count()
    }

    /// `matches[r]` = leading blocks of `blocks` held by r, for every replica holding any: a
    /// holder of block i advances only if it held blocks 0..i, so each holder of each walked
    /// block is visited once; the walk stops at the first block on which no holder advanced.
    fn walk_holders(&mut self, blocks: &[BlockHash]) {
        for (depth, block) in blocks.iter().enumerate() {
            let Some(holders) = self.holders.get(block) else {
                break;
            };
            let mut advanced = false;
            for &holder in holders {
                let holder = holder as usize;
                if self.matches[holder] == depth {
                    self.matches[holder] = depth + 1;
                    advanced = true;
                    if depth == 0 {
                        self.matched.push(holder);
                    }
                }
            }
            if !advanced {
                break;
            }
        }
    }

    /// Step 6's order: lower window load, then fewer running requests, then the lower id.
    fn key(&self, replica: usize) -> (u64, u32) {
        (self.load[replica], self.order[replica])
    }

    /// The least-loaded replica under k for the current unit.
    fn least_loaded(&self) -> Option<usize> {
        self.under_k
            .first()
            .map(|&(_, rank)| self.by_order[rank as usize] as usize)
    }
}

/// A block-hash sequence as a map key. Chained hashes make the last block stand for the whole
/// sequence, so only it (and the length) is hashed; equality still compares every block.
#[derive(PartialEq, Eq)]
struct Chain<'a>(&'a [BlockHash]);

impl Hash for Chain<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.0.last().copied().unwrap_or(0) ^ self.0.len() as u64);
    }
}

/// Block hashes are already XXH64 outputs: spread them with one multiply instead of SipHash.
#[derive(Default)]
struct BlockHasher(u64);

impl Hasher for BlockHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0.rotate_left(5) ^ value).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn write_u32(&mut self, value: u32) {
        self.write_u64(u64::from(value));
    }

    fn write_usize(&mut self, value: usize) {
        self.write_u64(value as u64);
    }
}

type BuildBlockHasher = BuildHasherDefault<BlockHasher>;

#[cfg(test)]
mod tests;
