//! `make bench-engine`: the simulator's workloads on llama-server replicas, straight and through
//! the producer's proxy; see the crate docs and bench/engine/README.md.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use burst_prefix_api::ProducerConfig;
use burst_prefix_engine_bench::bound::lower_bound_per_step;
use burst_prefix_engine_bench::engine::{start_replicas, stop_replicas, EngineOptions};
use burst_prefix_engine_bench::report::{Report, RouteFigures, Setup, WorkloadReport};
use burst_prefix_engine_bench::run::{client, proxy_planner_yaml, run, Route, RunOptions};
use burst_prefix_engine_bench::workloads::{bench_workloads, fold_into_vocabulary};
use burst_prefix_engine_bench::{chart, check};
use burst_prefix_simulator::simulate::Slots;
use clap::Parser;

/// Runs the engine bench and writes engine-bench.md, .json and .svg to --out-dir.
#[derive(Parser, Debug)]
struct Args {
    /// The llama-server binary (bench/engine/build-llama-server.sh --print-bin).
    #[arg(long)]
    llama_server: PathBuf,
    /// The GGUF model (bench/engine/model.sh --print-path).
    #[arg(long)]
    model: PathBuf,
    #[arg(long, default_value = "target/bench-engine")]
    out_dir: PathBuf,
    #[arg(long, default_value_t = 4)]
    replicas: usize,
    /// Slots per replica (-np).
    #[arg(long, default_value_t = 2)]
    slots: usize,
    #[arg(long, default_value_t = 4096)]
    ctx_per_slot: usize,
    /// Threads per replica (-t, -tb).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    #[arg(long, default_value_t = 1024)]
    cache_ram_mib: usize,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 4)]
    max_tokens: usize,
    /// Seed of the workload generators.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Run only these workloads (by name; default all).
    #[arg(long, value_delimiter = ',')]
    workloads: Vec<String>,
    /// The proxy's planner config (SPEC §2), without endpoints.
    #[arg(
        long,
        default_value = "windowDurationMs: 100\nmaxBatchSize: -1\nbalanceBy: tokens\nblockSizeTokens: 64\n"
    )]
    planner_yaml: String,
    /// memory.cacheTokensPerReplica of the memory-on proxy, and the simulator's cache per
    /// replica: the prompt tokens one replica keeps. Default: its KV cache (--slots x
    /// --ctx-per-slot) plus its host prompt cache (--cache-ram / --kv-bytes-per-token), which
    /// llama-server restores prompts from (it logs "limits: 1024 MiB, 8192 tokens, 261370 est"
    /// and keeps 16 prompts of 1,000 tokens, past its 8,192-token figure).
    #[arg(long)]
    cache_tokens_per_replica: Option<u64>,
    /// A cached prompt token's size: the bench model's 4 layers x 256 wide x (K, V) x 2 bytes.
    #[arg(long, default_value_t = 4096)]
    kv_bytes_per_token: u64,
    /// memory.loadHalfLifeMs of the memory-on proxy.
    #[arg(long, default_value_t = 10_000)]
    load_half_life_ms: u64,
    /// Pause between a step's last answer and the next step, in milliseconds.
    #[arg(long, default_value_t = 200)]
    pause_between_steps_ms: u64,
    /// The simulator's cost of a request besides its prefill (decoding --max-tokens, HTTP), in
    /// prefill-token equivalents: on the tiny model a decoded token takes ~5 prompt tokens' time.
    #[arg(long, default_value_t = 24)]
    simulator_overhead_tokens: u64,
    /// The whole bench stops after this many seconds.
    #[arg(long, default_value_t = 1800)]
    time_limit_s: u64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let limit = Duration::from_secs(args.time_limit_s);
    match runtime.block_on(async { tokio::time::timeout(limit, bench(&args)).await }) {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(error)) => {
            eprintln!("engine bench: {error:#}");
            ExitCode::FAILURE
        }
        Err(_) => {
            eprintln!("engine bench: stopped at the --time-limit-s of {limit:?}");
            ExitCode::FAILURE
        }
    }
}

async fn bench(args: &Args) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("cannot create {}", args.out_dir.display()))?;
    let engine = EngineOptions {
        llama_server: args.llama_server.clone(),
        model: args.model.clone(),
        slots: args.slots,
        ctx_per_slot: args.ctx_per_slot,
        threads: args.threads,
        cache_ram_mib: args.cache_ram_mib,
        log_dir: args.out_dir.clone(),
    };
    let cache_tokens_per_replica = args.cache_tokens_per_replica.unwrap_or(
        (args.slots * args.ctx_per_slot) as u64
            + (args.cache_ram_mib as u64 * 1024 * 1024) / args.kv_bytes_per_token.max(1),
    );
    let options = RunOptions {
        replicas: args.replicas,
        max_tokens: args.max_tokens,
        planner_yaml: args.planner_yaml.clone(),
        cache_tokens_per_replica,
        load_half_life_ms: args.load_half_life_ms,
        request_timeout: Duration::from_secs(300),
        pause_between_steps: Duration::from_millis(args.pause_between_steps_ms),
    };
    // The memory-on proxy's config: the simulator's policies are built from it.
    let planner = ProducerConfig::from_yaml(&format!(
        "{}endpoints: []\n",
        proxy_planner_yaml(&options, true)
    ))
    .map_err(|e| anyhow!("--planner-yaml: {e}"))?
    .planner;
    let simulator_cache_blocks = planner
        .memory_settings()
        .map_or(1, |memory| memory.capacity_blocks.get());
    let (vocabulary, engine_version) = probe(&engine, &client()?).await?;
    let mut report = Report {
        setup: Setup {
            replicas: args.replicas,
            slots: args.slots,
            threads: args.threads,
            cache_ram_mib: args.cache_ram_mib,
            max_tokens: args.max_tokens,
            seed: args.seed,
            model: format!(
                "{} ({vocabulary}-token vocabulary)",
                args.model.file_name().unwrap_or_default().to_string_lossy()
            ),
            engine: engine_version,
            planner: format!(
                "{}; memory on: cacheTokensPerReplica {cache_tokens_per_replica}, \
                 loadHalfLifeMs {}",
                args.planner_yaml.trim().replace('\n', ", "),
                args.load_half_life_ms
            ),
        },
        workloads: Vec::new(),
    };
    let workloads = bench_workloads();
    if let Some(unknown) = args
        .workloads
        .iter()
        .find(|name| !workloads.iter().any(|w| w.name() == name.as_str()))
    {
        bail!("--workloads: no workload {unknown}");
    }
    for workload in workloads
        .iter()
        .filter(|w| args.workloads.is_empty() || args.workloads.iter().any(|n| n == w.name()))
    {
        let steps = fold_into_vocabulary(workload.generate(args.seed), vocabulary);
        let mut measured = WorkloadReport {
            workload: workload.name().to_string(),
            steps: steps.len(),
            requests: steps.iter().map(Vec::len).sum(),
            prompt_tokens: steps.iter().flatten().map(|p| p.len() as u64).sum(),
            lower_bound_tokens: lower_bound_per_step(&steps).iter().sum(),
            routes: Vec::new(),
            simulator: Vec::new(),
        };
        for route in Route::ALL {
            let started = Instant::now();
            let mut engine = engine.clone();
            engine.log_dir =
                args.out_dir
                    .join("logs")
                    .join(format!("{}-{:?}", workload.name(), route));
            std::fs::create_dir_all(&engine.log_dir)?;
            let record = run(route, &steps, &engine, &options)
                .await
                .with_context(|| format!("{} through {}", workload.name(), route.name()))?;
            if route == Route::ProxyMemoryOn && record.memory_in_use != Some(true) {
                bail!(
                    "{}: the producer exports no burst_prefix_memory_blocks with memory on",
                    workload.name()
                );
            }
            let figures = RouteFigures::new(&record, args.replicas);
            eprintln!(
                "{} / {}: {} computed tokens, TTFT p50 {:.0} ms, {:.1} s",
                workload.name(),
                route.name(),
                figures.computed_tokens,
                figures.ttft_p50_ms,
                started.elapsed().as_secs_f64()
            );
            let raw = args
                .out_dir
                .join(format!("requests-{}-{:?}.json", workload.name(), route));
            std::fs::write(&raw, serde_json::to_string_pretty(&record)?)?;
            measured.routes.push(figures);
        }
        measured.simulator = check::check(
            &steps,
            &measured.routes,
            args.replicas,
            Slots {
                per_replica: args.slots,
                overhead_tokens: args.simulator_overhead_tokens,
            },
            simulator_cache_blocks,
            &planner,
            args.pause_between_steps_ms,
        );
        report.workloads.push(measured);
    }
    let markdown = report.to_markdown();
    print!("{markdown}");
    let out = |name: &str| args.out_dir.join(name);
    std::fs::write(out("engine-bench.md"), &markdown)?;
    std::fs::write(out("engine-bench.json"), report.to_json())?;
    std::fs::write(
        out("engine-bench.svg"),
        chart::svg(&report).map_err(|e| anyhow!(e))?,
    )?;
    eprintln!(
        "wrote {}/engine-bench.{{md,json,svg}}",
        args.out_dir.display()
    );
    Ok(())
}

/// Starts one replica to read the model's vocabulary size and the engine's build, and stops it.
async fn probe(engine: &EngineOptions, client: &reqwest::Client) -> anyhow::Result<(u32, String)> {
    let replicas = start_replicas(engine, 1, client).await?;
    let url = replicas[0].url();
    let models = async {
        let models: serde_json::Value = client
            .get(format!("{url}/v1/models"))
            .timeout(Duration::from_secs(10))
            .send()
            .await?
            .json()
            .await?;
        let props: serde_json::Value = client
            .get(format!("{url}/props"))
            .timeout(Duration::from_secs(10))
            .send()
            .await?
            .json()
            .await?;
        anyhow::Ok((models, props))
    }
    .await;
    stop_replicas(replicas).await;
    let (models, props) = models?;
    let vocabulary = models["data"][0]["meta"]["n_vocab"]
        .as_u64()
        .ok_or_else(|| anyhow!("/v1/models names no n_vocab: {models}"))?;
    let build = props["build_info"]
        .as_str()
        .unwrap_or("llama-server")
        .to_string();
    Ok((u32::try_from(vocabulary)?, build))
}
