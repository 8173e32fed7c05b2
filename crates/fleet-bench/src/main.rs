//! `make bench-fleet`: RL steps, agent fan-outs and inference-perf's loads on fleets of
//! llm-d-inference-sim replicas, through every route of bench/fleet/routes.yaml; see the crate
//! docs and bench/fleet/README.md. `front` is the direct routes' forwarding process, which the
//! bench starts itself.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use burst_prefix_engine_bench::engine::free_port;
use burst_prefix_engine_bench::provenance::{self, Provenance};
use burst_prefix_engine_bench::routes::{self, Direct, Placeholders};
use burst_prefix_fleet_bench::fleet::FleetConfig;
use burst_prefix_fleet_bench::inference_perf::{Conversations, Load, SharedPrefixSweep};
use burst_prefix_fleet_bench::load::{AgentWorkload, OutputLengths, RlShape, RlWorkload};
use burst_prefix_fleet_bench::report::{Report, Setup, Skipped};
use burst_prefix_fleet_bench::run::{self, Context as RunContext, Workload};
use burst_prefix_fleet_bench::sim::SimOptions;
use burst_prefix_fleet_bench::{chart, front, netns};
use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Runs the bench and writes fleet-bench.md, .json and .svg to --out-dir.
    Run(Box<Args>),
    /// The direct routes' front: forwards every request to the replica `--policy` chooses.
    Front {
        #[arg(long, value_enum)]
        policy: Policy,
        #[arg(long)]
        listen: SocketAddr,
        /// The replicas' base URLs.
        #[arg(required = true)]
        workers: Vec<String>,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Policy {
    RoundRobin,
    LeastLoaded,
}

#[derive(clap::Args, Debug)]
struct Args {
    /// The llm-d-inference-sim binary (bench/fleet/install-sim.sh --print-bin).
    #[arg(long)]
    sim: PathBuf,
    /// burst-prefix's producer, a release build (target/release/burst-prefix-producer).
    #[arg(long)]
    producer: PathBuf,
    /// The peer routers' venv python (bench/engine/peers/setup.sh --print-python).
    #[arg(long)]
    peers_python: Option<PathBuf>,
    /// inference-perf's venv python (bench/fleet/inference-perf/setup.sh --print-python).
    #[arg(long)]
    inference_perf_python: Option<PathBuf>,
    /// Its offline tokenizer (bench/fleet/inference-perf/setup.sh --print-tokenizer).
    #[arg(long)]
    inference_perf_tokenizer: Option<PathBuf>,
    #[arg(long, default_value = "bench/fleet/fleet.yaml")]
    fleet: PathBuf,
    #[arg(long, default_value = "bench/fleet/routes.yaml")]
    routes: PathBuf,
    /// Run only these routes (by name, `;`-separated; default all).
    #[arg(long, value_delimiter = ';')]
    only_routes: Vec<String>,
    /// Run only these workloads (by name; default all).
    #[arg(long, value_delimiter = ',')]
    workloads: Vec<String>,
    /// Fleet sizes (each workload runs on those of its own sizes that are listed here).
    #[arg(long, value_delimiter = ',', default_value = "16,64")]
    replicas: Vec<usize>,
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    seeds: Vec<u64>,
    /// A smoke run: small workloads, 16 replicas, one seed (unless given).
    #[arg(long)]
    quick: bool,
    /// Every simulated latency is multiplied by this.
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    #[arg(long, default_value = "target/bench-fleet")]
    out_dir: PathBuf,
    /// The longest a request may take, in seconds.
    #[arg(long, default_value_t = 300)]
    request_timeout_s: u64,
    /// The whole bench stops after this many seconds.
    #[arg(long, default_value_t = 5400)]
    time_limit_s: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Front {
            policy,
            listen,
            workers,
        } => {
            let policy = match policy {
                Policy::RoundRobin => Direct::RoundRobin,
                Policy::LeastLoaded => Direct::LeastLoaded,
            };
            let runtime = runtime();
            match runtime
                .block_on(async { front::serve(front::Front::new(policy, workers)?, listen).await })
            {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("front: {error:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Run(args) => {
            if let Err(error) = netns::enter() {
                eprintln!("fleet bench: {error:#}");
                return ExitCode::FAILURE;
            }
            let limit = Duration::from_secs(args.time_limit_s);
            let runtime = runtime();
            // Stopped by the time limit or a signal, the bench's future is dropped, and with it
            // every process it started (each stopped by its process group).
            let outcome = runtime.block_on(async {
                tokio::select! {
                    outcome = tokio::time::timeout(limit, bench(&args)) => {
                        outcome.map_err(|_| format!("stopped at the --time-limit-s of {limit:?}"))
                    }
                    signal = stop_signal() => Err(format!("stopped by {signal}")),
                }
            });
            match outcome {
                Ok(Ok(())) => ExitCode::SUCCESS,
                Ok(Err(error)) => {
                    eprintln!("fleet bench: {error:#}");
                    ExitCode::FAILURE
                }
                Err(why) => {
                    eprintln!("fleet bench: {why}; its simulators and routes are stopped");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// SIGTERM or SIGINT, by name, once one arrives (never, if they cannot be listened for).
async fn stop_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        },
        _ => std::future::pending().await,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// A workload and the fleet sizes it runs on.
#[derive(serde::Serialize)]
struct Planned {
    workload: Workload,
    replicas: Vec<usize>,
}

/// The workloads, full or `--quick` (on 16 replicas). A 256 x 16 step runs on 64 replicas only:
/// on 16 it is 256 requests a replica, `--max-num-seqs` itself, and the simulators' own CPU for
/// its 4,096 prompts (~10-13 ms each measured) makes it the slowest run of all. inference-perf's
/// loads run on 16: its client costs 20-35 ms of CPU a request, so no rate it can offer here
/// loads 64 replicas more than 16.
fn workloads(quick: bool) -> Vec<Planned> {
    let planned = |workload, replicas: &[usize]| Planned {
        workload,
        replicas: if quick { vec![16] } else { replicas.to_vec() },
    };
    // RL answers: long-tailed, median 128 tokens, 2% at the cap of 512 (a step then lasts up to
    // 512 tokens' decode: 3 s on the fast class, 8.5 s on the slow).
    let rl_output = OutputLengths {
        median: 128.0,
        sigma: 0.8,
        max: 512,
    };
    let rl = |prompts, samples| {
        Workload::Rl(RlWorkload {
            shape: RlShape { prompts, samples },
            // Three steps: what a producer learns of the replicas in one shows in the next.
            steps: 3,
            system_prompt_tokens: 256,
            min_prompt_tokens: 1024,
            max_prompt_tokens: 4096,
            output: rl_output,
        })
    };
    let agent_output = OutputLengths {
        median: 64.0,
        sigma: 0.6,
        max: 256,
    };
    if quick {
        return vec![
            planned(rl(16, 4), &[16]),
            planned(
                Workload::Agents(AgentWorkload {
                    agents: 2,
                    fanout: 4,
                    rounds: 1,
                    system_prompt_tokens: 1024,
                    min_suffix_tokens: 64,
                    max_suffix_tokens: 256,
                    output: agent_output,
                }),
                &[16],
            ),
            planned(
                Workload::Perf(Load::SharedPrefix(SharedPrefixSweep {
                    groups: 4,
                    prompts_per_group: 8,
                    system_prompt_tokens: 1024,
                    question_tokens: 64,
                    output_tokens: 32,
                    rates: vec![4.0, 8.0],
                    stage_seconds: 4,
                })),
                &[16],
            ),
            planned(
                Workload::Perf(Load::Conversations(Conversations {
                    conversations: 4,
                    turns: 2,
                    shared_system_prompt_tokens: 512,
                    own_system_prompt_tokens: 128,
                    input_tokens_per_turn: 64,
                    output_tokens_per_turn: 32,
                    requests: 16,
                })),
                &[16],
            ),
        ];
    }
    vec![
        // The GRPO burst of issue 41's targets (one producer against several side by side).
        planned(rl(8, 8), &[16]),
        planned(rl(64, 8), &[16, 64]),
        planned(rl(256, 16), &[64]),
        planned(
            Workload::Agents(AgentWorkload {
                agents: 8,
                fanout: 16,
                rounds: 2,
                system_prompt_tokens: 2048,
                min_suffix_tokens: 128,
                max_suffix_tokens: 512,
                output: agent_output,
            }),
            &[16, 64],
        ),
        planned(
            Workload::Perf(Load::SharedPrefix(SharedPrefixSweep {
                groups: 16,
                prompts_per_group: 16,
                system_prompt_tokens: 2048,
                question_tokens: 128,
                output_tokens: 64,
                // inference-perf's client costs ~20-35 ms of CPU a request here: 32/s is most of a
                // core.
                rates: vec![8.0, 16.0, 32.0],
                stage_seconds: 5,
            })),
            &[16],
        ),
        planned(
            Workload::Perf(Load::Conversations(Conversations {
                conversations: 32,
                turns: 4,
                shared_system_prompt_tokens: 1024,
                own_system_prompt_tokens: 256,
                input_tokens_per_turn: 128,
                output_tokens_per_turn: 64,
                requests: 128,
            })),
            &[16],
        ),
    ]
}

async fn bench(args: &Args) -> anyhow::Result<()> {
    let started = Instant::now();
    std::fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("cannot create {}", args.out_dir.display()))?;
    let fleet_text = std::fs::read_to_string(&args.fleet)
        .with_context(|| format!("cannot read {}", args.fleet.display()))?;
    let fleet = FleetConfig::parse(&fleet_text)?;
    let tokenizer = args
        .inference_perf_tokenizer
        .clone()
        .unwrap_or_else(|| PathBuf::from("none"));
    let placeholders = Placeholders {
        cache_tokens_per_replica: fleet.kv_cache_blocks * u64::from(fleet.block_size),
        kv_events_bind: format!("tcp://127.0.0.1:{}", free_port()?),
        tokenizer_path: tokenizer.display().to_string(),
    };
    let text = std::fs::read_to_string(&args.routes)
        .with_context(|| format!("cannot read {}", args.routes.display()))?;
    let chosen = routes::only(
        routes::parse(&text, &placeholders)?,
        &args.only_routes,
        &args.routes,
    )?;
    let all_workloads = workloads(args.quick);
    if let Some(unknown) = args
        .workloads
        .iter()
        .find(|name| !all_workloads.iter().any(|p| &p.workload.name() == *name))
    {
        bail!("--workloads: no workload {unknown}");
    }
    let chosen_workloads: Vec<Planned> = all_workloads
        .into_iter()
        .filter(|p| args.workloads.is_empty() || args.workloads.contains(&p.workload.name()))
        .collect();
    let (replicas, seeds) = if args.quick {
        (vec![16], vec![args.seeds[0]])
    } else {
        (args.replicas.clone(), args.seeds.clone())
    };
    let context = RunContext {
        sim: SimOptions {
            binary: args.sim.clone(),
            fleet: fleet.clone(),
            time_scale: args.time_scale,
            seed: 0,
        },
        bench_binary: std::env::current_exe()?,
        producer: args.producer.clone(),
        peers_python: args.peers_python.clone(),
        inference_perf: args
            .inference_perf_python
            .clone()
            .zip(args.inference_perf_tokenizer.clone()),
        request_timeout: Duration::from_secs(args.request_timeout_s),
        client: reqwest::Client::builder()
            .no_proxy()
            .tcp_nodelay(true)
            .pool_max_idle_per_host(4096)
            // Below the idle close of the servers it sends to (the producer's 5 s header-read
            // timeout, uvicorn's 5 s keep-alive): a connection they closed is never reused
            // (reqwest's 90 s made the next step's requests fail on connections closed during
            // the last one).
            .pool_idle_timeout(front::POOL_IDLE)
            .build()?,
    };
    let fleet_json = serde_json::json!({
        "config": fleet,
        "latenciesUs": fleet.classes.iter().map(|c| serde_json::json!({
            "class": c.name, "flags": c.latencies(fleet.max_num_seqs),
        })).collect::<Vec<_>>(),
        "classes16": fleet.assign(16),
    });
    let mut report = Report {
        setup: Setup {
            provenance: Provenance::now(),
            load_average_end: String::new(),
            wall_time_s: 0.0,
            command: std::env::args().collect::<Vec<_>>().join(" "),
            simulator: format!("llm-d-inference-sim ({})", args.sim.display()),
            time_scale: args.time_scale,
            fleet: fleet_json,
            replicas: replicas.clone(),
            seeds: seeds.clone(),
            workloads: serde_json::to_value(&chosen_workloads)?,
            routes: chosen.clone(),
        },
        runs: Vec::new(),
        skipped: chosen
            .iter()
            .filter_map(|r| {
                Some(Skipped {
                    route: r.name.clone(),
                    why: format!("pending: {}", r.pending.as_ref()?),
                })
            })
            .collect(),
    };
    for &size in &replicas {
        for &seed in &seeds {
            for Planned { workload, replicas } in &chosen_workloads {
                if !replicas.contains(&size) {
                    continue;
                }
                for route in chosen.iter().filter(|r| r.pending.is_none()) {
                    let unit = Instant::now();
                    let dir = args.out_dir.join("logs").join(format!(
                        "{size}-seed{seed}-{}-{}",
                        workload.name(),
                        route.slug()
                    ));
                    let figures = run::run(&context, route, workload, size, seed, &dir)
                        .await
                        .with_context(|| {
                            format!(
                                "{} on {size} replicas (seed {seed}) through {}",
                                workload.name(),
                                route.name
                            )
                        })?;
                    eprintln!(
                        "{size} replicas, seed {seed}, {} / {}: {} in {:.1} s",
                        workload.name(),
                        route.name,
                        summary(&figures),
                        unit.elapsed().as_secs_f64()
                    );
                    report.runs.push(figures);
                    report.setup.wall_time_s = started.elapsed().as_secs_f64();
                    report.setup.load_average_end = provenance::load_average();
                    write_report(&args.out_dir, &report)?;
                }
            }
        }
    }
    print!("{}", report.to_markdown());
    Ok(())
}

fn summary(figures: &burst_prefix_fleet_bench::report::RunFigures) -> String {
    figures
        .steps
        .iter()
        .map(|s| {
            // The commonest reason a request failed, when any did.
            let reason = s
                .failure_reasons
                .iter()
                .max_by_key(|(_, count)| **count)
                .map_or(String::new(), |(reason, count)| {
                    format!(" ({count} x {reason})")
                });
            format!(
                "[{}makespan {} TTFT p50 {:.0} ms, hit {:.2}, failed {}{reason}]",
                s.offered_rate.map_or(String::new(), |r| format!("{r}/s: ")),
                s.makespan_ms
                    .map_or("-".into(), |m| format!("{:.2} s", m / 1e3)),
                s.client.ttft_p50_ms,
                s.sims.hit_rate,
                s.failures
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn write_report(out_dir: &Path, report: &Report) -> anyhow::Result<()> {
    let out = |name: &str| out_dir.join(name);
    std::fs::write(out("fleet-bench.md"), report.to_markdown())?;
    std::fs::write(out("fleet-bench.json"), report.to_json())?;
    std::fs::write(
        out("fleet-bench.svg"),
        chart::svg(report).map_err(|e| anyhow!(e))?,
    )?;
    Ok(())
}
