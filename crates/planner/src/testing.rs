//! Builders for the planner's tests and benches (the `testing` feature, which the crate's own
//! integration tests and benches turn on): replicas, batches, block chains, knobs and a memory,
//! built one way everywhere.

use std::num::NonZeroUsize;

use crate::{
    BalanceBy, BatchRequest, BlockHash, Memory, MemorySettings, Plan, PlanParams, Replica,
};

/// `count` endpoint ids whose byte order is their index order: `p1`..`p9` up to 9, zero-padded
/// beyond (`p0001`.. for 1,024), so that the last tie-break follows the index.
pub fn replica_ids(count: usize) -> Vec<String> {
    let width = count.to_string().len();
    (1..=count).map(|i| format!("p{i:0width$}")).collect()
}

/// Replicas with these ids and no running requests.
pub fn replicas<S: AsRef<str>>(ids: &[S]) -> Vec<Replica<'_>> {
    ids.iter().map(|id| Replica::new(id.as_ref())).collect()
}

/// A window of these prompts, in order, each free to use every replica.
pub fn batch(prompts: &[Vec<BlockHash>]) -> Vec<BatchRequest<'_>> {
    prompts
        .iter()
        .map(|blocks| BatchRequest {
            blocks,
            allowed_replicas: None,
        })
        .collect()
}

/// A window of these prompts, each limited to its list of replicas (`None`: all).
pub fn batch_with_endpoints<'a>(
    prompts: &'a [Vec<BlockHash>],
    allowed: &'a [Option<Vec<usize>>],
) -> Vec<BatchRequest<'a>> {
    prompts
        .iter()
        .zip(allowed)
        .map(|(blocks, allowed)| BatchRequest {
            blocks,
            allowed_replicas: allowed.as_deref(),
        })
        .collect()
}

/// A prompt of `shared` blocks of family `family` followed by `own` blocks unique to `tag`.
/// Small readable numbers, not chained hashes: two prompts of one family share exactly the
/// family's blocks, and a longer `own` extends a shorter one (a conversation's next turn).
pub fn blocks(family: u64, shared: usize, tag: u64, own: usize) -> Vec<BlockHash> {
    (0..shared as u64)
        .map(|i| family * 1_000_000 + i)
        .chain((0..own as u64).map(|i| 1_000_000_000 + tag * 1_000 + i))
        .collect()
}

/// `count` copies of the same prompt.
pub fn copies(prompt: Vec<BlockHash>, count: usize) -> Vec<Vec<BlockHash>> {
    vec![prompt; count]
}

/// `count` blocks of chain `id` that no other id's blocks collide with (a splitmix64 stream),
/// for shapes too large for [`blocks`]' numbering.
pub fn synthetic_blocks(id: u64, count: usize) -> impl Iterator<Item = BlockHash> {
    (0..count as u64).map(move |i| {
        let mut z = (id << 20 | i).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z ^ (z >> 31)
    })
}

/// An RL step: `prompts` prompts x `samples` samples, every prompt `system` blocks of a shared
/// system prompt and `own` blocks of its own; the samples of one prompt arrive interleaved with
/// the other prompts', as a rollout driver sends them.
pub fn rl_step(prompts: usize, samples: usize, system: usize, own: usize) -> Vec<Vec<BlockHash>> {
    let system: Vec<BlockHash> = synthetic_blocks(0, system).collect();
    let distinct: Vec<Vec<BlockHash>> = (0..prompts)
        .map(|p| {
            let mut blocks = system.clone();
            blocks.extend(synthetic_blocks(1 + p as u64, own));
            blocks
        })
        .collect();
    (0..prompts * samples)
        .map(|i| distinct[i % prompts].clone())
        .collect()
}

/// The knobs as the config writes them: k = -1 is unlimited.
pub fn params(k: i64, n: usize, balance_by: BalanceBy) -> PlanParams {
    PlanParams {
        max_per_replica: (k >= 1).then_some(k as usize),
        min_colocate_blocks: n,
        balance_by,
        ..PlanParams::default()
    }
}

/// A memory of `capacity` blocks per replica whose carried load halves every `half_life_ms`.
pub fn memory(capacity: usize, half_life_ms: u64) -> Memory {
    Memory::new(MemorySettings {
        capacity_blocks: NonZeroUsize::new(capacity).expect("a capacity of at least 1"),
        load_half_life_ms: half_life_ms,
    })
}

/// Requests the plan put on each of `replica_count` replicas.
pub fn per_replica(plan: &Plan, replica_count: usize) -> Vec<usize> {
    let mut counts = vec![0; replica_count];
    for &replica in plan.assignments.iter().flatten() {
        counts[replica] += 1;
    }
    counts
}

/// Llama-3.1-8B on one A100 80GB (BLIS's calibrated coefficients, as `Speed::default()` is the
/// H100's): about 2.6 times slower, the fleet bench's slow class.
pub fn a100() -> crate::Speed {
    crate::Speed {
        prefill_seconds_per_token: 50.15e-6,
        prefill_overhead_seconds: 24.18e-3,
        decode_seconds_per_step: 16.46e-3,
        decode_seconds_per_step_per_sequence: 18.2e-6,
        max_running: 256.0,
    }
}
