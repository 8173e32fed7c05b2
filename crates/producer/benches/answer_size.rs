//! Answer size on large fleets: a burst through `POST /v1/produce` with every
//! endpoint listed in `matches` (the default, `?matches=all`) beside `?matches=nonzero` and
//! `?matches=none`, at `--endpoints` replicas (a benchmark, not a test).
//!
//! In this process: the producer on loopback (100 ms window, hints off), `--bursts` bursts of
//! `--prompts` prompts x 8 identical samples, all sent at once; per setting, the bytes of one
//! answer and the p50/p99 of the round trip over every request of every burst.
//!
//! Run: `cargo bench -p burst-prefix-producer --bench answer_size [-- --endpoints 1000,10000]`
//! (`-- --help` explains every flag).

#[path = "stats/mod.rs"]
mod stats;

use std::time::{Duration, Instant};

use burst_prefix_core::{Limits, Producer};
use burst_prefix_producer::proxy::ProxyConfig;
use burst_prefix_producer::serve::{Role, Service};
use clap::Parser;
use serde_json::json;
use stats::args::CargoBench;
use stats::summary;

#[derive(Parser, Debug)]
#[command(
    name = "answer_size",
    bin_name = "cargo bench -p burst-prefix-producer --bench answer_size --",
    about = "Bytes and round trip of POST /v1/produce answers on large fleets, by ?matches= setting",
    long_about = None
)]
struct Options {
    /// Fleet sizes to measure, comma-separated (one producer each, fake endpoints).
    #[arg(long, value_delimiter = ',', default_values_t = [1_000, 10_000])]
    endpoints: Vec<usize>,
    /// Bursts sent per fleet size and matches setting, one after the other.
    #[arg(long, default_value_t = 5)]
    bursts: usize,
    /// Prompts per burst (each sent as 8 identical samples at once).
    #[arg(long, default_value_t = 32)]
    prompts: usize,
    #[command(flatten)]
    cargo: CargoBench,
}

async fn start(endpoints: usize) -> Service {
    let mut yaml =
        String::from("windowDurationMs: 100\nmaxBatchSize: -1\nsealOnHints: false\nendpoints:\n");
    for i in 0..endpoints {
        yaml.push_str(&format!(
            "  - {{id: bench/e{i}, address: '10.{}.{}.{}:8000'}}\n",
            i / 65_536,
            (i / 256) % 256,
            i % 256
        ));
    }
    let producer = Producer::with_config(&yaml, Limits::default()).unwrap();
    Service::on_loopback(producer, ProxyConfig::default())
        .await
        .unwrap()
}

/// One burst: every sample of every prompt at once; (round trip of each, bytes of each answer).
async fn burst(
    client: &reqwest::Client,
    url: &str,
    prompts: usize,
    round: usize,
) -> Vec<(Duration, usize)> {
    let sends = (0..prompts * 8).map(|i| {
        let body = json!({
            "model": "m",
            "prompt": format!("round {round} prompt {}: {}", i / 8, "solve this step by step ".repeat(64)),
        });
        let client = client.clone();
        let url = url.to_string();
        async move {
            let sent = Instant::now();
            let response = client.post(&url).json(&body).send().await.expect("an answer");
            assert_eq!(response.status(), 200, "a planned answer");
            let bytes = response.bytes().await.expect("a body").len();
            (sent.elapsed(), bytes)
        }
    });
    futures::future::join_all(sends).await
}

fn main() {
    let options = Options::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "{} bursts of {} prompts x 8 samples, 100 ms window; round trip includes the window wait",
        options.bursts, options.prompts
    );
    println!("| endpoints, matches, bytes per answer | samples | p50 (ms) | p99 (ms) | p99.9 (ms) | max (ms) |");
    println!("|---|---:|---:|---:|---:|---:|");
    runtime.block_on(async {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        for &endpoints in &options.endpoints {
            let service = start(endpoints).await;
            let base = format!("http://{}/v1/produce", service.addr(Role::Api).unwrap());
            for matches in ["all", "nonzero", "none"] {
                let url = format!("{base}?matches={matches}");
                let mut latencies = Vec::new();
                let mut bytes = 0;
                for round in 0..options.bursts {
                    for (latency, size) in burst(&client, &url, options.prompts, round).await {
                        latencies.push(latency.as_secs_f64() * 1000.0);
                        bytes = size;
                    }
                }
                let name = format!("{endpoints}, {matches}, {bytes} B");
                println!("{}", summary(&name, latencies));
            }
            service.shutdown(Duration::from_secs(5)).await;
        }
    });
}
