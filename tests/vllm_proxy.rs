//! End to end on a real vLLM (tests/vllm/setup.sh installs it; `make test` runs it first): two
//! tiny replicas behind burst-prefix's proxy. A burst of 8 samples of one prompt computes at
//! most 1.05x the engine's own bound, read from the engine's counters, and a conversation's
//! second turn lands on the replica that holds its first.

use std::path::Path;
use std::time::{Duration, Instant};

use burst_prefix_engine_bench::bound::tail_tokens;
use burst_prefix_engine_bench::engine::{
    cache_config, counters, installed_vllm, settled_counters, start_replicas, stop_replicas,
    Counters, Engine, Replica, Vllm, MODEL_NAME,
};
use burst_prefix_engine_bench::producer::{replica_of_endpoint, Proxy, ENDPOINT_HEADER};
use burst_prefix_engine_bench::prompts::{words, Message};
use burst_prefix_engine_bench::run::client;
use burst_prefix_test_support::real_engine::runs_on_vllm;
use serde_json::{json, Value};

/// The proxy as the engine bench runs it with memory (bench/engine/routes.yaml), memory sized
/// to a replica's cache (1 GiB of the tiny model's KV: 262,144 tokens).
const PLANNER: &str = "windowDurationMs: 100\nmaxBatchSize: -1\nbalanceBy: tokens\n\
                       blockSizeTokens: 64\nmemory: {enabled: true, cacheTokensPerReplica: 262144}\n";

/// Every request and wait of the test is bounded by this.
const PATIENCE: Duration = Duration::from_secs(120);

/// Sends one non-streamed request through the proxy: (the replica that served it, its usage's
/// prompt tokens, its cached tokens).
async fn send(client: &reqwest::Client, url: &str, path: &str, prompt: Value) -> (usize, u64, u64) {
    let mut body = json!({"model": MODEL_NAME, "max_tokens": 2, "temperature": 0.0});
    body.as_object_mut()
        .unwrap()
        .extend(prompt.as_object().unwrap().clone());
    let response = client
        .post(format!("{url}{path}"))
        .json(&body)
        .timeout(PATIENCE)
        .send()
        .await
        .unwrap();
    let status = response.status();
    let replica = response
        .headers()
        .get(ENDPOINT_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(replica_of_endpoint);
    let answer: Value = response.json().await.unwrap();
    assert!(status.is_success(), "{path} answered {status}: {answer}");
    let usage = &answer["usage"];
    (
        replica.unwrap_or_else(|| panic!("the proxy's answer names no replica: {answer}")),
        usage["prompt_tokens"].as_u64().unwrap(),
        usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
    )
}

async fn all_counters(replicas: &[Replica], client: &reqwest::Client) -> Vec<Counters> {
    let mut all = Vec::new();
    for replica in replicas {
        all.push(counters(replica, client).await.unwrap());
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_computes_the_engines_bound_and_a_second_turn_finds_its_history() {
    if !runs_on_vllm(
        "vllm_proxy::a_burst_computes_the_engines_bound_and_a_second_turn_finds_its_history",
    ) {
        return;
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let (python, model) = installed_vllm(&repo).unwrap();
    let engine = Engine::Vllm(Vllm {
        python,
        model,
        kv_cache_gib: 1,
        kv_cache_blocks: None,
        threads: 2,
        max_model_len: 4096,
        kv_events: None,
    });
    let log_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("vllm-proxy");
    let client = &client().unwrap();
    let started = Instant::now();
    let replicas = start_replicas(&engine, 2, &log_dir, client).await.unwrap();
    eprintln!("2 vLLM replicas ready in {:?}", started.elapsed());
    let addrs: Vec<_> = replicas.iter().map(|r| r.addr).collect();
    let proxy = Proxy::start(PLANNER, &addrs).await.unwrap();
    let url = proxy.url();
    let block_size = cache_config(&replicas[0], client).await.unwrap().block_size;

    // A burst: 8 samples of one ~1,000-token prompt, sent at once.
    let before = all_counters(&replicas, client).await;
    let prompt = json!({"prompt": words(1, 915)});
    let burst = (0..8).map(|_| send(client, &url, "/v1/completions", prompt.clone()));
    let answers = futures::future::join_all(burst).await;
    let computed: u64 = settled_counters(&replicas, &before, 8, client, PATIENCE)
        .await
        .unwrap()
        .iter()
        .map(|c| c.computed_tokens)
        .sum();
    let length = answers[0].1;
    assert!(answers.iter().all(|a| a.1 == length), "{answers:?}");
    let length = length as usize;
    let block_size = block_size as usize;
    // The prompt's full blocks once, each request's tail (its partial last block) every time.
    let bound =
        ((length - 1) / block_size * block_size + 8 * tail_tokens(length, block_size)) as u64;
    eprintln!(
        "burst of 8 x {length} tokens on {block_size}-token blocks: computed {computed}, bound \
         {bound} ({:.3}x), replicas {:?}",
        computed as f64 / bound as f64,
        answers.iter().map(|a| a.0).collect::<Vec<_>>()
    );
    assert!(
        computed >= bound,
        "the engine computed {computed} tokens, below its bound {bound}: the bound is wrong"
    );
    assert!(
        computed as f64 <= 1.05 * bound as f64,
        "the burst computed {computed} prompt tokens, over 1.05x the engine's bound {bound}"
    );

    // Four conversations on one system prompt at once, then their second turns at once. The
    // system prompt is under a KV block, so the only replica that holds more than it of a
    // conversation is the one its first turn ran on. (Without a shared prefix a first turn is a
    // cold single the planner leaves to the proxy's least-loaded fallback, which memory does
    // not record: see bench/engine/README.md.)
    let system = Message {
        role: "system",
        content: words(99, 80),
    };
    let first_turn = |c: u32| {
        vec![
            system.clone(),
            Message {
                role: "user",
                content: words(100 + c, 380 + 40 * c),
            },
        ]
    };
    let turns1 = (0..4).map(|c| {
        send(
            client,
            &url,
            "/v1/chat/completions",
            json!({"messages": first_turn(c)}),
        )
    });
    let turns1 = futures::future::join_all(turns1).await;
    let turns2 = (0..4).map(|c| {
        let mut messages = first_turn(c);
        messages.push(Message {
            role: "assistant",
            content: words(200 + c, 30),
        });
        messages.push(Message {
            role: "user",
            content: words(300 + c, 60),
        });
        send(
            client,
            &url,
            "/v1/chat/completions",
            json!({"messages": messages}),
        )
    });
    let turns2 = futures::future::join_all(turns2).await;
    eprintln!("first turns (replica, prompt, cached): {turns1:?}\nsecond turns: {turns2:?}");
    for (c, (first, second)) in turns1.iter().zip(&turns2).enumerate() {
        assert_eq!(
            second.0, first.0,
            "conversation {c}'s second turn went to replica {}, its history is on {}",
            second.0, first.0
        );
        let history_blocks = first.1 as usize / block_size * block_size;
        assert!(
            second.2 as usize >= history_blocks,
            "conversation {c}'s second turn reused {} cached tokens of its {history_blocks}-token \
             history's full blocks",
            second.2
        );
    }
    let served: std::collections::HashSet<usize> = turns1.iter().map(|t| t.0).collect();
    assert_eq!(
        served.len(),
        2,
        "four conversations all went to one replica: {turns1:?}"
    );

    proxy.shutdown().await;
    stop_replicas(replicas).await;
    eprintln!("the test took {:?}", started.elapsed());
}
