//! Hashing throughput against plain XXH64 over the same bytes, and planning time per window;
//! `assign` against the naive reading of docs/behaviour.md §4 (`tests/reference`) as the baseline
//! where that finishes in reasonable time. Run: `cargo bench -p burst-prefix-planner` (see
//! BENCHMARKS.md).

#[path = "../tests/reference/mod.rs"]
mod reference;
#[path = "windows/mod.rs"]
mod windows;

use burst_prefix_planner::testing::{
    batch, memory, replica_ids, replicas, rl_step, synthetic_blocks,
};
use burst_prefix_planner::{
    assign, assign_with_memory, hash_prompts, Arrival, BalanceBy, BatchRequest, BlockHash,
    BlockSpec, InFlight, InFlightSettings, Memory, PlanParams, Prompt,
};
use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use reference::reference_assign;
use std::hint::black_box;
use std::time::{Duration, Instant};
use windows::{
    memory_stream, memory_stream_params, plan_then_settle, steady_memory, tokens, window_seeded,
    GROUP_SIZE, PROMPT_TOKENS,
};
use xxhash_rust::xxh64::xxh64;

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
    window_seeded(requests, 0)
}

fn planning(c: &mut Criterion) {
    let ids = replica_ids(16);
    let replicas = replicas(&ids);
    let mut group = c.benchmark_group("plan_window");
    for requests in [100, 1_000, 10_000] {
        let prompts = window(requests);
        let batch = batch(&prompts);
        group.throughput(Throughput::Elements(requests as u64));
        for n in [0, 4] {
            for (mode, balance_by) in [
                ("requests", BalanceBy::Requests),
                ("tokens", BalanceBy::Tokens),
                ("time", BalanceBy::Time),
            ] {
                let params = PlanParams {
                    max_per_replica: Some(GROUP_SIZE),
                    min_colocate_blocks: n,
                    balance_by,
                    ..PlanParams::default()
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

/// Issue 17's RL step: 1,024 prompts x 8 samples, 1,024 replicas, k = 1 (requests mode, N = 0);
/// `assign_n1` with N = 1, where every unit may follow the system prompt to any replica holding it.
fn rl_step_bench(c: &mut Criterion) {
    let prompts = rl_step(1_024, 8, 16, 8);
    let batch = batch(&prompts);
    let ids = replica_ids(1_024);
    let replicas = replicas(&ids);
    let params = PlanParams {
        max_per_replica: Some(1),
        ..PlanParams::default()
    };
    let mut group = c.benchmark_group("rl_step_1024x8_on_1024");
    group.sampling_mode(SamplingMode::Flat).sample_size(10);
    group.bench_function("assign", |b| {
        b.iter(|| assign(black_box(&batch), &replicas, &params))
    });
    let n1 = PlanParams {
        min_colocate_blocks: 1,
        ..params
    };
    group.bench_function("assign_n1", |b| {
        b.iter(|| assign(black_box(&batch), &replicas, &n1))
    });
    // Time mode: each member priced on the holders of its prefix and the cheapest other
    // replica (no k: the cost splits).
    let time = PlanParams {
        balance_by: BalanceBy::Time,
        ..PlanParams::default()
    };
    group.bench_function("assign_time", |b| {
        b.iter(|| assign(black_box(&batch), &replicas, &time))
    });
    group.bench_function("reference_baseline", |b| {
        b.iter(|| reference_assign(black_box(&batch), &replicas, &params))
    });
    group.finish();
}

/// Replicas from 16 to 50,000 with the work growing alike: as many prompts as replicas, 8
/// samples each, sharing a 16-block system prompt. Near-linear planning shows as a slope ~1.
/// With N = 0 (`assign_k..`) a unit looks up only the replicas it lands on; with N = 1
/// (`assign_n1_k..`) it may follow the system prompt, which every replica soon holds.
fn scaling(c: &mut Criterion) {
    let mut group = c.benchmark_group("scaling_groups_eq_replicas");
    group.sampling_mode(SamplingMode::Flat).sample_size(10);
    for fleet in [16, 64, 256, 1_024, 4_096, 10_000, 50_000] {
        let prompts = rl_step(fleet, 8, 16, 8);
        let batch = batch(&prompts);
        let ids = replica_ids(fleet);
        let list = replicas(&ids);
        group.throughput(Throughput::Elements(batch.len() as u64));
        for (name, k) in [("k1", Some(1)), ("k-1", None)] {
            let params = PlanParams {
                max_per_replica: k,
                ..PlanParams::default()
            };
            group.bench_with_input(
                BenchmarkId::new(format!("assign_{name}"), fleet),
                &batch,
                |b, batch| b.iter(|| assign(black_box(batch), &list, &params)),
            );
            let n1 = PlanParams {
                min_colocate_blocks: 1,
                ..params
            };
            group.bench_with_input(
                BenchmarkId::new(format!("assign_n1_{name}"), fleet),
                &batch,
                |b, batch| b.iter(|| assign(black_box(batch), &list, &n1)),
            );
            // The naive reading is quadratic in replicas: only where it ends in seconds.
            if fleet <= 1_024 {
                group.bench_with_input(
                    BenchmarkId::new(format!("reference_{name}"), fleet),
                    &batch,
                    |b, batch| b.iter(|| reference_assign(black_box(batch), &list, &params)),
                );
            }
        }
    }
    group.finish();
}

/// `assign_with_memory` against `assign` in the same run, on a stream of 10,000-request windows
/// (eight, in turn, each on the same families with other prompts), as a producer plans them one
/// after the other: each window's 80,000 new blocks overflow the replicas' caches (default
/// capacity, 4,096 blocks each), so the memory evicts as many. The memory is at its steady size
/// (it planned all eight windows once before), and both planners see the same windows.
///
/// With memory, timed to the plan (`assign_with_memory`: what the window's requests wait for;
/// the producer answers them, then merges the window into the memory) and with the merge
/// (`.._and_merge`: `Memory::settle` too, the planner's CPU per window).
///
/// Measured two ways: each planner in a loop of its own (`back_to_back`: the memoryless one
/// then finds its few megabytes in cache from its last window), and `interleaved`: each timed
/// window right after a window of the other planner, untimed, as when planning shares the
/// caches with other work.
fn planning_with_memory(c: &mut Criterion) {
    let (ids, windows) = memory_stream();
    let replicas = replicas(&ids);
    let batches: Vec<Vec<BatchRequest<'_>>> = windows.iter().map(|w| batch(w)).collect();
    let mut group = c.benchmark_group("plan_window_memory_10000");
    group.throughput(Throughput::Elements(10_000));
    for (mode, balance_by) in [
        ("requests", BalanceBy::Requests),
        ("tokens", BalanceBy::Tokens),
        ("time", BalanceBy::Time),
    ] {
        let params = memory_stream_params(balance_by);
        let (mut memory, mut now_ms) = steady_memory(&batches, &replicas, &params);
        let mut next = 0;
        let mut next_window = || {
            next += 1;
            now_ms += 100;
            (&batches[next % batches.len()], now_ms)
        };
        let without = |batch: &[BatchRequest<'_>]| assign(black_box(batch), &replicas, &params);
        // A window with memory, timed to the plan or with the merge; merged either way.
        let with = |batch: &[BatchRequest<'_>], memory: &mut Memory, now_ms, merge_timed| {
            let (planned, merged) = plan_then_settle(batch, &replicas, &params, memory, now_ms);
            if merge_timed {
                planned + merged
            } else {
                planned
            }
        };
        group.bench_function(format!("back_to_back/assign_baseline_{mode}"), |b| {
            b.iter(|| without(next_window().0))
        });
        group.bench_function(format!("interleaved/assign_baseline_{mode}"), |b| {
            b.iter_custom(|windows| {
                let mut timed = Duration::ZERO;
                for _ in 0..windows {
                    let (batch, now_ms) = next_window();
                    with(batch, &mut memory, now_ms, true);
                    let start = Instant::now();
                    black_box(without(batch));
                    timed += start.elapsed();
                }
                timed
            })
        });
        // With memory, each way (`interleaved`: after the same window, untimed, without memory),
        // to the plan and with the merge.
        for (way, interleaved) in [("back_to_back", false), ("interleaved", true)] {
            for (name, merge_timed) in [
                ("assign_with_memory", false),
                ("assign_with_memory_and_merge", true),
            ] {
                group.bench_function(format!("{way}/{name}_{mode}"), |b| {
                    b.iter_custom(|windows| {
                        (0..windows)
                            .map(|_| {
                                let (batch, now_ms) = next_window();
                                if interleaved {
                                    black_box(without(batch));
                                }
                                with(batch, &mut memory, now_ms, merge_timed)
                            })
                            .sum()
                    })
                });
            }
        }
    }
    group.finish();
}

/// Pairs of new 64-block prompts (`synthetic_blocks` from `first_id` on), each pair one unit.
fn pairs(first_id: u64, count: usize) -> Vec<Vec<BlockHash>> {
    (0..count as u64)
        .flat_map(|id| {
            let prompt: Vec<BlockHash> = synthetic_blocks(first_id + id, 64).collect();
            [prompt.clone(), prompt]
        })
        .collect()
}

/// Small windows on a large memory: 1,024 replicas, each at the default capacity (4,096 blocks:
/// 4.2 million entries in all), then windows of 100 pairs of new 64-block prompts (6,400 touches
/// each), 16 in turn (from the second turn on, the memory remembers them). The merge
/// (`Memory::settle`) is timed on its own, after the window's plan.
fn memory_at_scale(c: &mut Criterion) {
    let ids = replica_ids(1_024);
    let replicas = replicas(&ids);
    let params = PlanParams::default();
    let mut memory = memory(4_096, 0);
    let mut now_ms = 0;
    // 66 windows of a pair per replica: every replica's model full, and then some.
    for window in 0..66 {
        let prompts = pairs(window * 1_024, 1_024);
        now_ms += 100;
        assign_with_memory(&batch(&prompts), &replicas, &params, &mut memory, now_ms);
    }
    let windows: Vec<Vec<Vec<BlockHash>>> =
        (0..16).map(|w| pairs(1_000_000 + w * 100, 100)).collect();
    let batches: Vec<Vec<BatchRequest<'_>>> = windows.iter().map(|w| batch(w)).collect();
    let mut group = c.benchmark_group("memory_1024_replicas_200_requests");
    group.throughput(Throughput::Elements(200));
    let mut next = 0;
    let mut next_window = || {
        next += 1;
        now_ms += 100;
        (&batches[next % batches.len()], now_ms)
    };
    group.bench_function("assign_baseline", |b| {
        b.iter(|| assign(black_box(next_window().0), &replicas, &params))
    });
    for (name, merge_timed) in [("assign_with_memory", false), ("settle", true)] {
        group.bench_function(name, |b| {
            b.iter_custom(|windows| {
                (0..windows)
                    .map(|_| {
                        let (batch, now_ms) = next_window();
                        let (planned, merged) =
                            plan_then_settle(batch, &replicas, &params, &mut memory, now_ms);
                        if merge_timed {
                            merged
                        } else {
                            planned
                        }
                    })
                    .sum()
            })
        });
    }
    group.finish();
}

/// Zero-wait placement of an RL step (`InFlight`): as many prompts as replicas, 8 samples each
/// with their group size, sharing a 16-block system prompt, N = 1, k = 1, requests mode; each
/// request placed as it arrives and finished after the next 8 x replicas / 4 arrivals (a quarter
/// of the step in flight). Per request, it visits the replicas holding the system prompt in
/// flight: a slope above 1 here is the cost that grows with the fleet.
fn zero_wait(c: &mut Criterion) {
    let mut group = c.benchmark_group("zero_wait_rl_step");
    group.sampling_mode(SamplingMode::Flat).sample_size(10);
    let params = PlanParams {
        max_per_replica: Some(1),
        min_colocate_blocks: 1,
        ..PlanParams::default()
    };
    let time = PlanParams {
        balance_by: BalanceBy::Time,
        ..PlanParams::default()
    };
    for fleet in [16, 64, 256, 512, 1_024, 2_048, 4_096] {
        let prompts = rl_step(fleet, 8, 16, 8);
        let ids = replica_ids(fleet);
        let list = replicas(&ids);
        group.throughput(Throughput::Elements(prompts.len() as u64));
        let modes: &[(&str, &PlanParams)] = &[
            ("place_and_finish", &params),
            ("place_and_finish_time", &time),
        ];
        for &(name, params) in modes {
            group.bench_function(BenchmarkId::new(name, fleet), |b| {
                b.iter(|| {
                    let mut in_flight = InFlight::new(InFlightSettings::default());
                    in_flight.set_replicas(&list);
                    let mut live = std::collections::VecDeque::new();
                    for (i, blocks) in prompts.iter().enumerate() {
                        let arrival = Arrival {
                            blocks,
                            allowed_replicas: None,
                            group_size: Some(8),
                            max_answer_tokens: None,
                            expected_answer_tokens: None,
                        };
                        live.push_back(in_flight.place(&arrival, params, None, i as u64).id);
                        if live.len() > prompts.len() / 4 {
                            in_flight.finish(live.pop_front().unwrap(), i as u64);
                        }
                    }
                    black_box(in_flight.len())
                })
            });
        }
    }
    group.finish();
}

/// A window of an RL step (as many prompts as replicas, 8 samples, a 16-block system prompt and
/// 8 blocks each, interleaved) planned with memory in `requests` and in `time` mode, side by
/// side, at 16 to 4,096 replicas (issue 53's shape): time mode's cost beside requests mode's.
fn time_against_requests(c: &mut Criterion) {
    let mut group = c.benchmark_group("time_against_requests");
    group.sampling_mode(SamplingMode::Flat).sample_size(10);
    for fleet in [16, 64, 256, 512, 1_024, 2_048, 4_096] {
        let prompts = rl_step(fleet, 8, 16, 8);
        let batch = batch(&prompts);
        let ids = replica_ids(fleet);
        let list = replicas(&ids);
        group.throughput(Throughput::Elements(batch.len() as u64));
        for (name, balance_by) in [("requests", BalanceBy::Requests), ("time", BalanceBy::Time)] {
            for (k_name, k) in [("k1", Some(1)), ("k-1", None)] {
                let params = PlanParams {
                    max_per_replica: k,
                    balance_by,
                    ..PlanParams::default()
                };
                group.bench_with_input(
                    BenchmarkId::new(format!("{name}_{k_name}"), fleet),
                    &batch,
                    |b, batch| {
                        b.iter(|| {
                            let mut memory = memory(4_096, 0);
                            assign_with_memory(black_box(batch), &list, &params, &mut memory, 0)
                        })
                    },
                );
            }
        }
    }
    group.finish();
}

criterion_group!(
    benches,
    zero_wait,
    time_against_requests,
    hashing,
    planning,
    planning_with_memory,
    memory_at_scale,
    rl_step_bench,
    scaling
);
criterion_main!(benches);
