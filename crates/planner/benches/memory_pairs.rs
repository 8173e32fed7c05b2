//! Planning with memory against the memoryless planner on the same windows, timed in pairs: the
//! criterion bench `plan_window_memory_10000` measures each planner over a few seconds, and on a
//! shared machine the other tenants' load can change between those seconds; here each window is
//! planned by both planners one right after the other, and the ratio reported is the median of
//! the windows' own ratios. Same stream as the criterion bench: 10,000-request windows, eight in
//! turn on one memory at its steady size, 16 replicas, k = 8, N = 0, default capacity.
//!
//! With memory, two times per window: to the plan (what the window's requests wait for: the
//! producer answers them before it merges the window into the memory), and with the merge
//! (`Memory::settle`: the planner's CPU per window).
//!
//! Run: `cargo bench -p burst-prefix-planner --bench memory_pairs` (see BENCHMARKS.md).

#[path = "windows/mod.rs"]
mod windows;

use std::hint::black_box;
use std::time::{Duration, Instant};

use burst_prefix_planner::testing::{batch, replicas};
use burst_prefix_planner::{assign, BalanceBy, BatchRequest};
use windows::{memory_stream, memory_stream_params, plan_then_settle, steady_memory};

/// Milliseconds, per window: without memory, and with memory to the plan and with the merge.
type Times = (f64, (f64, f64));

/// Windows timed per planner and way of timing.
const WINDOWS: usize = 160;

fn main() {
    let (ids, windows) = memory_stream();
    let replicas = replicas(&ids);
    let batches: Vec<Vec<BatchRequest<'_>>> = windows.iter().map(|w| batch(w)).collect();
    println!("{WINDOWS} windows each; medians in ms; ratio = median of the windows' with/without");
    for (mode, balance_by) in [
        ("requests", BalanceBy::Requests),
        ("tokens", BalanceBy::Tokens),
        ("time", BalanceBy::Time),
    ] {
        let params = memory_stream_params(balance_by);
        let (mut memory, mut now_ms) = steady_memory(&batches, &replicas, &params);
        let mut with = |batch: &[BatchRequest<'_>]| {
            now_ms += 100;
            let (planned, merged) =
                plan_then_settle(batch, &replicas, &params, &mut memory, now_ms);
            let ms = |time: Duration| time.as_secs_f64() * 1e3;
            (ms(planned), ms(planned + merged))
        };
        let without = |batch: &[BatchRequest<'_>]| {
            let start = Instant::now();
            black_box(assign(black_box(batch), &replicas, &params));
            start.elapsed().as_secs_f64() * 1e3
        };
        // Interleaved: each window by one planner, then by the other.
        let pairs: Vec<Times> = (0..WINDOWS)
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
            let mem: Vec<(f64, f64)> = batches.iter().map(|batch| with(batch)).collect();
            pairs.extend(base.into_iter().zip(mem));
        }
        report(mode, "back to back", &pairs);
    }
}

fn report(mode: &str, way: &str, times: &[Times]) {
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let base = median(times.iter().map(|t| t.0).collect());
    let [planned, settled] = [|t: &Times| t.1 .0, |t: &Times| t.1 .1].map(|with| {
        let mem = median(times.iter().map(with).collect());
        let ratio = median(times.iter().map(|t| with(t) / t.0).collect());
        format!("{mem:6.3} ({ratio:.2}x)")
    });
    println!(
        "{mode:8} {way:12}  assign {base:6.3}  with memory: to the plan {planned}, with the merge {settled}"
    );
}
