//! The figures of a run, as ratios to round-robin in the same run and to the lower bound, and
//! the markdown and JSON they are published as.

use std::fmt::Write;

use serde::Serialize;

use crate::provenance::Provenance;
use crate::routes::Route;
use crate::run::RunRecord;

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

/// The name of the route every ratio is taken to.
pub const ROUND_ROBIN: &str = "round-robin";

/// One route's figures on one workload.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteFigures {
    pub route: String,
    /// Whether it is burst-prefix's proxy (the routes others are checked against).
    pub ours: bool,
    /// Prompt tokens the engines computed (their counters, or the answers' usage).
    pub computed_tokens: u64,
    /// Σ over steps of the busiest replica's computed tokens.
    pub busiest_sum: u64,
    /// Σ of the answers' `prompt_tokens - cached_tokens` (a check of the counters), and how many
    /// answers carried no usage.
    pub answers_computed_tokens: u64,
    pub answers_without_usage: usize,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    /// Σ over steps of the step's wall time: on shared cores, total work more than step time.
    pub wall_ms: f64,
    /// Per step, the requests each replica finished: where the route put them.
    pub placements: Vec<Vec<u64>>,
    pub memory_in_use: Option<bool>,
    /// A produce-then-direct route: the proxy route whose placements it sends straight, whose
    /// wall time is compared to its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline_of: Option<String>,
}

impl RouteFigures {
    pub fn new(run: &RunRecord, ours: bool) -> Self {
        let ttft: Vec<f64> = run.requests.iter().map(|r| r.ttft_ms).collect();
        let (answers_computed_tokens, answers_without_usage) = run.answers_computed_tokens();
        RouteFigures {
            route: run.route.clone(),
            ours,
            computed_tokens: run.computed_tokens(),
            busiest_sum: run.busiest_sum(),
            answers_computed_tokens,
            answers_without_usage,
            ttft_p50_ms: percentile(&ttft, 50.0),
            ttft_p99_ms: percentile(&ttft, 99.0),
            wall_ms: run.step_wall_ms.iter().sum(),
            placements: run
                .steps
                .iter()
                .map(|step| step.iter().map(|r| r.requests).collect())
                .collect(),
            memory_in_use: run.memory_in_use,
            baseline_of: None,
        }
    }

    /// Whether `self` computes fewer tokens than `other` and has a lower busiest-replica sum.
    pub fn dominates(&self, other: &RouteFigures) -> bool {
        self.computed_tokens < other.computed_tokens && self.busiest_sum < other.busiest_sum
    }
}

/// The simulator's prefill for a route, on the same prompts, against the engine's.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SimulatorCheck {
    pub route: String,
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

/// Everything measured on one workload with one seed.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadReport {
    pub workload: String,
    pub seed: u64,
    pub steps: usize,
    pub requests: usize,
    /// In the engine's tokens.
    pub prompt_tokens: u64,
    /// See [`crate::bound`].
    pub lower_bound_tokens: u64,
    /// Σ over steps of the step's bound over the replicas: no route's busiest replica can do
    /// less.
    pub lower_bound_busiest: u64,
    pub routes: Vec<RouteFigures>,
    /// Routes not run on this workload, and why.
    pub skipped: Vec<(String, String)>,
    pub simulator: Vec<SimulatorCheck>,
}

/// How the bench was run, for the table's caption.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Setup {
    /// When, from which commit, on how many cores.
    pub provenance: Provenance,
    /// Every route run, with its configuration as given.
    pub routes: Vec<Route>,
    pub engine: String,
    pub replicas: usize,
    /// The engine's settings, in words.
    pub engine_settings: String,
    pub max_tokens: usize,
    pub seeds: Vec<u64>,
    pub model: String,
    /// The prompts' form (text or token IDs).
    pub prompts: String,
    /// The share of each step's requests sent straight to a replica instead of through the
    /// route (`--direct-fraction`, [`crate::second_path`]).
    pub direct_fraction: f64,
    /// How the proxy's producer talks to the replicas, in words (its pool of connections).
    pub upstream: String,
    /// Streamed or whole answers, in words.
    pub answers: String,
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
        self.routes.iter().find(|r| r.route == ROUND_ROBIN)
    }

    /// Computed tokens over the lower bound.
    pub fn by_bound(&self, r: &RouteFigures) -> f64 {
        ratio(r.computed_tokens as f64, self.lower_bound_tokens as f64)
    }

    /// Busiest-replica sum over its lower bound.
    pub fn busiest_by_bound(&self, r: &RouteFigures) -> f64 {
        ratio(r.busiest_sum as f64, self.lower_bound_busiest as f64)
    }

    /// `pick(r) / pick(round-robin)`.
    pub fn by_rr(&self, r: &RouteFigures, pick: fn(&RouteFigures) -> f64) -> f64 {
        self.round_robin()
            .map_or(f64::NAN, |rr| ratio(pick(r), pick(rr)))
    }

    /// For each produce-then-direct route that ran with its proxy route: the proxy route, the
    /// baseline, and the proxy's wall time over the baseline's.
    pub fn proxy_by_direct_wall(&self) -> Vec<(&RouteFigures, &RouteFigures, f64)> {
        self.routes
            .iter()
            .filter_map(|baseline| {
                let of = baseline.baseline_of.as_deref()?;
                let proxy = self.routes.iter().find(|r| r.route == of)?;
                Some((proxy, baseline, ratio(proxy.wall_ms, baseline.wall_ms)))
            })
            .collect()
    }

    /// For each of our routes, the routes that dominate it (fewer computed tokens and a lower
    /// busiest-replica sum).
    pub fn dominating(&self) -> Vec<(&RouteFigures, Vec<&RouteFigures>)> {
        self.routes
            .iter()
            .filter(|r| r.ours)
            .map(|ours| {
                let others = self.routes.iter().filter(|r| r.dominates(ours)).collect();
                (ours, others)
            })
            .collect()
    }
}

/// The (proxy, produce-then-direct) route pairs that ran on some of `runs`, in order.
fn wall_pairs(runs: &[&WorkloadReport]) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    for w in runs {
        for (proxy, baseline, _) in w.proxy_by_direct_wall() {
            let pair = (proxy.route.clone(), baseline.route.clone());
            if !pairs.contains(&pair) {
                pairs.push(pair);
            }
        }
    }
    pairs
}

/// `lo-hi` of `values` (one value when they agree to the shown precision).
pub fn range(values: &[f64], decimals: usize) -> String {
    let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if finite.is_empty() {
        return "-".into();
    }
    let lo = finite.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (lo, hi) = (format!("{lo:.decimals$}"), format!("{hi:.decimals$}"));
    if lo == hi {
        lo
    } else {
        format!("{lo}-{hi}")
    }
}

impl Report {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report serializes")
    }

    /// The workloads' names, in order of first appearance.
    pub fn workload_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for w in &self.workloads {
            if !names.contains(&w.workload.as_str()) {
                names.push(&w.workload);
            }
        }
        names
    }

    /// The routes' names, in order of first appearance.
    pub fn route_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for r in self.workloads.iter().flat_map(|w| &w.routes) {
            if !names.contains(&r.route.as_str()) {
                names.push(&r.route);
            }
        }
        names
    }

    /// The markdown: per workload, a summary over the seeds (ratios as lo-hi), who dominates
    /// our proxy, then every seed's figures.
    pub fn to_markdown(&self) -> String {
        let s = &self.setup;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "Run {} from commit {} on {} cores (load average {} at the start); the routes' \
             configs are in the JSON's `setup.routes`.\n",
            s.provenance.date, s.provenance.commit, s.provenance.cores, s.provenance.load_average
        );
        let _ = writeln!(
            out,
            "{} {} replicas ({}); model {}; prompts as {}; {} generated tokens per request; \
             seeds {:?}. Ratios are to round-robin in the same run (x rr) and to the lower bound \
             (x bound). *Busiest* is Σ over steps of the busiest replica's computed tokens: the \
             step time of a cluster whose replicas each have their own accelerator (its bound: \
             each step's bound spread evenly). Wall time is shared-core time: all replicas ran \
             on the same 2 cores, so it measures total work, not a cluster's step time. \
             The proxy's connections to the replicas: {}. Answers: {}.",
            s.replicas,
            s.engine,
            s.engine_settings,
            s.model,
            s.prompts,
            s.max_tokens,
            s.seeds,
            s.upstream,
            s.answers
        );
        let _ = writeln!(
            out,
            "Direct fraction {}: {}\n",
            s.direct_fraction,
            if s.direct_fraction > 0.0 {
                "that share of each step's requests (chosen by a seeded hash, the same on every \
                 route) was sent straight to a replica, round-robin, and not through the route: \
                 prompts that also arrive by a second path."
            } else {
                "every request went through the route."
            }
        );
        for name in self.workload_names() {
            let runs: Vec<&WorkloadReport> = self
                .workloads
                .iter()
                .filter(|w| w.workload == name)
                .collect();
            // Every seed's own count: the generators draw how many requests a step has.
            let _ =
                writeln!(
                out,
                "**{name}**: {} steps, {} requests; over seeds {}: {} prompt tokens, lower bound \
                 {} computed tokens.\n",
                range(&runs.iter().map(|w| w.steps as f64).collect::<Vec<_>>(), 0),
                range(&runs.iter().map(|w| w.requests as f64).collect::<Vec<_>>(), 0),
                runs.iter().map(|w| w.seed.to_string()).collect::<Vec<_>>().join(", "),
                range(&runs.iter().map(|w| w.prompt_tokens as f64).collect::<Vec<_>>(), 0),
                range(&runs.iter().map(|w| w.lower_bound_tokens as f64).collect::<Vec<_>>(), 0),
            );
            let _ = writeln!(
                out,
                "| route | computed x bound | computed x rr | busiest x bound | busiest x rr | \
                 TTFT p50 x rr | TTFT p99 x rr | wall x rr (shared cores) |\n\
                 |---|---:|---:|---:|---:|---:|---:|---:|"
            );
            for route in self.route_names() {
                let cells: Vec<(&WorkloadReport, &RouteFigures)> = runs
                    .iter()
                    .filter_map(|w| Some((*w, w.routes.iter().find(|r| r.route == route)?)))
                    .collect();
                if cells.is_empty() {
                    continue;
                }
                let col = |f: &dyn Fn(&WorkloadReport, &RouteFigures) -> f64| {
                    range(&cells.iter().map(|(w, r)| f(w, r)).collect::<Vec<_>>(), 2)
                };
                let _ = writeln!(
                    out,
                    "| {route} | {} | {} | {} | {} | {} | {} | {} |",
                    col(&|w, r| w.by_bound(r)),
                    col(&|w, r| w.by_rr(r, |r| r.computed_tokens as f64)),
                    col(&|w, r| w.busiest_by_bound(r)),
                    col(&|w, r| w.by_rr(r, |r| r.busiest_sum as f64)),
                    col(&|w, r| w.by_rr(r, |r| r.ttft_p50_ms)),
                    col(&|w, r| w.by_rr(r, |r| r.ttft_p99_ms)),
                    col(&|w, r| w.by_rr(r, |r| r.wall_ms)),
                );
            }
            out.push('\n');
            for (proxy, baseline) in wall_pairs(&runs) {
                let per_seed: Vec<String> = runs
                    .iter()
                    .filter_map(|w| {
                        let (p, b, ratio) = w
                            .proxy_by_direct_wall()
                            .into_iter()
                            .find(|(p, b, _)| p.route == proxy && b.route == baseline)?;
                        Some(format!(
                            "{ratio:.2} ({:.2} s / {:.2} s, seed {})",
                            p.wall_ms / 1e3,
                            b.wall_ms / 1e3,
                            w.seed
                        ))
                    })
                    .collect();
                let _ = writeln!(
                    out,
                    "- wall time through {proxy} x {baseline} (the producer's placements sent \
                     straight): {}",
                    per_seed.join(", ")
                );
            }
            for w in &runs {
                for (ours, others) in w.dominating() {
                    let names: Vec<&str> = others.iter().map(|r| r.route.as_str()).collect();
                    let _ = writeln!(
                        out,
                        "- seed {}: {} is dominated by {}",
                        w.seed,
                        ours.route,
                        if names.is_empty() {
                            "no route".to_string()
                        } else {
                            names.join(", ")
                        }
                    );
                }
                for (route, why) in &w.skipped {
                    let _ = writeln!(out, "- seed {}: {route} not run: {why}", w.seed);
                }
            }
            out.push('\n');
        }
        out.push_str("### Every seed\n\n");
        for w in &self.workloads {
            let _ = writeln!(
                out,
                "**{}, seed {}**: {} prompt tokens, lower bound {} (busiest {}).\n\n\
                 | route | computed | answers' sum | busiest | TTFT p50 ms | TTFT p99 ms | \
                 wall s | requests per replica, per step |\n|---|---:|---:|---:|---:|---:|---:|---|",
                w.workload, w.seed, w.prompt_tokens, w.lower_bound_tokens, w.lower_bound_busiest
            );
            for r in &w.routes {
                let placements: Vec<String> = r
                    .placements
                    .iter()
                    .map(|step| {
                        step.iter()
                            .map(u64::to_string)
                            .collect::<Vec<_>>()
                            .join("/")
                    })
                    .collect();
                let answers = if r.answers_without_usage == 0 {
                    r.answers_computed_tokens.to_string()
                } else {
                    format!(
                        "{} ({} without usage)",
                        r.answers_computed_tokens, r.answers_without_usage
                    )
                };
                let _ = writeln!(
                    out,
                    "| {} | {} | {answers} | {} | {:.0} | {:.0} | {:.1} | {} |",
                    r.route,
                    r.computed_tokens,
                    r.busiest_sum,
                    r.ttft_p50_ms,
                    r.ttft_p99_ms,
                    r.wall_ms / 1e3,
                    placements.join(", ")
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
                        c.route,
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

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn figures(route: &str, computed: u64, busiest: u64, ttft: f64) -> RouteFigures {
        RouteFigures {
            route: route.into(),
            ours: route.starts_with("proxy"),
            computed_tokens: computed,
            busiest_sum: busiest,
            answers_computed_tokens: computed,
            answers_without_usage: 0,
            ttft_p50_ms: ttft,
            ttft_p99_ms: ttft,
            wall_ms: 1_000.0,
            placements: vec![vec![1, 1]],
            memory_in_use: None,
            baseline_of: None,
        }
    }

    #[test]
    fn a_route_dominates_ours_only_with_fewer_tokens_and_a_lower_busiest_sum() {
        let ours = figures("proxy", 100, 50, 1.0);
        assert!(figures("a", 90, 40, 1.0).dominates(&ours));
        assert!(!figures("b", 90, 60, 1.0).dominates(&ours));
        assert!(!figures("c", 100, 40, 1.0).dominates(&ours));
    }

    #[test]
    fn the_summary_spans_the_seeds_and_names_who_dominates() {
        let workload = |seed, proxy_computed| WorkloadReport {
            workload: "grpo".into(),
            seed,
            steps: 1,
            requests: 2 + seed as usize,
            prompt_tokens: 400,
            lower_bound_tokens: 100,
            lower_bound_busiest: 50,
            routes: vec![
                figures(ROUND_ROBIN, 300, 150, 200.0),
                figures("proxy", proxy_computed, 100, 100.0),
                figures("peer", 150, 90, 100.0),
                RouteFigures {
                    wall_ms: 800.0,
                    baseline_of: Some("proxy".into()),
                    ..figures("produce + direct", proxy_computed, 100, 100.0)
                },
            ],
            skipped: vec![("session".into(), "no conversations".into())],
            simulator: Vec::new(),
        };
        let report = Report {
            setup: Setup {
                provenance: Provenance::default(),
                routes: Vec::new(),
                engine: "vllm".into(),
                replicas: 2,
                engine_settings: String::new(),
                max_tokens: 1,
                seeds: vec![1, 2],
                model: "tiny".into(),
                prompts: "text".into(),
                direct_fraction: 0.25,
                upstream: "at most 2 idle per replica".into(),
                answers: "streamed".into(),
            },
            workloads: vec![workload(1, 175), workload(2, 125)],
        };
        let markdown = report.to_markdown();
        // Each seed's own request count, not the first seed's.
        assert!(
            markdown.contains("**grpo**: 1 steps, 3-4 requests; over seeds 1, 2"),
            "{markdown}"
        );
        assert!(
            markdown.contains("Direct fraction 0.25: that share"),
            "{markdown}"
        );
        assert!(
            markdown.contains("| proxy | 1.25-1.75 | 0.42-0.58 | 2.00 | 0.67 | 0.50 |"),
            "{markdown}"
        );
        assert!(
            markdown.contains("- seed 1: proxy is dominated by peer"),
            "{markdown}"
        );
        assert!(
            markdown.contains("- seed 2: proxy is dominated by no route"),
            "{markdown}"
        );
        assert!(markdown.contains("- seed 1: session not run: no conversations"));
        assert!(
            markdown.contains(
                "- wall time through proxy x produce + direct (the producer's placements sent \
                 straight): 1.25 (1.00 s / 0.80 s, seed 1), 1.25 (1.00 s / 0.80 s, seed 2)"
            ),
            "{markdown}"
        );
    }
}
