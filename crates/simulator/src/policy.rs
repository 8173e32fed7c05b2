//! The routing policies compared: each deciding one step's requests at a time ([`Policy`]), or
//! each request the moment it arrives ([`OnlinePolicy`], served by [`crate::arrivals`]).
//!
//! A policy sees only the requests and what it has itself recorded; never the replicas' real
//! caches. "Load" is the number of requests a policy has sent to a replica in the current step:
//! a step's requests run concurrently and the previous step's have finished.

use std::collections::HashMap;

use burst_prefix_planner::{
    assign, assign_with_memory, Arrival, BatchRequest, InFlight, InFlightSettings, Memory,
    MemorySettings, PlacementId, PlanParams, Replica,
};

use crate::cache::BlockCache;
use crate::workload::HashedRequest;

/// Routes the requests of one step.
pub trait Policy {
    /// The name shown in reports.
    fn name(&self) -> &'static str;

    /// A replica index (`0..replicas`) per request of `step`, in its arrival order.
    fn route(&mut self, step: &[HashedRequest]) -> Vec<usize>;
}

/// Places requests one at a time.
pub trait OnlinePolicy {
    /// The name shown in reports.
    fn name(&self) -> &'static str;

    /// The replica (`0..replicas`) for `request`, arriving at `now_ms`; `request_id` is its
    /// handle for `complete`. `group_size` is how many requests of its step have its prompt,
    /// as a client sending n samples knows (`None` for a prompt sent once).
    fn place(
        &mut self,
        request: &HashedRequest,
        group_size: Option<usize>,
        request_id: usize,
        now_ms: u64,
    ) -> usize;

    /// `request_id` completed at `now_ms`.
    fn complete(&mut self, request_id: usize, now_ms: u64);
}

/// The replica with the lowest load among `candidates`; ties go to the lower index.
fn least_loaded(loads: &[u64], candidates: impl IntoIterator<Item = usize>) -> usize {
    candidates
        .into_iter()
        .min_by_key(|&r| (loads[r], r))
        .expect("at least one replica")
}

/// Cycles through the replicas, carrying on across steps.
#[derive(Debug)]
pub struct RoundRobin {
    replicas: usize,
    next: usize,
}

impl RoundRobin {
    pub fn new(replicas: usize) -> Self {
        RoundRobin { replicas, next: 0 }
    }
}

impl Policy for RoundRobin {
    fn name(&self) -> &'static str {
        "round-robin"
    }

    fn route(&mut self, step: &[HashedRequest]) -> Vec<usize> {
        step.iter()
            .map(|_| {
                let replica = self.next % self.replicas;
                self.next = (self.next + 1) % self.replicas;
                replica
            })
            .collect()
    }
}

/// Each request to the replica with the fewest prompt tokens routed to it in this step (what a
/// KV-cache-utilization scorer sees), ties to fewer requests, then the lower index. Blind to
/// prefixes: it balances well and shares little.
#[derive(Debug)]
pub struct LeastLoaded {
    replicas: usize,
}

impl LeastLoaded {
    pub fn new(replicas: usize) -> Self {
        LeastLoaded { replicas }
    }
}

impl Policy for LeastLoaded {
    fn name(&self) -> &'static str {
        "least-loaded"
    }

    fn route(&mut self, step: &[HashedRequest]) -> Vec<usize> {
        // (prompt tokens, requests) per replica.
        let mut loads = vec![(0u64, 0u64); self.replicas];
        step.iter()
            .map(|request| {
                let replica = (0..self.replicas)
                    .min_by_key(|&r| (loads[r], r))
                    .expect("at least one replica");
                loads[replica].0 += request.tokens();
                loads[replica].1 += 1;
                replica
            })
            .collect()
    }
}

/// An approximate prefix index (as llm-d's approximate prefix-cache scorer keeps): per replica,
/// an LRU set of the blocks routed there, as large as a replica's cache. A request goes to the
/// replica with the longest indexed prefix, ties to the least loaded. The index is updated with
/// the step's routing only after the step: requests that arrive together all see the index as
/// it was before it, so a burst of identical cold prompts is spread like least-loaded would.
#[derive(Debug)]
pub struct ApproxPrefix {
    index: Vec<BlockCache>,
}

impl ApproxPrefix {
    pub fn new(replicas: usize, index_blocks: usize) -> Self {
        ApproxPrefix {
            index: vec![BlockCache::new(index_blocks); replicas],
        }
    }
}

impl Policy for ApproxPrefix {
    fn name(&self) -> &'static str {
        "approx-prefix"
    }

    fn route(&mut self, step: &[HashedRequest]) -> Vec<usize> {
        let replicas = self.index.len();
        let mut loads = vec![0; replicas];
        let mut matches = vec![0; replicas];
        let routes: Vec<usize> = step
            .iter()
            .map(|request| {
                for (r, index) in self.index.iter().enumerate() {
                    matches[r] = index.prefix_hits(&request.blocks);
                }
                let best = matches.iter().copied().max().unwrap_or(0);
                let replica = least_loaded(&loads, (0..replicas).filter(|&r| matches[r] == best));
                loads[replica] += 1;
                replica
            })
            .collect();
        for (request, &replica) in step.iter().zip(&routes) {
            self.index[replica].touch(&request.blocks);
        }
        routes
    }
}

/// Thresholds of [`CacheAware`]; the defaults are SGLang's router's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CacheAwareParams {
    /// Follow the best prefix match only when it covers more than this share of the prompt.
    pub cache_threshold: f64,
    /// The cluster is imbalanced when `max_load - min_load` exceeds this ...
    pub balance_abs_threshold: u64,
    /// ... and `max_load` exceeds this times `min_load`.
    pub balance_rel_threshold: f64,
}

impl Default for CacheAwareParams {
    fn default() -> Self {
        CacheAwareParams {
            cache_threshold: 0.3,
            balance_abs_threshold: 64,
            balance_rel_threshold: 1.5,
        }
    }
}

/// SGLang's cache-aware router: a per-replica prefix index updated synchronously as each
/// request is routed. When the loads are imbalanced (both thresholds exceeded) a request goes
/// to the least loaded replica; otherwise to the replica with the longest indexed prefix when
/// its share of the prompt's tokens exceeds `cache_threshold`, else to the least loaded. (SGLang
/// picks the replica with the smallest tree in that last case; least-loaded is used here.)
#[derive(Debug)]
pub struct CacheAware {
    index: Vec<BlockCache>,
    params: CacheAwareParams,
}

impl CacheAware {
    pub fn new(replicas: usize, index_blocks: usize, params: CacheAwareParams) -> Self {
        CacheAware {
            index: vec![BlockCache::new(index_blocks); replicas],
            params,
        }
    }
}

impl Policy for CacheAware {
    fn name(&self) -> &'static str {
        "cache-aware"
    }

    fn route(&mut self, step: &[HashedRequest]) -> Vec<usize> {
        let replicas = self.index.len();
        let mut loads = vec![0u64; replicas];
        step.iter()
            .map(|request| {
                let max = loads.iter().copied().max().unwrap_or(0);
                let min = loads.iter().copied().min().unwrap_or(0);
                let imbalanced = max - min > self.params.balance_abs_threshold
                    && max as f64 > self.params.balance_rel_threshold * min as f64;
                let replica = if imbalanced {
                    least_loaded(&loads, 0..replicas)
                } else {
                    let hits: Vec<usize> = self
                        .index
                        .iter()
                        .map(|index| index.prefix_hits(&request.blocks))
                        .collect();
                    let best_hits = hits.iter().copied().max().unwrap_or(0);
                    let best =
                        least_loaded(&loads, (0..replicas).filter(|&r| hits[r] == best_hits));
                    let matched: u64 = request.block_tokens[..best_hits].iter().sum();
                    let total = request.tokens();
                    if total > 0 && matched as f64 / total as f64 > self.params.cache_threshold {
                        best
                    } else {
                        least_loaded(&loads, 0..replicas)
                    }
                };
                self.index[replica].touch(&request.blocks);
                loads[replica] += 1;
                replica
            })
            .collect()
    }
}

/// Ours: the real planner on each step's window, with memory across windows
/// ([`assign_with_memory`], docs/behaviour.md §7: `burst`) or without ([`assign`],
/// docs/behaviour.md §4 exactly: `burst-nomem`). Requests it gives no affinity go to the least
/// loaded replica (by requests of the step), as a gateway's load scorers would send them. Steps are
/// `step_ms` apart on the memory's clock.
#[derive(Debug)]
pub struct Burst {
    ids: Vec<String>,
    params: PlanParams,
    memory: Option<Memory>,
    step_ms: u64,
    now_ms: u64,
}

impl Burst {
    pub fn new(
        replicas: usize,
        params: PlanParams,
        memory: Option<MemorySettings>,
        step_ms: u64,
    ) -> Self {
        Burst {
            ids: replica_ids(replicas),
            params,
            memory: memory.map(Memory::new),
            step_ms,
            now_ms: 0,
        }
    }
}

impl Policy for Burst {
    fn name(&self) -> &'static str {
        if self.memory.is_some() {
            "burst"
        } else {
            "burst-nomem"
        }
    }

    fn route(&mut self, step: &[HashedRequest]) -> Vec<usize> {
        let replicas: Vec<Replica<'_>> = self.ids.iter().map(|id| Replica::new(id)).collect();
        let batch: Vec<BatchRequest<'_>> = step
            .iter()
            .map(|request| BatchRequest {
                blocks: &request.blocks,
                allowed_replicas: None,
            })
            .collect();
        let plan = match &mut self.memory {
            Some(memory) => {
                assign_with_memory(&batch, &replicas, &self.params, memory, self.now_ms)
            }
            None => assign(&batch, &replicas, &self.params),
        };
        self.now_ms += self.step_ms;
        let mut loads = vec![0; replicas.len()];
        for &replica in plan.assignments.iter().flatten() {
            loads[replica] += 1;
        }
        plan.assignments
            .iter()
            .map(|assigned| {
                assigned.unwrap_or_else(|| {
                    let replica = least_loaded(&loads, 0..replicas.len());
                    loads[replica] += 1;
                    replica
                })
            })
            .collect()
    }
}

/// Ids zero-padded, so that the planner's byte-wise id tie-break follows the index.
fn replica_ids(replicas: usize) -> Vec<String> {
    let width = replicas.saturating_sub(1).to_string().len();
    (0..replicas).map(|r| format!("r{r:0width$}")).collect()
}

/// Ours without a window ([`InFlight`], zero-wait mode): each request placed as it arrives,
/// from the placements in flight and, with memory, the cache models. `zero-wait` hears every
/// completion, as the proxy does; `zero-wait-decay` does not, as the endpoint picker and
/// `/v1/produce` do not, and lets each placement's load decay with a half-life instead. Both
/// pass the number of identical prompts of a step as the group size (a client sending n
/// samples knows n). The memory's touches are merged before each placement.
#[derive(Debug)]
pub struct ZeroWait {
    params: PlanParams,
    in_flight: InFlight,
    memory: Option<Memory>,
    /// Without completions heard: `None`.
    placements: Option<HashMap<usize, PlacementId>>,
}

impl ZeroWait {
    /// `decay_half_life_ms`: `None` hears completions, `Some` decays loads instead.
    pub fn new(
        replicas: usize,
        params: PlanParams,
        memory: Option<MemorySettings>,
        decay_half_life_ms: Option<u64>,
    ) -> Self {
        let mut in_flight = InFlight::new(InFlightSettings {
            load_half_life_ms: decay_half_life_ms.unwrap_or(0),
        });
        let ids = replica_ids(replicas);
        let list: Vec<Replica<'_>> = ids.iter().map(|id| Replica::new(id)).collect();
        in_flight.set_replicas(&list);
        ZeroWait {
            params,
            in_flight,
            memory: memory.map(Memory::new),
            placements: decay_half_life_ms.is_none().then(HashMap::new),
        }
    }
}

impl OnlinePolicy for ZeroWait {
    fn name(&self) -> &'static str {
        match (&self.placements, &self.memory) {
            (Some(_), Some(_)) => "zero-wait",
            (Some(_), None) => "zero-wait-nomem",
            (None, Some(_)) => "zero-wait-decay",
            (None, None) => "zero-wait-decay-nomem",
        }
    }

    fn place(
        &mut self,
        request: &HashedRequest,
        group_size: Option<usize>,
        request_id: usize,
        now_ms: u64,
    ) -> usize {
        if let Some(memory) = &mut self.memory {
            memory.settle();
        }
        let arrival = Arrival {
            blocks: &request.blocks,
            allowed_replicas: None,
            group_size,
            // The simulator's requests name no answer length: priced at the configured one.
            max_answer_tokens: None,
            expected_answer_tokens: None,
        };
        let placement = self
            .in_flight
            .place(&arrival, &self.params, self.memory.as_mut(), now_ms);
        if let Some(placements) = &mut self.placements {
            placements.insert(request_id, placement.id);
        }
        placement.replica.expect("a replica for every request")
    }

    fn complete(&mut self, request_id: usize, now_ms: u64) {
        if let Some(id) = self
            .placements
            .as_mut()
            .and_then(|placements| placements.remove(&request_id))
        {
            self.in_flight.finish(id, now_ms);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burst_prefix_planner::BalanceBy;

    fn request(blocks: &[u64]) -> HashedRequest {
        HashedRequest {
            blocks: blocks.to_vec(),
            block_tokens: vec![4; blocks.len()],
        }
    }

    #[test]
    fn round_robin_carries_on_across_steps() {
        let mut policy = RoundRobin::new(3);
        let step = vec![request(&[1]); 2];
        assert_eq!(policy.route(&step), vec![0, 1]);
        assert_eq!(policy.route(&step), vec![2, 0]);
    }

    #[test]
    fn least_loaded_balances_prompt_tokens() {
        let mut policy = LeastLoaded::new(2);
        let step = [
            request(&[1, 2, 3]),
            request(&[4]),
            request(&[5]),
            request(&[6]),
        ];
        // 12 tokens on r0; r1 takes the next three (4, 8, then 12 tokens, ties to fewer requests).
        assert_eq!(policy.route(&step), vec![0, 1, 1, 1]);
    }

    #[test]
    fn approx_prefix_is_cold_within_a_step_and_warm_after_it() {
        let mut policy = ApproxPrefix::new(2, 100);
        let step = vec![request(&[1, 2]); 4];
        assert_eq!(policy.route(&step), vec![0, 1, 0, 1]);
        // Both replicas now hold [1, 2]: ties go to the least loaded.
        assert_eq!(policy.route(&step), vec![0, 1, 0, 1]);
        // A prompt seen only on replica 0 follows it.
        let mut policy = ApproxPrefix::new(2, 100);
        policy.route(&[request(&[5, 6])]);
        assert_eq!(
            policy.route(&[request(&[5, 7]), request(&[5, 6, 8])]),
            vec![0, 0]
        );
    }

    #[test]
    fn cache_aware_follows_its_index_until_imbalanced() {
        let params = CacheAwareParams {
            cache_threshold: 0.5,
            balance_abs_threshold: 2,
            balance_rel_threshold: 1.5,
        };
        let mut policy = CacheAware::new(2, 100, params);
        // The first copy goes to the least loaded replica and the next ones follow it until the
        // load gap exceeds 2; the fourth goes to the least loaded, after which both replicas
        // hold the prompt and ties go to the least loaded.
        let routes = policy.route(&vec![request(&[1, 2]); 5]);
        assert_eq!(routes, vec![0, 0, 0, 1, 1]);
        // A match of 1 block in 4 (25%) is under the threshold: least loaded.
        let mut policy = CacheAware::new(2, 100, params);
        assert_eq!(
            policy.route(&[request(&[1]), request(&[1, 7, 8, 9])]),
            vec![0, 1]
        );
    }

    #[test]
    fn burst_places_groups_and_spreads_the_rest() {
        let params = PlanParams {
            max_per_replica: None,
            min_colocate_blocks: 0,
            balance_by: BalanceBy::Requests,
            ..PlanParams::default()
        };
        let mut policy = Burst::new(2, params, None, 1_000);
        assert_eq!(policy.name(), "burst-nomem");
        let mut step = vec![request(&[1, 2]); 3];
        step.push(request(&[9]));
        step.push(request(&[8]));
        // The group of three on r0; the lone requests have no affinity: least loaded.
        assert_eq!(policy.route(&step), vec![0, 0, 0, 1, 1]);
    }

    #[test]
    fn burst_with_memory_keeps_a_session_where_it_was() {
        let params = PlanParams::default();
        let settings = MemorySettings {
            capacity_blocks: std::num::NonZeroUsize::new(100).unwrap(),
            load_half_life_ms: 1_000,
        };
        let mut policy = Burst::new(2, params, Some(settings), 1_000);
        assert_eq!(policy.name(), "burst");
        // Two sessions sharing a first block: placed apart by the fair share.
        let first = policy.route(&[request(&[1, 2]), request(&[1, 3])]);
        assert_ne!(first[0], first[1]);
        // Their next turns, in the other order, go back where they were.
        let second = policy.route(&[request(&[1, 3, 5]), request(&[1, 2, 4])]);
        assert_eq!(second, vec![first[1], first[0]]);
    }
}
