//! The figures of a run, as the result file keeps them, and the tables made from them.
//!
//! Per route: BLIS's own cluster figures (`makespanS` is its `vllm_estimated_duration_s`), and
//! from its per-request results the RL steps' makespans (each step from its arrival to its last
//! answer, summed: what a synchronous RL loop waits for) and the time to first token per class
//! of client.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::blis::Outcome;
use crate::placer::PlacerStats;
use crate::workloads::{Class, Objective, Row};

/// One route's figures on one trace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteFigures {
    /// BLIS's `vllm_estimated_duration_s`: from the first arrival to the last answer.
    pub makespan_s: f64,
    pub ttft_mean_ms: f64,
    pub ttft_p99_ms: f64,
    pub e2e_mean_ms: f64,
    pub e2e_p99_ms: f64,
    /// BLIS's prefix cache hit rate (blocks found cached over blocks needed).
    pub hit_rate: f64,
    /// Preemptions per request.
    pub preemption_rate: f64,
    pub completed: u64,
    /// The RL steps' makespans, summed (each from its arrival to its last answer); absent
    /// without RL steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps_s: Option<f64>,
    /// Each step's makespan, in the trace's order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub step_makespans_s: Vec<f64>,
    /// Mean time to first token per class of client (`rl`, `agent`, `chat`).
    #[serde(default)]
    pub ttft_mean_ms_by_class: BTreeMap<String, f64>,
    /// Wall seconds the replay took (BLIS, and for ours the placer beside it).
    pub wall_s: f64,
    /// For ours: what the placer measured of itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placer: Option<PlacerStats>,
}

impl RouteFigures {
    /// The figures of `outcome` on a trace of `rows` (`None`: an outside trace, whose rows the
    /// bench does not know: BLIS's figures only).
    pub fn from_outcome(outcome: &Outcome, rows: Option<&HashMap<String, &Row>>) -> Self {
        let cluster = &outcome.cluster;
        let mut figures = RouteFigures {
            makespan_s: cluster.vllm_estimated_duration_s,
            ttft_mean_ms: cluster.ttft_mean_ms,
            ttft_p99_ms: cluster.ttft_p99_ms,
            e2e_mean_ms: cluster.e2e_mean_ms,
            e2e_p99_ms: cluster.e2e_p99_ms,
            hit_rate: cluster.hit_rate,
            preemption_rate: cluster.preemption_rate,
            completed: cluster.completed_requests,
            wall_s: outcome.seconds,
            placer: outcome.placer.clone(),
            ..RouteFigures::default()
        };
        let Some(rows) = rows else {
            return figures;
        };
        // Steps: start (its arrival) and the latest end of its requests.
        let mut steps: BTreeMap<u32, (u64, f64)> = BTreeMap::new();
        let mut ttfts: BTreeMap<&str, (f64, u64)> = BTreeMap::new();
        for request in &outcome.requests {
            let row = rows.get(&request.request_id);
            // A session's later rounds carry BLIS's own ids.
            let class = match row {
                Some(row) => class_label(row.class),
                None if request.request_id.starts_with("session_") => class_label(Class::Agent),
                None => "other",
            };
            let entry = ttfts.entry(class).or_default();
            entry.0 += request.ttft_us / 1e3;
            entry.1 += 1;
            if let Some(row) = row {
                if let Some(step) = row.step {
                    let end = row.arrival_us as f64 + request.e2e_us;
                    let slot = steps.entry(step).or_insert((row.arrival_us, end));
                    slot.0 = slot.0.min(row.arrival_us);
                    slot.1 = slot.1.max(end);
                }
            }
        }
        figures.ttft_mean_ms_by_class = ttfts
            .into_iter()
            .map(|(class, (sum, n))| (class.to_string(), sum / n as f64))
            .collect();
        figures.step_makespans_s = steps
            .values()
            .map(|&(start, end)| (end - start as f64) / 1e6)
            .collect();
        if !figures.step_makespans_s.is_empty() {
            figures.steps_s = Some(figures.step_makespans_s.iter().sum());
        }
        figures
    }

    /// The makespan a workload judged by `objective` is judged by: its steps' (summed) for
    /// synchronous RL steps, else BLIS's.
    pub fn judged_makespan_s(&self, objective: Option<Objective>) -> f64 {
        match (objective, self.steps_s) {
            (Some(Objective::Steps), Some(steps)) => steps,
            _ => self.makespan_s,
        }
    }
}

fn class_label(class: Class) -> &'static str {
    match class {
        Class::Rl => "rl",
        Class::Agent => "agent",
        Class::Chat => "chat",
    }
}

/// One trace at one size, every route.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunReport {
    pub workload: String,
    pub instances: usize,
    pub requests: usize,
    pub objective: Option<Objective>,
    /// Its prompts come back (an epoch repeated) or it is a stream: where the TTFT targets
    /// are stricter.
    #[serde(default)]
    pub repeats_or_streams: bool,
    /// By route name, in the routes' order.
    pub routes: BTreeMap<String, RouteFigures>,
    /// Routes that failed, with why.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub failed: BTreeMap<String, String>,
}

/// The baseline every ratio is against.
pub const BASELINE: &str = "round-robin";
/// Our routes' names start with this.
pub const OURS: &str = "ours";

impl RunReport {
    /// `figures`' makespan as this run is judged by it.
    pub fn judged_makespan_s(&self, figures: &RouteFigures) -> f64 {
        figures.judged_makespan_s(self.objective)
    }

    /// The best of the routes that are not ours by `figure` (lowest), with its name.
    pub fn best_peer(&self, figure: impl Fn(&RouteFigures) -> f64) -> Option<(&str, f64)> {
        self.routes
            .iter()
            .filter(|(name, _)| !name.starts_with(OURS))
            .map(|(name, figures)| (name.as_str(), figure(figures)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// The markdown table of this run: every route's figures and its ratios to round-robin's.
    pub fn table(&self, order: &[String]) -> String {
        let mut md = String::new();
        let baseline = self.routes.get(BASELINE);
        let ratio = |value: f64, base: Option<f64>| match base {
            Some(base) if base > 0.0 => format!(" ({:.2}x)", value / base),
            _ => String::new(),
        };
        let _ = writeln!(
            md,
            "| route | makespan s | steps s | TTFT mean ms | TTFT p99 ms | e2e mean ms | e2e p99 ms | hit rate | preemptions / request |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
        for name in order {
            let Some(f) = self.routes.get(name) else {
                if let Some(why) = self.failed.get(name) {
                    let _ = writeln!(md, "| {name} | failed: {why} | | | | | | | |");
                }
                continue;
            };
            let steps = f.steps_s.map_or(String::from("-"), |s| {
                format!("{s:.1}{}", ratio(s, baseline.and_then(|b| b.steps_s)))
            });
            let _ = writeln!(
                md,
                "| {name} | {:.1}{} | {steps} | {:.0}{} | {:.0}{} | {:.0}{} | {:.0}{} | {:.2} | {:.4} |",
                f.makespan_s,
                ratio(f.makespan_s, baseline.map(|b| b.makespan_s)),
                f.ttft_mean_ms,
                ratio(f.ttft_mean_ms, baseline.map(|b| b.ttft_mean_ms)),
                f.ttft_p99_ms,
                ratio(f.ttft_p99_ms, baseline.map(|b| b.ttft_p99_ms)),
                f.e2e_mean_ms,
                ratio(f.e2e_mean_ms, baseline.map(|b| b.e2e_mean_ms)),
                f.e2e_p99_ms,
                ratio(f.e2e_p99_ms, baseline.map(|b| b.e2e_p99_ms)),
                f.hit_rate,
                f.preemption_rate,
            );
        }
        md
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blis::{Cluster, RequestResult};

    fn row(id: u64, class: Class, step: Option<u32>, arrival_us: u64) -> Row {
        Row {
            id,
            class,
            step,
            session: None,
            round: 0,
            group: None,
            input: 1,
            output: 1,
            arrival_us,
        }
    }

    #[test]
    fn steps_are_timed_from_their_arrival_to_their_last_answer_and_summed() {
        let rows = [
            row(0, Class::Rl, Some(0), 0),
            row(1, Class::Rl, Some(0), 0),
            row(2, Class::Rl, Some(1), 100_000_000),
            row(3, Class::Chat, None, 5_000_000),
        ];
        let by_id: HashMap<String, &Row> = rows.iter().map(|r| (r.id.to_string(), r)).collect();
        let result = |id: u64, ttft_us: f64, e2e_us: f64| RequestResult {
            request_id: id.to_string(),
            ttft_us,
            e2e_us,
            output_tokens: 1,
        };
        let outcome = Outcome {
            cluster: Cluster {
                vllm_estimated_duration_s: 130.0,
                ..Cluster::default()
            },
            requests: vec![
                result(0, 1_000.0, 10_000_000.0),
                result(1, 3_000.0, 20_000_000.0),
                result(2, 2_000.0, 30_000_000.0),
                result(3, 500.0, 1_000_000.0),
            ],
            seconds: 1.0,
            placer: None,
        };
        let figures = RouteFigures::from_outcome(&outcome, Some(&by_id));
        assert_eq!(figures.step_makespans_s, vec![20.0, 30.0]);
        assert_eq!(figures.steps_s, Some(50.0));
        assert_eq!(figures.judged_makespan_s(Some(Objective::Steps)), 50.0);
        assert_eq!(figures.judged_makespan_s(Some(Objective::Makespan)), 130.0);
        assert_eq!(figures.ttft_mean_ms_by_class["rl"], 2.0);
        assert_eq!(figures.ttft_mean_ms_by_class["chat"], 0.5);
        // An outside trace: BLIS's figures alone.
        let outside = RouteFigures::from_outcome(&outcome, None);
        assert_eq!(
            (
                outside.steps_s,
                outside.judged_makespan_s(Some(Objective::Steps))
            ),
            (None, 130.0)
        );
    }
}
