//! `burst-prefix-stub-engine`: the stub inference server as a process (the e2e test's pods).

use std::net::SocketAddr;
use std::process::ExitCode;

use burst_prefix_stub_engine::{
    serve, Options, Recorder, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_RECORDED, DEFAULT_MODEL,
};
use clap::Parser;
use tokio::net::TcpListener;

#[derive(Parser, Debug)]
#[command(
    name = "burst-prefix-stub-engine",
    version,
    about = "A stub OpenAI-compatible inference server for tests: names the replica that served \
             each answer and records what reached it",
    long_about = "A stub OpenAI-compatible inference server for tests: it generates no text \
        worth reading, but names the replica that served each answer and records what reached \
        it.\n\n\
        Routes:\n  \
        POST /v1/completions, POST /v1/chat/completions   an answer in OpenAI's shape, or with \
        \"stream\": true an SSE stream (data: {...} chunks, then data: [DONE])\n  \
        GET  /v1/models                                   the one model (--model)\n  \
        GET  /healthz                                     \"ok\"\n  \
        GET  /stub/requests                               what reached it, oldest first\n  \
        DELETE /stub/requests                             forget it\n\n\
        Every answer carries the header x-stub-engine-id: <--id>, and the id in the field \
        \"stub_engine_id\", in \"id\" (cmpl-<id>-<seq>) and in the generated text.\n\n\
        Test controls, in the request body under \"stub\" (no real client sends it), all optional:\n  \
        {\"stub\": {\"chunks\": 5, \"chunkDelayMs\": 50, \"delayMs\": 0, \"status\": 503, \
        \"abortAfterChunks\": 2}}\n  \
        chunks: tokens in the answer (default max_tokens, else 8); chunkDelayMs: pause between \
        SSE chunks; delayMs: pause before the answer; status: answer this HTTP status with an \
        OpenAI error body; abortAfterChunks: cut the connection mid-stream.\n\n\
        Bad input (not JSON, no prompt/messages, bad controls) gets 400 with an OpenAI error \
        body naming the problem; bad flags exit with code 2."
)]
struct Cli {
    /// Address to listen on.
    #[arg(long, env = "STUB_ENGINE_LISTEN", default_value = "0.0.0.0:8000")]
    listen: SocketAddr,
    /// This replica's name in every answer. Default: the host name (a pod's name in Kubernetes).
    #[arg(long, env = "STUB_ENGINE_ID")]
    id: Option<String>,
    /// Model name listed by /v1/models and answered when a request names none.
    #[arg(long, env = "STUB_ENGINE_MODEL", default_value = DEFAULT_MODEL)]
    model: String,
    /// Answer every inference request with this HTTP status (e.g. 503), unless the request's
    /// "stub": {"status": ...} says otherwise.
    #[arg(long, env = "STUB_ENGINE_FAIL_STATUS",
          value_parser = clap::value_parser!(u16).range(100..=599))]
    fail_status: Option<u16>,
    /// Requests the record keeps (the newest).
    #[arg(long, default_value_t = DEFAULT_MAX_RECORDED,
          value_parser = at_least_one)]
    max_recorded: usize,
    /// Largest request body accepted, in bytes; larger ones get 413.
    #[arg(long, default_value_t = DEFAULT_MAX_BODY_BYTES)]
    max_body_bytes: usize,
    /// Log filter: a level (error, warn, info, debug) or tracing directives; `debug` logs
    /// every request.
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    log_level: String,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<(), String> {
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log_level)
        .map_err(|e| format!("invalid --log-level {:?}: {e}", cli.log_level))?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal: pod logs and tests read plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let id = match cli.id {
        Some(id) if !id.trim().is_empty() => id,
        Some(_) => return Err("--id must not be empty".into()),
        None => host_name(),
    };
    let options = Options {
        id,
        model: cli.model,
        fail_status: cli.fail_status,
        max_recorded: cli.max_recorded,
        max_body_bytes: cli.max_body_bytes,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    runtime.block_on(async move {
        let listener = TcpListener::bind(cli.listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", cli.listen))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("cannot read the listening address: {e}"))?;
        tracing::info!(%addr, id = %options.id, model = %options.model,
                       fail_status = ?options.fail_status, "stub-engine listening");
        serve(
            listener,
            options,
            Recorder::new(cli.max_recorded),
            shutdown_signal(),
        )
        .await
        .map_err(|e| format!("serving on {addr}: {e}"))?;
        tracing::info!("stub-engine stopped");
        Ok(())
    })
}

fn at_least_one(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{value:?} is not a whole number of at least 1")),
    }
}

/// The kernel's host name: in Kubernetes, the pod's name.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "stub-engine".to_owned())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
