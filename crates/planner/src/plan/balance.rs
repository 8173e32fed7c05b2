//! How a unit's first replica is balanced against its prefix: the fair share of step 4, or with
//! memory in tokens mode the replica where the unit finishes first, its copies priced.

use std::cmp::{Ordering, Reverse};

use super::units::Unit;
use super::{BalanceBy, PlanParams};

/// Step 4: the fair share that bounds the prefix-preference path (with memory it shares the
/// carried-over load too).
pub(super) fn max_share(units: &[Unit<'_>], carried: &[u64], params: &PlanParams) -> u64 {
    let total = match params.balance_by {
        BalanceBy::Requests => units.iter().map(|unit| unit.members.len()).sum::<usize>(),
        BalanceBy::Tokens => units.iter().map(|unit| unit.blocks.len()).sum(),
    } as u64;
    (total + carried.iter().sum::<u64>()).div_ceil(carried.len() as u64)
}

/// How a unit's first replica is balanced against its prefix.
pub(super) enum Balance {
    /// §4: the longest prefix among replicas under the fair share, else the least-loaded.
    FairShare { max_share: u64 },
    /// With memory in tokens mode, where load and prefill are both blocks: where the unit
    /// finishes first, pricing the blocks it would prefill again (`earliest_finish`).
    EarliestFinish,
}

/// A replica as `earliest_finish` ranks it: the leading blocks of the unit it holds (0 when
/// fewer than the preference needs), its load, and step 6's key.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Candidate<K> {
    pub(crate) replica: usize,
    pub(crate) held: usize,
    pub(crate) load: f64,
    pub(crate) key: K,
}

/// The candidate holding a prefix where a unit of `blocks` blocks finishes first, if it beats
/// `coldest` (the least-loaded replica). Finishing is the replica's load plus the blocks
/// prefilled there, plus a price for each block it would prefill although another replica holds
/// it: `COPY_PRICE_PER_BLOCK`, and `SPLIT_PRICE_PER_BLOCK` divided among the units that use the
/// block (`shared_by(depth)`, 1 for a block of the unit's own). So a conversation (its history
/// used by one unit) moves only to a replica lighter by many times its history, while a system
/// prompt that a fan-out of many units shares is copied to another replica once the holders run
/// ahead by about the prompt's own length. Ties go to the longer prefix, then to step 6's order.
///
/// A prefix that other units share is followed only to a replica that stays under `PILE_CAP`
/// (`within_pile_cap`, with `(total load, replicas)`): with few units, the price alone would
/// pile them all onto the first replica given their prompt.
pub(crate) fn earliest_finish<K: Ord + Copy>(
    blocks: usize,
    candidates: impl Iterator<Item = Candidate<K>> + Clone,
    coldest: Candidate<K>,
    shared_by: impl Fn(usize) -> u32,
    (total_load, replicas): (f64, usize),
    price_from: &mut Vec<f64>,
) -> Option<usize> {
    let longest = candidates.clone().map(|c| c.held).max()?;
    // price_from[i]: the price of blocks i..longest, which a replica holding i lacks.
    price_from.clear();
    price_from.resize(longest + 1, 0.0);
    for i in (0..longest).rev() {
        price_from[i] = price_from[i + 1]
            + COPY_PRICE_PER_BLOCK
            + SPLIT_PRICE_PER_BLOCK / f64::from(shared_by(i));
    }
    let finish = |c: &Candidate<K>| c.load + (blocks - c.held) as f64 + price_from[c.held];
    // Ordered by finish, then the longer prefix, then step 6's order.
    let rank = |c: &Candidate<K>| (finish(c), Reverse(c.held), c.key);
    // The first of the lowest rank (each ranked once).
    let mut best: Option<(usize, _)> = None;
    let eligible = candidates.filter(|c| {
        c.held > 0
            && (shared_by(c.held - 1) == 1
                || within_pile_cap(blocks, c.held, c.load, total_load, replicas))
    });
    for c in eligible {
        let rank_c = rank(&c);
        let lower = |(_, best_rank): &(usize, _)| {
            rank_c.partial_cmp(best_rank).expect("finite") == Ordering::Less
        };
        if best.as_ref().is_none_or(lower) {
            best = Some((c.replica, rank_c));
        }
    }
    let (best, best_rank) = best?;
    (best_rank <= rank(&coldest)).then_some(best)
}

/// Whether a replica with `load`, holding `held` leading blocks of a unit of `blocks` blocks,
/// would stay under `PILE_CAP` with it: its load, plus the blocks it would prefill, within
/// `PILE_CAP` times the mean load after them (of `total_load` over `replicas`), or times the
/// unit's own blocks when those are more (among a few units, the mean is a fraction of one).
fn within_pile_cap(
    blocks: usize,
    held: usize,
    load: f64,
    total_load: f64,
    replicas: usize,
) -> bool {
    let prefill = (blocks - held) as f64;
    let mean = (total_load + prefill) / replicas as f64;
    load + prefill <= PILE_CAP * mean.max(blocks as f64)
}

/// `earliest_finish`'s price, in blocks of load, of prefilling a block again that another
/// replica holds: this much always, plus `SPLIT_PRICE_PER_BLOCK` shared among the window's units
/// that use the block. Chosen with the simulator (BENCHMARKS.md, "Memory across windows"): the
/// only pair found that met the targets of multiturn and mixed on three seeds, with thin margins.
const COPY_PRICE_PER_BLOCK: f64 = 0.7;
const SPLIT_PRICE_PER_BLOCK: f64 = 12.0;

/// `within_pile_cap`'s bound on a replica that a unit follows a shared prefix to, in
/// times the mean load. Without it, at the engine bench's sizes (8 sessions or a fan-out of 16 on
/// 4 replicas) all the units of a window went to the first replica given their system prompt
/// (imbalance 2.0-3.2, on the engine and in the simulator). Chosen with the simulator
/// (BENCHMARKS.md, "A cap on piling"): 1.3 misses the mixed workload's prefill target at the
/// default sizes, 1.4 lets fan-outs pile again at the engine's.
const PILE_CAP: f64 = 1.35;
