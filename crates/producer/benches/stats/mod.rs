//! What the producer's bench binaries share: percentiles and the markdown rows of the load
//! benches, the flags every bench accepts ([`args`]) and the process figures read from `/proc`
//! ([`procfs`]).
#![allow(dead_code)] // Each bench uses its own part of this.

pub mod args;
pub mod procfs;

/// The `p`-th percentile (nearest rank) of sorted values.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// `| name | samples | p50 | p99 | p99.9 | max |`, in milliseconds.
pub fn summary(name: &str, mut values_ms: Vec<f64>) -> String {
    values_ms.sort_by(f64::total_cmp);
    format!(
        "| {name} | {} | {:.3} | {:.3} | {:.3} | {:.3} |",
        values_ms.len(),
        percentile(&values_ms, 50.0),
        percentile(&values_ms, 99.0),
        percentile(&values_ms, 99.9),
        values_ms.last().copied().unwrap_or(f64::NAN),
    )
}
