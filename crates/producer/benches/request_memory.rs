//! Memory per request, measured on the real binary (a benchmark, not a test).
//!
//! For each body shape (a text prompt, a token-array prompt, chat messages): a fresh producer
//! (`serve`, 4 endpoints, a 3 s window so that every body waits in it together), then
//! `--concurrent` bodies of `--body-mib` MiB each sent at once to `POST /v1/produce`. Read from
//! `/proc/PID/status`: the resident set before (`VmRSS`), the peak while the window held them
//! (`VmHWM`, reset through `/proc/PID/clear_refs` just before), and `VmRSS` 5 s after the answers.
//! Printed: the peak's growth as a multiple of the bytes of the bodies in flight (target ≤ 3x)
//! and how far RSS stayed above its level before (target ≤ 64 MB).
//!
//! Run: `cargo bench -p burst-prefix-producer --bench request_memory [-- --concurrent 8 --body-mib
//! 7.8]` (`-- --help` explains every flag).

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "stats/mod.rs"]
mod stats;

use std::time::Duration;

use clap::Parser;
use common::{endpoints, Binary};
use serde_json::{json, Value};
use stats::args::CargoBench;
use stats::procfs::{reset_peak, status_bytes};

#[derive(Parser, Debug)]
#[command(
    name = "request_memory",
    bin_name = "cargo bench -p burst-prefix-producer --bench request_memory --",
    about = "Peak and lasting RSS of the producer binary while one window holds large bodies, per body shape",
    long_about = None
)]
struct Options {
    /// Bodies sent at once (they all wait in one 3 s window).
    #[arg(long, default_value_t = 8)]
    concurrent: usize,
    /// Size of each body, in MiB (the producer runs with --max-body-bytes 16 MiB).
    #[arg(long, default_value_t = 7.8)]
    body_mib: f64,
    #[command(flatten)]
    cargo: CargoBench,
}

/// A body of about `bytes` bytes whose prompt differs per `seed` (no two share blocks).
fn body(shape: &str, bytes: usize, seed: usize) -> Vec<u8> {
    let words =
        |n: usize| -> String { (0..n).map(|i| format!("w{seed}x{i} ")).collect::<String>() };
    let value: Value = match shape {
        "text" => json!({"model": "m", "prompt": words(bytes / 8)}),
        "tokens" => {
            // Token ids of 6 digits and a comma: 7 bytes each.
            let tokens: Vec<u32> = (0..bytes / 7)
                .map(|i| (100_000 + (i + seed * 7) % 900_000) as u32)
                .collect();
            json!({"model": "m", "prompt": tokens})
        }
        "chat" => {
            // Many short messages: the shape whose tree cost 14x its bytes.
            let messages: Vec<Value> = (0..bytes / 64)
                .map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": format!("m{seed}-{i} hello")}))
                .collect();
            json!({"model": "m", "messages": messages})
        }
        other => panic!("unknown shape {other}"),
    };
    serde_json::to_vec(&value).unwrap()
}

const MIB: f64 = 1024.0 * 1024.0;

fn main() {
    let options = Options::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let target = (options.body_mib * MIB) as usize;
    println!(
        "{} concurrent bodies of ~{:.1} MiB each, one window (3 s) holding them all",
        options.concurrent, options.body_mib
    );
    println!("| shape | bodies in flight (MiB) | RSS before (MiB) | peak growth (MiB) | peak / bodies | RSS 5 s after, above before (MiB) |");
    println!("|---|---:|---:|---:|---:|---:|");
    for shape in ["text", "tokens", "chat"] {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.yaml");
        std::fs::write(
            &config,
            format!(
                "windowDurationMs: 3000\nmaxBatchSize: 10000\n{}",
                endpoints(4)
            ),
        )
        .unwrap();
        let producer = Binary::serve(&[
            "--config",
            config.to_str().unwrap(),
            "--max-body-bytes",
            &(16 * 1024 * 1024).to_string(),
        ]);
        let pid = producer.child.id();
        let bodies: Vec<Vec<u8>> = (0..options.concurrent)
            .map(|seed| body(shape, target, seed))
            .collect();
        let in_flight: usize = bodies.iter().map(Vec::len).sum();
        std::thread::sleep(Duration::from_millis(500));
        let before = status_bytes(pid, "VmRSS");
        reset_peak(pid);
        let url = format!("{}/v1/produce", producer.base);
        let statuses = runtime.block_on(async {
            let client = reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap();
            let sends = bodies.into_iter().map(|body| {
                let client = client.clone();
                let url = url.clone();
                async move {
                    client
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(body)
                        .send()
                        .await
                        .map(|response| response.status().as_u16())
                        .unwrap_or(0)
                }
            });
            futures::future::join_all(sends).await
        });
        assert!(
            statuses.iter().all(|&status| status == 200),
            "{shape}: answers {statuses:?}\n{}",
            producer.logs()
        );
        let peak = status_bytes(pid, "VmHWM");
        std::thread::sleep(Duration::from_secs(5));
        let after = status_bytes(pid, "VmRSS");
        let growth = peak.saturating_sub(before) as f64;
        println!(
            "| {shape} | {:.1} | {:.1} | {:.1} | {:.2}x | {:.1} |",
            in_flight as f64 / MIB,
            before as f64 / MIB,
            growth / MIB,
            growth / in_flight as f64,
            (after as f64 - before as f64) / MIB,
        );
        producer.terminate();
    }
}
