//! What the engines say, end to end on real vLLM (docs/behaviour.md §7, "What the engines say"):
//! two replicas publish their KV events to the producer's proxy in the bind topology (the
//! producer binds one ZMQ endpoint; each replica connects and publishes with its endpoint id as
//! the topic), and the proxy tokenizes prompts with the model's own tokenizer. A prompt sent
//! straight to one replica, never through the proxy, draws the proxy's later requests that share
//! its leading blocks to that replica; after the replica resets its prefix cache they are drawn
//! no more.
//!
//! Replica A is the second endpoint (`bench/r1`): a request without affinity goes to the
//! replica with the fewest requests in flight, ties to the lower id, i.e. to B (`bench/r0`). So
//! a request reaches A only when something draws it there.

mod common;
#[path = "engine/vllm_server.rs"]
mod vllm;

use std::time::{Duration, Instant};

use burst_prefix_engine_bench::producer::{
    endpoint_id, replica_of_endpoint, Proxy, ENDPOINT_HEADER,
};
use burst_prefix_engine_bench::prompts::{words, Message};
use common::{metric, runtime};
use serde_json::{json, Value};
use vllm::{engine_test, free_port, model_dir, Vllm, VllmOptions};

/// The engine's KV block size on vLLM's CPU build, in tokens.
const ENGINE_BLOCK: u64 = 128;

/// Every request and wait of the test is bounded by this.
const PATIENCE: Duration = Duration::from_secs(60);

/// The index of replica A among the endpoints (see the module's comment).
const A: usize = 1;
/// The index of replica B.
const B: usize = 0;

/// The proxy's metrics the test reads.
#[derive(Clone, Copy, Debug)]
struct Seen {
    /// Engine blocks the KV events stored in the producer's index.
    stored: f64,
    /// Requests for which some replica's engine held a leading run.
    engine_matched: f64,
    /// Requests whose prompt was tokenized with the model's tokenizer.
    tokenized: f64,
    /// AllBlocksCleared applied.
    cleared: f64,
    /// Memory dropped (a reset, a weight update, an engine that cleared its cache).
    memory_resets: f64,
}

fn seen(proxy: &Proxy) -> Seen {
    let m = proxy.metrics();
    let state = |outcome: &str| {
        metric(
            &m,
            &format!("burst_prefix_engine_state_total{{outcome=\"{outcome}\"}}"),
        )
    };
    Seen {
        stored: metric(
            &m,
            "burst_prefix_engine_index_blocks_total{outcome=\"stored\"}",
        ),
        engine_matched: state("engine_matched"),
        tokenized: state("tokenized"),
        cleared: metric(&m, "burst_prefix_kv_event_resets_total{reason=\"cleared\"}"),
        memory_resets: state("reset"),
    }
}

/// Polls `check` every 100 ms until it holds or `limit` passes; false on time-out.
async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    check()
}

/// Sends one non-streamed request (`path`, with `prompt`'s fields) to `url`: the endpoint header
/// (the proxy's answer names the replica; none when sent straight to a replica) and the usage's
/// prompt tokens.
async fn send(
    client: &reqwest::Client,
    url: &str,
    path: &str,
    prompt: &Value,
) -> (Option<usize>, u64) {
    let mut body = json!({"model": "tiny", "max_tokens": 1, "temperature": 0.0});
    body.as_object_mut()
        .unwrap()
        .extend(prompt.as_object().unwrap().clone());
    let response = client
        .post(format!("{url}{path}"))
        .json(&body)
        .timeout(PATIENCE)
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {url}{path}: {e}"));
    let status = response.status();
    let endpoint = response
        .headers()
        .get(ENDPOINT_HEADER)
        .map(|v| v.to_str().unwrap().to_string());
    let answer: Value = response.json().await.unwrap();
    assert!(
        status.is_success(),
        "{url}{path} answered {status}: {answer}"
    );
    let replica = endpoint.map(|id| {
        replica_of_endpoint(&id).unwrap_or_else(|| panic!("an endpoint id of no replica: {id}"))
    });
    (replica, answer["usage"]["prompt_tokens"].as_u64().unwrap())
}

/// Sends `prompt` straight to `replica` (not through the proxy) and waits until the proxy's
/// index stored the engine blocks of its prompt: what the replica's KV events said.
async fn learned_from_events(
    client: &reqwest::Client,
    proxy: &Proxy,
    replica: &Vllm,
    path: &str,
    prompt: &Value,
) {
    let before = seen(proxy);
    let (_, tokens) = send(client, &replica.url(""), path, prompt).await;
    let blocks = (tokens / ENGINE_BLOCK) as f64;
    assert!(
        blocks >= 2.0,
        "{path}: a {tokens}-token prompt is too short"
    );
    let heard = eventually(PATIENCE, || seen(proxy).stored >= before.stored + blocks).await;
    assert!(
        heard,
        "{path}: the {blocks} engine blocks of a {tokens}-token prompt sent to port {} never \
         reached the proxy's index: {:?} before, {:?} now",
        replica.port,
        before,
        seen(proxy)
    );
}

/// Sends `prompt` through the proxy: the replica that served it and whether the engine index
/// matched it (the proxy's `engine_matched` count went up).
async fn through_proxy(
    client: &reqwest::Client,
    proxy: &Proxy,
    path: &str,
    prompt: &Value,
) -> (usize, bool) {
    let before = seen(proxy);
    let (replica, _) = send(client, &proxy.url(), path, prompt).await;
    let after = seen(proxy);
    assert!(
        after.tokenized > before.tokenized,
        "{path}: the proxy did not tokenize the prompt with the model's tokenizer: {after:?}"
    );
    (
        replica.expect("the proxy's answer names its endpoint"),
        after.engine_matched > before.engine_matched,
    )
}

/// vLLM's `POST /reset_prefix_cache` (dev mode), retried while it answers `{"success": false}`
/// (it refuses while blocks are still held, e.g. just after the last answer).
async fn reset_prefix_cache(client: &reqwest::Client, replica: &Vllm) {
    let url = replica.url("/reset_prefix_cache");
    let deadline = Instant::now() + PATIENCE;
    loop {
        let response = client.post(&url).timeout(PATIENCE).send().await.unwrap();
        let status = response.status();
        let body = response.text().await.unwrap();
        assert!(status.is_success(), "POST {url}: {status}: {body}");
        let answer: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        if answer["success"] == true {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "POST {url} still answers {body} after {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A chat's first turn: a long system prompt and a question, distinct per `seed`.
fn first_turn(seed: u32) -> Vec<Message> {
    vec![
        Message {
            role: "system",
            content: words(seed, 300),
        },
        Message {
            role: "user",
            content: words(seed + 1, 60),
        },
    ]
}

/// The first turn, its answer and a next question.
fn second_turn(seed: u32, question: u32) -> Vec<Message> {
    let mut messages = first_turn(seed);
    messages.push(Message {
        role: "assistant",
        content: words(seed + 2, 20),
    });
    messages.push(Message {
        role: "user",
        content: words(question, 40),
    });
    messages
}

/// A completion prompt: `seed`'s 400 words, then `tail`'s 40.
fn completion(seed: u32, tail: Option<u32>) -> Value {
    let mut prompt = words(seed, 400);
    if let Some(tail) = tail {
        prompt.push(' ');
        prompt.push_str(&words(tail, 40));
    }
    json!({ "prompt": prompt })
}

#[test]
fn prompts_a_replica_computed_draw_the_proxys_requests_until_it_resets_its_cache() {
    let Some(_engine) = engine_test("vllm_kv_events::prompts_a_replica_computed_draw_the_proxys_requests_until_it_resets_its_cache") else {
        return;
    };
    let started = Instant::now();
    let events_port = free_port();
    // Both replicas at once: each waits for its own /health.
    let replicas: Vec<Vllm> = std::thread::scope(|scope| {
        let starting: Vec<_> = [B, A]
            .into_iter()
            .map(|index| {
                scope.spawn(move || {
                    Vllm::start(VllmOptions {
                        port: free_port(),
                        kv_events: Some(json!({
                            "enable_kv_cache_events": true,
                            "publisher": "zmq",
                            "endpoint": format!("tcp://127.0.0.1:{events_port}"),
                            "topic": endpoint_id(index),
                        })),
                        env: vec![("VLLM_SERVER_DEV_MODE".into(), "1".into())],
                        ..VllmOptions::default()
                    })
                })
            })
            .collect();
        starting.into_iter().map(|s| s.join().unwrap()).collect()
    });
    eprintln!("2 vLLM replicas ready in {:?}", started.elapsed());
    runtime().block_on(async {
        let addrs: Vec<_> = replicas
            .iter()
            .map(|r| ([127, 0, 0, 1], r.port).into())
            .collect();
        let planner = format!(
            "windowDurationMs: 100\nmemory: {{enabled: true}}\nengines:\n  kvEvents: {{bind: \
             'tcp://127.0.0.1:{events_port}'}}\n  tokenizer: {{path: '{}'}}\n",
            model_dir().display()
        );
        let proxy = Proxy::start(&planner, &addrs).await.unwrap();
        let client = &reqwest::Client::builder().no_proxy().build().unwrap();
        let (a, b) = (&replicas[A], &replicas[B]);

        // Each replica's events reach the proxy (its ZMQ connection to the bound endpoint is
        // up, and the proxy follows the config's engines) before the test counts on them.
        for (name, replica, seed) in [("A", a, 900), ("B", b, 910)] {
            let mut heard = false;
            for attempt in 0..10 {
                let before = seen(&proxy).stored;
                let prompt = completion(seed + attempt, None);
                send(client, &replica.url(""), "/v1/completions", &prompt).await;
                heard = eventually(Duration::from_secs(5), || seen(&proxy).stored > before).await;
                if heard {
                    break;
                }
            }
            assert!(heard, "replica {name}'s KV events never reached the proxy");
        }

        // The control: a prompt no engine holds goes to B, the least-loaded replica with the
        // lower id.
        let (replica, matched) =
            through_proxy(client, &proxy, "/v1/completions", &completion(1, Some(2))).await;
        assert_eq!(
            (replica, matched),
            (B, false),
            "a prompt no engine holds: (replica, engine matched)"
        );

        // (1) A completion prompt sent straight to A, then through the proxy with another tail.
        learned_from_events(client, &proxy, a, "/v1/completions", &completion(10, None)).await;
        let (replica, matched) =
            through_proxy(client, &proxy, "/v1/completions", &completion(10, Some(11))).await;
        assert!(
            matched,
            "completions: the engine index did not match a prompt A's events announced"
        );
        assert_eq!(
            replica, A,
            "completions: a prompt whose leading blocks A's events announced went to replica \
             {replica}, not A"
        );

        // ... and a chat's first turn sent straight to A, then its second turn through the proxy.
        learned_from_events(
            client,
            &proxy,
            a,
            "/v1/chat/completions",
            &json!({ "messages": first_turn(20) }),
        )
        .await;
        let (replica, matched) = through_proxy(
            client,
            &proxy,
            "/v1/chat/completions",
            &json!({ "messages": second_turn(20, 25) }),
        )
        .await;
        assert!(
            matched,
            "chat: the engine index did not match a first turn A's events announced"
        );
        assert_eq!(
            replica, A,
            "chat: a second turn whose first A's events announced went to replica {replica}, not A"
        );

        // (2) A resets its prefix cache. vLLM publishes the AllBlocksCleared with its next
        // engine step's batch, so a short request (under a block) follows the reset.
        let before = seen(&proxy);
        reset_prefix_cache(client, a).await;
        let mut cleared = false;
        for _ in 0..6 {
            let hello = json!({"prompt": "hello"});
            send(client, &a.url(""), "/v1/completions", &hello).await;
            cleared = eventually(Duration::from_secs(5), || {
                seen(&proxy).cleared > before.cleared
            })
            .await;
            if cleared {
                break;
            }
        }
        let after = seen(&proxy);
        assert!(
            cleared,
            "no AllBlocksCleared reached the proxy after A's reset: {after:?}"
        );
        assert_eq!(
            after.cleared,
            before.cleared + 1.0,
            "one replica reset its cache once: {before:?} -> {after:?}"
        );
        assert!(
            after.memory_resets > before.memory_resets,
            "the engine's clear did not drop the proxy's memory of A: {before:?} -> {after:?}"
        );

        // The same prompts as in (1), with new tails: nothing holds them now, neither A's events
        // nor the proxy's memory of what it sent A in (1), so they go where a cold prompt goes.
        let (replica, matched) =
            through_proxy(client, &proxy, "/v1/completions", &completion(10, Some(12))).await;
        assert!(
            !matched,
            "completions: the engine index still matched a prompt A dropped in its reset"
        );
        assert_eq!(
            replica, B,
            "completions: a prompt A dropped in its reset was still drawn to A"
        );
        let (replica, matched) = through_proxy(
            client,
            &proxy,
            "/v1/chat/completions",
            &json!({ "messages": second_turn(20, 26) }),
        )
        .await;
        assert!(
            !matched,
            "chat: the engine index still matched a first turn A dropped in its reset"
        );
        assert_eq!(
            replica, B,
            "chat: a conversation A dropped in its reset was still drawn to A"
        );

        proxy.shutdown().await;
    });
    // Each stopped by its process group's id.
    drop(replicas);
    eprintln!("the test took {:?}", started.elapsed());
}
