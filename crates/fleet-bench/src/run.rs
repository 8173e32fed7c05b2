//! One route's run of one workload: fresh simulator replicas, the route's front (the direct
//! routes' own front process, the producer's release binary, or a peer router), the load (the
//! bench's driver or inference-perf), and each step's figures: the client's latencies, the
//! simulators' own, and the CPU every process used.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};
use burst_prefix_engine_bench::engine::wait_healthy;
use burst_prefix_engine_bench::peers::PeerRouter;
use burst_prefix_engine_bench::process::Process;
use burst_prefix_engine_bench::routes::{Direct, Route, RouteKind};
use serde::Serialize;
use tokio::process::Command;

use crate::cpu;
use crate::inference_perf::{self, Load, StageEvent, StageWatcher};
use crate::load::{self, AgentWorkload, Outcome, Request, RlWorkload};
use crate::producer::Producer;
use crate::report::{ClientLatencies, CpuUse, RunFigures, SimFigures, StepFigures};
use crate::sim::{self, SimOptions, SimReplica, SimTotals};

/// A workload of the bench.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Workload {
    /// RL steps (the driver; answers not streamed, as rollouts are collected).
    Rl(RlWorkload),
    /// Agents' fan-outs (the driver; streamed).
    Agents(AgentWorkload),
    /// inference-perf.
    Perf(Load),
}

impl Workload {
    pub fn name(&self) -> String {
        match self {
            Workload::Rl(w) => format!("rl-{}x{}", w.shape.prompts, w.shape.samples),
            Workload::Agents(w) => format!("agents-{}x{}", w.agents, w.fanout),
            Workload::Perf(load) => load.name().to_string(),
        }
    }
}

/// What every run shares.
pub struct Context {
    pub sim: SimOptions,
    /// This binary: the direct routes' front runs as `<it> front ...`.
    pub bench_binary: PathBuf,
    /// The producer's release binary.
    pub producer: PathBuf,
    pub peers_python: Option<PathBuf>,
    /// inference-perf's venv python and tokenizer directory.
    pub inference_perf: Option<(PathBuf, PathBuf)>,
    pub request_timeout: Duration,
    pub client: reqwest::Client,
}

/// What the requests are sent to.
enum Front {
    Direct(Process, u16),
    Proxy(Producer),
    /// Producers side by side behind the round-robin front (`Route::producers`).
    Producers(Vec<Producer>, Process, u16),
    Peer(PeerRouter),
}

/// Starts the bench's own front (`fleet-bench front`) with `policy` over `workers`.
async fn start_front(
    policy: Direct,
    workers: &[String],
    dir: &Path,
    context: &Context,
) -> anyhow::Result<(Process, u16)> {
    let port = crate::netns::next_port()?;
    let mut command = Command::new(&context.bench_binary);
    command
        .arg("front")
        .args(["--policy", policy_name(policy)])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(workers);
    let mut process = Process::start(command, &dir.join("front.log"))?;
    let url = format!("http://127.0.0.1:{port}/health");
    wait_healthy(&mut process, &url, &context.client, Duration::from_secs(30))
        .await
        .context("the bench's front")?;
    Ok((process, port))
}

impl Front {
    async fn start(
        route: &Route,
        workers: &[String],
        dir: &Path,
        context: &Context,
    ) -> anyhow::Result<Front> {
        let client = &context.client;
        Ok(match &route.kind {
            RouteKind::Direct(policy) => {
                let (process, port) = start_front(*policy, workers, dir, context).await?;
                Front::Direct(process, port)
            }
            RouteKind::Proxy { planner_yaml } if route.producers == 1 => Front::Proxy(
                Producer::start(
                    &context.producer,
                    planner_yaml,
                    workers,
                    (dir, "producer"),
                    false,
                    client,
                )
                .await?,
            ),
            RouteKind::Proxy { planner_yaml } => {
                let mut producers = Vec::with_capacity(route.producers);
                for index in 0..route.producers {
                    let name = format!("producer-{index}");
                    let started = Producer::start(
                        &context.producer,
                        planner_yaml,
                        workers,
                        (dir, &name),
                        true,
                        client,
                    )
                    .await;
                    match started {
                        Ok(producer) => producers.push(producer),
                        Err(error) => {
                            for producer in producers {
                                producer.stop().await;
                            }
                            return Err(error);
                        }
                    }
                }
                let urls: Vec<String> = producers.iter().map(Producer::url).collect();
                match start_front(Direct::RoundRobin, &urls, dir, context).await {
                    Ok((process, port)) => Front::Producers(producers, process, port),
                    Err(error) => {
                        for producer in producers {
                            producer.stop().await;
                        }
                        return Err(error);
                    }
                }
            }
            RouteKind::Peer { peer, args } => {
                let python = context
                    .peers_python
                    .as_deref()
                    .ok_or_else(|| anyhow!("route {:?} needs --peers-python", route.name))?;
                let log = dir.join(format!("{}.log", route.slug()));
                Front::Peer(PeerRouter::start(*peer, python, args, workers, log, client).await?)
            }
            // The fleet's loads come from inference-perf, which sends to one URL.
            RouteKind::ProduceThenDirect { .. } => anyhow::bail!(
                "route {:?}: produceThenDirect is an engine-bench route; the fleet bench's \
                 loads are sent to one URL",
                route.name
            ),
        })
    }

    fn url(&self) -> String {
        match self {
            Front::Direct(_, port) | Front::Producers(_, _, port) => {
                format!("http://127.0.0.1:{port}")
            }
            Front::Proxy(producer) => producer.url(),
            Front::Peer(router) => router.url(),
        }
    }

    /// Its process groups, named as the reports name them: "route" for what places (several
    /// producers' CPU is added up), "front" for the producers' round-robin front.
    fn watched(&self) -> Vec<(String, u32)> {
        let route = |group: Option<u32>| group.map(|g| ("route".to_string(), g));
        match self {
            Front::Direct(process, _) => route(process.group()).into_iter().collect(),
            Front::Proxy(producer) => route(producer.group()).into_iter().collect(),
            Front::Producers(producers, front, _) => producers
                .iter()
                .filter_map(|p| route(p.group()))
                .chain(front.group().map(|g| ("front".to_string(), g)))
                .collect(),
            Front::Peer(router) => route(router.group()).into_iter().collect(),
        }
    }

    async fn stop(self, dir: &Path, client: &reqwest::Client) {
        match self {
            Front::Direct(process, _) => process.stop(Duration::from_secs(5)).await,
            Front::Proxy(producer) => {
                let _ =
                    std::fs::write(dir.join("producer.metrics"), producer.metrics(client).await);
                producer.stop().await;
            }
            Front::Producers(producers, front, _) => {
                front.stop(Duration::from_secs(5)).await;
                for (index, producer) in producers.into_iter().enumerate() {
                    let metrics = producer.metrics(client).await;
                    let _ = std::fs::write(dir.join(format!("producer-{index}.metrics")), metrics);
                    producer.stop().await;
                }
            }
            Front::Peer(router) => {
                let _ = std::fs::write(dir.join("router.metrics"), router.metrics(client).await);
                router.stop().await;
            }
        }
    }
}

fn policy_name(policy: burst_prefix_engine_bench::routes::Direct) -> &'static str {
    match policy {
        burst_prefix_engine_bench::routes::Direct::RoundRobin => "round-robin",
        burst_prefix_engine_bench::routes::Direct::LeastLoaded => "least-loaded",
    }
}

/// Runs `workload` through `route` on `replicas` fresh simulator replicas; logs under `dir`.
pub async fn run(
    context: &Context,
    route: &Route,
    workload: &Workload,
    replicas: usize,
    seed: u64,
    dir: &Path,
) -> anyhow::Result<RunFigures> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut options = context.sim.clone();
    options.seed = seed;
    let fleet = sim::start(&options, replicas, dir, &context.client).await?;
    let workers: Vec<String> = fleet.iter().map(SimReplica::url).collect();
    let result = async {
        let front = Front::start(route, &workers, dir, context).await?;
        // Idle simulators use ~0.008 of a core each (measured: 16 used 1.32 s in 10 s).
        let groups: Vec<u32> = fleet.iter().filter_map(SimReplica::group).collect();
        cpu::settle(&groups, 0.02, Duration::from_secs(15)).await;
        let steps = on_front(context, &front, &fleet, workload, seed, dir).await;
        front.stop(dir, &context.client).await;
        steps
    }
    .await;
    sim::stop(fleet).await;
    Ok(RunFigures {
        replicas,
        workload: workload.name(),
        seed,
        route: route.name.clone(),
        steps: result?,
    })
}

/// The simulators' process groups, as one watched name each.
fn sims_watched(fleet: &[SimReplica]) -> Vec<(String, u32)> {
    fleet
        .iter()
        .filter_map(|r| Some(("sims".to_string(), r.group()?)))
        .collect()
}

/// Sums the CPU of watched entries that share a name (the simulators).
fn merge_cpu(used: Vec<(String, f64)>) -> Vec<CpuUse> {
    let mut merged: Vec<CpuUse> = Vec::new();
    for (process, seconds) in used {
        match merged.iter_mut().find(|c| c.process == process) {
            Some(c) => c.seconds += seconds,
            None => merged.push(CpuUse { process, seconds }),
        }
    }
    merged
}

async fn on_front(
    context: &Context,
    front: &Front,
    fleet: &[SimReplica],
    workload: &Workload,
    seed: u64,
    dir: &Path,
) -> anyhow::Result<Vec<StepFigures>> {
    let classes: Vec<usize> = fleet.iter().map(|r| r.class).collect();
    let class_count = context.sim.fleet.classes.len();
    let mut watched: Vec<(String, u32)> = front.watched();
    watched.extend(sims_watched(fleet));
    match workload {
        Workload::Rl(w) => {
            let steps = w.steps(seed);
            driver_steps(
                context,
                front,
                fleet,
                &steps,
                false,
                &watched,
                &classes,
                class_count,
            )
            .await
        }
        Workload::Agents(w) => {
            let rounds = w.rounds(seed);
            driver_steps(
                context,
                front,
                fleet,
                &rounds,
                true,
                &watched,
                &classes,
                class_count,
            )
            .await
        }
        Workload::Perf(load) => {
            perf_stages(
                context,
                front,
                fleet,
                load,
                seed,
                dir,
                &watched,
                &classes,
                class_count,
            )
            .await
        }
    }
}

/// The driver's steps, one after the other, each sent at once.
#[allow(clippy::too_many_arguments)]
async fn driver_steps(
    context: &Context,
    front: &Front,
    fleet: &[SimReplica],
    steps: &[Vec<Request>],
    stream: bool,
    watched: &[(String, u32)],
    classes: &[usize],
    class_count: usize,
) -> anyhow::Result<Vec<StepFigures>> {
    let send = load::Send {
        url: front.url(),
        stream,
        timeout: context.request_timeout,
    };
    let mut figures = Vec::with_capacity(steps.len());
    for (index, step) in steps.iter().enumerate() {
        let before = sim::scrape(fleet, &context.client).await?;
        let meter = cpu::Meter::start(watched.to_vec());
        let pressure = cpu::pressure();
        let started = Instant::now();
        let outcomes = load::send_step(&context.client, &send, step).await;
        let wall = started.elapsed();
        let used = meter.read("client");
        let pressure = (cpu::pressure() - pressure) / wall.as_secs_f64();
        let answered = outcomes.iter().filter(|o| o.error.is_none()).count() as f64;
        let totals = sim::settled(
            fleet,
            &before,
            answered,
            &context.client,
            Duration::from_secs(10),
        )
        .await?;
        let mut step_figures =
            driver_figures(index, &outcomes, wall, used, &totals, classes, class_count);
        step_figures.cpu_pressure = pressure;
        figures.push(step_figures);
        if let Some(error) = outcomes.iter().find_map(|o| o.error.as_ref()) {
            eprintln!("  step {index}: a request failed: {error}");
        }
    }
    Ok(figures)
}

fn driver_figures(
    step: usize,
    outcomes: &[Outcome],
    wall: Duration,
    used: Vec<(String, f64)>,
    totals: &SimTotals,
    classes: &[usize],
    class_count: usize,
) -> StepFigures {
    let answered: Vec<&Outcome> = outcomes.iter().filter(|o| o.error.is_none()).collect();
    let ttft: Vec<f64> = answered.iter().filter_map(|o| o.ttft_ms).collect();
    let e2e: Vec<f64> = answered.iter().map(|o| o.latency_ms).collect();
    // From the first request sent to the last answer.
    let makespan_ms = answered
        .iter()
        .map(|o| o.sent_ms + o.latency_ms)
        .fold(0.0, f64::max)
        - answered
            .iter()
            .map(|o| o.sent_ms)
            .fold(f64::INFINITY, f64::min);
    let output_tokens: u64 = answered.iter().map(|o| o.output_tokens).sum();
    let mut failure_reasons = BTreeMap::new();
    for error in outcomes.iter().filter_map(|o| o.error.as_ref()) {
        *failure_reasons.entry(error.clone()).or_insert(0) += 1;
    }
    StepFigures {
        step,
        offered_rate: None,
        requests: outcomes.len(),
        failures: outcomes.len() - answered.len(),
        failure_reasons,
        makespan_ms: Some(makespan_ms),
        wall_s: wall.as_secs_f64(),
        client: ClientLatencies::of(&ttft, &e2e),
        sims: SimFigures::of(totals, classes, class_count),
        output_tokens_per_s: output_tokens as f64 / (makespan_ms / 1e3),
        cpu: merge_cpu(used),
        cpu_pressure: f64::NAN,
    }
}

/// A reading at a stage's bound.
struct Reading {
    at: Instant,
    cpu: BTreeMap<u32, f64>,
    own: f64,
    pressure: f64,
    sims: SimTotals,
}

/// Reads CPU and the simulators at every stage's start and end.
struct Readings<'a> {
    fleet: &'a [SimReplica],
    client: &'a reqwest::Client,
    /// By stage: at its start, and at its end.
    stages: BTreeMap<usize, (Reading, Option<Reading>)>,
    /// inference-perf's process group.
    group: Option<u32>,
}

impl StageWatcher for Readings<'_> {
    async fn on_stage(&mut self, event: StageEvent, group: Option<u32>) -> anyhow::Result<()> {
        self.group = group;
        let reading = Reading {
            at: Instant::now(),
            cpu: cpu::by_group(),
            own: cpu::own(),
            pressure: cpu::pressure(),
            sims: sim::scrape(self.fleet, self.client).await?,
        };
        match event {
            StageEvent::Started(stage) => {
                self.stages.insert(stage, (reading, None));
            }
            StageEvent::Ended(stage) => {
                if let Some(entry) = self.stages.get_mut(&stage) {
                    entry.1 = Some(reading);
                }
            }
        }
        Ok(())
    }
}

/// inference-perf's stages, each read at its bounds.
#[allow(clippy::too_many_arguments)]
async fn perf_stages(
    context: &Context,
    front: &Front,
    fleet: &[SimReplica],
    load: &Load,
    seed: u64,
    dir: &Path,
    watched: &[(String, u32)],
    classes: &[usize],
    class_count: usize,
) -> anyhow::Result<Vec<StepFigures>> {
    let (python, tokenizer) = context
        .inference_perf
        .as_ref()
        .ok_or_else(|| anyhow!("the {} load needs inference-perf", load.name()))?;
    let reports = dir.join("inference-perf");
    std::fs::create_dir_all(&reports)?;
    let config = load.config(&front.url(), tokenizer, &reports, seed);
    let mut readings = Readings {
        fleet,
        client: &context.client,
        stages: BTreeMap::new(),
        group: None,
    };
    let limit = Duration::from_secs(600);
    inference_perf::run(python, &config, dir, limit, &mut readings).await?;
    let client_group = readings.group;
    let readings = readings.stages;
    let reported = inference_perf::stage_reports(&reports)?;
    let rates = load.rates();
    let mut figures = Vec::new();
    for report in reported {
        let Some((start, Some(end))) = readings.get(&report.stage) else {
            anyhow::bail!(
                "stage {} was reported but not seen to start and end",
                report.stage
            );
        };
        let mut used = vec![("bench".to_string(), end.own - start.own)];
        let mut named: Vec<(String, u32)> = watched.to_vec();
        if let Some(group) = client_group {
            named.push(("client".to_string(), group));
        }
        for (name, group) in named {
            let before = start.cpu.get(&group).copied().unwrap_or(0.0);
            let after = end.cpu.get(&group).copied().unwrap_or(before);
            used.push((name, after - before));
        }
        let totals = end.sims.since(&start.sims);
        let requests = (report.successes + report.failures) as usize;
        let wall_s = end.at.duration_since(start.at).as_secs_f64();
        figures.push(StepFigures {
            step: report.stage,
            offered_rate: rates.get(report.stage).copied().filter(|r| r.is_finite()),
            requests,
            failures: report.failures as usize,
            failure_reasons: BTreeMap::new(),
            makespan_ms: None,
            wall_s,
            client: ClientLatencies {
                ttft_mean_ms: report.ttft_mean_ms,
                ttft_p50_ms: report.ttft_p50_ms,
                ttft_p99_ms: report.ttft_p99_ms,
                e2e_mean_ms: report.latency_mean_ms,
                e2e_p50_ms: report.latency_p50_ms,
                e2e_p99_ms: report.latency_p99_ms,
            },
            sims: SimFigures::of(&totals, classes, class_count),
            output_tokens_per_s: report.output_tokens_per_s,
            cpu: merge_cpu(used),
            cpu_pressure: (end.pressure - start.pressure) / wall_s,
        });
    }
    Ok(figures)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burst_prefix_engine_bench::routes::{Direct, Placeholders};

    #[test]
    fn the_shipped_routes_parse() {
        let placeholders = Placeholders {
            cache_tokens_per_replica: 16_000_000,
            kv_events_bind: "tcp://127.0.0.1:5557".into(),
            tokenizer_path: "/tokenizer".into(),
        };
        let routes = burst_prefix_engine_bench::routes::parse(
            include_str!("../../../bench/fleet/routes.yaml"),
            &placeholders,
        )
        .unwrap();
        let names: Vec<&str> = routes.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names[..2], ["round-robin", "least-loaded"]);
        assert_eq!(routes[1].kind, RouteKind::Direct(Direct::LeastLoaded));
        // Ours with the product's defaults, and on arrival.
        let default = routes
            .iter()
            .find(|r| r.name == "ours, default")
            .unwrap()
            .planner()
            .unwrap();
        assert_eq!(
            default,
            burst_prefix_engine_bench::routes::Route::planner(&Route {
                name: "x".into(),
                kind: RouteKind::Proxy {
                    planner_yaml: String::new()
                },
                session_header: None,
                pending: None,
                producers: 1,
            })
            .unwrap()
        );
        assert_eq!(default.placement(), burst_prefix_api::Placement::OnArrival);
        assert_eq!(default.balance(), burst_prefix_api::BalanceBy::Time);
        let planner = |name: &str| {
            routes
                .iter()
                .find(|r| r.name == name)
                .and_then(Route::planner)
                .unwrap()
        };
        assert_eq!(
            planner("ours, window").placement(),
            burst_prefix_api::Placement::Window
        );
        assert_eq!(
            planner("ours, learned speeds").engines.load_interval_ms,
            250
        );
        let before = planner("ours, before (window, requests)");
        assert_eq!(
            (before.placement(), before.balance()),
            (
                burst_prefix_api::Placement::Window,
                burst_prefix_api::BalanceBy::Requests
            )
        );
        // The KV-events route is listed, pending, with a reason.
        let events = routes.iter().find(|r| r.hears_kv_events()).unwrap();
        assert!(events.pending.as_deref().unwrap().contains("kv@"));
        assert_eq!(routes.iter().filter(|r| r.pending.is_some()).count(), 1);
        assert_eq!(
            routes
                .iter()
                .filter(|r| matches!(r.kind, RouteKind::Peer { .. }))
                .count(),
            4
        );
    }

    #[test]
    fn a_steps_makespan_runs_from_the_first_send_to_the_last_answer() {
        let outcome = |sent: f64, latency: f64| Outcome {
            sent_ms: sent,
            ttft_ms: None,
            latency_ms: latency,
            output_tokens: 10,
            error: None,
        };
        let mut failed = outcome(0.0, f64::NAN);
        failed.error = Some("refused".into());
        let outcomes = vec![outcome(2.0, 100.0), outcome(5.0, 400.0), failed];
        let totals = SimTotals {
            per_replica_requests: vec![1.0, 1.0],
            ..SimTotals::default()
        };
        let used = vec![
            ("client".into(), 0.2),
            ("sims".into(), 0.1),
            ("sims".into(), 0.3),
        ];
        let figures = driver_figures(
            0,
            &outcomes,
            Duration::from_millis(410),
            used,
            &totals,
            &[0, 1],
            2,
        );
        assert_eq!(figures.makespan_ms, Some(403.0));
        assert_eq!((figures.requests, figures.failures), (3, 1));
        assert_eq!(
            figures.failure_reasons,
            BTreeMap::from([("refused".into(), 1)])
        );
        assert_eq!(figures.client.e2e_p99_ms, 400.0);
        assert!(figures.client.ttft_p50_ms.is_nan());
        assert_eq!(figures.sims.requests_per_class, vec![1.0, 1.0]);
        assert_eq!(figures.cpu[1].process, "sims");
        assert!((figures.cpu[1].seconds - 0.4).abs() < 1e-12);
        assert!((figures.output_tokens_per_s - 20.0 / 0.403).abs() < 1e-9);
    }
}
