//! `burst-prefix-producer`: the producer service and its debugging tools.

use std::io::Read;
use std::process::ExitCode;

use burst_prefix_api::PlannerConfig;
use burst_prefix_core::read::InferenceRequest;
use burst_prefix_core::whole_batch::{plan_input, PlanBounds, PlanInput};
use burst_prefix_producer::serve;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "burst-prefix-producer",
    version,
    about = "Co-locates bursts of prefix-sharing LLM requests on inference replicas",
    long_about = "Co-locates bursts of prefix-sharing LLM requests on inference replicas.\n\n\
        Requests that arrive within one window are hashed into prefix blocks (llm-d prefixhash \
        compatible), grouped, and placed jointly, so a shared prompt is prefilled once.\n\n\
        Invalid input exits with code 2 and one line on stderr."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the prefix block hashes of one request body (JSON on stdin).
    ///
    /// Output: {"blockSizeTokens": B, "prompts": [["ff375b446cd15b25", ...], ...]}, one list of
    /// 16-digit hex block hashes per non-empty prompt.
    Hash {
        /// Tokens per block.
        #[arg(long, default_value_t = 64)]
        block_size_tokens: i64,
        /// Hash at most this many leading tokens per request (0: up to 2048 blocks).
        #[arg(long, default_value_t = 0)]
        max_prefix_tokens: i64,
    },
    /// Plan one batch (JSON on stdin) and print where each request goes.
    ///
    /// Input: {"config": {...}, "replicas": [{"id": "...", "runningRequests": 0}],
    /// "requests": [{"id": "...", "body": {...inference request...}}]}.
    /// Output: {"assignments": [{"id": "...", "endpoint": "..." or null, "totalBlocks": n}]},
    /// in request order.
    Plan,
    /// Run the producer service (docs/behaviour.md): the scoring API, the OpenAI-compatible
    /// proxy, the endpoint picker, and health and metrics.
    ///
    /// --listen serves POST /v1/produce, POST /v1/plan and GET /v1/endpoints (the scoring API),
    /// and POST /v1/completions, POST /v1/chat/completions and GET /v1/models (the proxy: each
    /// request goes to the replica its window placed it on). --epp-listen serves Envoy's
    /// ext_proc gRPC service, for Gateway API Inference Extension gateways (an InferencePool's
    /// endpoint picker). --admin-listen serves /healthz, /readyz and /metrics.
    ///
    /// Requests are collected into windows of windowDurationMs, planned together, and placed so
    /// that a shared prompt is prefilled once. The config comes from --config FILE or
    /// --configmap NAMESPACE/NAME and is reloaded on change. SIGTERM/SIGINT answer the open
    /// window and exit 0; a startup failure exits 2.
    Serve(Box<serve::ServeArgs>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => return serve::run(*args),
        Command::Hash {
            block_size_tokens,
            max_prefix_tokens,
        } => hash(block_size_tokens, max_prefix_tokens),
        Command::Plan => plan_from_stdin(),
    };
    match result {
        Ok(output) => {
            // A closed stdout (`... | head`) is not an error worth a panic.
            use std::io::Write;
            let _ = writeln!(std::io::stdout(), "{output}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            // One line, so scripts can show it as it is.
            eprintln!("error: {}", message.replace('\n', " "));
            ExitCode::from(2)
        }
    }
}

fn read_stdin() -> Result<Vec<u8>, String> {
    let mut input = Vec::new();
    std::io::stdin()
        .read_to_end(&mut input)
        .map_err(|e| format!("cannot read stdin: {e}"))?;
    Ok(input)
}

fn hash(block_size_tokens: i64, max_prefix_tokens: i64) -> Result<String, String> {
    let mut config = PlannerConfig {
        block_size_tokens,
        max_prefix_tokens_to_match: max_prefix_tokens,
        ..PlannerConfig::default()
    };
    // Hashing never uses the memory: its capacity must not refuse a large block size.
    config.memory.cache_tokens_per_replica = config
        .memory
        .cache_tokens_per_replica
        .max(block_size_tokens);
    config.validate().map_err(|e| {
        format!("invalid options: {e}")
            .replace("blockSizeTokens", "--block-size-tokens")
            .replace("maxPrefixTokensToMatch", "--max-prefix-tokens")
    })?;
    let body = read_stdin()?;
    let request = InferenceRequest::parse(&body).map_err(|e| e.to_string())?;
    let prompts: Vec<Vec<String>> = request
        .block_hashes(config.block_spec())
        .iter()
        .map(|chain| chain.iter().map(|hash| format!("{hash:016x}")).collect())
        .collect();
    Ok(serde_json::json!({"blockSizeTokens": block_size_tokens, "prompts": prompts}).to_string())
}

fn plan_from_stdin() -> Result<String, String> {
    let input = read_stdin()?;
    let input = PlanInput::parse(&input).map_err(|e| format!("invalid plan input: {e}"))?;
    let output = plan_input(&input, &PlanBounds::NONE).map_err(|e| e.to_string())?;
    serde_json::to_string(&output).map_err(|e| e.to_string())
}
