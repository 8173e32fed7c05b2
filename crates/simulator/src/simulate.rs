//! The cluster model and its accounting.
//!
//! `R` replicas each keep a [`BlockCache`] of `C` blocks. A step's requests are served in
//! arrival order, each on the replica its policy chose: the request's leading blocks held by that
//! replica's cache are free (whether cached before the step or prefilled earlier in the same step
//! on that replica), the rest are prefilled, and then all its blocks are touched in the cache.
//! A replica's *work* in a step is the tokens it prefilled in that step.
//!
//! [`simulate_on_slots`] also models an engine's slots (llama.cpp's `--parallel`, vLLM's
//! concurrent sequences): requests computed at the same time on one replica cannot use each
//! other's blocks, as two slots prefilling the same prompt at once both compute it.

use std::collections::{BTreeMap, HashMap, HashSet};

use burst_prefix_planner::BlockHash;

use crate::cache::BlockCache;
use crate::policy::Policy;
use crate::workload::HashedRequest;

/// The simulated replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cluster {
    pub replicas: usize,
    /// Blocks each replica's prefix cache holds.
    pub cache_blocks: usize,
}

/// What one policy cost over a run.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub policy: &'static str,
    /// Tokens prefilled, summed over replicas and steps.
    pub prefill_tokens: u64,
    /// The step time proxy: the busiest replica's work, summed over steps.
    pub step_time_tokens: u64,
    pub requests: u64,
    /// Requests that share at least their first block with another request of their step.
    pub sharing_requests: u64,
    /// Sharing requests that were co-located (see [`Outcome::colocation_rate`]).
    pub colocated_requests: u64,
    replicas: usize,
}

impl Outcome {
    /// Nothing counted yet.
    pub(crate) fn new(policy: &'static str, replicas: usize) -> Self {
        Outcome {
            policy,
            prefill_tokens: 0,
            step_time_tokens: 0,
            requests: 0,
            sharing_requests: 0,
            colocated_requests: 0,
            replicas,
        }
    }

    /// Counts one step served: per request its replica and the leading blocks its replica held
    /// when it started, and per replica the tokens it prefilled.
    pub(crate) fn add_step(
        &mut self,
        step: &[HashedRequest],
        routes: &[usize],
        hits: &[usize],
        work: &[u64],
    ) {
        self.prefill_tokens += work.iter().sum::<u64>();
        self.step_time_tokens += work.iter().copied().max().unwrap_or(0);
        self.requests += step.len() as u64;
        let (sharing, colocated) = colocation(step, routes, hits);
        self.sharing_requests += sharing;
        self.colocated_requests += colocated;
    }

    /// Busiest-replica work over mean replica work, as a ratio of sums over the steps:
    /// `Σ_s max_r work(s, r) / Σ_s mean_r work(s, r)`, i.e. the step time proxy over the step time
    /// a perfectly even spread of the same prefill would take. A step weighs as much as it
    /// prefills, so an almost fully cached step cannot swing the figure. 1 is perfect; 1 when
    /// nothing was prefilled at all.
    pub fn imbalance(&self) -> f64 {
        if self.prefill_tokens == 0 {
            1.0
        } else {
            self.step_time_tokens as f64 * self.replicas as f64 / self.prefill_tokens as f64
        }
    }

    /// Of the requests that share a prefix with another request of their step, the fraction
    /// that were co-located, `None` when no request shares.
    ///
    /// Let `L` be the longest prefix (in blocks, >= 1) a request shares with any other request
    /// of its step. It is co-located when its replica held those `L` blocks as it was served
    /// (cached before the step, or prefilled earlier in the step), or when another request of
    /// the step sharing those `L` blocks was served on the same replica (so the first of a
    /// co-located group counts too, and 1.0 is reachable).
    pub fn colocation_rate(&self) -> Option<f64> {
        (self.sharing_requests > 0)
            .then(|| self.colocated_requests as f64 / self.sharing_requests as f64)
    }
}

/// The lower bound on prefill tokens for any policy: every distinct block prefilled exactly
/// once in the whole cluster, on its first appearance in the run. Per step, it counts the
/// tokens of the distinct blocks of that step that no earlier step had (those are taken as
/// cached from before, as with an unbounded cache on the right replica); summed over the steps.
/// No policy can do better, since a block's first appearance is cached nowhere.
pub fn lower_bound(steps: &[Vec<HashedRequest>]) -> u64 {
    let mut seen: HashSet<BlockHash> = HashSet::new();
    steps
        .iter()
        .flatten()
        .flat_map(|request| request.blocks.iter().zip(&request.block_tokens))
        .filter(|(block, _)| seen.insert(**block))
        .map(|(_, tokens)| tokens)
        .sum()
}

/// Runs one policy over all steps, each on fresh replicas with empty caches.
pub fn simulate(
    steps: &[Vec<HashedRequest>],
    cluster: Cluster,
    policy: &mut dyn Policy,
) -> Outcome {
    simulate_on_slots(
        steps,
        cluster,
        Slots {
            per_replica: 1,
            overhead_tokens: 0,
        },
        policy,
    )
}

/// An engine's slots: how many requests a replica computes at once, and what a request costs
/// besides its prefill (decoding, in prefill-token equivalents), for [`simulate_on_slots`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slots {
    pub per_replica: usize,
    pub overhead_tokens: u64,
}

/// [`simulate`] on replicas whose slots compute requests side by side. Within a step, each
/// replica takes its requests in arrival order, each on the slot that frees first; a request
/// takes its prefilled tokens plus the overhead, in token time. It sees the blocks of the
/// requests that finished by the time it starts (and of every earlier step), not of those still
/// computing on the other slots: llama.cpp, for one, shares no KV cache between slots in flight.
/// One slot is [`simulate`].
pub fn simulate_on_slots(
    steps: &[Vec<HashedRequest>],
    cluster: Cluster,
    slots: Slots,
    policy: &mut dyn Policy,
) -> Outcome {
    assert!(slots.per_replica >= 1, "a replica has at least one slot");
    let mut caches = vec![BlockCache::new(cluster.cache_blocks); cluster.replicas];
    let mut outcome = Outcome::new(policy.name(), cluster.replicas);
    for step in steps {
        let routes = policy.route(step);
        assert_eq!(
            routes.len(),
            step.len(),
            "{} routed a step partly",
            policy.name()
        );
        let mut work = vec![0u64; cluster.replicas];
        let mut hits = Vec::with_capacity(step.len());
        // Per replica: when each slot frees, and the requests still computing, by (finish, order).
        let mut free_at = vec![vec![0u64; slots.per_replica]; cluster.replicas];
        let mut computing: Vec<BTreeMap<(u64, usize), &[BlockHash]>> =
            vec![BTreeMap::new(); cluster.replicas];
        for (order, (request, &replica)) in step.iter().zip(&routes).enumerate() {
            assert!(
                replica < cluster.replicas,
                "{} chose replica {replica}",
                policy.name()
            );
            let cache = &mut caches[replica];
            let (slot, start) = free_at[replica]
                .iter()
                .copied()
                .enumerate()
                .min_by_key(|&(slot, at)| (at, slot))
                .expect("at least one slot");
            while let Some(entry) = computing[replica].first_entry() {
                if entry.key().0 > start {
                    break;
                }
                cache.touch(entry.remove());
            }
            let held = cache.prefix_hits(&request.blocks);
            let prefilled = request.block_tokens[held..].iter().sum::<u64>();
            work[replica] += prefilled;
            let finish = start + prefilled + slots.overhead_tokens;
            free_at[replica][slot] = finish;
            computing[replica].insert((finish, order), &request.blocks);
            hits.push(held);
        }
        // The step ends when all its requests are done.
        for (cache, done) in caches.iter_mut().zip(&mut computing) {
            for blocks in std::mem::take(done).into_values() {
                cache.touch(blocks);
            }
        }
        outcome.add_step(step, &routes, &hits, &work);
    }
    outcome
}

/// (sharing, co-located) requests of one step, as [`Outcome::colocation_rate`] defines them.
fn colocation(step: &[HashedRequest], routes: &[usize], hits: &[usize]) -> (u64, u64) {
    // Chained hashes: two requests share their first L blocks iff both hold block L-1.
    let mut in_step: HashMap<BlockHash, u32> = HashMap::new();
    let mut on_replica: HashMap<(usize, BlockHash), u32> = HashMap::new();
    for (request, &replica) in step.iter().zip(routes) {
        for &block in &request.blocks {
            *in_step.entry(block).or_default() += 1;
            *on_replica.entry((replica, block)).or_default() += 1;
        }
    }
    let mut sharing = 0;
    let mut colocated = 0;
    for ((request, &replica), &held) in step.iter().zip(routes).zip(hits) {
        let shared = request
            .blocks
            .iter()
            .take_while(|block| in_step[block] >= 2)
            .count();
        if shared == 0 {
            continue;
        }
        sharing += 1;
        if held >= shared || on_replica[&(replica, request.blocks[shared - 1])] >= 2 {
            colocated += 1;
        }
    }
    (sharing, colocated)
}

#[cfg(test)]
mod tests;
