//! Hashing throughput against plain XXH64 over the same bytes, and planning time per window.
//! Run: `cargo bench -p burst-prefix-planner` (see BENCHMARKS.md).

use burst_prefix_planner::{
    assign, hash_prompts, BalanceBy, BatchRequest, BlockHash, BlockSpec, PlanParams, Prompt,
    Replica,
};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use xxhash_rust::xxh64::xxh64;

const PROMPT_TOKENS: usize = 4096;
const GROUP_SIZE: usize = 8;
/// Groups per family; a family shares its first quarter (1,024 tokens), like a system prompt.
const FAMILY_SIZE: usize = 4;

/// A deterministic pseudo-random token stream (splitmix64), so the bench needs no RNG crate.
fn tokens(seed: u64, count: usize) -> Vec<u32> {
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

fn hashing(c: &mut Criterion) {
    let prompt = tokens(1, PROMPT_TOKENS);
    let bytes: Vec<u8> = prompt.iter().flat_map(|t| t.to_le_bytes()).collect();
    let text: String = (0..PROMPT_TOKENS * 4)
        .map(|i| (b'a' + (i % 26) as u8) as char)
        .collect();
    let spec = BlockSpec::new(64, 0);
    let mut group = c.benchmark_group("hash_4096_tokens");
    group.throughput(Throughput::Bytes(bytes.len() as u64));
    group.bench_function("plain_xxh64_baseline", |b| {
        b.iter(|| xxh64(black_box(&bytes), 0))
    });
    // The floor of any llm-d compatible hasher: one XXH64 per 64-token block, no chaining.
    group.bench_function("plain_xxh64_per_block_baseline", |b| {
        b.iter(|| {
            black_box(&bytes)
                .chunks(spec.block_size_tokens * 4)
                .fold(0u64, |acc, block| acc ^ xxh64(block, 0))
        })
    });
    group.bench_function("prefixhash_tokens", |b| {
        b.iter(|| hash_prompts("model", "", &[Prompt::Tokens(black_box(&prompt))], spec))
    });
    group.bench_function("prefixhash_text", |b| {
        b.iter(|| hash_prompts("model", "", &[Prompt::Text(black_box(&text))], spec))
    });
    group.finish();
}

/// `requests` requests in groups of 8, four groups per family sharing 16 of their 64 blocks.
fn window(requests: usize) -> Vec<Vec<BlockHash>> {
    let spec = BlockSpec::new(64, 0);
    let groups = requests.div_ceil(GROUP_SIZE);
    let distinct: Vec<Vec<BlockHash>> = (0..groups)
        .map(|g| {
            let family = (g / FAMILY_SIZE) as u64;
            let mut prompt = tokens(family, PROMPT_TOKENS / 4);
            prompt.extend(tokens(1_000_000 + g as u64, PROMPT_TOKENS * 3 / 4));
            hash_prompts("model", "", &[Prompt::Tokens(&prompt)], spec).concat()
        })
        .collect();
    // Samples of one prompt arrive interleaved with the others, as a rollout driver sends them.
    (0..requests)
        .map(|i| distinct[i % groups].clone())
        .collect()
}

fn planning(c: &mut Criterion) {
    let ids: Vec<String> = (0..16).map(|i| format!("ns/pod-{i:02}-rank-0")).collect();
    let replicas: Vec<Replica<'_>> = ids
        .iter()
        .map(|id| Replica {
            id,
            running_requests: 0,
        })
        .collect();
    let mut group = c.benchmark_group("plan_window");
    for requests in [100, 1_000, 10_000] {
        let prompts = window(requests);
        let batch: Vec<BatchRequest<'_>> = prompts
            .iter()
            .map(|blocks| BatchRequest {
                blocks,
                allowed_replicas: None,
            })
            .collect();
        group.throughput(Throughput::Elements(requests as u64));
        for n in [0, 4] {
            for (mode, balance_by) in [
                ("requests", BalanceBy::Requests),
                ("tokens", BalanceBy::Tokens),
            ] {
                let params = PlanParams {
                    max_per_replica: Some(GROUP_SIZE),
                    min_colocate_blocks: n,
                    balance_by,
                };
                group.bench_with_input(
                    BenchmarkId::new(format!("n{n}_{mode}"), requests),
                    &batch,
                    |b, batch| b.iter(|| assign(black_box(batch), &replicas, &params)),
                );
            }
        }
    }
    group.finish();
}

criterion_group!(benches, hashing, planning);
criterion_main!(benches);
