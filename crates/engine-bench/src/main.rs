//! `make bench-engine`: the simulator's workloads on vLLM or llama-server replicas, straight,
//! through the producer's proxy and through the peer routers; see the crate docs and
//! bench/engine/README.md.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use burst_prefix_engine_bench::bound::lower_bound_per_step;
use burst_prefix_engine_bench::engine::{
    cache_config, free_port, start_replicas, stop_replicas, tokenize, Engine, LlamaCpp, Replica,
    Vllm,
};
use burst_prefix_engine_bench::prompts::{as_text, as_tokens, Request};
use burst_prefix_engine_bench::provenance::Provenance;
use burst_prefix_engine_bench::report::{Report, RouteFigures, Setup, WorkloadReport};
use burst_prefix_engine_bench::routes::{self, Placeholders, Route, RouteKind};
use burst_prefix_engine_bench::run::{client, run, RunOptions};
use burst_prefix_engine_bench::second_path::parse_fraction;
use burst_prefix_engine_bench::workloads::{bench_workloads, fold_into_vocabulary};
use burst_prefix_engine_bench::{chart, check};
use burst_prefix_producer::proxy::ProxyConfig;
use burst_prefix_simulator::simulate::Slots;
use clap::{Parser, ValueEnum};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum EngineName {
    #[value(name = "llama.cpp")]
    LlamaCpp,
    Vllm,
}

/// Runs the engine bench and writes engine-bench.md, .json and .svg to --out-dir.
#[derive(Parser, Debug)]
struct Args {
    #[arg(long, value_enum, default_value = "llama.cpp")]
    engine: EngineName,
    /// llama.cpp: the llama-server binary (bench/engine/build-llama-server.sh --print-bin).
    #[arg(long, required_if_eq("engine", "llama.cpp"))]
    llama_server: Option<PathBuf>,
    /// llama.cpp: the GGUF model (bench/engine/model.sh --print-path).
    #[arg(long, required_if_eq("engine", "llama.cpp"))]
    model: Option<PathBuf>,
    /// vLLM: the venv python (tests/vllm/setup.sh --print-python).
    #[arg(
        long,
        env = "BURST_PREFIX_VLLM_PYTHON",
        required_if_eq("engine", "vllm")
    )]
    vllm_python: Option<PathBuf>,
    /// vLLM: the model directory (tests/vllm/setup.sh --print-model).
    #[arg(
        long,
        env = "BURST_PREFIX_VLLM_MODEL",
        required_if_eq("engine", "vllm")
    )]
    vllm_model: Option<PathBuf>,
    /// vLLM: each replica's KV cache, in GiB (VLLM_CPU_KVCACHE_SPACE).
    #[arg(long, default_value_t = 1)]
    kv_cache_gib: usize,
    /// vLLM: each replica's KV cache, in blocks (`--num-gpu-blocks-override`), instead of
    /// --kv-cache-gib: a cache small enough to evict. It must hold one --max-model-len request.
    #[arg(long)]
    kv_cache_blocks: Option<u64>,
    /// vLLM: `--max-model-len`, the longest prompt plus answer a replica accepts.
    #[arg(long, default_value_t = 4096)]
    max_model_len: usize,
    /// The peer routers' venv python (bench/engine/peers/setup.sh --print-python).
    #[arg(long)]
    peers_python: Option<PathBuf>,
    /// The routes (see the file's header).
    #[arg(long, default_value = "bench/engine/routes.yaml")]
    routes: PathBuf,
    /// Run only these routes (by name; default all).
    #[arg(long, value_delimiter = ';')]
    only_routes: Vec<String>,
    #[arg(long, default_value = "target/bench-engine")]
    out_dir: PathBuf,
    #[arg(long, default_value_t = 4)]
    replicas: usize,
    /// llama.cpp: slots per replica (-np).
    #[arg(long, default_value_t = 2)]
    slots: usize,
    /// llama.cpp: context tokens per slot.
    #[arg(long, default_value_t = 4096)]
    ctx_per_slot: usize,
    /// Threads per replica (llama.cpp -t, -tb; vLLM OMP_NUM_THREADS).
    #[arg(long)]
    threads: Option<usize>,
    /// llama.cpp: --cache-ram, in MiB.
    #[arg(long, default_value_t = 1024)]
    cache_ram_mib: usize,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 4)]
    max_tokens: usize,
    /// Seeds of the workload generators (each seed runs every workload through every route).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    seeds: Vec<u64>,
    /// Run only these workloads (by name; default all).
    #[arg(long, value_delimiter = ',')]
    workloads: Vec<String>,
    /// llama.cpp: ${cacheTokensPerReplica} of the routes, and the simulator's cache per replica:
    /// the prompt tokens one replica keeps. Default: its KV cache (--slots x --ctx-per-slot) plus
    /// its host prompt cache (--cache-ram / --kv-bytes-per-token), which llama-server restores
    /// prompts from. vLLM: its KV cache (blocks x block size, from its metrics).
    #[arg(long)]
    cache_tokens_per_replica: Option<u64>,
    /// llama.cpp: a cached prompt token's size: 4 layers x 256 wide x (K, V) x 2 bytes.
    #[arg(long, default_value_t = 4096)]
    kv_bytes_per_token: u64,
    /// Pause between a step's last answer and the next step, in milliseconds.
    #[arg(long, default_value_t = 200)]
    pause_between_steps_ms: u64,
    /// llama.cpp: the simulator's cost of a request besides its prefill, in prefill-token
    /// equivalents: on the tiny model a decoded token takes ~5 prompt tokens' time.
    #[arg(long, default_value_t = 24)]
    simulator_overhead_tokens: u64,
    /// The share (0 to 1) of each step's requests sent straight to a replica (round-robin over
    /// them) instead of through the route, on every route: prompts that also arrive by a second
    /// path. Chosen by a hash of the seed, the step and the request, the same on every route.
    #[arg(long, default_value_t = 0.0, value_parser = parse_fraction)]
    direct_fraction: f64,
    /// The proxy routes' idle connections kept open to each replica (the producer's
    /// `--upstream-max-idle`; default: its default).
    #[arg(long, default_value_t = ProxyConfig::default().max_idle_per_upstream)]
    upstream_max_idle: usize,
    /// The proxy routes' idle timeout of a connection to a replica, in milliseconds (the
    /// producer's `--upstream-idle-timeout-ms`; default: its default).
    #[arg(long, default_value_t = ProxyConfig::default().idle_timeout.as_millis() as u64)]
    upstream_idle_timeout_ms: u64,
    /// Whether requests ask for a streamed answer (SSE, usage in its last events) or a whole
    /// one (`--stream false`: TTFT is then the time to the whole answer).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    stream: bool,
    /// The whole bench stops after this many seconds.
    #[arg(long, default_value_t = 7200)]
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

/// The engine of `args`; vLLM's replicas publish their KV events to `kv_events_bind`.
fn engine(args: &Args, kv_events_bind: &str) -> Engine {
    match args.engine {
        EngineName::LlamaCpp => Engine::LlamaCpp(LlamaCpp {
            llama_server: args.llama_server.clone().expect("required"),
            model: args.model.clone().expect("required"),
            slots: args.slots,
            ctx_per_slot: args.ctx_per_slot,
            threads: args.threads.unwrap_or(1),
            cache_ram_mib: args.cache_ram_mib,
        }),
        EngineName::Vllm => Engine::Vllm(Vllm {
            python: args.vllm_python.clone().expect("required"),
            model: args.vllm_model.clone().expect("required"),
            kv_cache_gib: args.kv_cache_gib,
            kv_cache_blocks: args.kv_cache_blocks,
            // One each: the replicas share the machine's 2 cores, and 2 OpenMP threads each
            // oversubscribe them (round-robin on grpo took 16.1 s of wall time with 2, 5.4 s
            // with 1, computing the same tokens).
            threads: args.threads.unwrap_or(1),
            max_model_len: args.max_model_len,
            kv_events: Some(kv_events_bind.to_string()),
        }),
    }
}

/// What the bench learns from the engine before it runs anything.
struct Probed {
    /// llama.cpp: the model's vocabulary, which token IDs are folded into.
    vocabulary: u32,
    version: String,
    /// Tokens per cached block (vLLM's KV block; 1 for llama.cpp, which caches any prefix).
    block_size: usize,
    cache_tokens_per_replica: u64,
}

/// Replicas kept across routes (vLLM, reset in place), or none (llama.cpp: fresh per route).
struct Kept {
    replicas: Vec<Replica>,
}

async fn bench(args: &Args) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("cannot create {}", args.out_dir.display()))?;
    // Where a route's proxy with engines.kvEvents binds (${kvEventsBind}) and every vLLM replica
    // publishes, on every route: a publisher drops what no proxy listens to.
    let kv_events_bind = format!("tcp://127.0.0.1:{}", free_port()?);
    let engine = engine(args, &kv_events_bind);
    let client = &client()?;
    let started = Instant::now();
    // vLLM's replicas are started once and reset between routes; llama-server's per route.
    let kept = if engine.resets_in_place() {
        let log_dir = args.out_dir.join("logs").join("replicas");
        Some(Kept {
            replicas: start_replicas(&engine, args.replicas, &log_dir, client).await?,
        })
    } else {
        None
    };
    eprintln!(
        "{} replicas ready in {:.0?}",
        engine.name(),
        started.elapsed()
    );
    let result = bench_on(args, &engine, kept.as_ref(), &kv_events_bind, client).await;
    if let Some(kept) = kept {
        stop_replicas(kept.replicas).await;
    }
    result
}

async fn bench_on(
    args: &Args,
    engine: &Engine,
    kept: Option<&Kept>,
    kv_events_bind: &str,
    client: &reqwest::Client,
) -> anyhow::Result<()> {
    let probed = probe(args, engine, kept, client).await?;
    let text = std::fs::read_to_string(&args.routes)
        .with_context(|| format!("cannot read {}", args.routes.display()))?;
    let placeholders = Placeholders {
        cache_tokens_per_replica: probed.cache_tokens_per_replica,
        kv_events_bind: kv_events_bind.to_string(),
        // llama.cpp: its GGUF, never loaded as a tokenizer (the routes that need one, with KV
        // events, are skipped there).
        tokenizer_path: match engine {
            Engine::Vllm(e) => e.model.display().to_string(),
            Engine::LlamaCpp(e) => e.model.display().to_string(),
        },
    };
    let routes = routes::only(
        routes::parse(&text, &placeholders)?,
        &args.only_routes,
        &args.routes,
    )?;
    if let Some(route) = routes.iter().find(|r| r.producers > 1) {
        bail!(
            "route {:?}: producers side by side run on the fleet bench (make bench-fleet), \
             not on a few engine replicas",
            route.name
        );
    }
    let workloads = bench_workloads();
    if let Some(unknown) = args
        .workloads
        .iter()
        .find(|name| !workloads.iter().any(|w| w.name() == name.as_str()))
    {
        bail!("--workloads: no workload {unknown}");
    }
    let text_prompts = matches!(engine, Engine::Vllm(_));
    let mut report = Report {
        setup: Setup {
            provenance: Provenance::now(),
            routes: routes.clone(),
            engine: format!("{} {}", engine.name(), probed.version),
            replicas: args.replicas,
            engine_settings: engine_settings(args, engine, &probed),
            max_tokens: args.max_tokens,
            seeds: args.seeds.clone(),
            model: model_name(engine, probed.vocabulary),
            prompts: if text_prompts {
                "text (completions; a conversation's turns as chat)".into()
            } else {
                "token IDs (completions)".into()
            },
            direct_fraction: args.direct_fraction,
            upstream: format!(
                "at most {} idle per replica, each closed after {} ms idle",
                args.upstream_max_idle, args.upstream_idle_timeout_ms
            ),
            answers: if args.stream {
                "streamed (SSE)".into()
            } else {
                "whole (no streaming; TTFT is the time to the whole answer)".into()
            },
        },
        workloads: Vec::new(),
    };
    for &seed in &args.seeds {
        for workload in workloads
            .iter()
            .filter(|w| args.workloads.is_empty() || args.workloads.iter().any(|n| n == w.name()))
        {
            let steps = fold_into_vocabulary(workload.generate(seed), probed.vocabulary);
            let requests = if text_prompts {
                as_text(&steps)
            } else {
                as_tokens(&steps)
            };
            let engine_tokens = match kept {
                Some(kept) => engine_tokens(&kept.replicas[0], &requests, client).await?,
                None => steps.clone(),
            };
            let lengths: Vec<Vec<u64>> = engine_tokens
                .iter()
                .map(|step| step.iter().map(|p| p.len() as u64).collect())
                .collect();
            let bound = lower_bound_per_step(&engine_tokens, probed.block_size);
            let has_sessions = requests.iter().flatten().any(|r| r.session.is_some());
            let mut measured = WorkloadReport {
                workload: workload.name().to_string(),
                seed,
                steps: steps.len(),
                requests: steps.iter().map(Vec::len).sum(),
                prompt_tokens: lengths.iter().flatten().sum(),
                lower_bound_tokens: bound.iter().sum(),
                lower_bound_busiest: bound.iter().map(|b| b.div_ceil(args.replicas as u64)).sum(),
                routes: Vec::new(),
                skipped: Vec::new(),
                simulator: Vec::new(),
            };
            let mut ran: Vec<&Route> = Vec::new();
            for route in &routes {
                if let Some(why) = &route.pending {
                    measured
                        .skipped
                        .push((route.name.clone(), format!("pending: {why}")));
                    continue;
                }
                if route.session_header.is_some() && !has_sessions {
                    measured.skipped.push((
                        route.name.clone(),
                        "no conversations in this workload".into(),
                    ));
                    continue;
                }
                if route.hears_kv_events() && !matches!(engine, Engine::Vllm(_)) {
                    let why = format!(
                        "{} publishes no KV events (engines.kvEvents needs vLLM)",
                        engine.name()
                    );
                    eprintln!(
                        "{workload} / {}: not run: {why}",
                        route.name,
                        workload = workload.name()
                    );
                    measured.skipped.push((route.name.clone(), why));
                    continue;
                }
                if matches!(route.kind, RouteKind::Peer { .. }) && !text_prompts {
                    measured.skipped.push((
                        route.name.clone(),
                        "token-ID prompts (peers build their trees from text)".into(),
                    ));
                    continue;
                }
                let figures = run_route(
                    args,
                    engine,
                    kept,
                    route,
                    workload.name(),
                    seed,
                    &requests,
                    &lengths,
                )
                .await?;
                ran.push(route);
                measured.routes.push(figures);
            }
            // The simulator knows nothing of the second path: no check with --direct-fraction.
            if !text_prompts && args.direct_fraction == 0.0 {
                let measured_routes: Vec<_> = ran.iter().copied().zip(&measured.routes).collect();
                let memory = routes
                    .iter()
                    .filter_map(Route::planner)
                    .find(|p| p.memory_settings().is_some())
                    .ok_or_else(|| {
                        anyhow!("the simulator check needs a proxy route with memory")
                    })?;
                measured.simulator = check::check(
                    &steps,
                    &measured_routes,
                    args.replicas,
                    Slots {
                        per_replica: args.slots,
                        overhead_tokens: args.simulator_overhead_tokens,
                    },
                    memory
                        .memory_settings()
                        .map_or(1, |m| m.capacity_blocks.get()),
                    memory.block_spec(),
                    args.pause_between_steps_ms,
                );
            }
            report.workloads.push(measured);
            // Written as the bench goes, so that a bench stopped half-way leaves its figures.
            write_report(&args.out_dir, &report)?;
        }
    }
    print!("{}", report.to_markdown());
    Ok(())
}

/// One workload through one route, on reset (vLLM) or fresh (llama.cpp) replicas.
#[allow(clippy::too_many_arguments)]
async fn run_route(
    args: &Args,
    engine: &Engine,
    kept: Option<&Kept>,
    route: &Route,
    workload: &str,
    seed: u64,
    requests: &[Vec<Request>],
    lengths: &[Vec<u64>],
) -> anyhow::Result<RouteFigures> {
    let started = Instant::now();
    let client = &client()?;
    let name = format!("seed{seed}-{workload}-{}", route.slug());
    let log_dir = args.out_dir.join("logs").join(&name);
    std::fs::create_dir_all(&log_dir)?;
    let options = RunOptions {
        max_tokens: args.max_tokens,
        request_timeout: Duration::from_secs(300),
        pause_between_steps: Duration::from_millis(args.pause_between_steps_ms),
        peers_python: args.peers_python.clone(),
        direct_fraction: args.direct_fraction,
        seed,
        proxy: ProxyConfig {
            max_idle_per_upstream: args.upstream_max_idle,
            idle_timeout: Duration::from_millis(args.upstream_idle_timeout_ms),
            ..ProxyConfig::default()
        },
        stream: args.stream,
    };
    let record = match kept {
        Some(kept) => {
            for replica in &kept.replicas {
                engine.reset(replica, client).await?;
            }
            run(
                route,
                requests,
                lengths,
                engine,
                &kept.replicas,
                &options,
                &log_dir,
            )
            .await
        }
        None => {
            let replicas = start_replicas(engine, args.replicas, &log_dir, client).await?;
            let record = run(
                route, requests, lengths, engine, &replicas, &options, &log_dir,
            )
            .await;
            stop_replicas(replicas).await;
            record
        }
    }
    .with_context(|| format!("{workload} (seed {seed}) through {}", route.name))?;
    if route.planner().and_then(|p| p.memory_settings()).is_some()
        && record.memory_in_use != Some(true)
    {
        bail!(
            "{workload}: the producer exports no burst_prefix_memory_blocks with memory on ({})",
            route.name
        );
    }
    // The bound is computed on the engine's tokens of each prompt: the answers must agree.
    let lengths: Vec<u64> = lengths.iter().flatten().copied().collect();
    if let Some((i, r)) = record
        .requests
        .iter()
        .enumerate()
        .find(|(i, r)| r.prompt_tokens.is_some_and(|p| p != lengths[*i]))
    {
        bail!(
            "{workload}: request {i}'s answer counts {:?} prompt tokens, the engine's tokenizer {}",
            r.prompt_tokens,
            lengths[i]
        );
    }
    let mut figures = RouteFigures::new(&record, matches!(route.kind, RouteKind::Proxy { .. }));
    if let RouteKind::ProduceThenDirect { of, .. } = &route.kind {
        figures.baseline_of = Some(of.clone());
    }
    eprintln!(
        "seed {seed} {workload} / {}: {} computed tokens (answers {}), busiest {}, TTFT p50 \
         {:.0} ms, {:.1} s",
        route.name,
        figures.computed_tokens,
        figures.answers_computed_tokens,
        figures.busiest_sum,
        figures.ttft_p50_ms,
        started.elapsed().as_secs_f64()
    );
    std::fs::write(
        args.out_dir.join(format!("requests-{name}.json")),
        serde_json::to_string_pretty(&record)?,
    )?;
    Ok(figures)
}

/// Every request's prompt in the engine's tokens (vLLM's tokenizer).
async fn engine_tokens(
    replica: &Replica,
    requests: &[Vec<Request>],
    client: &reqwest::Client,
) -> anyhow::Result<Vec<Vec<Vec<u32>>>> {
    let mut steps = Vec::with_capacity(requests.len());
    for step in requests {
        let mut tokens = Vec::with_capacity(step.len());
        for request in step {
            tokens.push(tokenize(replica, &request.prompt, client).await?);
        }
        steps.push(tokens);
    }
    Ok(steps)
}

fn write_report(out_dir: &Path, report: &Report) -> anyhow::Result<()> {
    let out = |name: &str| out_dir.join(name);
    std::fs::write(out("engine-bench.md"), report.to_markdown())?;
    std::fs::write(out("engine-bench.json"), report.to_json())?;
    std::fs::write(
        out("engine-bench.svg"),
        chart::svg(report).map_err(|e| anyhow!(e))?,
    )?;
    Ok(())
}

fn engine_settings(args: &Args, engine: &Engine, probed: &Probed) -> String {
    match engine {
        Engine::LlamaCpp(e) => format!(
            "{} slots and {} thread(s) each, --cache-ram {} MiB; ${{cacheTokensPerReplica}} {}",
            e.slots, e.threads, e.cache_ram_mib, probed.cache_tokens_per_replica
        ),
        Engine::Vllm(e) => format!(
            "CPU build, --enforce-eager, prefix caching, {}-token KV blocks, {} KV cache \
             ({} tokens) and OMP_NUM_THREADS={} each, all on the same cores; {} replicas",
            probed.block_size,
            match e.kv_cache_blocks {
                Some(blocks) => format!("a {blocks}-block (--num-gpu-blocks-override)"),
                None => format!("{} GiB", e.kv_cache_gib),
            },
            probed.cache_tokens_per_replica,
            e.threads,
            args.replicas
        ),
    }
}

fn model_name(engine: &Engine, vocabulary: u32) -> String {
    match engine {
        Engine::LlamaCpp(e) => format!(
            "{} ({vocabulary}-token vocabulary)",
            e.model.file_name().unwrap_or_default().to_string_lossy()
        ),
        Engine::Vllm(_) => {
            "tests/vllm/write_model.py (random weights, 4 layers x 256, 4,096-token BPE)".into()
        }
    }
}

async fn probe(
    args: &Args,
    engine: &Engine,
    kept: Option<&Kept>,
    client: &reqwest::Client,
) -> anyhow::Result<Probed> {
    match (engine, kept) {
        (Engine::Vllm(_), Some(kept)) => {
            let replica = &kept.replicas[0];
            let cache = cache_config(replica, client).await?;
            let version: serde_json::Value = client
                .get(format!("{}/version", replica.url()))
                .timeout(Duration::from_secs(10))
                .send()
                .await?
                .json()
                .await?;
            Ok(Probed {
                // Text prompts: simulator tokens become words, never the engine's IDs.
                vocabulary: burst_prefix_simulator::workload::VOCABULARY,
                version: version["version"].as_str().unwrap_or("?").to_string(),
                block_size: cache.block_size as usize,
                cache_tokens_per_replica: args
                    .cache_tokens_per_replica
                    .unwrap_or(cache.blocks * cache.block_size),
            })
        }
        (Engine::LlamaCpp(e), _) => {
            let (vocabulary, version) = probe_llama(engine, &args.out_dir, client).await?;
            Ok(Probed {
                vocabulary,
                version,
                block_size: 1,
                cache_tokens_per_replica: args.cache_tokens_per_replica.unwrap_or(
                    (e.slots * e.ctx_per_slot) as u64
                        + (e.cache_ram_mib as u64 * 1024 * 1024) / args.kv_bytes_per_token.max(1),
                ),
            })
        }
        (Engine::Vllm(_), None) => bail!("vLLM's replicas are kept across routes"),
    }
}

/// Starts one llama-server to read the model's vocabulary size and the engine's build.
async fn probe_llama(
    engine: &Engine,
    out_dir: &Path,
    client: &reqwest::Client,
) -> anyhow::Result<(u32, String)> {
    let replicas = start_replicas(engine, 1, &out_dir.join("logs").join("probe"), client).await?;
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
