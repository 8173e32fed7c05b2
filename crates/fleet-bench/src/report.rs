//! The fleet bench's figures: per fleet size, workload, seed and route, one row per step (an RL
//! step, an agents' round, an offered rate), with the client's and the simulators' own
//! latencies side by side, the CPU each process used, and ratios to round-robin in the same
//! run; the JSON and markdown they are published as.

use std::collections::BTreeMap;
use std::fmt::Write;

use burst_prefix_engine_bench::provenance::Provenance;
use burst_prefix_engine_bench::report::{percentile, range};
use burst_prefix_engine_bench::routes::Route;
use serde::Serialize;

use crate::sim::SimTotals;

/// The name of the route every ratio is taken to.
pub const ROUND_ROBIN: &str = "round-robin";

/// Latencies of one step at the client, in milliseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientLatencies {
    /// Streamed requests only (NaN otherwise).
    pub ttft_mean_ms: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    pub e2e_mean_ms: f64,
    pub e2e_p50_ms: f64,
    pub e2e_p99_ms: f64,
}

impl ClientLatencies {
    /// From each answered request's time to first byte (if streamed) and latency.
    pub fn of(ttft_ms: &[f64], e2e_ms: &[f64]) -> ClientLatencies {
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        ClientLatencies {
            ttft_mean_ms: mean(ttft_ms),
            ttft_p50_ms: percentile(ttft_ms, 50.0),
            ttft_p99_ms: percentile(ttft_ms, 99.0),
            e2e_mean_ms: mean(e2e_ms),
            e2e_p50_ms: percentile(e2e_ms, 50.0),
            e2e_p99_ms: percentile(e2e_ms, 99.0),
        }
    }
}

/// What the simulators say about one step, summed over the fleet (milliseconds).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SimFigures {
    /// `vllm:prefix_cache_hits_total / _queries_total`.
    pub hit_rate: f64,
    /// Mean of queue time plus simulated prefill over the requests that got their first token:
    /// the time to first token a client would see without the network and the router.
    pub ttft_mean_ms: f64,
    /// The prefill alone (`vllm:time_to_first_token_seconds`), its mean and quantiles
    /// interpolated within the simulator's buckets.
    pub prefill_mean_ms: f64,
    pub prefill_p50_ms: f64,
    pub prefill_p99_ms: f64,
    /// Queue time per request (over every request, waiting or not).
    pub queue_mean_ms: f64,
    /// `vllm:e2e_request_latency_seconds`.
    pub e2e_mean_ms: f64,
    pub e2e_p50_ms: f64,
    pub e2e_p99_ms: f64,
    pub requests: f64,
    pub output_tokens: f64,
    /// Requests per replica class (in fleet.yaml's order).
    pub requests_per_class: Vec<f64>,
    /// The replicas' real prefill and decode times over the latency model's (1.0: on time; more:
    /// the simulators were short of CPU and every time figure is stretched).
    pub prefill_slowdown: f64,
    pub decode_slowdown: f64,
    /// The most requests one replica served, and the fewest.
    pub busiest_replica_requests: f64,
    pub idlest_replica_requests: f64,
}

impl SimFigures {
    /// From the fleet's totals over the step; `classes[r]` is replica r's class of `class_count`.
    pub fn of(totals: &SimTotals, classes: &[usize], class_count: usize) -> SimFigures {
        let ms = |s: f64| s * 1e3;
        let mut per_class = vec![0.0; class_count];
        for (replica, &n) in totals.per_replica_requests.iter().enumerate() {
            per_class[classes[replica]] += n;
        }
        let per_replica = &totals.per_replica_requests;
        let (prefill_slowdown, decode_slowdown) = totals.slowdown();
        SimFigures {
            prefill_slowdown,
            decode_slowdown,
            hit_rate: totals.hit_rate(),
            // The simulator observes a queue time only for requests that waited: the queue's
            // sum is spread over every request that reached its first token.
            ttft_mean_ms: ms((totals.queue.sum + totals.ttft.sum) / totals.ttft.count),
            prefill_mean_ms: ms(totals.ttft.mean()),
            prefill_p50_ms: ms(totals.ttft.quantile(0.5)),
            prefill_p99_ms: ms(totals.ttft.quantile(0.99)),
            queue_mean_ms: ms(totals.queue.sum / totals.ttft.count),
            e2e_mean_ms: ms(totals.e2e.mean()),
            e2e_p50_ms: ms(totals.e2e.quantile(0.5)),
            e2e_p99_ms: ms(totals.e2e.quantile(0.99)),
            requests: totals.requests_finished,
            output_tokens: totals.generation_tokens,
            requests_per_class: per_class,
            busiest_replica_requests: per_replica.iter().copied().fold(0.0, f64::max),
            idlest_replica_requests: per_replica.iter().copied().fold(f64::INFINITY, f64::min),
        }
    }
}

/// CPU one process (or group) used during a step.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuUse {
    pub process: String,
    pub seconds: f64,
}

/// One step of a run: an RL step, an agents' round, or one offered rate.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StepFigures {
    pub step: usize,
    /// inference-perf's offered rate, requests per second (None for the driver's steps).
    pub offered_rate: Option<f64>,
    pub requests: usize,
    pub failures: usize,
    /// The driver's failed requests by what the client saw (inference-perf's are counted only).
    pub failure_reasons: BTreeMap<String, usize>,
    /// From the first request sent to the last answer (the driver's steps); an RL step's
    /// figure.
    pub makespan_ms: Option<f64>,
    /// The step's wall time (for an inference-perf stage: its start to its end in the log).
    pub wall_s: f64,
    pub client: ClientLatencies,
    pub sims: SimFigures,
    /// Output tokens per second: the client's count (inference-perf's, or the driver's over the
    /// makespan).
    pub output_tokens_per_s: f64,
    pub cpu: Vec<CpuUse>,
    /// The share of the step's wall time during which some task on the machine waited for a
    /// CPU (/proc/pressure/cpu): how contended the cores were, by this bench or anything else.
    pub cpu_pressure: f64,
}

impl StepFigures {
    /// CPU milliseconds per request of `process` (of all its groups: several producers).
    pub fn cpu_ms_per_request(&self, process: &str) -> f64 {
        let mut of_process = self.cpu.iter().filter(|c| c.process == process).peekable();
        if of_process.peek().is_none() {
            return f64::NAN;
        }
        of_process.map(|c| c.seconds).sum::<f64>() * 1e3 / self.requests.max(1) as f64
    }

    /// The busiest process's CPU over the step's wall time, in cores.
    pub fn busiest_cores(&self) -> (String, f64) {
        self.cpu
            .iter()
            .map(|c| (c.process.clone(), c.seconds / self.wall_s))
            .fold((String::new(), 0.0), |a, b| if b.1 > a.1 { b } else { a })
    }
}

/// One route's run of one workload on one fleet with one seed.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunFigures {
    pub replicas: usize,
    pub workload: String,
    pub seed: u64,
    pub route: String,
    pub steps: Vec<StepFigures>,
}

/// A route configured but not run, and why.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Skipped {
    pub route: String,
    pub why: String,
}

/// How the bench was run.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Setup {
    /// When, from which commit, on how many cores, under what load at the start.
    pub provenance: Provenance,
    /// `/proc/loadavg` when the bench ended.
    pub load_average_end: String,
    pub wall_time_s: f64,
    pub command: String,
    pub simulator: String,
    pub time_scale: f64,
    pub fleet: serde_json::Value,
    pub replicas: Vec<usize>,
    pub seeds: Vec<u64>,
    pub workloads: serde_json::Value,
    /// Every route, with its configuration as given (pending ones too).
    pub routes: Vec<Route>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub setup: Setup,
    pub runs: Vec<RunFigures>,
    pub skipped: Vec<Skipped>,
}

/// A figure of a step.
pub type Pick = fn(&StepFigures) -> f64;

/// The figures the summary shows as ratios to round-robin's, per step: the client's, and the
/// simulators' own time to first token (queue + prefill; for the RL steps, whose answers are not
/// streamed, the only one).
pub const RATIOS: [(&str, Pick); 6] = [
    ("makespan", |s| s.makespan_ms.unwrap_or(f64::NAN)),
    ("TTFT p50", |s| s.client.ttft_p50_ms),
    ("TTFT p99", |s| s.client.ttft_p99_ms),
    ("e2e p50", |s| s.client.e2e_p50_ms),
    ("e2e p99", |s| s.client.e2e_p99_ms),
    ("sims' TTFT mean", |s| s.sims.ttft_mean_ms),
];

impl Report {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report serializes")
    }

    /// (replicas, workload) pairs in order of first appearance.
    pub fn cells(&self) -> Vec<(usize, &str)> {
        let mut cells: Vec<(usize, &str)> = Vec::new();
        for run in &self.runs {
            if !cells.contains(&(run.replicas, run.workload.as_str())) {
                cells.push((run.replicas, &run.workload));
            }
        }
        cells
    }

    /// The routes' names, in order of first appearance.
    pub fn route_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for run in &self.runs {
            if !names.contains(&run.route.as_str()) {
                names.push(&run.route);
            }
        }
        names
    }

    /// The runs of one cell and route, one per seed.
    pub fn runs_of(&self, replicas: usize, workload: &str, route: &str) -> Vec<&RunFigures> {
        self.runs
            .iter()
            .filter(|r| r.replicas == replicas && r.workload == workload && r.route == route)
            .collect()
    }

    /// `pick(step) / pick(round-robin's same step)` over every seed and step of a cell.
    pub fn ratios(&self, replicas: usize, workload: &str, route: &str, pick: Pick) -> Vec<f64> {
        let mut ratios = Vec::new();
        for run in self.runs_of(replicas, workload, route) {
            let Some(rr) = self
                .runs_of(replicas, workload, ROUND_ROBIN)
                .into_iter()
                .find(|r| r.seed == run.seed)
            else {
                continue;
            };
            for (step, base) in run.steps.iter().zip(&rr.steps) {
                ratios.push(pick(step) / pick(base));
            }
        }
        ratios
    }

    /// Markdown: the setup, per cell a summary over seeds and steps (ratios to round-robin),
    /// then every step's figures.
    pub fn to_markdown(&self) -> String {
        let s = &self.setup;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "Fleet bench, {} (commit {}), {} cores, load average {} at the start and {} at the \
             end, {:.0} s in all: `{}`.\n\nSimulator: {}, every latency x {}. Replicas: {:?}; \
             seeds {:?}. Routes and the fleet's classes: see the JSON's `setup`.\n",
            s.provenance.date,
            s.provenance.commit,
            s.provenance.cores,
            s.provenance.load_average,
            s.load_average_end,
            s.wall_time_s,
            s.command,
            s.simulator,
            s.time_scale,
            s.replicas,
            s.seeds
        );
        for skipped in &self.skipped {
            let _ = writeln!(out, "- {}: not run: {}", skipped.route, skipped.why);
        }
        out.push('\n');
        for (replicas, workload) in self.cells() {
            let names: Vec<String> = RATIOS.iter().map(|(n, _)| format!("{n} x rr")).collect();
            let _ = writeln!(
                out,
                "**{workload}, {replicas} replicas**: ratios to round-robin over seeds and steps, \
                 and absolute figures (slowdown: the simulators' real decode time over their \
                 model's, 1.0 when they had the CPU they needed; route CPU: the front's, \
                 router's or producer's CPU per request).\n\n| route | {} | hit rate | \
                 makespan s | TTFT p50 ms | out tok/s | slowdown | route CPU ms/req |\n\
                 |---|{}---:|---:|---:|---:|---:|---:|",
                names.join(" | "),
                "---:|".repeat(RATIOS.len())
            );
            for route in self.route_names() {
                let runs = self.runs_of(replicas, workload, route);
                if runs.is_empty() {
                    continue;
                }
                let steps: Vec<&StepFigures> = runs.iter().flat_map(|r| &r.steps).collect();
                let column = |f: &dyn Fn(&StepFigures) -> f64, decimals| {
                    range(&steps.iter().map(|s| f(s)).collect::<Vec<_>>(), decimals)
                };
                let ratios: Vec<String> = RATIOS
                    .iter()
                    .map(|(_, pick)| range(&self.ratios(replicas, workload, route, *pick), 2))
                    .collect();
                let _ = writeln!(
                    out,
                    "| {route} | {} | {} | {} | {} | {} | {} | {} |",
                    ratios.join(" | "),
                    column(&|s| s.sims.hit_rate, 2),
                    column(&|s| s.makespan_ms.unwrap_or(f64::NAN) / 1e3, 1),
                    column(&|s| s.client.ttft_p50_ms, 0),
                    column(&|s| s.output_tokens_per_s, 0),
                    column(&|s| s.sims.decode_slowdown, 2),
                    column(&|s| s.cpu_ms_per_request("route"), 2),
                );
            }
            out.push('\n');
        }
        out.push_str(
            "### Every step\n\nClient and simulators side by side: TTFT mean at the client \
             against the simulators' queue + prefill mean, e2e mean against theirs; CPU in ms per \
             request of the client, the route's front and the simulators together.\n\n",
        );
        for run in &self.runs {
            let _ = writeln!(
                out,
                "**{}, {} replicas, seed {}, {}**\n\n| step | rate | requests (failed) | \
                 makespan s | TTFT p50/p99 ms | e2e p50/p99 ms | TTFT mean ms client/sims | e2e \
                 mean ms client/sims | hit rate | per class | busiest/idlest replica | out tok/s \
                 | CPU ms/request | busiest process, cores | CPU pressure | sims' slowdown \
                 prefill/decode |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---|---|---:|---:|",
                run.workload, run.replicas, run.seed, run.route
            );
            for step in &run.steps {
                let cpu: Vec<String> = step
                    .cpu
                    .iter()
                    .map(|c| format!("{} {:.2}", c.process, step.cpu_ms_per_request(&c.process)))
                    .collect();
                let (busiest, cores) = step.busiest_cores();
                let classes: Vec<String> = step
                    .sims
                    .requests_per_class
                    .iter()
                    .map(|n| format!("{n:.0}"))
                    .collect();
                let _ = writeln!(
                    out,
                    "| {} | {} | {} ({}) | {} | {:.0}/{:.0} | {:.0}/{:.0} | {:.0}/{:.0} | \
                     {:.0}/{:.0} | {:.3} | {} | {:.0}/{:.0} | {:.0} | {} | {busiest} {cores:.2} | \
                     {:.2} | {:.2}/{:.2} |",
                    step.step,
                    step.offered_rate.map_or("-".into(), |r| format!("{r}/s")),
                    step.requests,
                    step.failures,
                    step.makespan_ms
                        .map_or("-".into(), |m| format!("{:.2}", m / 1e3)),
                    step.client.ttft_p50_ms,
                    step.client.ttft_p99_ms,
                    step.client.e2e_p50_ms,
                    step.client.e2e_p99_ms,
                    step.client.ttft_mean_ms,
                    step.sims.ttft_mean_ms,
                    step.client.e2e_mean_ms,
                    step.sims.e2e_mean_ms,
                    step.sims.hit_rate,
                    classes.join("/"),
                    step.sims.busiest_replica_requests,
                    step.sims.idlest_replica_requests,
                    step.output_tokens_per_s,
                    cpu.join(", "),
                    step.cpu_pressure,
                    step.sims.prefill_slowdown,
                    step.sims.decode_slowdown,
                );
            }
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn step(makespan: f64, ttft: f64, rate: Option<f64>) -> StepFigures {
        StepFigures {
            step: 0,
            offered_rate: rate,
            requests: 10,
            failures: 0,
            failure_reasons: BTreeMap::new(),
            makespan_ms: Some(makespan),
            wall_s: 2.0,
            client: ClientLatencies {
                ttft_p50_ms: ttft,
                ttft_p99_ms: ttft * 2.0,
                ..ClientLatencies::default()
            },
            sims: SimFigures::default(),
            output_tokens_per_s: 100.0 * rate.unwrap_or(1.0),
            cpu: vec![CpuUse {
                process: "client".into(),
                seconds: 0.5,
            }],
            cpu_pressure: 0.1,
        }
    }

    pub(crate) fn report(runs: Vec<RunFigures>) -> Report {
        Report {
            setup: Setup {
                provenance: Provenance::default(),
                load_average_end: "1.0".into(),
                wall_time_s: 1.0,
                command: "make bench-fleet".into(),
                simulator: "llm-d-inference-sim".into(),
                time_scale: 1.0,
                fleet: serde_json::Value::Null,
                replicas: vec![16],
                seeds: vec![1, 2],
                workloads: serde_json::Value::Null,
                routes: Vec::new(),
            },
            runs,
            skipped: vec![Skipped {
                route: "ours, with KV events".into(),
                why: "pending".into(),
            }],
        }
    }

    fn run(route: &str, seed: u64, makespan: f64) -> RunFigures {
        RunFigures {
            replicas: 16,
            workload: "rl-64x8".into(),
            seed,
            route: route.into(),
            steps: vec![step(makespan, makespan / 10.0, None)],
        }
    }

    #[test]
    fn ratios_are_to_round_robin_of_the_same_seed_and_step() {
        let report = report(vec![
            run(ROUND_ROBIN, 1, 1000.0),
            run("ours", 1, 800.0),
            run(ROUND_ROBIN, 2, 2000.0),
            run("ours", 2, 2200.0),
        ]);
        let ratios = report.ratios(16, "rl-64x8", "ours", RATIOS[0].1);
        assert_eq!(ratios, vec![0.8, 1.1]);
        let markdown = report.to_markdown();
        assert!(
            markdown.contains("| ours | 0.80-1.10 | 0.80-1.10 |"),
            "{markdown}"
        );
        assert!(markdown.contains("ours, with KV events: not run: pending"));
        assert!(markdown.contains("client 50.00"), "{markdown}");
        assert_eq!(
            step(1.0, 1.0, None).busiest_cores(),
            ("client".into(), 0.25)
        );
    }
}
