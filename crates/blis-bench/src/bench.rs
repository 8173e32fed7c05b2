//! One bench run: every route on every trace at every size, two replays at a time, into one
//! result file (JSON, with the markdown and the chart made from it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context;
use burst_prefix_engine_bench::provenance::Provenance;
use serde::{Deserialize, Serialize};

use crate::blis::{Blis, PlacerCommand, Replay, Setting};
use crate::report::{RouteFigures, RunReport};
use crate::routes::Route;
use crate::workloads::{Trace, Workload};

/// What a result file says about how it was made.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Setup {
    pub provenance: Provenance,
    /// The BLIS commit the replays ran on.
    pub blis_commit: String,
    pub setting: Setting,
    pub seed: u64,
    pub routes: Vec<Route>,
    /// The `max_tokens` every request of our route asked for.
    pub max_tokens: u32,
    /// The command that made it.
    pub command: String,
    /// The bench's round-robin against a plain `blis replay --routing-policy round-robin` of
    /// the first trace, on BLIS built without our policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plain_round_robin: Option<PlainCheck>,
}

/// The bench's BLIS runs BLIS's own routers as BLIS does.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlainCheck {
    pub trace: String,
    pub instances: usize,
    pub bench_makespan_s: f64,
    pub plain_makespan_s: f64,
    pub bench_ttft_mean_ms: f64,
    pub plain_ttft_mean_ms: f64,
    /// Every cluster figure equal.
    pub equal: bool,
}

/// The result file.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Results {
    pub setup: Setup,
    pub runs: Vec<RunReport>,
    /// An outside trace's figures, by route (the one run's), as `make bench-blis BLIS_ARGS=...`
    /// promises them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub routes: Option<BTreeMap<String, RouteFigures>>,
}

/// A trace to run, generated or from outside.
pub struct Job {
    pub name: String,
    pub instances: usize,
    pub dir: PathBuf,
    /// A generated trace (for its steps and classes); `None` for an outside one.
    pub trace: Option<Trace>,
    pub sessions: bool,
    pub max_tokens: u32,
}

impl Job {
    /// Writes `workload`'s trace at `instances` under `work`.
    pub fn generated(
        workload: Workload,
        instances: usize,
        seed: u64,
        work: &Path,
    ) -> anyhow::Result<Job> {
        let trace = workload.trace(instances, seed);
        let name = workload.name().to_string();
        let dir = work.join(format!("traces/{name}-{instances}-seed{seed}"));
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("header.yaml"), trace.header())?;
        std::fs::write(dir.join("data.csv"), trace.csv())?;
        Ok(Job {
            name,
            instances,
            dir,
            sessions: trace.sessions,
            max_tokens: trace.max_tokens,
            trace: Some(trace),
        })
    }
}

/// How every replay of a run is made.
pub struct Bench<'a> {
    pub blis: &'a Blis,
    pub setting: &'a Setting,
    pub routes: &'a [Route],
    pub seed: u64,
    /// Replays at once.
    pub jobs: usize,
    /// Longest a replay may take.
    pub limit: Duration,
    /// Our placer's binary (this one).
    pub placer: &'a Path,
    /// Further BLIS flags for every replay.
    pub extra: &'a [String],
    /// Where each replay's output goes.
    pub work: &'a Path,
}

/// Runs every route on every job, `bench.jobs` replays at a time.
pub fn run_all(bench: &Bench<'_>, work_items: &[Job]) -> Vec<RunReport> {
    let Bench {
        blis,
        setting,
        routes,
        seed,
        jobs,
        limit,
        placer: placer_binary,
        extra,
        work,
    } = *bench;
    let tasks: Vec<(usize, usize)> = (0..work_items.len())
        .flat_map(|job| (0..routes.len()).map(move |route| (job, route)))
        .collect();
    let reports: Vec<Mutex<RunReport>> = work_items
        .iter()
        .map(|job| {
            Mutex::new(RunReport {
                workload: job.name.clone(),
                instances: job.instances,
                requests: job.trace.as_ref().map_or(0, |t| t.rows.len()),
                objective: job.trace.as_ref().map(|t| t.workload.objective()),
                repeats_or_streams: job
                    .trace
                    .as_ref()
                    .is_some_and(|t| t.workload.repeats_or_streams()),
                ..RunReport::default()
            })
        })
        .collect();
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| loop {
                let Some(&(j, r)) = tasks.get(next.fetch_add(1, Ordering::Relaxed)) else {
                    return;
                };
                let (job, route) = (&work_items[j], &routes[r]);
                let mut args = route.blis_args();
                args.extend(extra.iter().cloned());
                let replay = Replay {
                    trace_dir: &job.dir,
                    sessions: job.sessions,
                    max_tokens: job.max_tokens,
                    setting,
                    instances: job.instances,
                    seed,
                    args: &args,
                    limit,
                };
                let placer = route.planner_yaml().map(|planner| PlacerCommand {
                    binary: placer_binary.to_path_buf(),
                    planner,
                });
                let out = work.join(format!("runs/{}-{}/{}", job.name, job.instances, route.name));
                let rows = job.trace.as_ref().map(Trace::by_request_id);
                let outcome = blis.replay(&replay, placer.as_ref(), &out);
                let mut report = reports[j].lock().expect("no panic holds it");
                match outcome {
                    Ok(outcome) => {
                        let figures = RouteFigures::from_outcome(&outcome, rows.as_ref());
                        eprintln!(
                            "{} x{} {}: makespan {:.1} s{}, TTFT {:.0} ms, hit rate {:.2} ({:.1} s)",
                            job.name,
                            job.instances,
                            route.name,
                            figures.makespan_s,
                            figures
                                .steps_s
                                .map_or(String::new(), |s| format!(" (steps {s:.1} s)")),
                            figures.ttft_mean_ms,
                            figures.hit_rate,
                            figures.wall_s,
                        );
                        report.routes.insert(route.name.clone(), figures);
                    }
                    Err(error) => {
                        eprintln!("{} x{} {}: FAILED: {error:#}", job.name, job.instances, route.name);
                        report.failed.insert(route.name.clone(), format!("{error:#}"));
                    }
                }
            });
        }
    });
    reports
        .into_iter()
        .map(|r| r.into_inner().expect("no panic holds it"))
        .collect()
}

/// Replays round-robin on `job` with the bench's BLIS and with `plain` (the same commit without
/// our policy) and compares BLIS's cluster figures.
pub fn check_plain(bench: &Bench<'_>, plain: &Blis, job: &Job) -> anyhow::Result<PlainCheck> {
    let args = vec!["--routing-policy".to_string(), "round-robin".to_string()];
    let replay = Replay {
        trace_dir: &job.dir,
        sessions: job.sessions,
        max_tokens: job.max_tokens,
        setting: bench.setting,
        instances: job.instances,
        seed: bench.seed,
        args: &args,
        limit: bench.limit,
    };
    let ours = bench
        .blis
        .replay(&replay, None, &bench.work.join("plain-check/bench"))?
        .cluster;
    let plain = plain
        .replay(&replay, None, &bench.work.join("plain-check/plain"))?
        .cluster;
    Ok(PlainCheck {
        trace: job.name.clone(),
        instances: job.instances,
        bench_makespan_s: ours.vllm_estimated_duration_s,
        plain_makespan_s: plain.vllm_estimated_duration_s,
        bench_ttft_mean_ms: ours.ttft_mean_ms,
        plain_ttft_mean_ms: plain.ttft_mean_ms,
        equal: ours == plain,
    })
}

/// Writes `results` as `out` (JSON), with the tables (`.md`) and the chart (`.svg`) beside it.
pub fn publish(results: &Results, out: &Path) -> anyhow::Result<()> {
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(out, serde_json::to_string_pretty(results)? + "\n")
        .with_context(|| format!("writing {}", out.display()))?;
    write_tables(&serde_json::to_value(results)?, out)
}

/// Writes the tables (`.md`) and the chart (`.svg`) of the result file `json` (read as `value`)
/// beside it.
pub fn write_tables(value: &serde_json::Value, json: &Path) -> anyhow::Result<()> {
    let file = json
        .file_name()
        .map_or(String::new(), |n| n.to_string_lossy().to_string());
    std::fs::write(
        json.with_extension("md"),
        crate::tables::markdown(value, &file)?,
    )?;
    std::fs::write(
        json.with_extension("svg"),
        crate::chart::svg(value).map_err(anyhow::Error::msg)?,
    )?;
    Ok(())
}

/// The runs of a result file, read back (for the tables and the chart).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Stored {
    pub setup: StoredSetup,
    pub runs: Vec<RunReport>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredSetup {
    pub provenance: StoredProvenance,
    pub blis_commit: String,
    pub setting: serde_json::Value,
    pub seed: u64,
    pub routes: Vec<Route>,
    pub max_tokens: u32,
    pub command: String,
    #[serde(default)]
    pub plain_round_robin: Option<PlainCheck>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredProvenance {
    pub date: String,
    pub commit: String,
    pub cores: usize,
}
