//! One workload through one route, on replicas with empty caches: each step's requests sent at
//! once (a share of them straight to a replica with `--direct-fraction`, [`crate::second_path`]),
//! every answer's timing and usage recorded, and what each replica computed in each step read
//! from the engine's own counters (vLLM) or summed from its answers (llama.cpp).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use futures::StreamExt;
use serde::Serialize;
use serde_json::json;

use crate::engine::{counters, settled_counters, tokenize, Counters, Engine, Replica, MODEL_NAME};
use crate::peers::PeerRouter;
use crate::producer::{replica_of_endpoint, Proxy, ENDPOINT_HEADER};
use crate::prompts::{text, Prompt, Request};
use crate::routes::{Direct, Route, RouteKind};
use crate::second_path::sent_direct;
use crate::usage::{self, EngineUsage};
use burst_prefix_producer::proxy::ProxyConfig;

/// The knobs of a run that are not the engine's.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Tokens generated per request (the bench measures prefill; a few decode steps keep the
    /// engines busy as real requests do).
    pub max_tokens: usize,
    /// The longest a request may take.
    pub request_timeout: Duration,
    /// Between one step's last answer and the next step (a trainer's update between rollouts).
    pub pause_between_steps: Duration,
    /// The venv python of the peer routers (bench/engine/peers/setup.sh --print-python).
    pub peers_python: Option<std::path::PathBuf>,
    /// The share of each step's requests sent straight to a replica, bypassing the route
    /// ([`crate::second_path`]), and the workload's seed that chooses them.
    pub direct_fraction: f64,
    pub seed: u64,
    /// How the proxy routes' producer talks to the replicas.
    pub proxy: ProxyConfig,
    /// Answers streamed (SSE), or whole.
    pub stream: bool,
}

/// One request's outcome.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestRecord {
    pub step: usize,
    /// The replica that served it, when the route says (direct routes, the proxy's header).
    pub replica: Option<usize>,
    /// Sent straight to the replica by the second path, not through the route.
    pub direct: bool,
    /// The engine's usage in the answer (`None` if the answer carried none).
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    /// From the step's start to sending the request (the step's requests are sent at once;
    /// this is how long their tasks took to start on these shared cores).
    pub sent_ms: f64,
    /// From sending the request to its first byte (of a streamed answer; of a whole answer,
    /// its last).
    pub ttft_ms: f64,
    pub latency_ms: f64,
}

/// What one replica did in one step.
#[derive(Clone, Copy, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaStep {
    pub computed_tokens: u64,
    pub requests: u64,
}

/// One route's run of one workload.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRecord {
    pub route: String,
    pub requests: Vec<RequestRecord>,
    /// Per step: from its first request sent to its last answer.
    pub step_wall_ms: Vec<f64>,
    /// Per step, per replica (see the module doc for the source).
    pub steps: Vec<Vec<ReplicaStep>>,
    /// "engine counters" or "answers".
    pub source: &'static str,
    /// Through a proxy with memory: whether it exported the memory model's size
    /// (`burst_prefix_memory_blocks`), i.e. the producer really placed with memory.
    pub memory_in_use: Option<bool>,
}

impl RunRecord {
    /// Σ over replicas and steps.
    pub fn computed_tokens(&self) -> u64 {
        self.steps.iter().flatten().map(|r| r.computed_tokens).sum()
    }

    /// Σ over steps of the busiest replica's computed tokens: a step's time on a cluster whose
    /// replicas each have their own accelerator.
    pub fn busiest_sum(&self) -> u64 {
        self.steps
            .iter()
            .map(|step| step.iter().map(|r| r.computed_tokens).max().unwrap_or(0))
            .sum()
    }

    /// Σ of `prompt_tokens - cached_tokens` over the answers that carried usage, and how many
    /// did not.
    pub fn answers_computed_tokens(&self) -> (u64, usize) {
        let with: Vec<u64> = self
            .requests
            .iter()
            .filter_map(|r| Some(r.prompt_tokens? - r.cached_tokens?))
            .collect();
        (with.iter().sum(), self.requests.len() - with.len())
    }
}

/// An HTTP client of its own for each run, one connection per request: a pooled connection to
/// an earlier run's replica must never be reused on a new replica that got the same port, and
/// on llama-server each idle connection kept would hold one of its HTTP threads (issue 40), so
/// the requests sent straight would wait behind the bench's own pool.
pub fn client() -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(0)
        .build()
}

/// What the requests are sent to.
enum Front {
    Direct(Direct),
    Proxy(Proxy),
    /// The producer places each request (`/v1/produce`); the bench sends it.
    Produce(Proxy, Placer),
    Peer(PeerRouter),
}

impl Front {
    async fn start(
        route: &Route,
        replicas: &[Replica],
        options: &RunOptions,
        log_dir: &Path,
        client: &reqwest::Client,
    ) -> anyhow::Result<Front> {
        Ok(match &route.kind {
            RouteKind::Direct(direct) => Front::Direct(*direct),
            RouteKind::Proxy { planner_yaml } => {
                let addrs: Vec<_> = replicas.iter().map(|r| r.addr).collect();
                let bind = route
                    .planner()
                    .and_then(|p| p.engines.kv_events)
                    .and_then(|k| k.bind);
                if let Some(bind) = &bind {
                    until_free(bind).await?;
                }
                let proxy = Proxy::start_with(planner_yaml, &addrs, options.proxy).await?;
                if route.hears_kv_events() {
                    if let Err(error) = hear_every_replica(&proxy, replicas, client).await {
                        proxy.shutdown().await;
                        return Err(error);
                    }
                }
                Front::Proxy(proxy)
            }
            RouteKind::ProduceThenDirect { planner_yaml, .. } => {
                let addrs: Vec<_> = replicas.iter().map(|r| r.addr).collect();
                let proxy = Proxy::start_with(planner_yaml, &addrs, options.proxy).await?;
                let placer = Placer {
                    produce_url: format!("{}/v1/produce?matches=none", proxy.url()),
                    in_flight: Arc::new(Mutex::new(vec![0; replicas.len()])),
                };
                Front::Produce(proxy, placer)
            }
            RouteKind::Peer { peer, args } => {
                let python = options
                    .peers_python
                    .as_deref()
                    .ok_or_else(|| anyhow!("route {:?} needs --peers-python", route.name))?;
                let workers: Vec<String> = replicas.iter().map(Replica::url).collect();
                let log = log_dir.join(format!("{}.log", route.slug()));
                Front::Peer(PeerRouter::start(*peer, python, args, &workers, log, client).await?)
            }
        })
    }

    async fn stop(self, route: &Route, log_dir: &Path, client: &reqwest::Client) -> Option<bool> {
        match self {
            Front::Direct(_) => None,
            Front::Proxy(proxy) | Front::Produce(proxy, _) => {
                let metrics = proxy.metrics();
                let _ = std::fs::write(log_dir.join(format!("{}.metrics", route.slug())), &metrics);
                proxy.shutdown().await;
                Some(metrics.contains("burst_prefix_memory_blocks"))
            }
            Front::Peer(router) => {
                let metrics = router.metrics(client).await;
                let _ = std::fs::write(log_dir.join(format!("{}.metrics", route.slug())), metrics);
                router.stop().await;
                None
            }
        }
    }
}

/// Runs `steps` through `route` on `replicas`, whose caches are empty; `lengths` are the
/// prompts' lengths in the engine's tokens (for least-loaded). Logs and the fronts' metrics go
/// to `log_dir`.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    route: &Route,
    steps: &[Vec<Request>],
    lengths: &[Vec<u64>],
    engine: &Engine,
    replicas: &[Replica],
    options: &RunOptions,
    log_dir: &Path,
) -> anyhow::Result<RunRecord> {
    let client = &client()?;
    let front = Front::start(route, replicas, options, log_dir, client).await?;
    let result = run_steps(
        route, steps, lengths, engine, replicas, &front, options, client,
    )
    .await;
    let memory_in_use = front.stop(route, log_dir, client).await;
    let mut record = result?;
    if route.planner().and_then(|p| p.memory_settings()).is_some() {
        record.memory_in_use = memory_in_use;
    }
    Ok(record)
}

#[allow(clippy::too_many_arguments)]
async fn run_steps(
    route: &Route,
    steps: &[Vec<Request>],
    lengths: &[Vec<u64>],
    engine: &Engine,
    replicas: &[Replica],
    front: &Front,
    options: &RunOptions,
    client: &reqwest::Client,
) -> anyhow::Result<RunRecord> {
    let urls: Arc<Vec<String>> = Arc::new(replicas.iter().map(Replica::url).collect());
    let counted = matches!(engine, Engine::Vllm(_));
    let mut round_robin = 0;
    let mut second_path = 0;
    let mut record = RunRecord {
        route: route.name.clone(),
        requests: Vec::new(),
        step_wall_ms: Vec::new(),
        steps: Vec::new(),
        source: if counted {
            "engine counters"
        } else {
            "answers"
        },
        memory_in_use: None,
    };
    for (index, (step, lengths)) in steps.iter().zip(lengths).enumerate() {
        let direct = sent_direct(options.direct_fraction, options.seed, index, step.len());
        let chooser = match front {
            Front::Direct(direct) => Some(*direct),
            Front::Proxy(_) | Front::Produce(..) | Front::Peer(_) => None,
        };
        let targets = targets(
            chooser,
            lengths,
            &direct,
            replicas.len(),
            &mut round_robin,
            &mut second_path,
        );
        let front_url = match front {
            Front::Direct(_) | Front::Produce(..) => None,
            Front::Proxy(proxy) => Some(proxy.url()),
            Front::Peer(router) => Some(router.url()),
        };
        let placer = match front {
            Front::Produce(_, placer) => Some(placer.clone()),
            _ => None,
        };
        let before = if counted {
            let mut before = Vec::with_capacity(replicas.len());
            for replica in replicas {
                before.push(counters(replica, client).await?);
            }
            before
        } else {
            Vec::new()
        };
        let started = Instant::now();
        let sends: Vec<_> = step
            .iter()
            .zip(targets)
            .zip(direct)
            .map(|((request, target), direct)| {
                let urls = urls.clone();
                let front_url = front_url.clone();
                let placer = placer.clone();
                let mut body = json!({
                    "model": MODEL_NAME,
                    "max_tokens": options.max_tokens,
                    "temperature": 0.0,
                    "ignore_eos": true,
                    "stream": options.stream,
                });
                if options.stream {
                    body["stream_options"] = json!({"include_usage": true});
                }
                merge(&mut body, request.prompt.fields());
                if matches!(engine, Engine::LlamaCpp(_)) {
                    body["cache_prompt"] = json!(true);
                }
                let session = route
                    .session_header
                    .clone()
                    .zip(request.session.map(|id| format!("session-{id}")));
                let path = request.prompt.path();
                let client = client.clone();
                let timeout = options.request_timeout;
                let stream = options.stream;
                tokio::spawn(async move {
                    // Sent from here on: asking the producer is part of the request's time.
                    let sent_at = Instant::now();
                    let (target, _counted) = match (target, &placer) {
                        (None, Some(placer)) => {
                            let (replica, counted) = placer.place(&client, path, &body).await?;
                            (Some(replica), Some(counted))
                        }
                        _ => (target, None),
                    };
                    let url = match target {
                        Some(r) => urls[r].clone(),
                        None => front_url.expect("a front for an indirect route"),
                    };
                    let sent = Sent {
                        url: &url,
                        path,
                        session,
                        replica: target,
                        direct,
                        step: index,
                        step_started: started,
                        sent_at,
                        timeout,
                        stream,
                    };
                    send(&client, sent, body).await
                })
            })
            .collect();
        let mut answers = Vec::with_capacity(step.len());
        for sent in futures::future::join_all(sends).await {
            answers.push(sent.context("a request task panicked")??);
        }
        record
            .step_wall_ms
            .push(started.elapsed().as_secs_f64() * 1e3);
        let per_replica = if counted {
            settled_counters(
                replicas,
                &before,
                step.len() as u64,
                client,
                Duration::from_secs(30),
            )
            .await?
            .into_iter()
            .map(|c: Counters| ReplicaStep {
                computed_tokens: c.computed_tokens,
                requests: c.finished_requests,
            })
            .collect()
        } else {
            from_answers(&answers, replicas.len())?
        };
        record.steps.push(per_replica);
        record.requests.extend(answers);
        tokio::time::sleep(options.pause_between_steps).await;
    }
    Ok(record)
}

/// Adds `fields`' members to `body`.
fn merge(body: &mut serde_json::Value, fields: serde_json::Value) {
    if let (Some(body), serde_json::Value::Object(fields)) = (body.as_object_mut(), fields) {
        body.extend(fields);
    }
}

/// Per replica, the step's computed tokens and requests summed from the answers' usage.
fn from_answers(answers: &[RequestRecord], replicas: usize) -> anyhow::Result<Vec<ReplicaStep>> {
    let mut per_replica = vec![ReplicaStep::default(); replicas];
    for answer in answers {
        let replica = answer
            .replica
            .ok_or_else(|| anyhow!("an answer names no replica, and the engine has no counters"))?;
        let (Some(prompt), Some(cached)) = (answer.prompt_tokens, answer.cached_tokens) else {
            bail!("an answer of replica {replica} carries no usage");
        };
        per_replica[replica].computed_tokens += prompt - cached;
        per_replica[replica].requests += 1;
    }
    Ok(per_replica)
}

/// Where each request of a step goes: `Some(replica)` when the bench chooses it (a direct route,
/// or the second path: round-robin over the requests sent by it, carried on across steps), `None`
/// through the route's front. A direct route chooses among the requests the second path leaves it,
/// as a router that never sees the others would.
fn targets(
    chooser: Option<Direct>,
    lengths: &[u64],
    direct: &[bool],
    replicas: usize,
    round_robin: &mut usize,
    second_path: &mut usize,
) -> Vec<Option<usize>> {
    let routed: Vec<u64> = lengths
        .iter()
        .zip(direct)
        .filter(|(_, &d)| !d)
        .map(|(&l, _)| l)
        .collect();
    let mut via_route = match chooser {
        Some(Direct::RoundRobin) => routed
            .iter()
            .map(|_| {
                *round_robin += 1;
                Some((*round_robin - 1) % replicas)
            })
            .collect(),
        Some(Direct::LeastLoaded) => least_loaded(&routed, replicas)
            .into_iter()
            .map(Some)
            .collect(),
        None => vec![None; routed.len()],
    }
    .into_iter();
    direct
        .iter()
        .map(|&d| {
            if d {
                *second_path += 1;
                Some((*second_path - 1) % replicas)
            } else {
                via_route.next().expect("a choice per routed request")
            }
        })
        .collect()
}

/// Waits until a KV-events endpoint (`tcp://HOST:PORT`) is free: the previous route's proxy
/// releases it when it stops, and the next one must bind it (the replicas connect to it).
async fn until_free(bind: &str) -> anyhow::Result<()> {
    let addr: SocketAddr = bind
        .strip_prefix("tcp://")
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| anyhow!("engines.kvEvents.bind {bind:?} is not tcp://IP:PORT"))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpListener::bind(addr).is_err() {
        if Instant::now() >= deadline {
            bail!("{bind} is still taken after 10 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Before a proxy that hears the engines' KV events gets its first request: every replica's
/// publisher has connected to it (ZMQ retries every 100 ms; a publisher drops what it sends before
/// that), and the proxy's index is current. Each replica gets a prompt shorter than a block (its
/// engine publishes the reset's `AllBlocksCleared` with its next step), then marker prompts of two
/// blocks, a new one each time (a repeated one would be a cache hit, and publish nothing), until
/// the proxy's index holds one on that replica. Each marker stays in its replica's cache: two
/// blocks of 2,048, that no workload prompt shares.
async fn hear_every_replica(
    proxy: &Proxy,
    replicas: &[Replica],
    client: &reqwest::Client,
) -> anyhow::Result<()> {
    static MARKERS: AtomicU64 = AtomicU64::new(0);
    const ATTEMPTS: usize = 15;
    for replica in replicas {
        complete(replica, "hello", client).await?;
        let mut heard = false;
        for _ in 0..ATTEMPTS {
            let words: Vec<u32> = (0..300).collect();
            let marker = format!(
                "kv events marker {}: {}",
                MARKERS.fetch_add(1, Ordering::Relaxed),
                text(&words)
            );
            let ids = tokenize(replica, &Prompt::Text(marker.clone()), client).await?;
            complete(replica, &marker, client).await?;
            let deadline = Instant::now() + Duration::from_secs(2);
            while !heard && Instant::now() < deadline {
                heard = proxy.engine_blocks_held(replica.index, &ids) > 0;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if heard {
                break;
            }
        }
        if !heard {
            bail!(
                "the proxy heard no KV event from replica {} after {ATTEMPTS} marker prompts (its \
                 log: {})",
                replica.index,
                replica.log().display()
            );
        }
    }
    Ok(())
}

/// One short completion straight to `replica`, its answer awaited.
async fn complete(replica: &Replica, prompt: &str, client: &reqwest::Client) -> anyhow::Result<()> {
    let url = format!("{}/v1/completions", replica.url());
    client
        .post(&url)
        .json(&json!({"model": MODEL_NAME, "prompt": prompt, "max_tokens": 1}))
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .with_context(|| format!("POST {url}"))?
        .error_for_status()
        .with_context(|| format!("POST {url}"))?;
    Ok(())
}

/// The least-loaded route's choices for one step, whose requests are all in flight at once
/// (the previous step's have finished): the fewest prompt tokens so far, then the fewest
/// requests, then the lower index. The simulator's `LeastLoaded` decides the same.
fn least_loaded(lengths: &[u64], replicas: usize) -> Vec<usize> {
    let mut loads = vec![(0u64, 0usize); replicas];
    lengths
        .iter()
        .map(|&length| {
            let replica = (0..replicas)
                .min_by_key(|&r| (loads[r], r))
                .expect("at least one replica");
            loads[replica].0 += length;
            loads[replica].1 += 1;
            replica
        })
        .collect()
}

/// A produce-then-direct route's placer: the producer's `/v1/produce` chooses the replica, and
/// the bench sends the request there itself.
#[derive(Clone)]
struct Placer {
    /// `POST` here: `/v1/produce?matches=none` of the producer.
    produce_url: String,
    /// Requests the bench has in flight per replica: for those the producer gives no
    /// affinity, sent to the fewest in flight (ties: the lower index), the proxy's own rule
    /// (docs/behaviour.md §8).
    in_flight: Arc<Mutex<Vec<u64>>>,
}

impl Placer {
    /// The replica the producer places `body` on, counted in flight until the guard drops.
    async fn place(
        &self,
        client: &reqwest::Client,
        path: &str,
        body: &serde_json::Value,
    ) -> anyhow::Result<(usize, InFlight)> {
        let url = &self.produce_url;
        let response = client
            .post(url.as_str())
            .json(body)
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .with_context(|| format!("POST {url} (for {path})"))?;
        let status = response.status();
        let answer: serde_json::Value = response
            .json()
            .await
            .with_context(|| format!("the answer of {url}"))?;
        if !status.is_success() {
            bail!("{url} answered {status}: {answer}");
        }
        let assigned = match answer["assignedEndpoint"].as_str() {
            Some(id) => Some(
                replica_of_endpoint(id)
                    .ok_or_else(|| anyhow!("{url} assigned an unknown endpoint {id:?}"))?,
            ),
            None => None,
        };
        let mut in_flight = self.in_flight.lock().expect("never poisoned");
        let replica = assigned.unwrap_or_else(|| {
            (0..in_flight.len())
                .min_by_key(|&r| (in_flight[r], r))
                .expect("at least one replica")
        });
        in_flight[replica] += 1;
        Ok((
            replica,
            InFlight {
                counts: self.in_flight.clone(),
                replica,
            },
        ))
    }
}

/// One request the bench has in flight on a replica.
struct InFlight {
    counts: Arc<Mutex<Vec<u64>>>,
    replica: usize,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.counts.lock().expect("never poisoned")[self.replica] -= 1;
    }
}

/// Where and how one request is sent.
struct Sent<'a> {
    url: &'a str,
    path: &'static str,
    /// (header, value)
    session: Option<(String, String)>,
    /// The replica, when the bench chose it.
    replica: Option<usize>,
    /// Sent by the second path.
    direct: bool,
    step: usize,
    /// When the step started.
    step_started: Instant,
    /// When the request left (before asking the producer, for produce-then-direct).
    sent_at: Instant,
    timeout: Duration,
    /// Whether the answer is an SSE stream.
    stream: bool,
}

async fn send(
    client: &reqwest::Client,
    sent: Sent<'_>,
    body: serde_json::Value,
) -> anyhow::Result<RequestRecord> {
    let Sent {
        url,
        path,
        session,
        replica,
        direct,
        step,
        step_started,
        sent_at: started,
        timeout,
        stream,
    } = sent;
    let sent_ms = started.duration_since(step_started).as_secs_f64() * 1e3;
    let mut request = client
        .post(format!("{url}{path}"))
        .json(&body)
        .timeout(timeout);
    if let Some((header, value)) = session {
        request = request.header(header, value);
    }
    let response = request.send().await.with_context(|| {
        format!(
            "POST {url}{path} (step {step}, after {:?})",
            started.elapsed()
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
        let chunk = chunk.with_context(|| format!("reading the answer of {url}{path}"))?;
        ttft.get_or_insert_with(|| started.elapsed());
        text.extend_from_slice(&chunk);
    }
    let latency = started.elapsed();
    if !status.is_success() {
        bail!(
            "{url}{path} answered {status} (step {step}): {}",
            String::from_utf8_lossy(&text)
        );
    }
    let usage: Option<EngineUsage> = match stream {
        true => usage::from_sse(&text),
        false => usage::from_completion(&text),
    }
    .ok();
    Ok(RequestRecord {
        step,
        replica: replica.or(endpoint),
        direct,
        prompt_tokens: usage.map(|u| u.prompt_tokens),
        cached_tokens: usage.map(|u| u.cached_tokens),
        sent_ms,
        ttft_ms: ttft.unwrap_or(latency).as_secs_f64() * 1e3,
        latency_ms: latency.as_secs_f64() * 1e3,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn least_loaded_balances_prompt_tokens_like_the_simulator() {
        assert_eq!(least_loaded(&[12, 4, 4, 4], 2), vec![0, 1, 1, 1]);
    }

    #[test]
    fn the_second_path_goes_round_robin_and_the_route_chooses_among_the_rest() {
        let direct = [false, true, false, true, true];
        let (mut rr, mut second) = (0, 0);
        let chosen = targets(None, &[1; 5], &direct, 4, &mut rr, &mut second);
        assert_eq!(chosen, vec![None, Some(0), None, Some(1), Some(2)]);
        let chosen = targets(
            Some(Direct::RoundRobin),
            &[1; 5],
            &direct,
            4,
            &mut rr,
            &mut second,
        );
        assert_eq!(chosen, vec![Some(0), Some(3), Some(1), Some(0), Some(1)]);
        // Least-loaded balances only the requests it is given.
        let chosen = targets(
            Some(Direct::LeastLoaded),
            &[12, 99, 4, 99, 99],
            &direct,
            2,
            &mut rr,
            &mut second,
        );
        assert_eq!(chosen, vec![Some(0), Some(0), Some(1), Some(1), Some(0)]);
    }

    #[test]
    fn the_busiest_replica_is_summed_over_steps() {
        let step = |a, b| {
            vec![
                ReplicaStep {
                    computed_tokens: a,
                    requests: 1,
                },
                ReplicaStep {
                    computed_tokens: b,
                    requests: 1,
                },
            ]
        };
        let record = RunRecord {
            route: "r".into(),
            requests: Vec::new(),
            step_wall_ms: vec![1.0, 1.0],
            steps: vec![step(10, 3), step(2, 7)],
            source: "answers",
            memory_in_use: None,
        };
        assert_eq!(record.computed_tokens(), 22);
        assert_eq!(record.busiest_sum(), 17);
    }
}
