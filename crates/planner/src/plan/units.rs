//! Steps 1-3 of the spec's placement: requests grouped by identical prompts, the units kept,
//! and their order; with memory, how many units share each leading block.

use std::cmp::Reverse;
use std::collections::HashMap;

use super::block_keys::{BuildBlockHasher, Chain};
use super::recall::Recall;
use super::BatchRequest;
use crate::prefixhash::BlockHash;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum UnitKind {
    Group,
    Single,
    /// A single whose prefix a replica's cache model holds (with memory only).
    Warm,
}

/// Requests placed together: a group of identical prompts, or one prefix-sharing single.
#[derive(Debug)]
pub(super) struct Unit<'a> {
    pub(super) blocks: &'a [BlockHash],
    /// Batch indices, in arrival order.
    pub(super) members: Vec<usize>,
    pub(super) kind: UnitKind,
    /// A replica's cache model holds its leading blocks (with memory only).
    pub(super) remembered: bool,
    /// With memory, per leading block that other units of the window share, how many units
    /// share it, themselves included (`count_sharers`): its shared prefix.
    pub(super) shared_by: Vec<u32>,
}

impl Unit<'_> {
    /// Its leading blocks that another unit of the window shares (with memory only).
    pub(super) fn shared(&self) -> usize {
        self.shared_by.len()
    }

    /// Its leading blocks that as many units share as its first: a prefix all of them start
    /// with (a system prompt), before any that fewer share.
    pub(super) fn widest_shared(&self) -> usize {
        let first = self.shared_by(0);
        self.shared_by
            .iter()
            .take_while(|&&sharers| sharers == first)
            .count()
    }

    /// The units of the window sharing its block at `depth` (1: its own).
    pub(super) fn shared_by(&self, depth: usize) -> u32 {
        self.shared_by.get(depth).copied().unwrap_or(1)
    }
}

/// Steps 1-3: group identical block sequences, keep the units, order them. A single that is no
/// unit by §4 becomes a warm one if `is_warm` says so; otherwise it gets no affinity, whatever
/// `balanceBy` is (§4 rule 2: the gateway's own scorers place it).
pub(super) fn form_units<'a>(
    batch: &[BatchRequest<'a>],
    min_colocate_blocks: usize,
    mut is_warm: impl FnMut(&[BlockHash]) -> bool,
) -> Vec<Unit<'a>> {
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
                remembered: false,
                shared_by: Vec::new(),
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
            unit.remembered = is_warm(unit.blocks);
            if unit.members.len() >= 2 {
                unit.kind = UnitKind::Group;
                Some(unit)
            } else if n > 0
                && unit.blocks.len() >= n
                && sharing_prefix[&Chain(&unit.blocks[..n])] >= 2
            {
                Some(unit)
            } else if unit.remembered {
                unit.kind = UnitKind::Warm;
                Some(unit)
            } else {
                None
            }
        })
        .collect();
    // Remembered units first (with memory: they have a replica to go back to, and the cold ones
    // balance around them), then groups, singles, warm singles; more blocks first; the stable
    // sort keeps arrival order on ties.
    units.sort_by_key(|unit| (!unit.remembered, unit.kind, Reverse(unit.blocks.len())));
    units
}

/// Sets each unit's `shared_by`: at each depth, how many units' chains agree with its own up
/// to that block, while two or more do. Found depth by depth among the units that agreed so
/// far, so a unit costs the blocks it shares, not all of its blocks. Returns how many
/// distinct shared blocks there are at most (one per run of agreeing units).
pub(super) fn count_sharers(units: &mut [Unit<'_>]) -> usize {
    let mut order: Vec<u32> = (0..units.len() as u32).collect();
    // (unit, sharers) at each depth a unit shares, each unit's in depth order.
    let mut found: Vec<(u32, u32)> = Vec::new();
    let mut shared = vec![0; units.len()];
    // Runs of `order` whose units agree on their blocks before `depth`: (depth, start, end).
    let mut runs = vec![(0, 0, order.len())];
    let mut shared_blocks = 0;
    while let Some((depth, start, end)) = runs.pop() {
        let block_at = |unit: u32| units[unit as usize].blocks.get(depth).copied();
        let run = &mut order[start..end];
        run.sort_unstable_by_key(|&unit| block_at(unit));
        let mut from = 0;
        while from < run.len() {
            let block = block_at(run[from]);
            let to = from + run[from..].partition_point(|&unit| block_at(unit) == block);
            if block.is_some() && to - from >= 2 {
                runs.push((depth + 1, start + from, start + to));
                shared_blocks += 1;
                // A unit's runs are found in depth order.
                for &unit in &run[from..to] {
                    found.push((unit, (to - from) as u32));
                    shared[unit as usize] += 1;
                }
            }
            from = to;
        }
    }
    // One allocation per unit, not one per doubling.
    for (unit, shared) in units.iter_mut().zip(shared) {
        unit.shared_by = Vec::with_capacity(shared);
    }
    for (unit, sharers) in found {
        units[unit as usize].shared_by.push(sharers);
    }
    shared_blocks
}

/// Orders the remembered units by how few units of the window share the prefix the models
/// remember (a conversation's own history first, a fan-out on a remembered system prompt
/// later), keeping `form_units`' order otherwise: the units with one good replica take it
/// before the flexible ones fill in around them. Measured with the simulator (BENCHMARKS.md):
/// with fan-outs placed first, conversations stayed on the replicas around them and the
/// chat-only windows of `mixed` ran at 1.3-1.4x the mean.
pub(super) fn most_constrained_first(units: &mut [Unit<'_>], recall: &mut Recall<'_>) {
    units.sort_by_cached_key(|unit| {
        // The remembered prefix: the first unheld block ends it. From the first block on (not
        // a binary search): the walk looks up these blocks again, and finds the shared ones
        // kept.
        let remembered = (0..unit.blocks.len())
            .take_while(|&depth| {
                let shared = depth < unit.shared();
                !recall.holders(unit.blocks[depth], shared).is_empty()
            })
            .count();
        let shared_by = match remembered {
            0 => u32::MAX,
            depth => unit.shared_by(depth - 1),
        };
        (!unit.remembered, shared_by)
    });
}
