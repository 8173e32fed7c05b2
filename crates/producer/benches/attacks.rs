//! The attacks of the second hardening round (BENCHMARKS.md, "Hardening, second round") on real
//! producer binaries, one after another on loopback, so that two builds (before and after) are
//! measured in the same run: a measurement, not a test.
//!
//! For each `--binary` (default: this build's), each attack gets a fresh producer (2 fake
//! endpoints, a 20 ms window, every flag at its default but `--max-connections 20` for the
//! first), and prints what it held (`VmRSS`, and the peak `VmHWM`, from `/proc/PID/status`) and
//! what clients saw:
//!
//! The HTTP attacks go to the proxy's `POST /v1/completions` (the scoring API answers any request
//! within 30 s on its own, so there they would only last that long).
//!
//! - `stalled`: 20 connections (the cap) each send a head declaring 100 bytes and 9 bytes of
//!   body, then nothing: is a normal request answered, and when; `/readyz`; then a body dripped
//!   at 2 B/s (declaring 1,000 bytes): when does the producer close it (watched for 45 s).
//! - `bodies`: 40 connections each send 7.9 MB of an 8 MB body and stop: RSS 3 s after the
//!   last write, and 35 s after the start (past the 30 s body timeout); what each got.
//! - `ext-proc`: 40 (`--streams`) endpoint-picker streams on one HTTP/2 connection each send 7.5 MB of body
//!   (1 MB messages) without end of stream: the same figures, and how many streams were closed.
//! - `ext-proc-partial`: 40 (`--streams`) streams on one HTTP/2 connection each send 7.5 MB of one gRPC
//!   message that declares 9,000,000 bytes (under the picker's decoding limit of the body limit
//!   plus 1 MiB) and never send the rest: the message is never decoded, so the picker never sees
//!   a body chunk; the same figures.
//! - `drain`: a 20 s streaming completion through the proxy (a stub engine in this process) and
//!   an endpoint-picker stream carrying a 20 s response, both in flight at SIGTERM: did they
//!   complete, when did the producer exit, with which code.
//!
//! A build that has `--epp-plaintext` gets it (the picker serves TLS by default there); the
//! other flags are common to both builds. Every wait is bounded (at most 45 s per attack but the
//! drain, 180 s).
//!
//! Run: `cargo bench -p burst-prefix-producer --bench attacks -- --binary OLD --binary NEW`
//! (`--attack NAME` runs one).

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "stats/mod.rs"]
mod stats;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use burst_prefix_producer::epp::data_plane;
use burst_prefix_stub_engine::{Options, StubEngine};
use clap::Parser;
use common::ext_proc::ExtProc;
use common::{endpoints, Binary};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response;
use futures::StreamExt;
use serde_json::json;
use stats::procfs::{load_averages, reset_peak, status_bytes};

#[derive(Parser, Debug)]
struct Args {
    /// A producer binary to attack (repeat to compare builds); default: this build's.
    #[arg(long)]
    binary: Vec<PathBuf>,
    /// Run only this attack: stalled, bodies, ext-proc, drain.
    #[arg(long)]
    attack: Vec<String>,
    /// Streams of `ext-proc` and `ext-proc-partial` (40 in the attack).
    #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u32).range(1..=256))]
    streams: u32,
    /// cargo bench passes --bench.
    #[arg(long, hide = true)]
    bench: bool,
}

const MIB: f64 = 1024.0 * 1024.0;

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / MIB)
}

fn rss(pid: u32) -> String {
    mib(status_bytes(pid, "VmRSS"))
}

fn main() {
    let args = Args::parse();
    let binaries = if args.binary.is_empty() {
        vec![PathBuf::from(env!("CARGO_BIN_EXE_burst-prefix-producer"))]
    } else {
        args.binary.clone()
    };
    let wanted = |name: &str| args.attack.is_empty() || args.attack.iter().any(|a| a == name);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("load at start: {}", load_averages());
    for binary in &binaries {
        println!("\n## {}", binary.display());
        let target = Target::new(binary);
        if wanted("stalled") {
            runtime.block_on(stalled(&target));
        }
        if wanted("bodies") {
            runtime.block_on(bodies(&target));
        }
        if wanted("ext-proc") {
            runtime.block_on(ext_proc(&target, args.streams));
        }
        if wanted("ext-proc-partial") {
            runtime.block_on(ext_proc_partial(&target, args.streams));
        }
        if wanted("drain") {
            runtime.block_on(drain(&target));
        }
    }
    println!("\nload at end: {}", load_averages());
}

/// A producer build, and the flags it needs to serve the picker as plaintext.
struct Target {
    binary: PathBuf,
    plaintext: Vec<&'static str>,
    dir: tempfile::TempDir,
}

impl Target {
    fn new(binary: &Path) -> Target {
        let help = std::process::Command::new(binary)
            .args(["serve", "--help"])
            .output()
            .expect("run the binary's help");
        let plaintext = match String::from_utf8_lossy(&help.stdout).contains("--epp-plaintext") {
            true => vec!["--epp-plaintext"],
            false => vec![],
        };
        Target {
            binary: binary.to_path_buf(),
            plaintext,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn serve(&self, config: &str, flags: &[&str]) -> Binary {
        let path = self.dir.path().join("config.yaml");
        std::fs::write(&path, config).unwrap();
        let mut args = vec!["--config", path.to_str().unwrap()];
        args.extend_from_slice(&self.plaintext);
        args.extend_from_slice(flags);
        let producer = Binary::serve_binary(&self.binary, &args, &[]);
        // Idle and settled before any figure.
        std::thread::sleep(Duration::from_millis(500));
        producer
    }
}

fn fake_config() -> String {
    format!("windowDurationMs: 20\n{}", endpoints(2))
}

fn api(producer: &Binary) -> String {
    producer.base.trim_start_matches("http://").to_string()
}

/// The head of a `POST /v1/completions` (the proxy's route: the scoring API has a 30 s request
/// timeout of its own) declaring `length` bytes of body.
fn head(length: usize) -> String {
    format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    )
}

/// The status line the server sent on `stream` within `wait`, or what happened instead.
fn answer_within(stream: &mut TcpStream, wait: Duration) -> String {
    stream.set_read_timeout(Some(wait)).unwrap();
    let mut buffer = [0u8; 1024];
    match stream.read(&mut buffer) {
        Ok(0) => "closed without an answer".to_string(),
        Ok(n) => String::from_utf8_lossy(&buffer[..n])
            .lines()
            .next()
            .unwrap_or_default()
            .to_string(),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            "open, no answer".to_string()
        }
        Err(e) => format!("reset ({e})"),
    }
}

/// Counts of equal strings, as `a ×n, b ×m`.
fn tally(items: impl IntoIterator<Item = String>) -> String {
    let mut counts = std::collections::BTreeMap::new();
    for item in items {
        *counts.entry(item).or_insert(0) += 1;
    }
    counts
        .into_iter()
        .map(|(item, n)| format!("{item} ×{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

async fn stalled(target: &Target) {
    let producer = target.serve(&fake_config(), &["--max-connections", "20"]);
    let pid = producer.pid();
    let before = rss(pid);
    let address = api(&producer);
    let mut held: Vec<TcpStream> = (0..20)
        .map(|_| {
            let mut stream = TcpStream::connect(&address).unwrap();
            stream.write_all(head(100).as_bytes()).unwrap();
            stream.write_all(b"{\"model\":").unwrap();
            stream
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(45))
        .build()
        .unwrap();
    let ready = common::get_text(&client, &format!("{}/readyz", producer.admin))
        .await
        .0;
    let started = Instant::now();
    let normal = client
        .post(format!("{}/v1/produce", producer.base))
        .json(&common::completion("a normal request"))
        .send()
        .await;
    let normal = match normal {
        Ok(response) => format!(
            "{} after {:.1} s",
            response.status().as_u16(),
            started.elapsed().as_secs_f64()
        ),
        Err(_) => format!("no answer in {:.0} s", started.elapsed().as_secs_f64()),
    };
    let held_rss = rss(pid);
    let stalled: Vec<String> = held
        .iter_mut()
        .map(|s| answer_within(s, Duration::from_millis(100)))
        .collect();
    drop(held);

    // A body dripped at 2 B/s, declaring 1,000 bytes (it would take 500 s).
    let mut drip = TcpStream::connect(&address).unwrap();
    drip.write_all(head(1000).as_bytes()).unwrap();
    let mut writer = drip.try_clone().unwrap();
    let started = Instant::now();
    let dripping = std::thread::spawn(move || {
        for _ in 0..90 {
            if writer.write_all(b" ").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    let dripped = answer_within(&mut drip, Duration::from_secs(45));
    let dripped = format!("{dripped} at {:.1} s", started.elapsed().as_secs_f64());
    drop(drip);
    let _ = dripping.join();
    println!(
        "stalled: RSS {before} MiB idle, {held_rss} MiB with 20 stalled bodies; /readyz {ready}; \
         a normal request: {normal}; the stalled ones: {}; a 2 B/s drip: {dripped}",
        tally(stalled)
    );
}

async fn bodies(target: &Target) {
    let producer = target.serve(&fake_config(), &[]);
    let pid = producer.pid();
    let before = rss(pid);
    reset_peak(pid);
    let address = api(&producer);
    let started = Instant::now();
    let senders: Vec<_> = (0..40)
        .map(|_| {
            let address = address.clone();
            std::thread::spawn(move || {
                let mut stream = TcpStream::connect(&address).unwrap();
                stream
                    .set_write_timeout(Some(Duration::from_secs(40)))
                    .unwrap();
                stream.write_all(head(8_000_000).as_bytes()).unwrap();
                let chunk = vec![b' '; 100_000];
                let mut sent = 0;
                while sent < 7_900_000 {
                    if stream.write_all(&chunk).is_err() {
                        break;
                    }
                    sent += chunk.len();
                }
                (stream, sent)
            })
        })
        .collect();
    let mut streams: Vec<(TcpStream, usize)> =
        senders.into_iter().map(|s| s.join().unwrap()).collect();
    let sent_in = started.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_secs(3));
    let held = rss(pid);
    let peak = mib(status_bytes(pid, "VmHWM"));
    let complete = streams
        .iter()
        .filter(|(_, sent)| *sent >= 7_900_000)
        .count();
    let answers: Vec<String> = streams
        .iter_mut()
        .map(|(s, _)| answer_within(s, Duration::from_millis(100)))
        .collect();
    let rest = Duration::from_secs(35).saturating_sub(started.elapsed());
    std::thread::sleep(rest);
    let later = rss(pid);
    let later_answers: Vec<String> = streams
        .iter_mut()
        .map(|(s, _)| answer_within(s, Duration::from_millis(100)))
        .collect();
    drop(streams);
    std::thread::sleep(Duration::from_secs(2));
    println!(
        "bodies: RSS {before} MiB idle; 40 × 7.9 of 8 MB: {complete} sent whole in {sent_in:.1} s; \
         3 s later RSS {held} MiB (peak {peak}), answers: {}; at 35 s RSS {later} MiB, answers \
         since: {}; 2 s after they closed RSS {} MiB",
        tally(answers),
        tally(later_answers),
        rss(pid)
    );
}

async fn ext_proc(target: &Target, count: u32) {
    let producer = target.serve(&fake_config(), &[]);
    let pid = producer.pid();
    let before = rss(pid);
    reset_peak(pid);
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", producer.epp))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let started = Instant::now();
    let answers = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..count {
        let channel = channel.clone();
        let answers = answers.clone();
        tasks.push(tokio::spawn(async move {
            let mut stream = ExtProc::on(channel).await;
            let mode = BodySendMode::FullDuplexStreamed;
            stream
                .send(data_plane::request_headers(
                    Some(data_plane::protocol(mode, mode)),
                    &[(":method", "POST"), (":path", "/v1/completions")],
                    None,
                    false,
                ))
                .await;
            let chunk = vec![b' '; 1_000_000];
            let send = async {
                for i in 0..8 {
                    let piece = if i == 7 {
                        &chunk[..500_000]
                    } else {
                        &chunk[..]
                    };
                    if !stream.offer(data_plane::request_body(piece, false)).await {
                        return;
                    }
                }
            };
            let _ = tokio::time::timeout(Duration::from_secs(30), send).await;
            let sent_at = started.elapsed();
            // What the stream gets within 35 s of the start.
            let wait = Duration::from_secs(35).saturating_sub(started.elapsed());
            let answer = match stream.next_within(wait).await {
                Some(Ok(Some(answer))) => match answer.response {
                    Some(processing_response::Response::ImmediateResponse(immediate)) => {
                        format!("{}", immediate.status.map_or(0, |s| s.code))
                    }
                    _ => "routed".to_string(),
                },
                Some(Ok(None)) => "closed without an answer".to_string(),
                Some(Err(status)) => format!("gRPC {:?}", status.code()),
                None => "open, no answer".to_string(),
            };
            answers.lock().unwrap().push((sent_at, answer));
            stream
        }));
    }
    // The figures once every stream has sent (or 30 s).
    let deadline = Instant::now() + Duration::from_secs(32);
    while Instant::now() < deadline
        && answers.lock().unwrap().len() < count as usize
        && started.elapsed() < Duration::from_secs(8)
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held = rss(pid);
    let peak = mib(status_bytes(pid, "VmHWM"));
    let early: Vec<String> = answers
        .lock()
        .unwrap()
        .iter()
        .map(|(_, answer)| answer.clone())
        .collect();
    let mut streams = Vec::new();
    for task in tasks {
        streams.push(task.await.unwrap());
    }
    let at_end = rss(pid);
    let answers: Vec<String> = answers
        .lock()
        .unwrap()
        .iter()
        .map(|(_, answer)| answer.clone())
        .collect();
    drop(streams);
    println!(
        "ext-proc: RSS {before} MiB idle; {count} streams × 7.5 MB on one connection: at 11 s RSS \
         {held} MiB (peak {peak}), answered by then: {}; by 35 s: {} (RSS {at_end} MiB)",
        early.len(),
        tally(answers),
    );
}

async fn ext_proc_partial(target: &Target, count: u32) {
    let producer = target.serve(&fake_config(), &[]);
    let pid = producer.pid();
    let before = rss(pid);
    reset_peak(pid);
    let tcp = tokio::net::TcpStream::connect(&producer.epp).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    let driver = tokio::spawn(connection);
    let started = Instant::now();
    let mut streams = Vec::new();
    let mut client = client;
    for _ in 0..count {
        client = client.ready().await.unwrap();
        let request = http::Request::post(format!(
            "http://{}/envoy.service.ext_proc.v3.ExternalProcessor/Process",
            producer.epp
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
        let (response, mut send) = client.send_request(request, false).unwrap();
        // The gRPC frame: not compressed, 9,000,000 bytes declared; 7.5 MB of them sent.
        let mut frame = vec![0u8];
        frame.extend_from_slice(&9_000_000u32.to_be_bytes());
        frame.resize(5 + 7_500_000, b' ');
        send.send_data(frame.into(), false).unwrap();
        streams.push((response, send));
    }
    tokio::time::sleep(Duration::from_secs(11).saturating_sub(started.elapsed())).await;
    let held = rss(pid);
    let peak = mib(status_bytes(pid, "VmHWM"));
    // What each stream got by 35 s: the answer's first bytes (a message) or its end.
    let mut outcomes = Vec::new();
    for (response, _send) in &mut streams {
        let wait = Duration::from_secs(35).saturating_sub(started.elapsed());
        let outcome = match tokio::time::timeout(wait, response).await {
            Err(_) => "no response head".to_string(),
            Ok(Err(e)) => format!("reset ({e})"),
            Ok(Ok(response)) => {
                let mut body = response.into_body();
                let wait = Duration::from_secs(35).saturating_sub(started.elapsed());
                match tokio::time::timeout(wait, body.data()).await {
                    Err(_) => "open, no answer".to_string(),
                    Ok(Some(Ok(_))) => "answered".to_string(),
                    Ok(Some(Err(e))) => format!("reset ({e})"),
                    Ok(None) => match body.trailers().await {
                        Ok(Some(trailers)) => format!(
                            "closed, grpc-status {}",
                            trailers
                                .get("grpc-status")
                                .map_or("?", |v| v.to_str().unwrap_or("?"))
                        ),
                        _ => "closed".to_string(),
                    },
                }
            }
        };
        outcomes.push(outcome);
    }
    let at_end = rss(pid);
    drop(streams);
    driver.abort();
    println!(
        "ext-proc-partial: RSS {before} MiB idle; {count} streams × 7.5 MB of a 9 MB message on one \
         connection: at 11 s RSS {held} MiB (peak {peak}); by 35 s: {} (RSS {at_end} MiB)",
        tally(outcomes)
    );
}

async fn drain(target: &Target) {
    let engine = StubEngine::start(Options::with_id("e0")).await.unwrap();
    let config = format!(
        "windowDurationMs: 20\nendpoints:\n  - {{id: ns/e0, address: '{}'}}\n",
        engine.addr()
    );
    let producer = target.serve(&config, &[]);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(180))
        .build()
        .unwrap();
    // A 20 s completion: 40 chunks 500 ms apart.
    let response = client
        .post(format!("{}/v1/completions", producer.base))
        .json(&json!({"model": "m", "prompt": "long", "stream": true,
                      "stub": {"chunks": 40, "chunkDelayMs": 500}}))
        .send()
        .await
        .unwrap();
    let mut chunks = response.bytes_stream();
    let mut received = chunks.next().await.unwrap().unwrap().to_vec();
    // An endpoint-picker stream routed, its response starting.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", producer.epp))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut stream = ExtProc::on(channel).await;
    let mode = BodySendMode::FullDuplexStreamed;
    stream
        .send(data_plane::request_headers(
            Some(data_plane::protocol(mode, mode)),
            &[(":method", "POST"), (":path", "/v1/completions")],
            None,
            false,
        ))
        .await;
    let body = json!({"model": "m", "prompt": "p"}).to_string();
    stream
        .send(data_plane::request_body(body.as_bytes(), true))
        .await;
    stream.next().await;
    stream.next().await;
    stream
        .send(data_plane::response_headers(Some(
            &engine.addr().to_string(),
        )))
        .await;
    stream.next().await;

    let sigterm = Instant::now();
    producer.terminate();
    let picker = tokio::spawn(async move {
        for i in 0..40 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let chunk = data_plane::response_body(format!("{i}").as_bytes(), i == 39);
            if !stream.offer(chunk).await {
                return format!("gone after {i} of 40 chunks");
            }
            match stream.next_or_end().await {
                Ok(Some(_)) => {}
                Ok(None) => return format!("closed after {i} of 40 chunks"),
                Err(status) => {
                    return format!(
                        "{:?} after {i} of 40 chunks, at {:.1} s",
                        status.code(),
                        sigterm.elapsed().as_secs_f64()
                    )
                }
            }
        }
        format!(
            "all 40 chunks answered, at {:.1} s",
            sigterm.elapsed().as_secs_f64()
        )
    });
    let mut cut = None;
    while let Some(chunk) = chunks.next().await {
        match chunk {
            Ok(chunk) => received.extend_from_slice(&chunk),
            Err(e) => {
                cut = Some(e);
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&received);
    let completion = format!(
        "{} of 40 chunks{}, ended at {:.1} s",
        text.matches("data: {").count(),
        match (&cut, text.ends_with("data: [DONE]\n\n")) {
            (None, true) => " and [DONE]".to_string(),
            (Some(e), _) => format!(", cut ({e})"),
            (None, false) => ", no [DONE]".to_string(),
        },
        sigterm.elapsed().as_secs_f64()
    );
    let picker = picker.await.unwrap();
    let (code, exited) = tokio::task::spawn_blocking(move || {
        let mut producer = producer;
        let code = producer.wait();
        (code, sigterm.elapsed())
    })
    .await
    .unwrap();
    println!(
        "drain: SIGTERM with a 20 s completion and a 20 s picker response in flight: the \
         completion {completion}; the picker stream {picker}; exit {code:?} at {:.1} s",
        exited.as_secs_f64()
    );
}
