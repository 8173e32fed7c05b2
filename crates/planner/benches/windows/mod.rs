//! The windows the planner's benches plan: requests in groups of 8 samples of one prompt, four
//! groups per family sharing the first quarter of their prompt (64 blocks of 64 tokens each).

use std::hint::black_box;
use std::time::{Duration, Instant};

use burst_prefix_planner::testing::{memory, replica_ids};
use burst_prefix_planner::{
    assign_with_memory, hash_prompts, BalanceBy, BatchRequest, BlockHash, BlockSpec, Memory,
    PlanParams, Prompt, Replica,
};

pub const PROMPT_TOKENS: usize = 4096;
pub const GROUP_SIZE: usize = 8;
/// Groups per family; a family shares its first quarter (1,024 tokens), like a system prompt.
pub const FAMILY_SIZE: usize = 4;

/// A deterministic pseudo-random token stream (splitmix64), so the bench needs no RNG crate.
pub fn tokens(seed: u64, count: usize) -> Vec<u32> {
    let mut state = seed;
    (0..count)
        .map(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((z ^ (z >> 31)) % 128_000) as u32
        })
        .collect()
}

/// The same shape; another `seed` gives other prompts on the same families' shared blocks.
pub fn window_seeded(requests: usize, seed: u64) -> Vec<Vec<BlockHash>> {
    let spec = BlockSpec::new(64, 0);
    let groups = requests.div_ceil(GROUP_SIZE);
    let distinct: Vec<Vec<BlockHash>> = (0..groups)
        .map(|g| {
            let family = (g / FAMILY_SIZE) as u64;
            let mut prompt = tokens(family, PROMPT_TOKENS / 4);
            prompt.extend(tokens(
                1_000_000 + seed * 100_000 + g as u64,
                PROMPT_TOKENS * 3 / 4,
            ));
            hash_prompts("model", "", &[Prompt::Tokens(&prompt)], spec).concat()
        })
        .collect();
    // Samples of one prompt arrive interleaved with the others, as a rollout driver sends them.
    (0..requests)
        .map(|i| distinct[i % groups].clone())
        .collect()
}

/// The stream the memory benches plan: eight 10,000-request windows in turn, each on the same
/// families with other prompts, on 16 replicas.
pub fn memory_stream() -> (Vec<String>, Vec<Vec<Vec<BlockHash>>>) {
    let ids = replica_ids(16);
    let windows = (0..8).map(|seed| window_seeded(10_000, seed)).collect();
    (ids, windows)
}

/// The memory benches' placement knobs: k = 8, N = 0.
pub fn memory_stream_params(balance_by: BalanceBy) -> PlanParams {
    PlanParams {
        max_per_replica: Some(GROUP_SIZE),
        min_colocate_blocks: 0,
        balance_by,
        ..PlanParams::default()
    }
}

/// A memory at the default capacity (4,096 blocks per replica) at its steady size: it planned
/// each of `batches` once, 100 ms apart. With the clock of its last window.
pub fn steady_memory(
    batches: &[Vec<BatchRequest<'_>>],
    replicas: &[Replica<'_>],
    params: &PlanParams,
) -> (Memory, u64) {
    let mut memory = memory(4_096, 1_000);
    let mut now_ms = 0;
    for batch in batches {
        now_ms += 100;
        assign_with_memory(batch, replicas, params, &mut memory, now_ms);
    }
    (memory, now_ms)
}

/// Plans `batch` with memory, then merges it into the memory (`Memory::settle`, which the
/// producer runs once the window's requests are answered): the time to the plan, and the
/// merge's own time.
pub fn plan_then_settle(
    batch: &[BatchRequest<'_>],
    replicas: &[Replica<'_>],
    params: &PlanParams,
    memory: &mut Memory,
    now_ms: u64,
) -> (Duration, Duration) {
    let start = Instant::now();
    black_box(assign_with_memory(
        black_box(batch),
        replicas,
        params,
        memory,
        now_ms,
    ));
    let planned = start.elapsed();
    let start = Instant::now();
    memory.settle();
    (planned, start.elapsed())
}
