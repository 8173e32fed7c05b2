//! Requests arriving over time inside a step, for policies that place each one the moment it
//! arrives (zero-wait) and hear when it completes.
//!
//! A step's requests arrive in their order, at seeded uniform times within `spread_ms` of the
//! step's start; a step starts when the one before has completed (as [`crate::simulate`] counts
//! steps apart). Each replica prefills its requests one at a time, in the order they reach it,
//! at `prefill_tokens_per_ms`; a request then decodes for `decode_ms` beside the others (an
//! engine batches decodes) and completes. Its blocks are cached once its prefill ends. So a
//! replica's prefill work is counted exactly as [`crate::simulate::simulate`] counts it for the
//! same routes; what differs is that the policy decides with only the requests before it known,
//! and the completions so far.

use std::collections::BTreeMap;

use crate::cache::BlockCache;
use crate::policy::OnlinePolicy;
use crate::rng::SplitMix64;
use crate::simulate::{Cluster, Outcome};
use crate::workload::HashedRequest;

/// How requests arrive and are served.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timing {
    /// A step's requests arrive within this long of its start.
    pub spread_ms: u64,
    pub prefill_tokens_per_ms: f64,
    /// After its prefill, a request completes this much later.
    pub decode_ms: u64,
    /// Seeds the arrival times.
    pub seed: u64,
}

/// Runs one online policy over all steps, on fresh replicas with empty caches.
pub fn simulate_arrivals(
    steps: &[Vec<HashedRequest>],
    cluster: Cluster,
    timing: Timing,
    policy: &mut dyn OnlinePolicy,
) -> Outcome {
    let mut caches = vec![BlockCache::new(cluster.cache_blocks); cluster.replicas];
    let mut outcome = Outcome::new(policy.name(), cluster.replicas);
    let mut rng = SplitMix64::new(timing.seed);
    let mut step_start = 0u64;
    let mut next_id = 0usize;
    for step in steps {
        // Arrival offsets, sorted: the step's order is its arrival order.
        let mut offsets: Vec<u64> = step
            .iter()
            .map(|_| rng.below(timing.spread_ms + 1))
            .collect();
        offsets.sort_unstable();
        let mut group_sizes: BTreeMap<&[u64], usize> = BTreeMap::new();
        for request in step {
            *group_sizes.entry(&request.blocks).or_default() += 1;
        }
        let mut work = vec![0u64; cluster.replicas];
        let mut routes = Vec::with_capacity(step.len());
        let mut hits = Vec::with_capacity(step.len());
        // Per replica: when its prefill queue frees, and the blocks of requests prefilling.
        let mut free_at = vec![step_start as f64; cluster.replicas];
        let mut prefilling: Vec<Vec<(f64, &[u64])>> = vec![Vec::new(); cluster.replicas];
        // Completions to tell the policy: (time, request id).
        let mut completions: BTreeMap<(u64, usize), ()> = BTreeMap::new();
        for (request, offset) in step.iter().zip(offsets) {
            let now = step_start + offset;
            while let Some(entry) = completions.first_entry() {
                let (at, id) = *entry.key();
                if at > now {
                    break;
                }
                entry.remove();
                policy.complete(id, at);
            }
            let id = next_id;
            next_id += 1;
            let group_size = Some(group_sizes[request.blocks.as_slice()]).filter(|&n| n > 1);
            let replica = policy.place(request, group_size, id, now);
            assert!(
                replica < cluster.replicas,
                "{} chose replica {replica}",
                policy.name()
            );
            // One prefill at a time: every earlier request on this replica is cached by the
            // time this one starts.
            for (_, blocks) in prefilling[replica].drain(..) {
                caches[replica].touch(blocks);
            }
            let held = caches[replica].prefix_hits(&request.blocks);
            let prefilled = request.block_tokens[held..].iter().sum::<u64>();
            work[replica] += prefilled;
            let start = free_at[replica].max(now as f64);
            let end = start + prefilled as f64 / timing.prefill_tokens_per_ms;
            free_at[replica] = end;
            prefilling[replica].push((end, &request.blocks));
            completions.insert((end.ceil() as u64 + timing.decode_ms, id), ());
            routes.push(replica);
            hits.push(held);
        }
        // The step ends when all its requests are done.
        for ((at, id), ()) in completions {
            policy.complete(id, at);
            step_start = step_start.max(at);
        }
        for (cache, done) in caches.iter_mut().zip(prefilling) {
            for (_, blocks) in done {
                cache.touch(blocks);
            }
        }
        outcome.add_step(step, &routes, &hits, &work);
    }
    outcome
}
