//! What the engines say, as the planner hears it (docs/behaviour.md §7): blocks an engine reports
//! holding (fed here to the producer's engine index as the KV-events subscriber feeds it; the
//! subscriber itself is tested on real vLLM in `tests/engine_state_vllm.rs`) draw a request to
//! that replica, in both modes; a reset and a new weight version forget them.

mod common;

use burst_prefix_engine_state::decode::{Batch, BlockHash as EngineHash, BlockStored, Event};
use common::Local;
use serde_json::json;

/// The engine block size of vLLM's CPU build.
const ENGINE_BLOCK: usize = 128;

/// `blocks` full engine blocks of token ids, distinct per `seed`.
fn tokens(seed: u32, blocks: usize) -> Vec<u32> {
    (0..(blocks * ENGINE_BLOCK) as u32)
        .map(|i| 1 + (seed * 7_919 + i * 31) % 4_000)
        .collect()
}

/// A batch in which an engine reports storing the blocks of `tokens` (a prompt's first blocks).
fn stored(tokens: &[u32]) -> Batch {
    let blocks = tokens.len() / ENGINE_BLOCK;
    Batch {
        ts: 0.0,
        events: vec![Event::BlockStored(BlockStored {
            block_hashes: (0..blocks as u64)
                .map(|i| EngineHash::Int(1_000 + i))
                .collect(),
            parent_block_hash: None,
            token_ids: tokens[..blocks * ENGINE_BLOCK].to_vec(),
            block_size: ENGINE_BLOCK as u32,
            lora_name: None,
            medium: None,
            has_extra_keys: false,
            group_idx: None,
        })],
        data_parallel_rank: None,
        unknown_fields: 0,
    }
}

fn config(window_ms: u64) -> String {
    // Memory on (the default), token prompts hashed in 64-token blocks: an engine block is two.
    format!(
        "windowDurationMs: {window_ms}\nbalanceBy: requests\nmemory: {{loadHalfLifeMs: 0}}\n{}",
        common::endpoints(4)
    )
}

async fn produce(local: &Local, prompt: &[u32], headers: &[(&str, &str)]) -> serde_json::Value {
    let mut request = local
        .client
        .post(format!("{}/v1/produce?matches=nonzero", local.base))
        .json(&json!({"model": "m", "prompt": prompt}));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.unwrap().json().await.unwrap()
}

async fn assigned(local: &Local, prompt: &[u32], headers: &[(&str, &str)]) -> String {
    let answer = produce(local, prompt, headers).await;
    answer["assignedEndpoint"]
        .as_str()
        .unwrap_or_else(|| panic!("not assigned: {answer}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_an_engine_holds_draw_the_request_to_it_in_both_modes() {
    for window_ms in [0, 20] {
        let local = Local::start(&config(window_ms)).await;
        let held = tokens(1, 4);
        // The fourth endpoint, which no tie-break would pick first.
        let engines = local.producer().engines();
        engines.index().apply("ns/p4-rank-0", &stored(&held));
        // The same prompt with a new question after it.
        let mut prompt = held.clone();
        prompt.extend(tokens(2, 1));
        assert_eq!(
            assigned(&local, &prompt, &[]).await,
            "ns/p4-rank-0",
            "window {window_ms} ms"
        );
        let metrics = local.metrics().await;
        assert!(
            common::sample(
                &metrics,
                "burst_prefix_engine_state_total{outcome=\"engine_matched\"}"
            ) >= 1.0
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_and_new_weights_forget_what_an_engine_held() {
    // Windows: what a replica holds comes from the memory alone between them (in zero-wait
    // mode the placements still in flight would count too).
    let local = Local::start(&config(20)).await;
    let engines = local.producer().engines();
    let prompt = |question: u32| {
        let mut prompt = tokens(1, 4);
        prompt.extend(tokens(100 + question, 1));
        prompt
    };
    engines
        .index()
        .apply("ns/p4-rank-0", &stored(&tokens(1, 4)));
    assert_eq!(assigned(&local, &prompt(0), &[]).await, "ns/p4-rank-0");
    let held = "burst_prefix_memory_blocks{endpoint=\"ns/p4-rank-0\"}";
    assert!(common::sample(&local.metrics().await, held) > 0.0);

    // POST /v1/memory/reset for that replica: its engine blocks and its memory model are gone,
    // so the next request on that prompt is a cold lone one: no affinity, no match anywhere.
    let reset = local
        .client
        .post(format!("{}/v1/memory/reset", local.base))
        .json(&json!({"endpoints": ["ns/p4-rank-0"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(reset.status(), 200);
    assert_eq!(engines.index().blocks_held("ns/p4-rank-0"), 0);
    let answer = produce(&local, &prompt(1), &[]).await;
    assert!(answer["assignedEndpoint"].is_null(), "{answer}");
    assert_eq!(answer["matches"], json!([]), "{answer}");
    // The memory's gauge forgets it too, once the window above settles the model (after its
    // answer): the series is gone, or reads 0 if the model took the replica back since.
    let started = std::time::Instant::now();
    let holds = |metrics: &str| {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(held)?.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    while holds(&local.metrics().await) > 0.0 {
        assert!(
            started.elapsed() < common::PATIENCE,
            "{held} still reported after the reset"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    // A new weight version: what the engines held under the older one is forgotten too.
    let step = |version| [("x-burst-prefix-weight-version", version)];
    engines
        .index()
        .apply("ns/p3-rank-0", &stored(&tokens(1, 4)));
    assert_eq!(
        assigned(&local, &prompt(2), &step("step-1")).await,
        "ns/p3-rank-0"
    );
    let answer = produce(&local, &prompt(3), &step("step-2")).await;
    assert!(answer["assignedEndpoint"].is_null(), "{answer}");
    assert_eq!(answer["matches"], json!([]), "{answer}");
    assert_eq!(engines.index().blocks_held("ns/p3-rank-0"), 0);
    let metrics = local.metrics().await;
    assert!(
        common::sample(
            &metrics,
            "burst_prefix_engine_state_total{outcome=\"reset\"}"
        ) >= 2.0
    );
}

/// Polls `holds` every 20 ms until it is true or `common::PATIENCE` has passed; its last answer.
async fn eventually(mut holds: impl FnMut() -> bool) -> bool {
    let started = std::time::Instant::now();
    while !holds() {
        if started.elapsed() > common::PATIENCE {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_producer_releases_its_kv_events_endpoint_for_the_next_one() {
    // Producers started and stopped one after the other in one process (the engine bench does
    // this per route): each binds the engines' endpoint, and a stopped one lets it go.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let bound = || std::net::TcpListener::bind(("127.0.0.1", port)).is_err();
    let yaml = format!(
        "engines:\n  kvEvents: {{bind: 'tcp://127.0.0.1:{port}'}}\n{}",
        common::endpoints(1)
    );
    for producer in ["first", "second"] {
        let local = Local::start(&yaml).await;
        assert!(
            eventually(bound).await,
            "the {producer} producer never bound port {port}"
        );
        local
            .service
            .shutdown(std::time::Duration::from_secs(1))
            .await;
        assert!(
            eventually(|| !bound()).await,
            "the {producer} producer still holds port {port} after its shutdown"
        );
    }
}
