//! A bounded load generator for `POST /v1/produce` on loopback (a benchmark, not a test).
//!
//! It starts, in this process, the producer service and the same axum server with a no-op
//! `/v1/produce` handler, then measures against each:
//!
//! 1. Latency, open loop at `--rate` requests/s for `--seconds`: for the producer, the latency
//!    *added beyond the window wait*. For each window, its deadline is estimated from the client
//!    side as (earliest send of a request in that window) + windowDurationMs, and a request's
//!    added latency is `received - max(deadline, sent)`. The window opens when its first request
//!    reaches the server, a little after that request was sent, so this over-estimates the added
//!    latency (it is conservative). For the no-op server: the plain round-trip latency.
//! 2. Throughput, closed loop: `--concurrency` clients sending back to back for
//!    `--throughput-seconds`, against the producer with a `--throughput-window-ms` window (so the
//!    window itself does not cap the rate) and against the no-op server.
//!
//! Bodies are completions requests with `--prompt-kib` KiB text prompts, in groups of 8
//! identical prompts (a GRPO-like burst). Everything runs on the same machine as the server,
//! so the figures include the load generator's own CPU use.
//!
//! Run: `cargo bench -p burst-prefix-producer --bench produce_load [-- --rate 2000 ...]`
//! (`-- --help` explains every flag).

#[path = "stats/mod.rs"]
mod stats;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::routing::post;
use axum::serve::ListenerExt;
use axum::{Json, Router};
use burst_prefix_core::admit::DEFAULT_MAX_BODY_BYTES;
use burst_prefix_core::{Limits, Producer};
use burst_prefix_producer::proxy::ProxyConfig;
use burst_prefix_producer::serve::{Role, Service};
use clap::Parser;
use serde_json::{json, Value};
use stats::args::{seconds_within, CargoBench};
use stats::summary;
use tokio::net::TcpListener;

#[derive(Parser, Debug)]
#[command(
    name = "produce_load",
    bin_name = "cargo bench -p burst-prefix-producer --bench produce_load --",
    about = "Latency and throughput of POST /v1/produce on loopback, against a no-op server and a no-op window server",
    long_about = None
)]
struct Options {
    /// Open-loop rate of the latency phase, in requests per second.
    #[arg(long, default_value_t = 2000.0)]
    rate: f64,
    /// How long the latency phase lasts per server, in seconds (0.1..=60).
    #[arg(long, default_value_t = 10.0, value_parser = seconds_within(0.1, 60.0))]
    seconds: f64,
    /// Size of each prompt, in KiB (groups of 8 identical prompts).
    #[arg(long, default_value_t = 16)]
    prompt_kib: usize,
    /// Distinct prompts, sent in turn: 64 repeat every 512 requests (the producer's memory then
    /// finds them cached); many thousands make every window's prompts new to it.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    distinct_prompts: u32,
    /// The producer's `memory.enabled` (docs/behaviour.md §7): false plans every window cold, as
    /// llm-d does.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    memory: bool,
    /// windowDurationMs of the producer (and the no-op window server's clock) in the latency
    /// phase.
    #[arg(long, default_value_t = 100)]
    window_ms: u64,
    /// Clients sending back to back in the throughput phase.
    #[arg(long, default_value_t = 256)]
    concurrency: usize,
    /// How long the throughput phase lasts per server, in seconds (0.1..=60).
    #[arg(long, default_value_t = 5.0, value_parser = seconds_within(0.1, 60.0))]
    throughput_seconds: f64,
    /// windowDurationMs of the producer in the throughput phase (short, so that the window
    /// does not cap the rate).
    #[arg(long, default_value_t = 5)]
    throughput_window_ms: u64,
    /// Worker threads of the servers' tokio runtime.
    #[arg(long, default_value_t = 2)]
    server_threads: usize,
    /// Worker threads of the load generator's tokio runtime.
    #[arg(long, default_value_t = 2)]
    client_threads: usize,
    #[command(flatten)]
    cargo: CargoBench,
}

/// Bodies: groups of 8 identical completions requests on `distinct` prompts.
fn bodies(prompt_kib: usize, distinct: u32) -> Vec<Bytes> {
    (0..distinct)
        .map(|p| {
            let mut prompt = format!("Rollout prompt {p}. ");
            let filler = "Solve the problem step by step and box the final answer. ";
            while prompt.len() < prompt_kib * 1024 {
                prompt.push_str(filler);
            }
            prompt.truncate(prompt_kib * 1024);
            Bytes::from(json!({"model": "bench", "prompt": prompt, "max_tokens": 512}).to_string())
        })
        .flat_map(|body| std::iter::repeat_n(body, 8))
        .collect()
}

struct Sample {
    sent: Instant,
    received: Instant,
    window: Option<u64>,
    waited_ms: Option<f64>,
    ok: bool,
    /// The answer's body size.
    bytes: usize,
}

async fn send(client: &reqwest::Client, url: &str, body: Bytes) -> Sample {
    let sent = Instant::now();
    let result = client
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await;
    let (ok, bytes) = match result {
        Ok(response) => {
            let ok = response.status().is_success();
            (ok, response.bytes().await.ok())
        }
        Err(_) => (false, None),
    };
    let received = Instant::now();
    let size = bytes.as_ref().map_or(0, |b| b.len());
    let answer = bytes.and_then(|b| serde_json::from_slice::<Value>(&b).ok());
    let window = answer.as_ref().and_then(|v| v["window"]["id"].as_u64());
    let waited_ms = answer
        .as_ref()
        .and_then(|v| v["window"]["waitedMs"].as_f64());
    Sample {
        sent,
        received,
        window,
        waited_ms,
        ok,
        bytes: size,
    }
}

/// Open loop: requests are sent on schedule whatever the answers do.
async fn open_loop(
    client: &reqwest::Client,
    url: &str,
    bodies: &[Bytes],
    rate: f64,
    seconds: f64,
) -> Vec<Sample> {
    let total = (rate * seconds) as usize;
    let mut tasks = Vec::with_capacity(total);
    let start = Instant::now();
    let mut ticks = tokio::time::interval(Duration::from_millis(1));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    while tasks.len() < total {
        ticks.tick().await;
        let due = ((start.elapsed().as_secs_f64() * rate) as usize).min(total);
        while tasks.len() < due {
            let client = client.clone();
            let url = url.to_string();
            let body = bodies[tasks.len() % bodies.len()].clone();
            tasks.push(tokio::spawn(async move { send(&client, &url, body).await }));
        }
    }
    let mut samples = Vec::with_capacity(total);
    for task in tasks {
        samples.push(task.await.unwrap());
    }
    samples
}

/// Closed loop: `concurrency` clients back to back; completed requests per second.
async fn closed_loop(
    client: &reqwest::Client,
    url: &str,
    bodies: &[Bytes],
    concurrency: usize,
    seconds: f64,
) -> (f64, u64) {
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let workers: Vec<_> = (0..concurrency)
        .map(|w| {
            let (client, url) = (client.clone(), url.to_string());
            let bodies = bodies.to_vec();
            let (done, failed) = (done.clone(), failed.clone());
            tokio::spawn(async move {
                let mut i = w;
                while Instant::now() < deadline {
                    let sample = send(&client, &url, bodies[i % bodies.len()].clone()).await;
                    if sample.ok {
                        done.fetch_add(1, Ordering::Relaxed);
                    } else {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    i += concurrency;
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64();
    (
        done.load(Ordering::Relaxed) as f64 / elapsed,
        failed.load(Ordering::Relaxed),
    )
}

/// Added latency beyond the window wait, per request (see the module docs).
fn added_latency_ms(samples: &[Sample], window: Duration) -> Vec<f64> {
    let mut first_sent: std::collections::HashMap<u64, Instant> = Default::default();
    for sample in samples {
        if let Some(id) = sample.window {
            let first = first_sent.entry(id).or_insert(sample.sent);
            *first = (*first).min(sample.sent);
        }
    }
    samples
        .iter()
        .filter_map(|sample| {
            let deadline = first_sent[&sample.window?] + window;
            let from = deadline.max(sample.sent);
            Some(
                sample
                    .received
                    .saturating_duration_since(from)
                    .as_secs_f64()
                    * 1e3,
            )
        })
        .collect()
}

/// Per window: from its first answer to its last (how long releasing it at once takes to drain).
fn spread_ms(samples: &[Sample]) -> Vec<f64> {
    let mut windows: std::collections::HashMap<u64, (Instant, Instant)> = Default::default();
    for sample in samples {
        if let Some(id) = sample.window {
            let entry = windows
                .entry(id)
                .or_insert((sample.received, sample.received));
            entry.0 = entry.0.min(sample.received);
            entry.1 = entry.1.max(sample.received);
        }
    }
    windows
        .values()
        .map(|(first, last)| (*last - *first).as_secs_f64() * 1e3)
        .collect()
}

/// Round trip minus the `waitedMs` the producer reports (joining to release): the time spent
/// outside the window (request in, parse, hash, response out, client).
fn outside_window_ms(samples: &[Sample]) -> Vec<f64> {
    samples
        .iter()
        .filter_map(|s| Some((s.received - s.sent).as_secs_f64() * 1e3 - s.waited_ms?))
        .collect()
}

fn round_trip_ms(samples: &[Sample]) -> Vec<f64> {
    samples
        .iter()
        .filter(|s| s.ok)
        .map(|s| (s.received - s.sent).as_secs_f64() * 1e3)
        .collect()
}

async fn start_producer(window_ms: u64, memory: bool) -> Service {
    let mut config = String::from("maxBatchSize: -1\nendpoints:\n");
    for i in 0..4 {
        config.push_str(&format!(
            "  - {{id: bench/vllm-{i}-rank-0, address: '127.0.0.1:{}'}}\n",
            8000 + i
        ));
    }
    let producer = Producer::with_config(
        &format!("windowDurationMs: {window_ms}\nmemory: {{enabled: {memory}}}\n{config}"),
        Limits::default(),
    )
    .unwrap();
    Service::on_loopback(producer, ProxyConfig::default())
        .await
        .unwrap()
}

/// The same axum server, with a `/v1/produce` that reads the body and answers at once.
/// Serves a baseline router on an ephemeral loopback port, with `TCP_NODELAY` like the producer.
async fn serve_on_loopback(router: Router) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move { axum::serve(listener, router).await });
    addr
}

async fn start_noop() -> std::net::SocketAddr {
    async fn noop(_body: Bytes) -> Json<Value> {
        Json(json!({"assignedEndpoint": null, "totalBlocks": 0}))
    }
    let router = Router::new()
        .route("/v1/produce", post(noop))
        .layer(DefaultBodyLimit::max(DEFAULT_MAX_BODY_BYTES));
    serve_on_loopback(router).await
}

/// The same axum server, with a `/v1/produce` that reads the body, waits for the next tick of
/// a fixed `window_ms` clock and then answers: the cost of releasing many waiters at once,
/// with none of the producer's work.
async fn start_noop_window(window_ms: u64) -> std::net::SocketAddr {
    let (tick, ticks) = tokio::sync::watch::channel(0u64);
    tokio::spawn(async move {
        let mut clock = tokio::time::interval(Duration::from_millis(window_ms));
        for id in 1.. {
            clock.tick().await;
            if tick.send(id).is_err() {
                return;
            }
        }
    });
    let router = Router::new()
        .route(
            "/v1/produce",
            post(
                |axum::extract::State(mut ticks): axum::extract::State<
                    tokio::sync::watch::Receiver<u64>,
                >,
                 _body: Bytes| async move {
                    let joined = Instant::now();
                    ticks.borrow_and_update();
                    let _ = ticks.changed().await;
                    let id = *ticks.borrow();
                    let waited_ms = joined.elapsed().as_secs_f64() * 1e3;
                    Json(json!({"window": {"id": id, "waitedMs": waited_ms}}))
                },
            ),
        )
        .layer(DefaultBodyLimit::max(DEFAULT_MAX_BODY_BYTES))
        .with_state(ticks);
    serve_on_loopback(router).await
}

fn main() {
    let options = Options::parse();
    let servers = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(options.server_threads)
        .enable_all()
        .build()
        .unwrap();
    let clients = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(options.client_threads)
        .enable_all()
        .build()
        .unwrap();
    let bodies = bodies(options.prompt_kib, options.distinct_prompts);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();

    let noop = servers.block_on(start_noop());
    let noop_window = servers.block_on(start_noop_window(options.window_ms));
    let producer = servers.block_on(start_producer(options.window_ms, options.memory));
    let fast = servers.block_on(start_producer(options.throughput_window_ms, options.memory));
    let noop_url = format!("http://{noop}/v1/produce");
    let noop_window_url = format!("http://{noop_window}/v1/produce");
    let producer_url = format!("http://{}/v1/produce", producer.addr(Role::Api).unwrap());
    let fast_url = format!("http://{}/v1/produce", fast.addr(Role::Api).unwrap());

    println!(
        "load: {} req/s for {} s, {} KiB prompts (body {} bytes, {} distinct), window {} ms, \
         memory {}; throughput: {} clients for {} s, window {} ms; threads: server {}, client {}",
        options.rate,
        options.seconds,
        options.prompt_kib,
        bodies[0].len(),
        options.distinct_prompts,
        options.window_ms,
        if options.memory { "on" } else { "off" },
        options.concurrency,
        options.throughput_seconds,
        options.throughput_window_ms,
        options.server_threads,
        options.client_threads,
    );
    let rate = options.rate;
    let seconds = options.seconds;
    let (noop_samples, noop_window_samples, producer_samples, noop_rps, fast_rps) = clients
        .block_on(async {
            let measure = |url: String| {
                let (client, bodies) = (client.clone(), bodies.clone());
                async move {
                    // Warm up connections and caches; not measured.
                    open_loop(&client, &url, &bodies, rate, 1.0).await;
                    open_loop(&client, &url, &bodies, rate, seconds).await
                }
            };
            let noop_samples = measure(noop_url.clone()).await;
            let noop_window_samples = measure(noop_window_url).await;
            let producer_samples = measure(producer_url).await;
            let throughput = |url: String| {
                let (client, bodies) = (client.clone(), bodies.clone());
                async move {
                    closed_loop(
                        &client,
                        &url,
                        &bodies,
                        options.concurrency,
                        options.throughput_seconds,
                    )
                    .await
                }
            };
            let noop_rps = throughput(noop_url).await;
            let fast_rps = throughput(fast_url).await;
            (
                noop_samples,
                noop_window_samples,
                producer_samples,
                noop_rps,
                fast_rps,
            )
        });

    let failed = |samples: &[Sample]| samples.iter().filter(|s| !s.ok).count();
    let windows: std::collections::HashSet<u64> =
        producer_samples.iter().filter_map(|s| s.window).collect();
    let metrics = producer.producer.metrics().render();
    let plan = |suffix: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("burst_prefix_window_plan_seconds_{suffix} ")))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    let window = Duration::from_millis(options.window_ms);
    println!();
    println!("| latency (ms) | samples | p50 | p99 | p99.9 | max |");
    println!("|---|---|---|---|---|---|");
    for (name, values) in [
        ("no-op server: round trip", round_trip_ms(&noop_samples)),
        (
            "producer: added beyond the window wait",
            added_latency_ms(&producer_samples, window),
        ),
        (
            "producer: round trip - waitedMs (time outside the window)",
            outside_window_ms(&producer_samples),
        ),
        (
            "no-op window server: round trip - waitedMs",
            outside_window_ms(&noop_window_samples),
        ),
        (
            "producer: round trip (incl. the window)",
            round_trip_ms(&producer_samples),
        ),
        (
            "producer, per window: first to last answer",
            spread_ms(&producer_samples),
        ),
        (
            "no-op window server, per window: first to last answer",
            spread_ms(&noop_window_samples),
        ),
    ] {
        println!("{}", summary(name, values));
    }
    println!();
    println!(
        "failed: no-op {}, no-op window {}, producer {}; producer windows: {} (mean {:.1} \
         requests), mean plan time {:.3} ms, mean answer {:.0} bytes",
        failed(&noop_samples),
        failed(&noop_window_samples),
        failed(&producer_samples),
        windows.len(),
        producer_samples.len() as f64 / windows.len().max(1) as f64,
        plan("sum") / plan("count") * 1e3,
        producer_samples.iter().map(|s| s.bytes).sum::<usize>() as f64
            / producer_samples.len().max(1) as f64
    );
    println!(
        "throughput: no-op {:.0} req/s ({} failed), producer {:.0} req/s ({} failed) = {:.0}% of \
         the no-op baseline",
        noop_rps.0,
        noop_rps.1,
        fast_rps.0,
        fast_rps.1,
        100.0 * fast_rps.0 / noop_rps.0
    );
    servers.block_on(async {
        producer.shutdown(Duration::from_secs(10)).await;
        fast.shutdown(Duration::from_secs(10)).await;
    });
}
