//! A bounded load generator for proxy mode (docs/behaviour.md §8) on loopback (a benchmark, not a
//! test).
//!
//! In this process: 4 stub engines (`crates/stub-engine`), the producer's proxy in front of
//! them, and as baselines a *no-op proxy* (the same axum server and the same pooled reqwest
//! client, forwarding each request round-robin with no window) and the stubs called directly.
//! Open loop at `--rate` requests/s for `--seconds`, completions bodies with `--prompt-kib` KiB
//! prompts in groups of 8 identical ones sent back to back (a GRPO burst: a group's requests
//! leave within 8 / rate seconds of each other).
//!
//! 1. Round trip of a non-streaming completion: direct, no-op proxy, and the producer proxy
//!    with group hints (`x-burst-prefix-group-size: 8`, window `--window-ms` as the upper bound:
//!    a window seals when its groups are complete), with a 1 ms window and no hints (the
//!    stack's overhead with a window that never waits long), and in zero-wait mode
//!    (`windowDurationMs: 0`, memory on, no hints: each request placed on arrival). The
//!    zero-wait path's added p50 and p99 over direct and over the no-op proxy close the table.
//! 2. Time to first byte of a streaming completion (SSE), at `--stream-rate`: direct, no-op
//!    proxy, producer proxy with a 1 ms window, in zero-wait mode, and with hints.
//! 3. Isolated bursts (`--bursts`): 6 prompts x 8 samples sent at once, hinted, one after the
//!    other: the wait of a burst that arrives within a few ms, against the stubs called directly.
//!
//! Run: `cargo bench -p burst-prefix-producer --bench proxy_load [-- --rate 2000 --seconds 10]`
//! (`-- --help` explains every flag).

#[path = "stats/mod.rs"]
mod stats;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use burst_prefix_core::{Limits, Producer};
use burst_prefix_producer::proxy::ProxyConfig;
use burst_prefix_producer::serve::{Role, Service};
use burst_prefix_stub_engine::{Options as StubOptions, StubEngine};
use clap::Parser;
use futures::StreamExt;
use serde_json::json;
use stats::args::CargoBench;
use stats::{percentile, summary};

#[derive(Parser, Debug)]
#[command(
    name = "proxy_load",
    bin_name = "cargo bench -p burst-prefix-producer --bench proxy_load --",
    about = "Round trip and time to first byte through the producer's proxy to stub engines, against the stubs called directly and a no-op proxy",
    long_about = None
)]
struct Options {
    /// Open-loop rate of the non-streaming phase, in requests per second.
    #[arg(long, default_value_t = 2000.0)]
    rate: f64,
    /// How long the non-streaming phase lasts per path, in seconds.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Open-loop rate of the streaming (SSE) phase, in requests per second.
    #[arg(long, default_value_t = 500.0)]
    stream_rate: f64,
    /// How long the streaming phase lasts per path, in seconds.
    #[arg(long, default_value_t = 5.0)]
    stream_seconds: f64,
    /// windowDurationMs of the hinted producer proxy (an upper bound: its windows seal when
    /// their hinted groups are complete).
    #[arg(long, default_value_t = 100)]
    window_ms: u64,
    /// Size of each prompt, in KiB (groups of 8 identical prompts, 64 distinct).
    #[arg(long, default_value_t = 4)]
    prompt_kib: usize,
    /// Isolated bursts (6 prompts x 8 samples at once, hinted) sent one after the other.
    #[arg(long, default_value_t = 100)]
    bursts: usize,
    /// The producer proxies' idle connections kept open to each stub (`--upstream-max-idle`;
    /// default: the producer's default).
    #[arg(long, default_value_t = ProxyConfig::default().max_idle_per_upstream)]
    upstream_max_idle: usize,
    #[command(flatten)]
    cargo: CargoBench,
}

/// 64 prompts x 8 identical samples, in sending order (a group's samples back to back).
fn bodies(prompt_kib: usize, stream: bool) -> Vec<Bytes> {
    (0..64)
        .flat_map(|p| {
            let mut prompt = format!("Rollout prompt {p}. ");
            while prompt.len() < prompt_kib * 1024 {
                prompt.push_str("Solve the problem step by step and box the final answer. ");
            }
            prompt.truncate(prompt_kib * 1024);
            let body = json!({"model": "bench", "prompt": prompt, "max_tokens": 4, "stream": stream,
                              "stub": {"chunks": 4}});
            std::iter::repeat_n(Bytes::from(body.to_string()), 8)
        })
        .collect()
}

/// Where requests go: a fixed URL, or round-robin over several (the direct baseline).
#[derive(Clone)]
struct Target {
    urls: Arc<Vec<String>>,
    next: Arc<AtomicUsize>,
    hints: bool,
}

impl Target {
    fn one(url: String, hints: bool) -> Self {
        Target {
            urls: Arc::new(vec![url]),
            next: Arc::default(),
            hints,
        }
    }

    fn url(&self) -> &str {
        &self.urls[self.next.fetch_add(1, Ordering::Relaxed) % self.urls.len()]
    }
}

/// (round trip, time to first body byte), or why it failed.
async fn send(
    client: &reqwest::Client,
    target: &Target,
    body: Bytes,
) -> Result<(f64, f64), String> {
    let sent = Instant::now();
    let mut request = client
        .post(format!("{}/v1/completions", target.url()))
        .header("content-type", "application/json")
        .body(body);
    if target.hints {
        request = request.header("x-burst-prefix-group-size", "8");
    }
    let response = request.send().await.map_err(|e| {
        if e.is_timeout() {
            "timeout".to_string()
        } else if e.is_connect() {
            "connect".to_string()
        } else {
            "send".to_string()
        }
    })?;
    if !response.status().is_success() {
        return Err(format!("status {}", response.status().as_u16()));
    }
    let mut chunks = response.bytes_stream();
    let mut first = None;
    while let Some(chunk) = chunks.next().await {
        chunk.map_err(|_| "body".to_string())?;
        first.get_or_insert_with(|| sent.elapsed().as_secs_f64() * 1e3);
    }
    Ok((
        sent.elapsed().as_secs_f64() * 1e3,
        first.unwrap_or(f64::NAN),
    ))
}

/// Open loop: requests leave on schedule whatever the answers do. Returns the samples and the
/// failures counted by cause.
async fn open_loop(
    client: &reqwest::Client,
    target: &Target,
    bodies: &[Bytes],
    rate: f64,
    seconds: f64,
) -> (Vec<(f64, f64)>, std::collections::BTreeMap<String, usize>) {
    let total = (rate * seconds) as usize;
    let mut tasks = Vec::with_capacity(total);
    let start = Instant::now();
    let mut ticks = tokio::time::interval(Duration::from_millis(1));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    while tasks.len() < total {
        ticks.tick().await;
        let due = ((start.elapsed().as_secs_f64() * rate) as usize).min(total);
        while tasks.len() < due {
            let (client, target) = (client.clone(), target.clone());
            let body = bodies[tasks.len() % bodies.len()].clone();
            tasks.push(tokio::spawn(
                async move { send(&client, &target, body).await },
            ));
        }
    }
    let mut samples = Vec::with_capacity(total);
    let mut failed = std::collections::BTreeMap::new();
    for task in tasks {
        match task.await.unwrap() {
            Ok(sample) => samples.push(sample),
            Err(cause) => *failed.entry(cause).or_insert(0) += 1,
        }
    }
    (samples, failed)
}

/// The no-op proxy: the same server stack and upstream client as the producer's proxy,
/// forwarding round-robin with no window.
async fn start_noop_proxy(upstreams: Vec<String>) -> String {
    #[derive(Clone)]
    struct Noop {
        client: reqwest::Client,
        upstreams: Arc<Vec<String>>,
        next: Arc<AtomicUsize>,
    }
    async fn forward(State(noop): State<Noop>, headers: HeaderMap, body: Bytes) -> Response {
        let i = noop.next.fetch_add(1, Ordering::Relaxed) % noop.upstreams.len();
        let mut headers = headers;
        headers.remove("host");
        headers.remove("content-length");
        let upstream = noop
            .client
            .post(format!("{}/v1/completions", noop.upstreams[i]))
            .headers(headers)
            .body(body)
            .send()
            .await
            .expect("the stub answers");
        let status = upstream.status();
        let mut response = Response::new(Body::from_stream(upstream.bytes_stream()));
        *response.status_mut() = status;
        response
    }
    let noop = Noop {
        client: reqwest::Client::builder()
            .no_proxy()
            .tcp_nodelay(true)
            .build()
            .unwrap(),
        upstreams: Arc::new(upstreams),
        next: Arc::default(),
    };
    let router = Router::new()
        .route("/v1/completions", post(forward))
        .with_state(noop);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{addr}")
}

async fn start_proxy(stubs: &[StubEngine], window_ms: u64, max_idle: usize) -> Service {
    let mut yaml = format!("windowDurationMs: {window_ms}\nmaxBatchSize: -1\nendpoints:\n");
    for (i, stub) in stubs.iter().enumerate() {
        yaml.push_str(&format!(
            "  - {{id: bench/e{i}, address: '{}'}}\n",
            stub.addr()
        ));
    }
    let producer = Producer::with_config(&yaml, Limits::default()).unwrap();
    let proxy = ProxyConfig {
        max_idle_per_upstream: max_idle,
        ..ProxyConfig::default()
    };
    Service::on_loopback(producer, proxy).await.unwrap()
}

fn main() {
    let options = Options::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut stubs = Vec::new();
        for i in 0..4 {
            stubs.push(StubEngine::start(StubOptions::with_id(format!("e{i}"))).await.unwrap());
        }
        let direct = Target {
            urls: Arc::new(stubs.iter().map(StubEngine::url).collect()),
            next: Arc::default(),
            hints: false,
        };
        let noop = Target::one(start_noop_proxy(stubs.iter().map(StubEngine::url).collect()).await, false);
        let hinted_proxy = start_proxy(&stubs, options.window_ms, options.upstream_max_idle).await;
        let hinted = Target::one(
            format!("http://{}", hinted_proxy.addr(Role::Api).unwrap()),
            true,
        );
        let fast_proxy = start_proxy(&stubs, 1, options.upstream_max_idle).await;
        let fast = Target::one(format!("http://{}", fast_proxy.addr(Role::Api).unwrap()), false);
        // Zero-wait mode: the default config (memory on) with windowDurationMs 0.
        let zero_wait_proxy = start_proxy(&stubs, 0, options.upstream_max_idle).await;
        let zero_wait =
            Target::one(format!("http://{}", zero_wait_proxy.addr(Role::Api).unwrap()), false);
        const ZERO_WAIT: &str = "producer proxy, zero-wait (window 0), no hints";
        let client = reqwest::Client::builder().no_proxy().tcp_nodelay(true).build().unwrap();

        println!(
            "The producer proxies keep at most {} idle connections open to each stub.\n",
            options.upstream_max_idle
        );
        let plain = bodies(options.prompt_kib, false);
        let streaming = bodies(options.prompt_kib, true);
        println!(
            "Round trip, non-streaming, open loop {} req/s for {} s, {} KiB prompts in groups of 8 (ms):\n",
            options.rate, options.seconds, options.prompt_kib
        );
        println!("| path | samples | p50 | p99 | p99.9 | max |\n|---|---|---|---|---|---|");
        // (p50, p99) of the baselines and of the zero-wait path.
        let mut quantiles = std::collections::HashMap::new();
        for (name, target) in [
            ("direct to the stubs", &direct),
            ("no-op proxy (no window)", &noop),
            ("producer proxy, window 1 ms, no hints", &fast),
            (ZERO_WAIT, &zero_wait),
            (&*format!("producer proxy, hints, window {} ms", options.window_ms), &hinted),
        ] {
            // A short warm-up, so that connection pools are full.
            let _ = open_loop(&client, target, &plain, options.rate, 0.5).await;
            let (samples, failed) =
                open_loop(&client, target, &plain, options.rate, options.seconds).await;
            let mut round_trips: Vec<f64> = samples.iter().map(|s| s.0).collect();
            round_trips.sort_by(f64::total_cmp);
            quantiles.insert(
                name.to_string(),
                (percentile(&round_trips, 50.0), percentile(&round_trips, 99.0)),
            );
            println!("{}", summary(name, round_trips));
            if !failed.is_empty() {
                println!("| {name}: FAILED {failed:?} | | | | | |");
            }
        }
        let (zero_p50, zero_p99) = quantiles[ZERO_WAIT];
        for baseline in ["direct to the stubs", "no-op proxy (no window)"] {
            let (p50, p99) = quantiles[baseline];
            println!(
                "\nzero-wait proxy over {baseline}: p50 {:+.3} ms, p99 {:+.3} ms",
                zero_p50 - p50,
                zero_p99 - p99
            );
        }
        println!(
            "\nTime to first byte, streaming, open loop {} req/s for {} s (ms):\n",
            options.stream_rate, options.stream_seconds
        );
        println!("| path | samples | p50 | p99 | p99.9 | max |\n|---|---|---|---|---|---|");
        for (name, target) in [
            ("direct to the stubs", &direct),
            ("no-op proxy (no window)", &noop),
            ("producer proxy, window 1 ms, no hints", &fast),
            (ZERO_WAIT, &zero_wait),
            (&*format!("producer proxy, hints, window {} ms", options.window_ms), &hinted),
        ] {
            let (samples, failed) = open_loop(
                &client,
                target,
                &streaming,
                options.stream_rate,
                options.stream_seconds,
            )
            .await;
            println!("{}", summary(name, samples.iter().map(|s| s.1).collect()));
            if !failed.is_empty() {
                println!("| {name}: FAILED {failed:?} | | | | | |");
            }
        }
        println!(
            "\nIsolated bursts: {} bursts of 6 prompts x 8 samples, each burst's 48 requests sent at once \
             (hinted: x-burst-prefix-group-size 8), the next burst after the last answer + 20 ms. \
             Round trip (ms):\n",
            options.bursts
        );
        println!("| path | samples | p50 | p99 | p99.9 | max |\n|---|---|---|---|---|---|");
        let mut spreads = Vec::new();
        for (name, target) in [
            ("direct to the stubs", &direct),
            (&*format!("producer proxy, hints, window {} ms", options.window_ms), &hinted),
        ] {
            let mut samples = Vec::new();
            for burst in 0..options.bursts {
                let first = Instant::now();
                let tasks: Vec<_> = (0..48)
                    .map(|i| {
                        let (client, target) = (client.clone(), target.clone());
                        // Distinct prompts per burst, so that no burst rides on the last one's
                        // groups.
                        let body = plain[(((burst * 6) % 64) * 8 + i) % plain.len()].clone();
                        tokio::spawn(async move { send(&client, &target, body).await })
                    })
                    .collect();
                spreads.push(first.elapsed().as_secs_f64() * 1e3);
                for task in tasks {
                    samples.push(task.await.unwrap().expect("a burst request failed").0);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            println!("{}", summary(name, samples));
        }
        println!("{}", summary("(time to spawn a burst's 48 sends)", spreads));
        let metrics = hinted_proxy.producer.metrics().render();
        let sealed: Vec<&str> = metrics
            .lines()
            .filter(|l| l.starts_with("burst_prefix_windows_sealed_total"))
            .collect();
        println!("\nwindows of the hinted proxy: {}", sealed.join(", "));
        hinted_proxy.shutdown(Duration::from_secs(5)).await;
        fast_proxy.shutdown(Duration::from_secs(5)).await;
        zero_wait_proxy.shutdown(Duration::from_secs(5)).await;
    });
}
