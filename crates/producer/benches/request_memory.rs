//! Memory per request (issue 17, item 4), measured on the real binary (a benchmark, not a test).
//!
//! For each body shape (a text prompt, a token-array prompt, chat messages): a fresh producer
//! (`serve`, 4 endpoints, a 3 s window so that every body waits in it together), then
//! `--concurrent` bodies of `--body-mib` MiB each sent at once to `POST /v1/produce`. Read from
//! `/proc/PID/status`: the resident set before (`VmRSS`), the peak while the window held them
//! (`VmHWM`, reset through `/proc/PID/clear_refs` just before), and `VmRSS` 5 s after the answers.
//! Printed: the peak's growth as a multiple of the bytes of the bodies in flight (target ≤ 3x)
//! and how far RSS stayed above its level before (target ≤ 64 MB).
//!
//! Run: `cargo bench -p burst-prefix-producer --bench request_memory [-- --concurrent 8 --body-mib 7.8]`

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use common::{endpoints, Binary};
use serde_json::{json, Value};

struct Options {
    concurrent: usize,
    body_mib: f64,
}

fn options() -> Options {
    let mut options = Options {
        concurrent: 8,
        body_mib: 7.8,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let value = || args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--concurrent" => options.concurrent = value().parse().expect("--concurrent N"),
            "--body-mib" => options.body_mib = value().parse().expect("--body-mib M"),
            "--bench" => {
                i += 1;
                continue;
            }
            other => panic!("unknown option {other}"),
        }
        i += 2;
    }
    options
}

/// A `/proc/PID/status` field in bytes (`VmRSS`, `VmHWM`).
fn status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map(|kib| kib * 1024)
        .unwrap_or_else(|| panic!("{field} missing from /proc/{pid}/status"))
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
    let options = options();
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
        // "5" resets the peak resident set (VmHWM) to the current one.
        std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("reset VmHWM");
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
