//! The figures of a run, as ratios to round-robin in the same run and to the lower bound, and
//! the markdown and JSON they are published as.

use std::fmt::Write;

use serde::Serialize;

use crate::run::{Route, RunRecord};

/// The `p`-th percentile (nearest rank) of `values`.
pub fn percentile(values: &[f64], p: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// One route's figures on one workload.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteFigures {
    pub route: Route,
    pub name: &'static str,
    /// Prompt tokens the engine computed (`prompt_tokens - cached_tokens`, summed).
    pub computed_tokens: u64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    /// Σ over steps of the step's wall time.
    pub wall_ms: f64,
    /// Σ over steps of the busiest replica's computed tokens, over Σ of the mean (1 = even).
    pub imbalance: f64,
}

impl RouteFigures {
    pub fn new(run: &RunRecord, replicas: usize) -> Self {
        let computed_tokens = run.requests.iter().map(|r| r.computed_tokens()).sum();
        let ttft: Vec<f64> = run.requests.iter().map(|r| r.ttft_ms).collect();
        let steps = run.step_wall_ms.len();
        let busiest: u64 = (0..steps)
            .map(|step| {
                let mut work = vec![0u64; replicas];
                for request in run.requests.iter().filter(|r| r.step == step) {
                    work[request.replica] += request.computed_tokens();
                }
                work.into_iter().max().unwrap_or(0)
            })
            .sum();
        RouteFigures {
            route: run.route,
            name: run.route.name(),
            computed_tokens,
            ttft_p50_ms: percentile(&ttft, 50.0),
            ttft_p99_ms: percentile(&ttft, 99.0),
            wall_ms: run.step_wall_ms.iter().sum(),
            imbalance: if computed_tokens == 0 {
                1.0
            } else {
                busiest as f64 * replicas as f64 / computed_tokens as f64
            },
        }
    }
}

/// The simulator's prefill for a route, on the same prompts, against the engine's.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SimulatorCheck {
    pub route: Route,
    /// The simulator's model ("blocks": block-level LRU caches, as published; "slots": the
    /// same with the engine's slots, see `crate::check`).
    pub model: &'static str,
    pub simulated_tokens: u64,
    pub measured_tokens: u64,
}

impl SimulatorCheck {
    /// `simulated / measured - 1`.
    pub fn error(&self) -> f64 {
        if self.measured_tokens == 0 {
            if self.simulated_tokens == 0 {
                0.0
            } else {
                f64::INFINITY
            }
        } else {
            self.simulated_tokens as f64 / self.measured_tokens as f64 - 1.0
        }
    }
}

/// Everything measured on one workload.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadReport {
    pub workload: String,
    pub steps: usize,
    pub requests: usize,
    pub prompt_tokens: u64,
    /// See [`crate::bound`].
    pub lower_bound_tokens: u64,
    pub routes: Vec<RouteFigures>,
    pub simulator: Vec<SimulatorCheck>,
}

/// How the bench was run, for the table's caption.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Setup {
    pub replicas: usize,
    pub slots: usize,
    pub threads: usize,
    pub cache_ram_mib: usize,
    pub max_tokens: usize,
    pub seed: u64,
    pub model: String,
    pub engine: String,
    pub planner: String,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub setup: Setup,
    pub workloads: Vec<WorkloadReport>,
}

fn ratio(value: f64, base: f64) -> f64 {
    if base == 0.0 {
        f64::NAN
    } else {
        value / base
    }
}

impl WorkloadReport {
    pub fn round_robin(&self) -> Option<&RouteFigures> {
        self.routes.iter().find(|r| r.route == Route::RoundRobin)
    }
}

impl Report {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report serializes")
    }

    /// The markdown tables: per workload, every route's figures and the simulator check.
    pub fn to_markdown(&self) -> String {
        let s = &self.setup;
        let mut out = String::new();
        let _ =
            writeln!(
            out,
            "{} llama-server replicas ({}), {} slots and {} thread(s) each, --cache-ram {} MiB; \
             model {}; {} generated tokens per request; seed {}. Proxy: {}.\n",
            s.replicas, s.engine, s.slots, s.threads, s.cache_ram_mib, s.model, s.max_tokens,
            s.seed, s.planner
        );
        for w in &self.workloads {
            let _ = writeln!(
                out,
                "**{}**: {} steps, {} requests, {} prompt tokens; lower bound {} computed tokens.\n",
                w.workload, w.steps, w.requests, w.prompt_tokens, w.lower_bound_tokens
            );
            let _ = writeln!(
                out,
                "| route | computed tokens | x bound | x round-robin | TTFT p50 ms (x rr) | \
                 TTFT p99 ms (x rr) | step wall s (x rr) | imbalance |\n\
                 |---|---:|---:|---:|---:|---:|---:|---:|"
            );
            let rr = w.round_robin();
            for r in &w.routes {
                let vs = |value: f64, pick: fn(&RouteFigures) -> f64| {
                    rr.map_or(f64::NAN, |rr| ratio(value, pick(rr)))
                };
                let _ = writeln!(
                    out,
                    "| {} | {} | {:.3} | {:.3} | {:.0} ({:.2}) | {:.0} ({:.2}) | {:.2} ({:.2}) | {:.2} |",
                    r.name,
                    r.computed_tokens,
                    ratio(r.computed_tokens as f64, w.lower_bound_tokens as f64),
                    vs(r.computed_tokens as f64, |rr| rr.computed_tokens as f64),
                    r.ttft_p50_ms,
                    vs(r.ttft_p50_ms, |rr| rr.ttft_p50_ms),
                    r.ttft_p99_ms,
                    vs(r.ttft_p99_ms, |rr| rr.ttft_p99_ms),
                    r.wall_ms / 1e3,
                    vs(r.wall_ms, |rr| rr.wall_ms),
                    r.imbalance,
                );
            }
            if !w.simulator.is_empty() {
                let _ = writeln!(
                    out,
                    "\nSimulator on the same prompts (computed tokens, error = simulated / measured - 1):\n\n\
                     | route | model | simulated | measured | error |\n|---|---|---:|---:|---:|"
                );
                for c in &w.simulator {
                    let _ = writeln!(
                        out,
                        "| {} | {} | {} | {} | {:+.1}% |",
                        c.route.name(),
                        c.model,
                        c.simulated_tokens,
                        c.measured_tokens,
                        c.error() * 100.0
                    );
                }
            }
            out.push('\n');
        }
        out
    }
}
