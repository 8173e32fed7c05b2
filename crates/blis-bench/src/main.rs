//! `burst-prefix-blis-bench`: the BLIS bench (docs/load-benches.md, "BLIS").

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use burst_prefix_api::PlannerConfig;
use burst_prefix_blis_bench::bench::{self, Bench, Job, Results, Setup};
use burst_prefix_blis_bench::blis::{Blis, Setting};
use burst_prefix_blis_bench::placer::{serve, Placer};
use burst_prefix_blis_bench::routes;
use burst_prefix_blis_bench::workloads::{Workload, MAX_TOKENS};
use burst_prefix_engine_bench::provenance::Provenance;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    version,
    about = "Placement judged step by step in BLIS, llm-d's vLLM simulator",
    long_about = "Placement judged step by step in BLIS (github.com/inference-sim/inference-sim), \
                  llm-d's discrete-event simulator of vLLM: every route of bench/blis/routes.yaml \
                  (BLIS's own routers, and ours: the producer's placer asked over a pipe on BLIS's \
                  simulated clock) on the same traces. `make bench-blis BLIS_SRC=DIR` runs it; \
                  docs/load-benches.md says what BLIS models and what it does not."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build BLIS with our policy and run every route on the bench's traces, or on one trace
    /// from outside (--trace-header and --trace-data).
    Run(Box<Run>),
    /// Serve BLIS's `burst-prefix` routing policy: read its asks from one named pipe, answer on
    /// the other (`run` starts it; bench/blis/routing_burst_prefix.go is the other end).
    Place {
        /// The pipe BLIS writes its asks to.
        #[arg(long)]
        asks: PathBuf,
        /// The pipe BLIS reads the answers from.
        #[arg(long)]
        answers: PathBuf,
        /// The route's planner config (YAML or JSON: the fields of docs/behaviour.md §2; `{}` is
        /// the product's defaults).
        #[arg(long)]
        planner: PathBuf,
        /// The `max_tokens` every request asks for (one cap for all, as a rollout driver sends).
        #[arg(long, default_value_t = MAX_TOKENS)]
        max_tokens: u32,
        /// Where to write what the placer measured of itself (JSON), once BLIS is done.
        #[arg(long)]
        stats: Option<PathBuf>,
        /// Where to write each placement (`clock_us request instance`, a line each).
        #[arg(long)]
        decisions: Option<PathBuf>,
    },
    /// Write a result file's tables (.md) and chart (.svg) again from its JSON.
    Tables {
        /// The result file (JSON).
        json: PathBuf,
    },
    /// Write every committed BLIS result's tables and chart again, then the generated regions of
    /// BENCHMARKS.md and README.md from their result files (`make results`).
    Results {
        /// The repository's root.
        #[arg(long, default_value = ".")]
        root: PathBuf,
    },
}

#[derive(clap::Args)]
struct Run {
    /// A git checkout of BLIS (github.com/inference-sim/inference-sim) at the pinned commit
    /// (f90a1e3a); it is copied, never changed.
    #[arg(long, env = "BLIS_SRC")]
    blis_src: PathBuf,
    /// Where BLIS is built (once per commit and version of our policy).
    #[arg(long, env = "BURST_PREFIX_CACHE")]
    cache: Option<PathBuf>,
    /// The routes (BLIS's routers and ours).
    #[arg(long, default_value = "bench/blis/routes.yaml")]
    routes: PathBuf,
    /// The workloads to run (default: all of them).
    #[arg(long, value_delimiter = ',', value_enum)]
    workloads: Vec<Workload>,
    /// Fleet sizes, instances.
    #[arg(long, value_delimiter = ',', default_value = "16,64")]
    instances: Vec<usize>,
    /// Seed of the traces and of BLIS.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// An outside trace's header YAML (with --trace-data): every route runs on it instead of
    /// the bench's workloads.
    #[arg(long, requires = "trace_data")]
    trace_header: Option<PathBuf>,
    /// An outside trace's data CSV.
    #[arg(long, requires = "trace_header")]
    trace_data: Option<PathBuf>,
    /// An outside trace's sessions are closed-loop (BLIS's `--session-mode closed-loop`).
    #[arg(long)]
    closed_loop: bool,
    /// The `max_tokens` ours is told for every request of an outside trace.
    #[arg(long, default_value_t = MAX_TOKENS)]
    max_tokens: u32,
    /// BLIS's --model.
    #[arg(long, default_value = "meta-llama/llama-3.1-8b-instruct")]
    model: String,
    /// BLIS's --hardware.
    #[arg(long, default_value = "H100")]
    hardware: String,
    /// BLIS's --tp.
    #[arg(long, default_value_t = 1)]
    tp: u32,
    /// Further flags for every replay (e.g. `--blis-arg=--max-num-seqs=128`).
    #[arg(long = "blis-arg", allow_hyphen_values = true)]
    blis_args: Vec<String>,
    /// The result file (JSON; its .md and .svg beside it).
    #[arg(long, default_value = "bench/blis/results/blis.json")]
    out: PathBuf,
    /// Where traces and each replay's output go.
    #[arg(long, default_value = "target/blis-bench")]
    work: PathBuf,
    /// Replays at once.
    #[arg(long, default_value_t = 2)]
    jobs: usize,
    /// Longest a replay may take, in seconds (it is stopped after).
    #[arg(long, default_value_t = 3_600)]
    limit_s: u64,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Run(run) => run_bench(*run),
        Command::Place {
            asks,
            answers,
            planner,
            max_tokens,
            stats,
            decisions,
        } => {
            let text = std::fs::read_to_string(&planner)
                .with_context(|| format!("reading {}", planner.display()))?;
            let config: PlannerConfig = serde_yaml::from_str(&text)
                .with_context(|| format!("{} is not a planner config", planner.display()))?;
            config
                .validate()
                .with_context(|| format!("{} is not a valid planner config", planner.display()))?;
            let mut placer = Placer::new(config, max_tokens);
            // The order BLIS's policy opens them in (opening a pipe waits for its other end).
            let asks = File::open(&asks).with_context(|| format!("opening {}", asks.display()))?;
            let answers = OpenOptions::new()
                .write(true)
                .open(&answers)
                .with_context(|| format!("opening {}", answers.display()))?;
            let mut decisions = match &decisions {
                Some(path) => Some(BufWriter::new(
                    File::create(path).with_context(|| format!("creating {}", path.display()))?,
                )),
                None => None,
            };
            serve(
                &mut placer,
                BufReader::with_capacity(1 << 20, asks),
                BufWriter::new(answers),
                decisions.as_mut().map(|d| d as &mut dyn std::io::Write),
            )?;
            if let Some(mut decisions) = decisions {
                std::io::Write::flush(&mut decisions)?;
            }
            if let Some(path) = stats {
                std::fs::write(&path, serde_json::to_string_pretty(&placer.stats())?)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            Ok(())
        }
        Command::Results { root } => {
            // Each committed result's own tables first: the docs' regions quote the same figures.
            let results = root.join("bench/blis/results");
            if let Ok(entries) = std::fs::read_dir(&results) {
                let mut jsons: Vec<PathBuf> = entries
                    .filter_map(|e| Some(e.ok()?.path()))
                    .filter(|p| p.extension().is_some_and(|e| e == "json"))
                    .collect();
                jsons.sort();
                for json in jsons {
                    write_tables(&json)?;
                }
            }
            for file in burst_prefix_blis_bench::generated::FILES {
                let path = root.join(file);
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("reading {}", path.display()))?;
                let made = burst_prefix_blis_bench::generated::regenerate(&text, &root)?;
                if made != text {
                    std::fs::write(&path, made)?;
                    eprintln!("rewrote the generated tables of {}", path.display());
                }
            }
            Ok(())
        }
        Command::Tables { json } => write_tables(&json),
    }
}

/// Writes the tables (.md) and chart (.svg) of the result file `json` beside it.
fn write_tables(json: &Path) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(json).with_context(|| format!("reading {}", json.display()))?;
    bench::write_tables(&serde_json::from_str(&text)?, json)
}

fn run_bench(run: Run) -> anyhow::Result<()> {
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let provenance = Provenance::now();
    let cache = match run.cache {
        Some(cache) => cache,
        None => PathBuf::from(std::env::var("HOME").context("HOME is not set")?)
            .join(".cache/burst-prefix"),
    };
    let routes = routes::parse(
        &std::fs::read_to_string(&run.routes)
            .with_context(|| format!("reading {}", run.routes.display()))?,
    )
    .map_err(|e| anyhow::anyhow!("{}: {e}", run.routes.display()))?;
    if run.instances.contains(&0) {
        bail!("--instances: every size must be at least 1");
    }
    // BLIS runs in its own tree: every path it is given is absolute.
    std::fs::create_dir_all(&run.work)?;
    let work = std::fs::canonicalize(&run.work)?;
    eprintln!("building BLIS from {} ...", run.blis_src.display());
    let blis = Blis::build(&run.blis_src, &cache)?;
    let setting = Setting {
        model: run.model.clone(),
        hardware: run.hardware.clone(),
        tp: run.tp,
    };
    let outside = run.trace_header.clone().zip(run.trace_data.clone());
    let jobs: Vec<Job> = match &outside {
        Some((header, data)) => {
            let dir = work.join("traces/outside");
            std::fs::create_dir_all(&dir)?;
            std::fs::copy(header, dir.join("header.yaml"))
                .with_context(|| format!("reading {}", header.display()))?;
            std::fs::copy(data, dir.join("data.csv"))
                .with_context(|| format!("reading {}", data.display()))?;
            let name = data
                .file_stem()
                .map_or("outside".into(), |s| s.to_string_lossy().to_string());
            run.instances
                .iter()
                .map(|&instances| Job {
                    name: name.clone(),
                    instances,
                    dir: dir.clone(),
                    trace: None,
                    sessions: run.closed_loop,
                    max_tokens: run.max_tokens,
                })
                .collect()
        }
        None => {
            let workloads = if run.workloads.is_empty() {
                Workload::ALL.to_vec()
            } else {
                run.workloads.clone()
            };
            let mut jobs = Vec::new();
            for &instances in &run.instances {
                for &workload in &workloads {
                    jobs.push(Job::generated(workload, instances, run.seed, &work)?);
                }
            }
            jobs
        }
    };
    let placer = std::env::current_exe().context("finding this binary (the placer)")?;
    let bench = Bench {
        blis: &blis,
        setting: &setting,
        routes: &routes,
        seed: run.seed,
        jobs: run.jobs,
        limit: Duration::from_secs(run.limit_s),
        placer: &placer,
        extra: &run.blis_args,
        work: &work,
    };
    // On the outside trace, or the bench's cheapest one (a GRPO step at the first size).
    let check_on = match &outside {
        Some(_) => jobs.first().map(|job| Job {
            trace: None,
            dir: job.dir.clone(),
            name: job.name.clone(),
            ..*job
        }),
        None => Some(Job::generated(
            Workload::Grpo,
            run.instances.first().copied().unwrap_or(16),
            run.seed,
            &work,
        )?),
    };
    let plain_round_robin = match &check_on {
        Some(first) => {
            eprintln!("checking round-robin against BLIS without our policy ...");
            let plain = Blis::build_plain(&run.blis_src, &cache)?;
            let check = bench::check_plain(&bench, &plain, first)?;
            eprintln!(
                "round-robin on {} x{}: bench {:.3} s, plain {:.3} s: {}",
                check.trace,
                check.instances,
                check.bench_makespan_s,
                check.plain_makespan_s,
                if check.equal { "equal" } else { "DIFFERENT" }
            );
            Some(check)
        }
        None => None,
    };
    let runs = bench::run_all(&bench, &jobs);
    let failed: usize = runs.iter().map(|r| r.failed.len()).sum();
    let outside_routes: Option<BTreeMap<_, _>> = outside
        .as_ref()
        .filter(|_| runs.len() == 1)
        .map(|_| runs[0].routes.clone());
    let results = Results {
        setup: Setup {
            provenance,
            blis_commit: blis.commit.clone(),
            setting,
            seed: run.seed,
            routes,
            max_tokens: jobs.first().map_or(run.max_tokens, |j| j.max_tokens),
            command,
            plain_round_robin,
        },
        runs,
        routes: outside_routes,
    };
    bench::publish(&results, &run.out)?;
    eprintln!("wrote {} (and its .md, .svg)", run.out.display());
    if failed > 0 {
        bail!("{failed} replay(s) failed: see {}", run.out.display());
    }
    Ok(())
}
