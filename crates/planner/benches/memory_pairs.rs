//! Planning with memory against the memoryless planner on the same windows, timed in pairs: the
//! criterion bench `plan_window_memory_10000` measures each planner over a few seconds, and on a
//! shared machine the other tenants' load can change between those seconds; here each window is
//! planned by both planners one right after the other, and the ratio reported is the median of
//! the windows' own ratios. Same stream as the criterion bench: 10,000-request windows, eight in
//! turn on one memory at its steady size, 16 replicas, k = 8, N = 0, default capacity.
//!
//! Run: `cargo bench -p burst-prefix-planner --bench memory_pairs` (see BENCHMARKS.md).

#[path = "windows/mod.rs"]
mod windows;

use std::hint::black_box;
use std::time::Instant;

use burst_prefix_planner::{assign, assign_with_memory, BalanceBy, BatchRequest};
use windows::{memory_stream, memory_stream_params, replica_list, steady_memory, whole_batch};

/// Windows timed per planner and way of timing.
const WINDOWS: usize = 160;

fn main() {
    let (ids, windows) = memory_stream();
    let replicas = replica_list(&ids);
    let batches: Vec<Vec<BatchRequest<'_>>> = windows.iter().map(|w| whole_batch(w)).collect();
    println!("{WINDOWS} windows each; medians in ms; ratio = median of the windows' with/without");
    for (mode, balance_by) in [
        ("requests", BalanceBy::Requests),
        ("tokens", BalanceBy::Tokens),
    ] {
        let params = memory_stream_params(balance_by);
        let (mut memory, mut now_ms) = steady_memory(&batches, &replicas, &params);
        let mut with = |batch: &[BatchRequest<'_>]| {
            now_ms += 100;
            let start = Instant::now();
            black_box(assign_with_memory(
                black_box(batch),
                &replicas,
                &params,
                &mut memory,
                now_ms,
            ));
            start.elapsed().as_secs_f64() * 1e3
        };
        let without = |batch: &[BatchRequest<'_>]| {
            let start = Instant::now();
            black_box(assign(black_box(batch), &replicas, &params));
            start.elapsed().as_secs_f64() * 1e3
        };
        // Interleaved: each window by one planner, then by the other.
        let pairs: Vec<(f64, f64)> = (0..WINDOWS)
            .map(|i| {
                let batch = &batches[i % batches.len()];
                let base = without(batch);
                (base, with(batch))
            })
            .collect();
        report(mode, "interleaved", &pairs);
        // Back to back: eight windows by one planner, then the same eight by the other.
        let mut pairs = Vec::new();
        for _ in 0..WINDOWS / batches.len() {
            let base: Vec<f64> = batches.iter().map(|batch| without(batch)).collect();
            let mem: Vec<f64> = batches.iter().map(|batch| with(batch)).collect();
            pairs.extend(base.into_iter().zip(mem));
        }
        report(mode, "back to back", &pairs);
    }
}

fn report(mode: &str, way: &str, pairs: &[(f64, f64)]) {
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let base = median(pairs.iter().map(|p| p.0).collect());
    let mem = median(pairs.iter().map(|p| p.1).collect());
    let ratio = median(pairs.iter().map(|p| p.1 / p.0).collect());
    println!("{mode:8} {way:12}  assign {base:6.3}  with memory {mem:6.3}  ratio {ratio:.2}x");
}
