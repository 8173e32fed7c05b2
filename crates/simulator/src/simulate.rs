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

use std::collections::{HashMap, HashSet, VecDeque};

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
    simulate_on_slots(steps, cluster, 1, policy)
}

/// [`simulate`] on replicas that each compute `slots` requests at once. A step's requests on a
/// replica are taken in arrival order by the first free slot, as if they took equally long: the
/// i-th one starts when the (i - slots)-th ends, so it sees the blocks of requests up to that
/// one (and of every earlier step) but not of the `slots - 1` computed beside it. One slot is
/// [`simulate`].
pub fn simulate_on_slots(
    steps: &[Vec<HashedRequest>],
    cluster: Cluster,
    slots: usize,
    policy: &mut dyn Policy,
) -> Outcome {
    assert!(slots >= 1, "a replica has at least one slot");
    let mut caches = vec![BlockCache::new(cluster.cache_blocks); cluster.replicas];
    // Per replica, the requests still being computed (their blocks not yet in the cache).
    let mut computing: Vec<VecDeque<&[BlockHash]>> = vec![VecDeque::new(); cluster.replicas];
    let mut outcome = Outcome {
        policy: policy.name(),
        prefill_tokens: 0,
        step_time_tokens: 0,
        requests: 0,
        sharing_requests: 0,
        colocated_requests: 0,
        replicas: cluster.replicas,
    };
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
        for (request, &replica) in step.iter().zip(&routes) {
            assert!(
                replica < cluster.replicas,
                "{} chose replica {replica}",
                policy.name()
            );
            let cache = &mut caches[replica];
            while computing[replica].len() >= slots {
                cache.touch(computing[replica].pop_front().expect("not empty"));
            }
            let held = cache.prefix_hits(&request.blocks);
            work[replica] += request.block_tokens[held..].iter().sum::<u64>();
            computing[replica].push_back(&request.blocks);
            hits.push(held);
        }
        // The step ends when all its requests are done.
        for (cache, done) in caches.iter_mut().zip(&mut computing) {
            for blocks in done.drain(..) {
                cache.touch(blocks);
            }
        }
        outcome.prefill_tokens += work.iter().sum::<u64>();
        outcome.step_time_tokens += work.iter().copied().max().unwrap_or(0);
        outcome.requests += step.len() as u64;
        let (sharing, colocated) = colocation(step, &routes, &hits);
        outcome.sharing_requests += sharing;
        outcome.colocated_requests += colocated;
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
