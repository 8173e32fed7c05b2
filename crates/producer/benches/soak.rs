//! A soak bench: the real producer binary under a long,
//! steady, mixed load on loopback, watched for growth (a benchmark, not a test).
//!
//! It starts `burst-prefix-producer serve` (this build's binary: `cargo bench` builds it with
//! the `bench` profile, i.e. release) on loopback, with `--endpoints` endpoints and memory on
//! (the default, docs/behaviour.md §7), and sends an open-loop stream of `--rate` requests/s for
//! `--seconds` (requests leave on schedule whatever the answers do). The stream mixes, by share of
//! requests:
//!
//! - 25% GRPO bursts with the group-size hint: one prompt x 8 samples sent at once, with
//!   `x-burst-prefix-group-size: 8`;
//! - 25% GRPO bursts without the hint;
//! - 20% agent fan-outs: 4 chat requests at once on one of 16 shared 4 KiB system prompts, each
//!   with its own task;
//! - 15% turns of multi-turn chat sessions (64 sessions at a time, on 4 shared system prompts;
//!   each turn resends the conversation with one more exchange; a session ends after 12 turns
//!   and a new one takes its place);
//! - 15% lone completions requests.
//!
//! Every GRPO prompt, lone prompt, agent task and session is new (a counter at its start), so
//! the producer's memory sees a long stream of distinct prompts: it fills up within seconds and
//! must then stay at capacity (`cacheTokensPerReplica` per endpoint), not grow.
//!
//! Every `--interval-seconds` it prints a row: requests sent, answered and failed (by cause)
//! in that interval (answers and failures counted when they complete), the answered rate,
//! p50/p99/max latency (from each request's scheduled send time to the end of its answer, so a
//! generator running late shows in it), requests in flight, the producer's windows by seal
//! reason and their mean size, `burst_prefix_memory_blocks` (sum and largest per endpoint),
//! the producer's resident set (`VmRSS` from `/proc/PID/status`) and the machine's 1-minute
//! load average. At the end: RSS idle, at the first interval, at half time and at the end,
//! the peak (`VmHWM`), p99 of the first and last interval, latency by traffic kind, and a
//! verdict computed from the rows: RSS growth over the second half and the p99 trend against
//! `--max-rss-growth-mib` and `--max-p99-ratio`, failures, and memory within its capacity. The
//! bench exits 1 when the verdict is not "no growth".
//!
//! `--proxy`: the same stream through the producer's proxy (docs/behaviour.md §8), `POST
//! /v1/completions` and `/v1/chat/completions` (session turns streamed), to one in-process stub
//! engine (`crates/stub-engine`) per endpoint.
//!
//! The load generator (and, with `--proxy`, the stubs) share the machine's cores with the
//! producer, so every figure includes their CPU use.
//!
//! RSS is not the live heap: glibc keeps what a peak of concurrency (a stall piles up
//! connections and bodies in flight) freed, and gives it back only in part, so RSS follows the
//! highest concurrency seen as well as any leak. To tell them apart, `--keep-seconds` leaves the
//! producer idle after the run for e.g. gdb's `malloc_info` (BENCHMARKS.md, "Producer: soak").
//!
//! Run: `cargo bench -p burst-prefix-producer --bench soak [-- --seconds 600 --rate 2000]`
//! (`-- --help` explains every flag).

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "stats/mod.rs"]
mod stats;

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use burst_prefix_stub_engine::{Options as StubOptions, StubEngine};
use clap::Parser;
use common::Binary;
use serde_json::{json, Value};
use stats::args::{seconds_within, CargoBench};
use stats::procfs::{load_average, load_averages, status_bytes};
use stats::{percentile, summary};

/// Tokens per block: the producer's default `blockSizeTokens`, which the config keeps.
const BLOCK_SIZE_TOKENS: u64 = 64;
/// The producer's default `memory.cacheTokensPerReplica`.
const DEFAULT_CACHE_TOKENS: u64 = 262_144;
const MIB: f64 = 1024.0 * 1024.0;

#[derive(Parser, Debug)]
#[command(
    name = "soak",
    bin_name = "cargo bench -p burst-prefix-producer --bench soak --",
    about = "Soak the real producer binary with a long open-loop mixed load; report RSS, p99 and memory per interval",
    long_about = None
)]
struct Options {
    /// Requests per second, open loop; each member of a burst or fan-out counts as one.
    #[arg(long, default_value_t = 2000.0)]
    rate: f64,
    /// How long the load lasts, in seconds (1..=3600).
    #[arg(long, default_value_t = 600.0, value_parser = seconds_within(1.0, 3600.0))]
    seconds: f64,
    /// One row of the table per this many seconds (1..=600).
    #[arg(long, default_value_t = 30.0, value_parser = seconds_within(1.0, 600.0))]
    interval_seconds: f64,
    /// Endpoints in the producer's config (fake addresses; with --proxy, one stub engine each).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    endpoints: u16,
    /// windowDurationMs of the producer's config.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    window_ms: u64,
    /// memory.cacheTokensPerReplica of the producer's config; unset keeps its default (262,144
    /// tokens: 4,096 blocks of 64 tokens per endpoint).
    #[arg(long, value_parser = clap::value_parser!(u64).range(64..))]
    cache_tokens_per_replica: Option<u64>,
    /// Size of a GRPO or lone prompt, in KiB (1 KiB of text is 4 blocks of 64 estimate tokens).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=64))]
    prompt_kib: u64,
    /// Route the stream through the producer's proxy (POST /v1/completions and
    /// /v1/chat/completions) to in-process stub engines, instead of POST /v1/produce.
    #[arg(long)]
    proxy: bool,
    /// Requests in flight beyond which the generator skips sends (counted as failed, "not sent:
    /// in-flight cap"), so that a stalled producer cannot exhaust the bench's memory or file
    /// descriptors.
    #[arg(long, default_value_t = 10_000)]
    max_in_flight: usize,
    /// Client timeout per request, in seconds (0.1..=300).
    #[arg(long, default_value_t = 30.0, value_parser = seconds_within(0.1, 300.0))]
    timeout_seconds: f64,
    /// Verdict: the most the producer's RSS may grow over the second half of the run, in MiB.
    #[arg(long, default_value_t = 8.0)]
    max_rss_growth_mib: f64,
    /// Verdict: the most the p99 may grow, as the median p99 of the last quarter of the
    /// intervals over that of the first quarter.
    #[arg(long, default_value_t = 1.5)]
    max_p99_ratio: f64,
    /// Seed of the traffic's pseudo-random choices: the same seed sends the same stream.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// After the drain, keep the producer running idle this many seconds (0..=3600) before
    /// stopping it, e.g. to inspect it with gdb or heaptrack; its PID is printed at the start.
    #[arg(long, default_value_t = 0.0, value_parser = seconds_within(0.0, 3600.0))]
    keep_seconds: f64,
    /// Worker threads of the load generator's tokio runtime.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    client_threads: u16,
    #[command(flatten)]
    cargo: CargoBench,
}

/// SplitMix64: a small deterministic generator, enough to draw a traffic mix.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The kinds of traffic in the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    GrpoHinted,
    Grpo,
    Agents,
    Session,
    Lone,
}

impl Kind {
    const ALL: [Kind; 5] = [
        Kind::GrpoHinted,
        Kind::Grpo,
        Kind::Agents,
        Kind::Session,
        Kind::Lone,
    ];

    /// Share of the stream's requests, in percent.
    fn share(self) -> f64 {
        match self {
            Kind::GrpoHinted | Kind::Grpo => 25.0,
            Kind::Agents => 20.0,
            Kind::Session | Kind::Lone => 15.0,
        }
    }

    /// Requests sent at once.
    fn size(self) -> usize {
        match self {
            Kind::GrpoHinted | Kind::Grpo => 8,
            Kind::Agents => 4,
            Kind::Session | Kind::Lone => 1,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Kind::GrpoHinted => "GRPO burst of 8, hinted",
            Kind::Grpo => "GRPO burst of 8, no hint",
            Kind::Agents => "agent fan-out of 4, shared system prompt",
            Kind::Session => "multi-turn session turn",
            Kind::Lone => "lone request",
        }
    }
}

/// One request to send.
struct Outgoing {
    kind: Kind,
    path: &'static str,
    body: Bytes,
    hinted: bool,
}

/// A conversation in progress.
struct Session {
    messages: Vec<Value>,
    turns: usize,
}

const SESSIONS: usize = 64;
const SESSION_TURNS: usize = 12;
const AGENT_PROMPTS: usize = 16;
const SESSION_PROMPTS: usize = 4;

/// Draws the stream: which kind comes next, and its bodies.
struct Traffic {
    rng: Rng,
    proxy: bool,
    prompt_bytes: usize,
    /// Text to cut prompts from (ASCII words).
    filler: String,
    next_id: u64,
    agent_prompts: Vec<String>,
    session_prompts: Vec<String>,
    sessions: Vec<Session>,
}

impl Traffic {
    fn new(seed: u64, proxy: bool, prompt_bytes: usize) -> Self {
        let mut rng = Rng(seed);
        const WORDS: [&str; 16] = [
            "solve",
            "the",
            "problem",
            "step",
            "by",
            "and",
            "box",
            "final",
            "answer",
            "consider",
            "each",
            "case",
            "carefully",
            "then",
            "check",
            "result",
        ];
        let mut filler = String::with_capacity(64 * 1024 + 16);
        while filler.len() < 64 * 1024 {
            filler.push_str(WORDS[rng.below(WORDS.len())]);
            filler.push(' ');
        }
        let mut traffic = Traffic {
            rng,
            proxy,
            prompt_bytes,
            filler,
            next_id: 0,
            agent_prompts: Vec::new(),
            session_prompts: Vec::new(),
            sessions: Vec::new(),
        };
        traffic.agent_prompts = (0..AGENT_PROMPTS)
            .map(|i| traffic.text(&format!("You are tool-using agent persona {i}."), 4096))
            .collect();
        traffic.session_prompts = (0..SESSION_PROMPTS)
            .map(|i| traffic.text(&format!("You are helpful assistant persona {i}."), 1024))
            .collect();
        traffic.sessions = (0..SESSIONS).map(|_| traffic.new_session()).collect();
        traffic
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// `head` followed by filler text, `bytes` long in all.
    fn text(&mut self, head: &str, bytes: usize) -> String {
        let mut text = String::with_capacity(bytes.max(head.len()) + 1);
        text.push_str(head);
        text.push(' ');
        let want = bytes.saturating_sub(text.len());
        let from = self
            .rng
            .below(self.filler.len() - want.min(self.filler.len()) + 1);
        text.push_str(&self.filler[from..(from + want).min(self.filler.len())]);
        text
    }

    fn new_session(&mut self) -> Session {
        let system = self.session_prompts[self.rng.below(SESSION_PROMPTS)].clone();
        let id = self.id();
        let first = self.text(&format!("Session {id}, first question."), 300);
        Session {
            messages: vec![
                json!({"role": "system", "content": system}),
                json!({"role": "user", "content": first}),
            ],
            turns: 0,
        }
    }

    /// The next arrival: its kind drawn by share of requests (so by share / size per arrival).
    fn next(&mut self) -> Vec<Outgoing> {
        let total: f64 = Kind::ALL.iter().map(|k| k.share() / k.size() as f64).sum();
        let mut draw = self.rng.unit() * total;
        let mut kind = Kind::Lone;
        for candidate in Kind::ALL {
            draw -= candidate.share() / candidate.size() as f64;
            if draw < 0.0 {
                kind = candidate;
                break;
            }
        }
        match kind {
            Kind::GrpoHinted | Kind::Grpo => {
                let id = self.id();
                let prompt = self.text(&format!("Rollout prompt {id}."), self.prompt_bytes);
                let body = self.completion(prompt);
                (0..8)
                    .map(|_| Outgoing {
                        kind,
                        path: self.path(false),
                        body: body.clone(),
                        hinted: kind == Kind::GrpoHinted,
                    })
                    .collect()
            }
            Kind::Lone => {
                let id = self.id();
                let prompt = self.text(&format!("Lone question {id}."), self.prompt_bytes);
                vec![Outgoing {
                    kind,
                    path: self.path(false),
                    body: self.completion(prompt),
                    hinted: false,
                }]
            }
            Kind::Agents => {
                let system = self.agent_prompts[self.rng.below(AGENT_PROMPTS)].clone();
                let id = self.id();
                (0..4)
                    .map(|agent| {
                        let task = self.text(&format!("Fan-out {id}, agent {agent}: task."), 256);
                        let messages = json!([
                            {"role": "system", "content": system},
                            {"role": "user", "content": task},
                        ]);
                        Outgoing {
                            kind,
                            path: self.path(true),
                            body: self.chat(messages, false),
                            hinted: false,
                        }
                    })
                    .collect()
            }
            Kind::Session => {
                let slot = self.rng.below(SESSIONS);
                if self.sessions[slot].turns >= SESSION_TURNS {
                    self.sessions[slot] = self.new_session();
                }
                let messages = Value::Array(self.sessions[slot].messages.clone());
                let body = self.chat(messages, self.proxy);
                // The conversation goes on: the answer it would get, and the next question.
                let answer = self.text("Here is my answer.", 400);
                let question = self.text("Follow-up question.", 300);
                let session = &mut self.sessions[slot];
                session.turns += 1;
                session
                    .messages
                    .push(json!({"role": "assistant", "content": answer}));
                session
                    .messages
                    .push(json!({"role": "user", "content": question}));
                vec![Outgoing {
                    kind,
                    path: self.path(true),
                    body,
                    hinted: false,
                }]
            }
        }
    }

    fn path(&self, chat: bool) -> &'static str {
        match (self.proxy, chat) {
            (false, _) => "/v1/produce",
            (true, false) => "/v1/completions",
            (true, true) => "/v1/chat/completions",
        }
    }

    fn completion(&self, prompt: String) -> Bytes {
        let mut body = json!({"model": "soak", "prompt": prompt, "max_tokens": 16});
        if self.proxy {
            body["stub"] = json!({"chunks": 4});
        }
        Bytes::from(body.to_string())
    }

    fn chat(&self, messages: Value, stream: bool) -> Bytes {
        let mut body = json!({"model": "soak", "messages": messages, "max_tokens": 16});
        if self.proxy {
            body["stub"] = json!({"chunks": 4});
            body["stream"] = json!(stream);
        }
        Bytes::from(body.to_string())
    }
}

/// What one interval saw from the client side.
#[derive(Default)]
struct Tally {
    sent: u64,
    answered: u64,
    failed: BTreeMap<String, u64>,
    latencies_ms: Vec<f64>,
    /// The latest an arrival left after its scheduled time.
    max_lag_ms: f64,
}

/// Shared by the generator, the requests in flight and the reporter.
#[derive(Default)]
struct Shared {
    tally: Mutex<Tally>,
    in_flight: AtomicUsize,
    /// Every answered request's latency over the whole run, by kind.
    by_kind: Mutex<BTreeMap<Kind, Vec<f64>>>,
}

impl Shared {
    fn fail(&self, cause: String) {
        *self.tally.lock().unwrap().failed.entry(cause).or_default() += 1;
    }
}

/// Sends one request and reads its whole answer (streamed or not); why it failed otherwise.
async fn send(client: &reqwest::Client, base: &str, request: &Outgoing) -> Result<(), String> {
    let mut builder = client
        .post(format!("{base}{}", request.path))
        .header("content-type", "application/json")
        .body(request.body.clone());
    if request.hinted {
        builder = builder.header("x-burst-prefix-group-size", "8");
    }
    let response = builder.send().await.map_err(|e| cause("send", &e))?;
    let status = response.status();
    let body = response.bytes().await.map_err(|e| cause("body", &e))?;
    if !status.is_success() {
        // The producer's errors name a stable code (`window_full`, `batch_full`, ...): the JSON
        // API's `{"error": code}`, the proxy's OpenAI-shaped `{"error": {"code": code}}`.
        let code = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| {
                v["error"]
                    .as_str()
                    .or(v["error"]["code"].as_str())
                    .map(str::to_string)
            })
            .unwrap_or_default();
        return Err(format!("status {} {code}", status.as_u16()));
    }
    Ok(())
}

/// A failure's cause, short enough to count by: timeout, connect, or the innermost error.
fn cause(stage: &str, error: &reqwest::Error) -> String {
    if error.is_timeout() {
        return format!("{stage}: timeout");
    }
    if error.is_connect() {
        return format!("{stage}: connect");
    }
    let mut inner: &dyn std::error::Error = error;
    while let Some(source) = inner.source() {
        inner = source;
    }
    format!("{stage}: {inner}")
}

/// Sends the stream: open loop, `rate` requests/s for `seconds`, from `start`.
async fn generate(
    client: reqwest::Client,
    base: Arc<str>,
    options: Arc<Options>,
    shared: Arc<Shared>,
    start: Instant,
) {
    let mut traffic = Traffic::new(
        options.seed,
        options.proxy,
        options.prompt_kib as usize * 1024,
    );
    let total = (options.rate * options.seconds) as u64;
    let mut sent = 0u64;
    let mut ticks = tokio::time::interval(Duration::from_millis(1));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    while sent < total {
        ticks.tick().await;
        let due = ((start.elapsed().as_secs_f64() * options.rate) as u64).min(total);
        while sent < due {
            let scheduled = start + Duration::from_secs_f64(sent as f64 / options.rate);
            let arrival = traffic.next();
            let lag_ms = scheduled.elapsed().as_secs_f64() * 1e3;
            {
                let mut tally = shared.tally.lock().unwrap();
                tally.sent += arrival.len() as u64;
                tally.max_lag_ms = tally.max_lag_ms.max(lag_ms);
            }
            sent += arrival.len() as u64;
            for request in arrival {
                if shared.in_flight.load(Ordering::Relaxed) >= options.max_in_flight {
                    shared.fail("not sent: in-flight cap".to_string());
                    continue;
                }
                shared.in_flight.fetch_add(1, Ordering::Relaxed);
                let (client, base, shared) = (client.clone(), base.clone(), shared.clone());
                tokio::spawn(async move {
                    let result = send(&client, &base, &request).await;
                    let latency_ms = scheduled.elapsed().as_secs_f64() * 1e3;
                    match result {
                        Ok(()) => {
                            {
                                let mut tally = shared.tally.lock().unwrap();
                                tally.answered += 1;
                                tally.latencies_ms.push(latency_ms);
                            }
                            shared
                                .by_kind
                                .lock()
                                .unwrap()
                                .entry(request.kind)
                                .or_default()
                                .push(latency_ms);
                        }
                        Err(cause) => shared.fail(cause),
                    }
                    shared.in_flight.fetch_sub(1, Ordering::Relaxed);
                });
            }
        }
    }
}

/// The producer's `/metrics` at one moment, as far as the soak reads them.
#[derive(Clone, Debug, Default)]
struct Scrape {
    sealed: BTreeMap<String, f64>,
    window_size_sum: f64,
    window_size_count: f64,
    outcomes: BTreeMap<String, f64>,
    placements: BTreeMap<String, f64>,
    /// `burst_prefix_memory_blocks` per endpoint.
    memory_blocks: Vec<f64>,
    upstream: BTreeMap<String, f64>,
    retries: f64,
}

impl Scrape {
    fn parse(text: &str) -> Scrape {
        let mut scrape = Scrape::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let (name, labels) = series.split_once('{').unwrap_or((series, ""));
            let label = |key: &str| -> String {
                labels
                    .split(',')
                    .find_map(|pair| pair.strip_prefix(key)?.strip_prefix("=\""))
                    .map(|v| v.trim_end_matches(['"', '}']).to_string())
                    .unwrap_or_default()
            };
            match name {
                "burst_prefix_windows_sealed_total" => {
                    scrape.sealed.insert(label("reason"), value);
                }
                "burst_prefix_window_size_sum" => scrape.window_size_sum = value,
                "burst_prefix_window_size_count" => scrape.window_size_count = value,
                "burst_prefix_requests_total" => {
                    scrape.outcomes.insert(label("outcome"), value);
                }
                "burst_prefix_placements_total" => {
                    scrape.placements.insert(label("source"), value);
                }
                "burst_prefix_memory_blocks" => scrape.memory_blocks.push(value),
                "burst_prefix_upstream_requests_total" => {
                    *scrape.upstream.entry(label("class")).or_default() += value;
                }
                "burst_prefix_upstream_retries_total" => scrape.retries = value,
                _ => {}
            }
        }
        scrape
    }

    /// `reason delta` pairs of the windows sealed since `before`, nonzero only.
    fn sealed_since(&self, before: &Scrape) -> String {
        let parts: Vec<String> = self
            .sealed
            .iter()
            .filter_map(|(reason, n)| {
                let delta = n - before.sealed.get(reason).copied().unwrap_or(0.0);
                (delta > 0.0).then(|| format!("{reason} {delta:.0}"))
            })
            .collect();
        if parts.is_empty() {
            "none".to_string()
        } else {
            parts.join(", ")
        }
    }

    fn windows_since(&self, before: &Scrape) -> f64 {
        self.window_size_count - before.window_size_count
    }

    fn mean_window_since(&self, before: &Scrape) -> f64 {
        (self.window_size_sum - before.window_size_sum) / self.windows_since(before).max(1.0)
    }

    fn memory_sum(&self) -> f64 {
        self.memory_blocks.iter().sum()
    }

    fn memory_max(&self) -> f64 {
        self.memory_blocks.iter().copied().fold(0.0, f64::max)
    }
}

fn counts(map: &BTreeMap<String, f64>) -> String {
    let parts: Vec<String> = map.iter().map(|(k, v)| format!("{k} {v:.0}")).collect();
    parts.join(", ")
}

/// One row of the table.
struct Row {
    end_s: f64,
    sent: u64,
    answered: u64,
    failed: BTreeMap<String, u64>,
    rate: f64,
    p50: f64,
    p99: f64,
    max: f64,
    in_flight: usize,
    lag_ms: f64,
    sealed: String,
    mean_window: f64,
    memory_sum: f64,
    memory_max: f64,
    rss: u64,
    load: f64,
}

impl Row {
    fn failed_total(&self) -> u64 {
        self.failed.values().sum()
    }

    fn markdown(&self, label: &str) -> String {
        let failed = if self.failed.is_empty() {
            "0".to_string()
        } else {
            let causes: Vec<String> = self
                .failed
                .iter()
                .map(|(cause, n)| format!("{cause}: {n}"))
                .collect();
            format!("{} ({})", self.failed_total(), causes.join("; "))
        };
        format!(
            "| {:.0}{label} | {} | {} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {} | {:.1} | {} | {:.1} | {:.0} / {:.0} | {:.1} | {:.2} |",
            self.end_s,
            self.sent,
            self.answered,
            failed,
            self.rate,
            self.p50,
            self.p99,
            self.max,
            self.in_flight,
            self.lag_ms,
            self.sealed,
            self.mean_window,
            self.memory_sum,
            self.memory_max,
            self.rss as f64 / MIB,
            self.load,
        )
    }
}

/// Closes an interval that ended `at` after the start and lasted `span`: takes its tally, reads
/// the producer's RSS, the load average and `/metrics` (against `previous`, then replaced).
async fn row(
    shared: &Shared,
    pid: u32,
    (at, span): (Duration, Duration),
    scraper: &reqwest::Client,
    admin: &str,
    previous: &mut Scrape,
) -> Row {
    let tally = std::mem::take(&mut *shared.tally.lock().unwrap());
    let rss = status_bytes(pid, "VmRSS");
    let load = load_average();
    let in_flight = shared.in_flight.load(Ordering::Relaxed);
    // A failed scrape leaves the producer's columns empty (NaN) and `previous` as it was, so
    // the next row's deltas span both intervals.
    let now = scrape(scraper, admin).await;
    let mut latencies = tally.latencies_ms;
    latencies.sort_by(f64::total_cmp);
    let (sealed, mean_window, memory_sum, memory_max) = match &now {
        Some(now) => (
            now.sealed_since(previous),
            now.mean_window_since(previous),
            now.memory_sum(),
            now.memory_max(),
        ),
        None => ("scrape failed".to_string(), f64::NAN, f64::NAN, f64::NAN),
    };
    let row = Row {
        end_s: at.as_secs_f64(),
        sent: tally.sent,
        answered: tally.answered,
        failed: tally.failed,
        rate: tally.answered as f64 / span.as_secs_f64(),
        p50: percentile(&latencies, 50.0),
        p99: percentile(&latencies, 99.0),
        max: latencies.last().copied().unwrap_or(f64::NAN),
        in_flight,
        lag_ms: tally.max_lag_ms,
        sealed,
        mean_window,
        memory_sum,
        memory_max,
        rss,
        load,
    };
    if let Some(now) = now {
        *previous = now;
    }
    row
}

const HEADER: &str = "| t (s) | sent | answered | failed (by cause) | answered/s | p50 (ms) | p99 (ms) | max (ms) | in flight | generator lag max (ms) | windows sealed | mean window | memory blocks sum / max per endpoint | RSS (MiB) | load 1 min |\n|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|";

/// The producer's `/metrics`, or `None` (and a line on stderr) when it cannot be read.
async fn scrape(client: &reqwest::Client, admin: &str) -> Option<Scrape> {
    let text = match client.get(format!("{admin}/metrics")).send().await {
        Ok(response) => response.text().await,
        Err(error) => Err(error),
    };
    match text {
        Ok(text) => Some(Scrape::parse(&text)),
        Err(error) => {
            eprintln!("scraping {admin}/metrics failed: {error}");
            None
        }
    }
}

/// Median of `values`: the middle value, or the mean of the two middle ones for an even count
/// (NaN when empty). Not the nearest-rank percentile, which takes the lower of two middle
/// values: with 2 rows per quarter that is their minimum, and a rising p99 would hide in it.
fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// Least-squares slope of `(x, y)` points (NaN with fewer than 2).
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if points.len() < 2 {
        return f64::NAN;
    }
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let covariance: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    let variance: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    covariance / variance
}

fn main() -> ExitCode {
    let options = Arc::new(Options::parse());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(options.client_threads as usize)
        .enable_all()
        .build()
        .unwrap();
    // With --proxy, the stub engines get their own runtime, apart from the load generator's.
    let stubs_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let stubs: Vec<StubEngine> = if options.proxy {
        stubs_runtime.block_on(async {
            let mut stubs = Vec::new();
            for i in 0..options.endpoints {
                let stub_options = StubOptions {
                    // The record keeps bodies: a few are enough, the soak reads none.
                    max_recorded: 16,
                    ..StubOptions::with_id(format!("e{i}"))
                };
                stubs.push(
                    StubEngine::start(stub_options)
                        .await
                        .expect("a stub engine"),
                );
            }
            stubs
        })
    } else {
        Vec::new()
    };

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    let mut yaml = format!("windowDurationMs: {}\n", options.window_ms);
    if let Some(tokens) = options.cache_tokens_per_replica {
        yaml.push_str(&format!("memory:\n  cacheTokensPerReplica: {tokens}\n"));
    }
    yaml.push_str("endpoints:\n");
    for i in 0..options.endpoints as usize {
        let address = match stubs.get(i) {
            Some(stub) => stub.addr().to_string(),
            None => format!("10.0.{}.{}:8000", i / 256, i % 256),
        };
        yaml.push_str(&format!("  - {{id: soak/e{i}, address: '{address}'}}\n"));
    }
    std::fs::write(&config, &yaml).unwrap();
    let producer = Binary::serve(&["--config", config.to_str().unwrap()]);
    let pid = producer.child.id();
    let capacity_blocks = options
        .cache_tokens_per_replica
        .unwrap_or(DEFAULT_CACHE_TOKENS)
        / BLOCK_SIZE_TOKENS;

    println!(
        "soak: {} req/s for {} s, rows every {} s; {}; {} endpoints, window {} ms, memory on \
         ({} blocks of {} tokens per endpoint); GRPO and lone prompts {} KiB; load average at \
         start {}",
        options.rate,
        options.seconds,
        options.interval_seconds,
        if options.proxy {
            "proxy mode: POST /v1/completions and /v1/chat/completions to stub engines"
        } else {
            "POST /v1/produce"
        },
        options.endpoints,
        options.window_ms,
        capacity_blocks,
        BLOCK_SIZE_TOKENS,
        options.prompt_kib,
        load_averages(),
    );
    let mix: Vec<String> = Kind::ALL
        .iter()
        .map(|k| format!("{:.0}% {}", k.share(), k.label()))
        .collect();
    println!("mix (share of requests): {}", mix.join(", "));

    let shared = Arc::new(Shared::default());
    let base: Arc<str> = Arc::from(producer.base.as_str());
    let admin = producer.admin.clone();
    let (rows, first_scrape, last_scrape, rss_idle, rss_drained, drain) = runtime.block_on(async {
        // Idle pooled connections are dropped before the producer closes them (it closes a
        // connection idle for its header read timeout, 5 s by default): reusing one at the
        // moment it closes it is a reset, not an answer (HTTP/1.1's keep-alive race).
        let client = reqwest::Client::builder()
            .no_proxy()
            .tcp_nodelay(true)
            .pool_idle_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs_f64(options.timeout_seconds))
            .build()
            .unwrap();
        // A fresh connection per scrape: the producer closes a connection idle for its header
        // read timeout (5 s), and a pooled one reused just then fails.
        let scraper = reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(0)
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        let first_scrape = scrape(&scraper, &admin)
            .await
            .expect("the producer's /metrics before the load");
        let rss_idle = status_bytes(pid, "VmRSS");
        println!(
            "producer PID {pid}, RSS idle before the load: {:.1} MiB\n",
            rss_idle as f64 / MIB
        );
        println!("{HEADER}");

        let start = Instant::now();
        let generator = tokio::spawn(generate(
            client,
            base,
            options.clone(),
            shared.clone(),
            start,
        ));
        let mut rows = Vec::new();
        let mut previous = first_scrape.clone();
        let intervals = (options.seconds / options.interval_seconds).ceil() as usize;
        let mut last = start;
        for i in 1..=intervals {
            let end = start
                + Duration::from_secs_f64(
                    (i as f64 * options.interval_seconds).min(options.seconds),
                );
            tokio::time::sleep_until(end.into()).await;
            let row = row(
                &shared,
                pid,
                (end - start, end - last),
                &scraper,
                &admin,
                &mut previous,
            )
            .await;
            println!("{}", row.markdown(""));
            rows.push(row);
            last = end;
        }
        generator.await.unwrap();
        // Drain: the answers still in flight, at most the client timeout and 5 s.
        let patience = Duration::from_secs_f64(options.timeout_seconds + 5.0);
        let drain_start = Instant::now();
        while shared.in_flight.load(Ordering::Relaxed) > 0 && drain_start.elapsed() < patience {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let end = Instant::now();
        let drain = row(
            &shared,
            pid,
            (end - start, end - last),
            &scraper,
            &admin,
            &mut previous,
        )
        .await;
        println!("{}", drain.markdown(" (drain)"));
        tokio::time::sleep(Duration::from_secs(5)).await;
        let rss_drained = status_bytes(pid, "VmRSS");
        let last_scrape = scrape(&scraper, &admin)
            .await
            .unwrap_or_else(|| previous.clone());
        (
            rows,
            first_scrape,
            last_scrape,
            rss_idle,
            rss_drained,
            drain,
        )
    });
    let peak = status_bytes(pid, "VmHWM");
    if options.keep_seconds > 0.0 {
        println!(
            "keeping the producer (PID {pid}) idle for {} s",
            options.keep_seconds
        );
        std::thread::sleep(Duration::from_secs_f64(options.keep_seconds));
        println!(
            "producer RSS after {} s idle: {:.1} MiB",
            options.keep_seconds,
            status_bytes(pid, "VmRSS") as f64 / MIB
        );
    }
    producer.terminate();

    // The summary, computed from the rows.
    let n = rows.len();
    let mib = |bytes: u64| bytes as f64 / MIB;
    let half = &rows[(n / 2).saturating_sub(1)];
    let (first, final_row) = (&rows[0], &rows[n - 1]);
    println!();
    println!(
        "RSS (MiB): idle {:.1}; after the first interval {:.1}; at half time ({:.0} s) {:.1}; at \
         the end {:.1}; 5 s after the drain {:.1}; peak (VmHWM) {:.1}",
        mib(rss_idle),
        mib(first.rss),
        half.end_s,
        mib(half.rss),
        mib(final_row.rss),
        mib(rss_drained),
        mib(peak),
    );
    let growth_mib = mib(final_row.rss) - mib(half.rss);
    let second_half: Vec<(f64, f64)> = rows[(n / 2).saturating_sub(1)..]
        .iter()
        .map(|r| (r.end_s / 60.0, mib(r.rss)))
        .collect();
    let rss_slope = slope(&second_half);
    println!(
        "RSS over the second half: {growth_mib:+.1} MiB ({rss_slope:+.2} MiB/min, least squares \
         over {} rows)",
        second_half.len()
    );
    let quarter = (n / 4).max(1);
    let p99s: Vec<f64> = rows.iter().map(|r| r.p99).collect();
    let (p99_early, p99_late) = (median(&p99s[..quarter]), median(&p99s[n - quarter..]));
    let p99_ratio = p99_late / p99_early;
    println!(
        "p99 (ms): first interval {:.1}, last {:.1}; median of the first {quarter} interval(s) \
         {p99_early:.1}, of the last {quarter} {p99_late:.1} (ratio {p99_ratio:.2}); highest \
         interval p99 {:.1}",
        first.p99,
        final_row.p99,
        p99s.iter().copied().fold(0.0, f64::max),
    );
    let sent: u64 = rows.iter().map(|r| r.sent).sum::<u64>() + drain.sent;
    let answered: u64 = rows.iter().map(|r| r.answered).sum::<u64>() + drain.answered;
    let mut failed: BTreeMap<String, u64> = BTreeMap::new();
    for row in rows.iter().chain([&drain]) {
        for (cause, count) in &row.failed {
            *failed.entry(cause.clone()).or_default() += count;
        }
    }
    let failed_total: u64 = failed.values().sum();
    println!(
        "requests: sent {sent}, answered {answered}, failed {failed_total} {failed:?}, left in \
         flight {}",
        drain.in_flight
    );
    let delta = |now: &BTreeMap<String, f64>, before: &BTreeMap<String, f64>| {
        now.iter()
            .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
            .collect::<BTreeMap<String, f64>>()
    };
    println!(
        "producer: requests by outcome {}; placements by source {}; windows {:.0} (mean {:.1} \
         requests), sealed by {}",
        counts(&delta(&last_scrape.outcomes, &first_scrape.outcomes)),
        counts(&delta(&last_scrape.placements, &first_scrape.placements)),
        last_scrape.windows_since(&first_scrape),
        last_scrape.mean_window_since(&first_scrape),
        last_scrape.sealed_since(&first_scrape),
    );
    if options.proxy {
        println!(
            "proxy upstream requests by class {}; retries {:.0}",
            counts(&delta(&last_scrape.upstream, &first_scrape.upstream)),
            last_scrape.retries - first_scrape.retries,
        );
    }
    let memory_max_seen = rows.iter().map(|r| r.memory_max).fold(0.0, f64::max);
    let memory_capacity = capacity_blocks as f64 * f64::from(options.endpoints);
    println!(
        "memory: {:.0} blocks held at the end of {:.0} (capacity {capacity_blocks} x {} \
         endpoints); the most one endpoint held in any row: {memory_max_seen:.0}",
        final_row.memory_sum, memory_capacity, options.endpoints,
    );
    let logs = producer.logs();
    let warnings = logs
        .lines()
        .filter(|l| l.contains("\"level\":\"WARN\"") || l.contains("\"level\":\"ERROR\""))
        .count();
    println!("producer log lines at WARN or ERROR: {warnings}");
    println!("load average at the end: {}", load_averages());
    println!("\nLatency over the whole run, by kind (from the scheduled send to the end of the answer, ms):\n");
    println!("| kind | samples | p50 | p99 | p99.9 | max |\n|---|---:|---:|---:|---:|---:|");
    for (kind, latencies) in std::mem::take(&mut *shared.by_kind.lock().unwrap()) {
        println!("{}", summary(kind.label(), latencies));
    }

    let mut problems = Vec::new();
    if growth_mib > options.max_rss_growth_mib {
        problems.push(format!(
            "RSS grew {growth_mib:.1} MiB over the second half (limit {} MiB)",
            options.max_rss_growth_mib
        ));
    }
    if p99_ratio.is_nan() || p99_ratio > options.max_p99_ratio {
        problems.push(format!(
            "p99 went from {p99_early:.1} to {p99_late:.1} ms (ratio {p99_ratio:.2}, limit {})",
            options.max_p99_ratio
        ));
    }
    if failed_total > 0 {
        problems.push(format!("{failed_total} requests failed"));
    }
    if memory_max_seen > capacity_blocks as f64 {
        problems.push(format!(
            "an endpoint's memory held {memory_max_seen:.0} blocks, over its capacity {capacity_blocks}"
        ));
    }
    println!();
    if problems.is_empty() {
        println!(
            "verdict: NO GROWTH: RSS {growth_mib:+.1} MiB over the second half (limit {} MiB), \
             p99 ratio last/first quarter {p99_ratio:.2} (limit {}), 0 failed of {sent}, memory \
             within capacity ({:.0} of {memory_capacity:.0} blocks at the end)",
            options.max_rss_growth_mib, options.max_p99_ratio, final_row.memory_sum,
        );
        ExitCode::SUCCESS
    } else {
        println!("verdict: NOT CLEAN: {}", problems.join("; "));
        ExitCode::FAILURE
    }
}
