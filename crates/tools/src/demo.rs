//! `burst-prefix-tools demo`: the producer service, in-process on a built-in config, sent one
//! realistic burst over HTTP, and a report of what happened.
//!
//! The burst is one GRPO rollout step (6 prompts x 8 samples, chat requests of about 1.5k
//! tokens sharing a system prompt) plus a few lone requests. The replicas are fake: their
//! addresses are never contacted. The report shows where each group landed and the prefill it
//! saved against spreading the same burst round-robin, counting as a prefix cache would: a
//! replica prefills each distinct block once.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::process::ExitCode;

use burst_prefix_api::{Endpoint, Placement, PlannerConfig, ProducerConfig};
use burst_prefix_planner::BlockHash;
use clap::Args;
use serde_json::{json, Value};

use burst_prefix_core::read::HashedRequest;
use burst_prefix_core::read::InferenceRequest;
use burst_prefix_core::ConfigOrigin;
use burst_prefix_core::{Limits, Producer};
use burst_prefix_producer::proxy::ProxyConfig;
use burst_prefix_producer::scoring::response::ProduceResponse;
use burst_prefix_producer::serve::{LogArgs, LogFormat, Role, Service};

const MODEL: &str = "Qwen/Qwen2.5-Math-7B-Instruct";
const PROMPTS: usize = 6;
const SAMPLES: usize = 8;
const LONE: usize = 4;

#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// Log filter for the in-process service (logs go to stderr; the report to stdout).
    #[arg(long, env = "RUST_LOG", default_value = "warn")]
    pub log_level: String,
}

/// The built-in config: 4 fake replicas, defaults otherwise (placed on arrival, 64-token
/// blocks).
pub fn config() -> ProducerConfig {
    ProducerConfig {
        planner: PlannerConfig::default(),
        endpoints: (0..4)
            .map(|i| Endpoint {
                id: format!("demo/vllm-{i}-rank-0"),
                address: format!("127.0.0.1:{}", 8000 + i),
                running_requests: None,
            })
            .collect(),
    }
}

/// One request of the burst.
pub struct DemoRequest {
    /// `Some(p)` for a sample of rollout prompt p, `None` for a lone request.
    pub prompt: Option<usize>,
    pub body: Value,
}

const SYSTEM: &str = "You are a careful competition mathematician. Solve the problem the user \
gives you. Think step by step: restate what is asked, list the quantities you know, decide on a \
method, and carry it out with every intermediate result written down. Check units at each step. \
When a problem gives a table, read every row; do not assume a pattern you have not verified. \
If a step uses a formula, state the formula before using it. If the problem is ambiguous, say \
which reading you take and why. Prefer exact arithmetic (fractions, radicals) to decimals until \
the last step. At the end, check the answer against the conditions of the problem, and write \
the final answer alone on the last line as \\boxed{ANSWER}.\n\n\
Example 1. A tank holds 240 litres and drains at 6 litres per minute while a pump adds 2 litres \
per minute. How long until it is empty?\n\
Solution. The net outflow is 6 - 2 = 4 litres per minute. The time to drain 240 litres at 4 \
litres per minute is 240 / 4 = 60 minutes. Check: after 60 minutes the drain removed 360 litres \
and the pump added 120 litres, a net loss of 240 litres, which empties the tank.\n\\boxed{60}\n\n\
Example 2. The sum of three consecutive odd integers is 147. What is the largest?\n\
Solution. Write them as n - 2, n, n + 2 for an odd n. Their sum is 3n = 147, so n = 49 and the \
integers are 47, 49 and 51. Check: 47 + 49 + 51 = 147, and all three are odd. The largest is \
51.\n\\boxed{51}\n\n\
Example 3. A rectangle's length is 3 cm more than twice its width, and its perimeter is 54 cm. \
Find its area.\n\
Solution. Let the width be w. The length is 2w + 3, and the perimeter is 2(w + 2w + 3) = 6w + 6 \
= 54, so w = 8 cm and the length is 19 cm. The area is 8 * 19 = 152 square centimetres. Check: \
2(8 + 19) = 54.\n\\boxed{152}\n\n\
Example 4. Two trains leave stations 300 km apart at the same time and travel toward each other \
at 70 km/h and 80 km/h. After how many hours do they meet, and how far from the first station?\n\
Solution. They close the gap at 70 + 80 = 150 km/h, so they meet after 300 / 150 = 2 hours. The \
first train has travelled 70 * 2 = 140 km by then. Check: the second has travelled 160 km, and \
140 + 160 = 300.\n\\boxed{2 \\text{ hours}, 140 \\text{ km}}\n\n\
Now solve the user's problem in the same way.";

const SUBJECTS: [(&str, &str, &str); PROMPTS] = [
    ("a warehouse", "crates shipped", "kg per crate"),
    ("a bakery", "trays of loaves baked", "loaves per tray"),
    ("a solar farm", "panels cleaned", "kWh gained per panel"),
    ("a library", "boxes of books catalogued", "books per box"),
    (
        "a bike-share scheme",
        "bikes redistributed",
        "km ridden per bike",
    ),
    ("a vineyard", "rows harvested", "kg of grapes per row"),
];

/// The user turn of rollout prompt `p`: a data-heavy word problem, different for each prompt.
fn problem(p: usize) -> String {
    let (place, counted, rate) = SUBJECTS[p];
    let mut text = format!(
        "The daily log of {place} over eight weeks records, for each day, the number of \
         {counted} and the {rate}:\n"
    );
    for day in 1..=56 {
        let count = 5 + (day * (p + 3) * 7) % 23;
        let per = 10 + (day * (p + 5) * 11) % 17;
        let _ = writeln!(text, "Day {day}: {count} {counted}, {per} {rate}.");
    }
    let _ = write!(
        text,
        "Using every row of the log, find the week (1 to 8) with the largest total, where a \
         day's total is the number of {counted} times the {rate}, and give that week's total. \
         Then find the mean daily total over all 56 days as an exact fraction."
    );
    text
}

/// Lone request `i`: unrelated to the rollout and to each other.
fn lone(i: usize) -> Value {
    match i % 2 {
        0 => json!({
            "model": MODEL,
            "messages": [
                {"role": "system", "content": format!("You are assistant #{i} of a support desk. Answer briefly.")},
                {"role": "user", "content": format!("Ticket {}: my invoice for order {} shows the wrong VAT rate. What should I do?", 4100 + i, 90_000 + i * 37)},
            ],
            "max_tokens": 256,
        }),
        _ => json!({
            "model": MODEL,
            "prompt": format!("Summarise in one paragraph the following changelog entry {i}: {}", "Fixed an off-by-one in the pager; ".repeat(20 + i)),
            "max_tokens": 128,
        }),
    }
}

/// The burst, in the order a GRPO trainer sends it: the samples of each prompt together.
pub fn burst() -> Vec<DemoRequest> {
    let mut requests = Vec::new();
    for p in 0..PROMPTS {
        let user = problem(p);
        for sample in 0..SAMPLES {
            requests.push(DemoRequest {
                prompt: Some(p),
                body: json!({
                    "model": MODEL,
                    "messages": [
                        {"role": "system", "content": SYSTEM},
                        {"role": "user", "content": user},
                    ],
                    "temperature": 1.0,
                    "max_tokens": 1024,
                    "seed": sample,
                }),
            });
        }
        if p % 2 == 1 {
            requests.push(DemoRequest {
                prompt: None,
                body: lone(p / 2),
            });
        }
    }
    while requests.iter().filter(|r| r.prompt.is_none()).count() < LONE {
        let i = requests.iter().filter(|r| r.prompt.is_none()).count();
        requests.push(DemoRequest {
            prompt: None,
            body: lone(i),
        });
    }
    requests
}

/// Runs the demo and prints its report: exit 0, or 1 with one line on stderr.
pub fn run(args: DemoArgs) -> ExitCode {
    let log = LogArgs {
        log_format: LogFormat::Text,
        log_level: args.log_level,
    };
    if let Err(message) = burst_prefix_runtime::logging::init(&log) {
        eprintln!("error: {message}");
        return ExitCode::from(2);
    }
    let result = tokio::runtime::Runtime::new()
        .map_err(|e| format!("cannot start the runtime: {e}"))
        .and_then(|runtime| runtime.block_on(demo()));
    match result {
        Ok(report) => {
            print!("{report}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("error: demo failed: {}", message.replace('\n', " "));
            ExitCode::from(1)
        }
    }
}

/// Starts the service on loopback, sends the burst at once, shuts down, and reports.
pub async fn demo() -> Result<String, String> {
    let config = config();
    let producer = Producer::new(ConfigOrigin::Demo, Limits::default());
    producer
        .config_store()
        .apply(config.clone())
        .map_err(|e| format!("the built-in config: {e}"))?;
    let service = Service::on_loopback(producer, ProxyConfig::default()).await?;
    let api_addr = service.addr(Role::Api).expect("bound");
    let url = format!("http://{api_addr}/v1/produce");

    let requests = burst();
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(10))
        .build()
        .map_err(|e| e.to_string())?;
    let sends = requests.iter().map(|request| {
        let client = &client;
        let url = &url;
        async move {
            let response = client
                .post(url)
                .json(&request.body)
                .send()
                .await
                .map_err(|e| format!("POST /v1/produce: {e}"))?;
            let status = response.status();
            if !status.is_success() {
                let text = response.text().await.unwrap_or_default();
                return Err(format!("POST /v1/produce answered {status}: {text}"));
            }
            response
                .json::<ProduceResponse>()
                .await
                .map_err(|e| format!("POST /v1/produce: unreadable answer: {e}"))
        }
    });
    let responses = futures::future::join_all(sends).await;
    service.shutdown(std::time::Duration::from_secs(10)).await;
    let responses = responses.into_iter().collect::<Result<Vec<_>, _>>()?;
    Ok(report(
        &config,
        &requests,
        &responses,
        &api_addr.to_string(),
    ))
}

/// Distinct blocks each replica prefills when request i runs on `placement[i]`.
fn prefill_blocks(blocks: &[Vec<BlockHash>], placement: &[usize], replicas: usize) -> usize {
    let mut held: Vec<HashSet<BlockHash>> = vec![HashSet::new(); replicas];
    for (request, &replica) in blocks.iter().zip(placement) {
        held[replica].extend(request.iter().copied());
    }
    held.iter().map(HashSet::len).sum()
}

fn label(prompt: Option<usize>) -> String {
    match prompt {
        Some(p) => format!("prompt {}", p + 1),
        None => "lone".to_string(),
    }
}

fn report(
    config: &ProducerConfig,
    requests: &[DemoRequest],
    responses: &[ProduceResponse],
    api: &str,
) -> String {
    let planner = &config.planner;
    let replicas = config.endpoints.len();
    let block = planner.block_size_tokens as usize;
    let blocks: Vec<Vec<BlockHash>> = requests
        .iter()
        .map(|request| {
            let body = request.body.to_string();
            let parsed = InferenceRequest::parse(body.as_bytes()).expect("demo bodies parse");
            HashedRequest::new(&parsed, planner.block_spec()).blocks
        })
        .collect();
    let index: BTreeMap<&str, usize> = config
        .endpoints
        .iter()
        .enumerate()
        .map(|(i, endpoint)| (endpoint.id.as_str(), i))
        .collect();

    // Where the producer put them; requests without affinity go round-robin, as a plain load
    // balancer would send them, in both countings.
    let mut spare = 0;
    let placed: Vec<usize> = responses
        .iter()
        .map(|response| match response.assigned_endpoint.as_deref() {
            Some(id) => index[id],
            None => {
                spare += 1;
                (spare - 1) % replicas
            }
        })
        .collect();
    let round_robin: Vec<usize> = (0..requests.len()).map(|i| i % replicas).collect();
    let ours = prefill_blocks(&blocks, &placed, replicas);
    let theirs = prefill_blocks(&blocks, &round_robin, replicas);

    let mut windows: BTreeMap<u64, usize> = BTreeMap::new();
    for response in responses {
        windows.insert(response.window.id, response.window.size);
    }
    let waited = |pick: fn(f64, f64) -> f64| {
        responses
            .iter()
            .map(|r| r.window.waited_ms)
            .reduce(pick)
            .unwrap_or(0.0)
    };
    let samples: Vec<usize> = (0..requests.len())
        .filter(|&i| requests[i].prompt.is_some())
        .collect();
    let tokens = samples.iter().map(|&i| blocks[i].len()).sum::<usize>() * block / samples.len();

    let mut out = String::new();
    let _ = writeln!(
        out,
        "burst-prefix demo: one GRPO rollout step through the producer service\n"
    );
    let _ = writeln!(
        out,
        "  service   http://{api} (built-in demo config, stopped after the burst)"
    );
    let _ = writeln!(
        out,
        "  replicas  {replicas}: {} .. {} (fake addresses, never contacted)",
        config.endpoints[0].id,
        config.endpoints[replicas - 1].id
    );
    let on_arrival = planner.placement() == Placement::OnArrival;
    let placement = if on_arrival {
        "on arrival (each request placed the moment it is read)".to_string()
    } else {
        format!("in windows of {} ms", planner.window_ms())
    };
    let _ = writeln!(
        out,
        "  config    placement {placement}, balanceBy {:?}, blockSizeTokens {}, maxPerReplica {}, minColocateBlocks {}",
        planner.balance(),
        planner.block_size_tokens,
        planner.max_per_replica,
        planner.min_colocate_blocks
    );
    let _ = writeln!(
        out,
        "  burst     {} requests at once: {PROMPTS} prompts x {SAMPLES} samples (chat requests of\n            \
         ~{tokens} tokens sharing a system prompt) + {LONE} lone requests\n",
        requests.len()
    );
    let waited = format!("{:.2}-{:.2} ms", waited(f64::min), waited(f64::max));
    if on_arrival {
        let _ = writeln!(
            out,
            "All {} placed as they arrived, each within {waited} of being read.\n",
            responses.len(),
        );
    } else {
        let _ = writeln!(
            out,
            "All {} answered by {} window(s) ({}), after waiting {waited}.\n",
            responses.len(),
            windows.len(),
            windows
                .iter()
                .map(|(id, size)| format!("window {id}: {size} requests"))
                .collect::<Vec<_>>()
                .join(", "),
        );
    }

    let _ = writeln!(out, "Where they landed:");
    let mut rows: Vec<(String, String, Vec<Option<usize>>)> = config
        .endpoints
        .iter()
        .map(|e| (e.id.clone(), e.address.clone(), Vec::new()))
        .collect();
    let mut unplaced = Vec::new();
    for (request, response) in requests.iter().zip(responses) {
        match response.assigned_endpoint.as_deref() {
            Some(id) => rows[index[id]].2.push(request.prompt),
            None => unplaced.push(request.prompt),
        }
    }
    let width = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    let describe = |landed: &[Option<usize>]| {
        let mut counts: BTreeMap<Option<usize>, usize> = BTreeMap::new();
        for prompt in landed {
            *counts.entry(*prompt).or_default() += 1;
        }
        counts
            .iter()
            .map(|(prompt, n)| format!("{} x{n}", label(*prompt)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for (id, address, landed) in &rows {
        let _ = writeln!(
            out,
            "  {id:width$}  {address:15}  {:>2} requests  {}",
            landed.len(),
            if landed.is_empty() {
                "-".to_string()
            } else {
                describe(landed)
            }
        );
    }
    let _ = writeln!(
        out,
        "  {:width$}  {:15}  {:>2} requests  {}\n  (no affinity: scored 0 on every replica, the load balancer decides)\n",
        "no affinity",
        "",
        unplaced.len(),
        describe(&unplaced)
    );

    let _ = writeln!(
        out,
        "Prefill, counting each distinct {block}-token block once per replica\n\
         (requests without affinity spread round-robin in both cases):"
    );
    let line =
        |name: &str, n: usize| format!("  {name:13} {n:>5} blocks  ~{:>7} tokens", n * block);
    let _ = writeln!(out, "{}", line("round-robin", theirs));
    let _ = writeln!(out, "{}", line("burst-prefix", ours));
    let saved = theirs.saturating_sub(ours);
    let _ = writeln!(
        out,
        "{}  ({:.0}% less prefill)\n",
        line("saved", saved),
        if theirs == 0 {
            0.0
        } else {
            100.0 * saved as f64 / theirs as f64
        }
    );
    let _ = writeln!(
        out,
        "Run it for real: burst-prefix-producer serve --config FILE (see --help),\n\
         then POST inference request bodies to /v1/produce."
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_burst_is_realistic() {
        let requests = burst();
        assert_eq!(requests.len(), PROMPTS * SAMPLES + LONE);
        config().validate().unwrap();
        let planner = PlannerConfig::default();
        for request in &requests {
            let body = request.body.to_string();
            let parsed = InferenceRequest::parse(body.as_bytes()).unwrap();
            let blocks = HashedRequest::new(&parsed, planner.block_spec())
                .blocks
                .len();
            if request.prompt.is_some() {
                // ~1-2k estimate tokens: 16 to 32 blocks of 64 tokens.
                assert!((16..=32).contains(&blocks), "{blocks} blocks");
            }
        }
    }

    #[test]
    fn prefill_counts_each_block_once_per_replica() {
        let blocks = vec![vec![1, 2], vec![1, 2], vec![1, 3]];
        assert_eq!(prefill_blocks(&blocks, &[0, 0, 0], 2), 3);
        assert_eq!(prefill_blocks(&blocks, &[0, 1, 0], 2), 5);
    }
}
