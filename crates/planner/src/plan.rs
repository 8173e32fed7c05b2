//! Placement of one window of requests on replicas (SPEC §4).
//!
//! Requests with identical prompts form groups; with `min_colocate_blocks` (N) > 0, single requests
//! that share their first N blocks with another request become units too. Units are placed one by
//! one, largest first, preferring the replica that already holds the longest prefix of the unit
//! (bounded by a fair share), and filling one replica up to `max_per_replica` (k) members before
//! spilling to the next least-loaded one.

use std::cmp::{Ordering, Reverse};
use std::collections::HashMap;
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
    let total_blocks = units.iter().map(|unit| unit.blocks.len()).sum();
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
struct Placer<'a> {
    replicas: &'a [Replica<'a>],
    params: &'a PlanParams,
    max_share: u64,
    load: Vec<u64>,
    /// For every block placed in this window, the head of its list of holders in
    /// `holder_nodes` (an arena: one allocation per window, not one per block).
    holders: HashMap<BlockHash, u32, BuildBlockHasher>,
    /// Singly linked lists of the replicas holding a block: (replica, next node or `NO_NODE`).
    holder_nodes: Vec<(u32, u32)>,
    /// Scratch, per replica: leading blocks of the current unit it holds.
    matches: Vec<usize>,
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
        Placer {
            replicas,
            params,
            max_share,
            load: vec![0; replicas.len()],
            holders: HashMap::with_capacity_and_hasher(total_blocks, BuildBlockHasher::default()),
            holder_nodes: Vec::with_capacity(total_blocks),
            matches: vec![0; replicas.len()],
            members_here: vec![0; replicas.len()],
            touched: Vec::new(),
        }
    }

    fn place(&mut self, unit: &Unit<'_>, assignments: &mut [Option<usize>]) {
        self.compute_matches(unit.blocks);
        let k = self.params.max_per_replica.unwrap_or(usize::MAX);
        let members = &unit.members;
        let mut next = 0;
        let mut target = self.first_replica(k);
        // Fill one replica up to k, then spill to the next least-loaded replica under k.
        loop {
            let take = k.min(members.len() - next);
            for &member in &members[next..next + take] {
                self.put(unit, member, target, assignments);
            }
            next += take;
            if next == members.len() {
                break;
            }
            match self.least_loaded(|r, placer| placer.members_here[r] < k) {
                Some(replica) => target = replica,
                None => break,
            }
        }
        // Members beyond k x replicas: one at a time on the least-loaded replica.
        for &member in &members[next..] {
            let replica = self
                .least_loaded(|_, _| true)
                .expect("at least one replica");
            self.put(unit, member, replica, assignments);
        }
        for i in 0..self.touched.len() {
            let replica = self.touched[i];
            for &block in unit.blocks {
                self.record_holder(block, replica);
            }
            self.members_here[replica] = 0;
        }
        self.touched.clear();
    }

    fn record_holder(&mut self, block: BlockHash, replica: usize) {
        let next = self.holder_nodes.len() as u32;
        let replica = replica as u32;
        let head = match self.holders.get(&block) {
            Some(&head) if self.holder_list(head).any(|r| r == replica as usize) => return,
            Some(&head) => head,
            None => NO_NODE,
        };
        self.holder_nodes.push((replica, head));
        self.holders.insert(block, next);
    }

    /// The replicas on the list starting at `node`.
    fn holder_list(&self, mut node: u32) -> impl Iterator<Item = usize> + '_ {
        std::iter::from_fn(move || {
            let (replica, next) = *self.holder_nodes.get(node as usize)?;
            node = next;
            Some(replica as usize)
        })
    }

    /// The replica a unit starts on: the longest held prefix (>= N) among replicas under the fair
    /// share, else the least-loaded replica under k, else the least-loaded overall.
    fn first_replica(&self, k: usize) -> usize {
        let n = self.params.min_colocate_blocks;
        let preferred = if n > 0 {
            (0..self.replicas.len())
                .filter(|&r| {
                    self.matches[r] >= n
                        && self.load[r] < self.max_share
                        && self.members_here[r] < k
                })
                .max_by(|&a, &b| {
                    self.matches[a]
                        .cmp(&self.matches[b])
                        .then_with(|| self.tie_break(b, a))
                })
        } else {
            None
        };
        preferred
            .or_else(|| self.least_loaded(|r, placer| placer.members_here[r] < k))
            .or_else(|| self.least_loaded(|_, _| true))
            .expect("at least one replica")
    }

    fn put(
        &mut self,
        unit: &Unit<'_>,
        member: usize,
        replica: usize,
        assignments: &mut [Option<usize>],
    ) {
        if self.members_here[replica] == 0 {
            self.touched.push(replica);
            if self.params.balance_by == BalanceBy::Tokens {
                // A prefix already held on this replica is not prefilled again.
                self.load[replica] += (unit.blocks.len() - self.matches[replica]) as u64;
            }
        }
        if self.params.balance_by == BalanceBy::Requests {
            self.load[replica] += 1;
        }
        self.members_here[replica] += 1;
        assignments[member] = Some(replica);
    }

    /// `matches[r]` = leading blocks of `blocks` held by replica r; the walk stops at the first
    /// unheld block.
    fn compute_matches(&mut self, blocks: &[BlockHash]) {
        self.matches.fill(0);
        let mut live: Vec<usize> = Vec::new();
        for (depth, block) in blocks.iter().enumerate() {
            let Some(&head) = self.holders.get(block) else {
                break;
            };
            if depth == 0 {
                live.extend(self.holder_list(head));
            } else {
                live.retain(|&r| self.holder_list(head).any(|h| h == r));
            }
            if live.is_empty() {
                break;
            }
            for &replica in &live {
                self.matches[replica] = depth + 1;
            }
        }
    }

    /// Step 6: lower window load, then lower live running count, then the lower id.
    fn tie_break(&self, a: usize, b: usize) -> Ordering {
        let key = |r: usize| {
            (
                self.load[r],
                self.replicas[r].running_requests,
                self.replicas[r].id.as_bytes(),
            )
        };
        key(a).cmp(&key(b))
    }

    fn least_loaded(&self, eligible: impl Fn(usize, &Self) -> bool) -> Option<usize> {
        (0..self.replicas.len())
            .filter(|&r| eligible(r, self))
            .min_by(|&a, &b| self.tie_break(a, b))
    }
}

/// The end of a holder list.
const NO_NODE: u32 = u32::MAX;

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

    fn write_usize(&mut self, value: usize) {
        self.write_u64(value as u64);
    }
}

type BuildBlockHasher = BuildHasherDefault<BlockHasher>;

#[cfg(test)]
mod tests;
