use super::*;
use crate::policy::{Burst, RoundRobin};
use crate::workload::{hash_steps, Grpo, Workload};
use burst_prefix_planner::{BalanceBy, BlockSpec, PlanParams};

const BLOCK: usize = 4;

fn request(tokens: &[u32]) -> HashedRequest {
    HashedRequest::new(tokens, BlockSpec::new(BLOCK, 0))
}

/// 12 tokens: 3 full blocks.
fn three_blocks(first: u32) -> HashedRequest {
    request(&(first..first + 12).collect::<Vec<_>>())
}

/// Routes by a fixed table, one row per step.
struct Fixed(Vec<Vec<usize>>);

impl Policy for Fixed {
    fn name(&self) -> &'static str {
        "fixed"
    }

    fn route(&mut self, _step: &[HashedRequest]) -> Vec<usize> {
        self.0.remove(0)
    }
}

fn burst(replicas: usize) -> Burst {
    Burst::new(
        replicas,
        PlanParams {
            max_per_replica: None,
            min_colocate_blocks: 0,
            balance_by: BalanceBy::Requests,
            ..PlanParams::default()
        },
        None,
        1_000,
    )
}

fn cluster(replicas: usize, cache_blocks: usize) -> Cluster {
    Cluster {
        replicas,
        cache_blocks,
    }
}

#[test]
fn identical_requests_round_robin_pays_per_replica_and_burst_once() {
    let steps = vec![vec![three_blocks(1); 4]];
    assert_eq!(lower_bound(&steps), 12);

    let rr = simulate(&steps, cluster(2, 100), &mut RoundRobin::new(2));
    // Two replicas each prefill the 3 blocks once: 2 x 3 blocks x 4 tokens.
    assert_eq!(rr.prefill_tokens, 24);
    assert_eq!(rr.step_time_tokens, 12);
    assert_eq!(rr.imbalance(), 1.0);
    // Each replica served two of the copies: all co-located.
    assert_eq!((rr.sharing_requests, rr.colocated_requests), (4, 4));

    let ours = simulate(&steps, cluster(2, 100), &mut burst(2));
    assert_eq!(ours.prefill_tokens, 12);
    // All the work on one of two replicas: max 12 over mean 6.
    assert_eq!(ours.step_time_tokens, 12);
    assert_eq!(ours.imbalance(), 2.0);
    assert_eq!(ours.colocation_rate(), Some(1.0));
}

#[test]
fn spread_copies_are_not_co_located() {
    let steps = vec![vec![three_blocks(1); 3]];
    let rr = simulate(&steps, cluster(3, 100), &mut RoundRobin::new(3));
    assert_eq!(rr.prefill_tokens, 36);
    assert_eq!(rr.colocation_rate(), Some(0.0));
    let ours = simulate(&steps, cluster(3, 100), &mut burst(3));
    assert_eq!(ours.prefill_tokens, 12);
    assert_eq!(ours.colocation_rate(), Some(1.0));
    assert_eq!(ours.imbalance(), 3.0);
}

#[test]
fn the_trailing_partial_block_costs_its_own_tokens() {
    // 10 tokens: blocks of 4, 4 and 2 tokens.
    let a = request(&(1..=10).collect::<Vec<_>>());
    // Shares the first two blocks of `a`, then 3 tokens of its own.
    let b = request(&(1..=8).chain([50, 51, 52]).collect::<Vec<_>>());
    let steps = vec![vec![a, b]];
    assert_eq!(lower_bound(&steps), 10 + 3);
    // Same replica: the second request prefills only its own block (within-step reuse).
    let same = simulate(&steps, cluster(2, 100), &mut Fixed(vec![vec![1, 1]]));
    assert_eq!(same.prefill_tokens, 13);
    assert_eq!(same.colocation_rate(), Some(1.0));
    let apart = simulate(&steps, cluster(2, 100), &mut Fixed(vec![vec![0, 1]]));
    assert_eq!(apart.prefill_tokens, 10 + 11);
    assert_eq!(apart.step_time_tokens, 11);
    assert_eq!(apart.colocation_rate(), Some(0.0));
}

#[test]
fn lru_eviction_with_a_small_cache() {
    let a = request(&(1..=10).collect::<Vec<_>>()); // 3 blocks: 4 + 4 + 2 tokens
    let b = request(&(100..108).collect::<Vec<_>>()); // 2 blocks: 4 + 4 tokens
    let steps = vec![vec![a.clone()], vec![b], vec![a]];
    // The bound counts each distinct block once: a later step's repeat is free.
    assert_eq!(lower_bound(&steps), 10 + 8);
    // 4 blocks of cache: b evicts a's tail block (2 tokens), which a prefills again.
    let small = simulate(&steps, cluster(1, 4), &mut RoundRobin::new(1));
    assert_eq!(small.prefill_tokens, 10 + 8 + 2);
    // 3 blocks: b evicts a's last two blocks.
    let smaller = simulate(&steps, cluster(1, 3), &mut RoundRobin::new(1));
    assert_eq!(smaller.prefill_tokens, 10 + 8 + 6);
    // 5 blocks: everything stays.
    let enough = simulate(&steps, cluster(1, 5), &mut RoundRobin::new(1));
    assert_eq!(enough.prefill_tokens, 18);
    // No cache at all: every request pays in full.
    let none = simulate(&steps, cluster(1, 0), &mut RoundRobin::new(1));
    assert_eq!(none.prefill_tokens, 28);
    // One request per step, none sharing: no co-location rate.
    assert_eq!(none.colocation_rate(), None);
}

#[test]
fn a_cached_prefix_counts_as_co_located() {
    let step = vec![three_blocks(1), three_blocks(1)];
    let steps = vec![vec![three_blocks(1)], step];
    // Step 1 warms replica 0; step 2 sends one copy there and one to replica 1.
    let outcome = simulate(
        &steps,
        cluster(2, 100),
        &mut Fixed(vec![vec![0], vec![0, 1]]),
    );
    assert_eq!(outcome.prefill_tokens, 24);
    assert_eq!(
        (outcome.sharing_requests, outcome.colocated_requests),
        (2, 1)
    );
    // The step-2 work is all on replica 1: 12 + 12 over (12 + 12) / 2.
    assert_eq!(outcome.step_time_tokens, 24);
    assert_eq!(outcome.imbalance(), 2.0);
}

#[test]
fn on_a_grpo_burst_burst_prefills_less_than_round_robin() {
    let workload = Workload::Grpo(Grpo {
        steps: 2,
        prompts: 16,
        samples: 4,
        shared_prefix_tokens: 0,
        min_tokens: 20,
        max_tokens: 200,
    });
    let steps = hash_steps(&workload.generate(5), BlockSpec::new(16, 0));
    let cluster = cluster(4, 1000);
    let rr = simulate(&steps, cluster, &mut RoundRobin::new(4));
    let ours = simulate(&steps, cluster, &mut burst(4));
    assert!(
        ours.prefill_tokens < rr.prefill_tokens,
        "{ours:?} vs {rr:?}"
    );
    // Each prompt's samples share one replica: exactly the bound.
    assert_eq!(ours.prefill_tokens, lower_bound(&steps));
    assert_eq!(ours.colocation_rate(), Some(1.0));
}

fn slots(per_replica: usize, overhead_tokens: u64) -> Slots {
    Slots {
        per_replica,
        overhead_tokens,
    }
}

#[test]
fn slots_compute_copies_at_the_same_time_and_later_ones_reuse_them() {
    // Five copies on one replica with two slots: the first two are computed side by side (both
    // prefill), the third starts when the first ends and reuses it, and so on.
    let steps = vec![vec![three_blocks(1); 5], vec![three_blocks(1); 2]];
    let one = cluster(1, 100);
    let fixed = || Fixed(vec![vec![0; 5], vec![0; 2]]);
    assert_eq!(simulate(&steps, one, &mut fixed()).prefill_tokens, 12);
    assert_eq!(
        simulate_on_slots(&steps, one, slots(1, 8), &mut fixed()).prefill_tokens,
        12
    );
    // Step 0: 2 x 12; step 1: cached from step 0.
    assert_eq!(
        simulate_on_slots(&steps, one, slots(2, 8), &mut fixed()).prefill_tokens,
        24
    );
    // As many slots as copies: every copy prefills.
    assert_eq!(
        simulate_on_slots(&steps, one, slots(5, 8), &mut fixed()).prefill_tokens,
        60
    );
}

#[test]
fn a_short_request_frees_its_slot_while_a_long_one_still_computes() {
    // A (12 tokens), B (4 tokens), A again, on one replica with two slots. B ends first, so the
    // second A starts while the first is still computing, and computes it again.
    let short = request(&[90, 91, 92, 93]);
    let steps = vec![vec![three_blocks(1), short, three_blocks(1)]];
    let fixed = || Fixed(vec![vec![0; 3]]);
    let one = cluster(1, 100);
    assert_eq!(
        simulate_on_slots(&steps, one, slots(2, 2), &mut fixed()).prefill_tokens,
        28
    );
    // With one slot the second A waits for the first and reuses it.
    assert_eq!(
        simulate_on_slots(&steps, one, slots(1, 2), &mut fixed()).prefill_tokens,
        16
    );
}

#[test]
fn one_slot_is_the_plain_simulation() {
    let workload = Workload::Grpo(Grpo {
        steps: 3,
        prompts: 6,
        samples: 4,
        shared_prefix_tokens: 8,
        min_tokens: 5,
        max_tokens: 30,
    });
    let steps = hash_steps(&workload.generate(5), BlockSpec::new(BLOCK, 0));
    let plain = simulate(&steps, cluster(3, 20), &mut RoundRobin::new(3));
    let one = simulate_on_slots(&steps, cluster(3, 20), slots(1, 7), &mut RoundRobin::new(3));
    assert_eq!(plain, one);
}
