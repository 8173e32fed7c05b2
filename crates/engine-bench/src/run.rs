//! One workload through one route: fresh replicas, each step's requests sent at once, every
//! answer's usage and timing recorded.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use burst_prefix_producer::core::{Limits, Producer};
use burst_prefix_producer::proxy::{ProxyConfig, ENDPOINT_HEADER};
use burst_prefix_producer::serve::{Role, Service};
use futures::StreamExt;
use serde::Serialize;
use serde_json::json;

use crate::engine::{start_replicas, stop_replicas, EngineOptions, Replica};
use crate::usage;

/// How requests reach the replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Route {
    /// (a) Straight to the replicas, cycling through them (carried on across steps).
    RoundRobin,
    /// (b) Straight to the replica with the fewest prompt tokens in flight (ties to fewer
    /// requests, then the lower index), as a KV-utilization scorer sees it.
    LeastLoaded,
    /// (c) Through the producer's proxy, the planner without memory (SPEC §4).
    ProxyMemoryOff,
    /// (d) Through the producer's proxy with memory across windows (SPEC §7).
    ProxyMemoryOn,
}

impl Route {
    pub const ALL: [Route; 4] = [
        Route::RoundRobin,
        Route::LeastLoaded,
        Route::ProxyMemoryOff,
        Route::ProxyMemoryOn,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Route::RoundRobin => "round-robin",
            Route::LeastLoaded => "least-loaded",
            Route::ProxyMemoryOff => "proxy, memory off",
            Route::ProxyMemoryOn => "proxy, memory on",
        }
    }
}

/// The knobs of a run that are not the engine's.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub replicas: usize,
    /// Tokens generated per request (the bench measures prefill; a few decode steps keep the
    /// slots busy as real requests do).
    pub max_tokens: usize,
    /// The proxy's planner config, `endpoints` and `memory` left out (the run adds them).
    pub planner_yaml: String,
    /// `memory.cacheTokensPerReplica` of the memory-on proxy: what one replica really holds.
    pub cache_tokens_per_replica: u64,
    /// `memory.loadHalfLifeMs` of the memory-on proxy.
    pub load_half_life_ms: u64,
    /// The longest a request may take.
    pub request_timeout: Duration,
    /// Between one step's last answer and the next step (a trainer's update between rollouts).
    pub pause_between_steps: Duration,
}

/// One request's outcome.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestRecord {
    pub step: usize,
    pub replica: usize,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    /// llama-server's own prompt time (`timings.prompt_ms`).
    pub prompt_ms: f64,
    /// From sending the request to its first streamed byte.
    pub ttft_ms: f64,
    pub latency_ms: f64,
}

impl RequestRecord {
    pub fn computed_tokens(&self) -> u64 {
        self.prompt_tokens - self.cached_tokens
    }
}

/// One route's run of one workload.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRecord {
    pub route: Route,
    pub requests: Vec<RequestRecord>,
    /// Per step: from its first request sent to its last answer.
    pub step_wall_ms: Vec<f64>,
    /// Through the proxy: whether it exported the memory model's size
    /// (`burst_prefix_memory_blocks`), i.e. the producer really placed with memory.
    pub memory_in_use: Option<bool>,
}

/// Where one request goes: a replica (direct), or the proxy.
#[derive(Clone, Copy)]
enum Target {
    Replica(usize),
    Proxy,
}

/// An HTTP client of its own for each run: a pooled connection to an earlier run's replica
/// must never be reused on a new replica that got the same port.
pub fn client() -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(256)
        .build()
}

/// Runs `steps` through `route` on fresh replicas (empty caches), and stops them all.
pub async fn run(
    route: Route,
    steps: &[Vec<Vec<u32>>],
    engine: &EngineOptions,
    options: &RunOptions,
) -> anyhow::Result<RunRecord> {
    let client = &client()?;
    let replicas = start_replicas(engine, options.replicas, client).await?;
    let proxy = match route {
        Route::ProxyMemoryOff | Route::ProxyMemoryOn => {
            match start_proxy(&replicas, route, options).await {
                Ok(proxy) => Some(proxy),
                Err(error) => {
                    stop_replicas(replicas).await;
                    return Err(error);
                }
            }
        }
        Route::RoundRobin | Route::LeastLoaded => None,
    };
    let mut result = run_steps(route, steps, &replicas, proxy.as_ref(), options, client).await;
    if let (Ok(record), Some(proxy)) = (&mut result, &proxy) {
        record.memory_in_use = Some(
            proxy
                .producer
                .metrics()
                .render()
                .contains("burst_prefix_memory_blocks"),
        );
    }
    if let Some(proxy) = proxy {
        proxy.shutdown(Duration::from_secs(5)).await;
    }
    stop_replicas(replicas).await;
    result
}

/// The planner config of a proxy route, without endpoints: `--planner-yaml` (its last line
/// ended, as a shell's `$(...)` does not) with memory on or (explicitly) off. The simulator's
/// memory policy is built from the same text.
pub fn proxy_planner_yaml(options: &RunOptions, memory: bool) -> String {
    format!(
        "{}\nmemory:\n  enabled: {memory}\n  cacheTokensPerReplica: {}\n  loadHalfLifeMs: {}\n",
        options.planner_yaml.trim_end(),
        options.cache_tokens_per_replica,
        options.load_half_life_ms
    )
}

async fn start_proxy(
    replicas: &[Replica],
    route: Route,
    options: &RunOptions,
) -> anyhow::Result<Service> {
    let mut yaml = proxy_planner_yaml(options, route == Route::ProxyMemoryOn);
    yaml.push_str("endpoints:\n");
    for replica in replicas {
        yaml.push_str(&format!(
            "  - {{id: {}, address: '{}'}}\n",
            endpoint_id(replica.index),
            replica.addr
        ));
    }
    let producer = Producer::with_config(&yaml, Limits::default())
        .map_err(|e| anyhow!("the proxy's config is refused: {e}\n{yaml}"))?;
    Service::on_loopback(producer, ProxyConfig::default())
        .await
        .map_err(|e| anyhow!("the proxy does not start: {e}"))
}

fn endpoint_id(replica: usize) -> String {
    format!("bench/r{replica}")
}

fn replica_of_endpoint(id: &str) -> Option<usize> {
    id.strip_prefix("bench/r")?.parse().ok()
}

async fn run_steps(
    route: Route,
    steps: &[Vec<Vec<u32>>],
    replicas: &[Replica],
    proxy: Option<&Service>,
    options: &RunOptions,
    client: &reqwest::Client,
) -> anyhow::Result<RunRecord> {
    let urls: Arc<Vec<String>> = Arc::new(replicas.iter().map(Replica::url).collect());
    let proxy_url = proxy.map(|p| format!("http://{}", p.addr(Role::Api).expect("an API port")));
    let mut round_robin = 0;
    let mut record = RunRecord {
        route,
        requests: Vec::new(),
        step_wall_ms: Vec::new(),
        memory_in_use: None,
    };
    for (index, step) in steps.iter().enumerate() {
        let targets: Vec<Target> = match route {
            Route::RoundRobin => step
                .iter()
                .map(|_| {
                    let replica = round_robin % replicas.len();
                    round_robin += 1;
                    Target::Replica(replica)
                })
                .collect(),
            Route::LeastLoaded => least_loaded(step, replicas.len())
                .into_iter()
                .map(Target::Replica)
                .collect(),
            Route::ProxyMemoryOff | Route::ProxyMemoryOn => vec![Target::Proxy; step.len()],
        };
        let started = Instant::now();
        let sends = step.iter().zip(targets).map(|(prompt, target)| {
            let url = match target {
                Target::Replica(r) => urls[r].clone(),
                Target::Proxy => proxy_url.clone().expect("a proxy for a proxy route"),
            };
            let body = json!({
                "model": "tiny",
                "prompt": prompt,
                "max_tokens": options.max_tokens,
                "temperature": 0.0,
                "ignore_eos": true,
                "cache_prompt": true,
                "stream": true,
                "stream_options": {"include_usage": true},
            });
            let fixed = match target {
                Target::Replica(r) => Some(r),
                Target::Proxy => None,
            };
            let client = client.clone();
            let timeout = options.request_timeout;
            tokio::spawn(async move { send(&client, &url, body, fixed, index, timeout).await })
        });
        let sends: Vec<_> = sends.collect();
        for sent in futures::future::join_all(sends).await {
            record
                .requests
                .push(sent.context("a request task panicked")??);
        }
        record
            .step_wall_ms
            .push(started.elapsed().as_secs_f64() * 1e3);
        tokio::time::sleep(options.pause_between_steps).await;
    }
    Ok(record)
}

/// The least-loaded route's choices for one step, whose requests are all in flight at once
/// (the previous step's have finished): the fewest prompt tokens so far, then the fewest
/// requests, then the lower index. The simulator's `LeastLoaded` decides the same.
fn least_loaded(step: &[Vec<u32>], replicas: usize) -> Vec<usize> {
    let mut loads = vec![(0usize, 0usize); replicas];
    step.iter()
        .map(|prompt| {
            let replica = (0..replicas)
                .min_by_key(|&r| (loads[r], r))
                .expect("at least one replica");
            loads[replica].0 += prompt.len();
            loads[replica].1 += 1;
            replica
        })
        .collect()
}

async fn send(
    client: &reqwest::Client,
    url: &str,
    body: serde_json::Value,
    replica: Option<usize>,
    step: usize,
    timeout: Duration,
) -> anyhow::Result<RequestRecord> {
    let sent = Instant::now();
    let response = client
        .post(format!("{url}/v1/completions"))
        .json(&body)
        .timeout(timeout)
        .send()
        .await
        .with_context(|| {
            format!(
                "POST {url}/v1/completions (step {step}, after {:?})",
                sent.elapsed()
            )
        })?;
    let status = response.status();
    let endpoint = response
        .headers()
        .get(ENDPOINT_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(replica_of_endpoint);
    let mut chunks = response.bytes_stream();
    let mut text = Vec::new();
    let mut ttft = None;
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.with_context(|| format!("reading the answer of {url}"))?;
        ttft.get_or_insert_with(|| sent.elapsed());
        text.extend_from_slice(&chunk);
    }
    let latency = sent.elapsed();
    if !status.is_success() {
        bail!(
            "{url} answered {status} (step {step}): {}",
            String::from_utf8_lossy(&text)
        );
    }
    let replica = replica
        .or(endpoint)
        .ok_or_else(|| anyhow!("the proxy's answer names no bench endpoint"))?;
    let usage =
        usage::from_sse(&text).with_context(|| format!("the stream of replica {replica}"))?;
    Ok(RequestRecord {
        step,
        replica,
        prompt_tokens: usage.prompt_tokens,
        cached_tokens: usage.cached_tokens,
        prompt_ms: usage.timings.map_or(f64::NAN, |t| t.prompt_ms),
        ttft_ms: ttft.unwrap_or(latency).as_secs_f64() * 1e3,
        latency_ms: latency.as_secs_f64() * 1e3,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn least_loaded_balances_prompt_tokens_like_the_simulator() {
        let step = vec![vec![1; 12], vec![2; 4], vec![3; 4], vec![4; 4]];
        assert_eq!(least_loaded(&step, 2), vec![0, 1, 1, 1]);
    }

    #[test]
    fn the_proxy_routes_set_memory_explicitly() {
        let options = RunOptions {
            replicas: 2,
            max_tokens: 1,
            planner_yaml: "windowDurationMs: 50\nblockSizeTokens: 64\n".into(),
            cache_tokens_per_replica: 6_400,
            load_half_life_ms: 2_000,
            request_timeout: Duration::from_secs(1),
            pause_between_steps: Duration::ZERO,
        };
        let planner = |memory| {
            let yaml = format!("{}endpoints: []\n", proxy_planner_yaml(&options, memory));
            burst_prefix_api::ProducerConfig::from_yaml(&yaml)
                .unwrap()
                .planner
        };
        assert_eq!(planner(false).memory_settings(), None);
        let on = planner(true).memory_settings().unwrap();
        assert_eq!(on.capacity_blocks.get(), 100);
        assert_eq!(on.load_half_life_ms, 2_000);
        assert_eq!(planner(true).window_duration_ms, 50);
        // A last line without its newline (a shell's `$(...)`) is still a line of its own.
        let options = RunOptions {
            planner_yaml: "windowDurationMs: 50\nidleSealMs: 20".into(),
            ..options
        };
        let yaml = format!("{}endpoints: []\n", proxy_planner_yaml(&options, true));
        let planner = burst_prefix_api::ProducerConfig::from_yaml(&yaml)
            .unwrap()
            .planner;
        assert_eq!(planner.idle_seal_ms, 20);
        assert!(planner.memory_settings().is_some());
    }

    #[test]
    fn endpoint_ids_round_trip() {
        assert_eq!(replica_of_endpoint(&endpoint_id(12)), Some(12));
        assert_eq!(replica_of_endpoint("other/r1"), None);
    }
}
