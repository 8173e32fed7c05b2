//! The engine-facing pieces against real vLLM servers that these tests start and stop (see
//! `engine/vllm_server.rs` for where vLLM and the model are found; missing is a failure, not a
//! skip).
//!
//! Each test holds the engine lock: at most two servers run at once.

mod common;
#[path = "engine/vllm_server.rs"]
mod vllm;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use burst_prefix_engine_state::decode::{Batch, Event};
use burst_prefix_engine_state::load::{scrape_load, spawn_load_scraper, LoadScraperConfig};
use burst_prefix_engine_state::tokenizer::{ChatOptions, Tokenizer};
use burst_prefix_engine_state::vllm_hash::{
    event_int, prompt_block_hashes, DEFAULT_NONE_HASH_SEED,
};
use burst_prefix_engine_state::{
    EngineEndpoint, EngineIndex, EngineUpdate, IndexConfig, KvEventsMetrics, KvEventsSubscriber,
    SubscriberConfig, Topology,
};
use common::runtime;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use vllm::{engine_test, free_port, model_dir, Vllm, VllmOptions};

/// What the test's consumer of the subscriber has seen.
#[derive(Default)]
struct Seen {
    index: EngineIndex,
    batches: Vec<(String, u64, Batch)>,
    clears: Vec<String>,
}

type Shared = Arc<Mutex<Seen>>;

/// Applies every update to an index, as the producer will, and keeps the batches.
fn consume(mut rx: mpsc::Receiver<EngineUpdate>, metrics: KvEventsMetrics) -> Shared {
    let seen: Shared = Arc::new(Mutex::new(Seen {
        index: EngineIndex::new(IndexConfig::default()),
        ..Seen::default()
    }));
    let out = seen.clone();
    tokio::spawn(async move {
        while let Some(update) = rx.recv().await {
            // A failed assertion holding the lock poisons it; the failure is the news, not this task.
            let mut s = seen.lock().unwrap_or_else(|p| p.into_inner());
            match update {
                EngineUpdate::Batch {
                    replica,
                    seq,
                    batch,
                } => {
                    let report = s.index.apply(&replica, &batch);
                    metrics.record_apply(&report);
                    s.batches.push((replica, seq, batch));
                }
                EngineUpdate::Clear { replica, .. } => {
                    s.index.clear(&replica);
                    s.clears.push(replica);
                }
            }
        }
    });
    out
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

fn endpoint(id: &str, vllm: &Vllm) -> EngineEndpoint {
    EngineEndpoint {
        id: id.into(),
        host: "127.0.0.1".into(),
        http_port: vllm.port,
    }
}

/// A long prompt in the tiny model's vocabulary, distinct per `seed`.
fn text(seed: usize, words: usize) -> String {
    let vocab = [
        "the",
        "system",
        "user",
        "assistant",
        "request",
        "prompt",
        "answer",
        "question",
        "context",
        "document",
        "of",
        "and",
        "to",
        "in",
        "is",
        "you",
        "that",
        "it",
    ];
    let mut out = format!("{seed} ");
    for i in 0..words {
        out.push_str(vocab[(i * 7 + seed * 13 + i / 5) % vocab.len()]);
        out.push(if i % 11 == 10 { '.' } else { ' ' });
    }
    out
}

async fn post(client: &reqwest::Client, url: String, body: Value) -> Value {
    let resp = client
        .post(&url)
        .json(&body)
        .timeout(Duration::from_secs(120))
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    let status = resp.status();
    let text = resp.text().await.unwrap();
    assert!(status.is_success(), "POST {url}: {status}: {text}");
    serde_json::from_str(&text).unwrap_or(Value::Null)
}

/// Sends distinct prompts of a few full blocks until the subscriber has heard a batch. A publisher
/// that connects to the subscriber's bound socket (the bind topology) drops what it publishes
/// before its connection and subscription are up (ZMQ's "slow joiner"); vLLM started long before
/// the subscriber bound and retries its connection every 100 ms, so a test's first requests can
/// be published to nobody.
async fn until_heard(
    client: &reqwest::Client,
    vllm: &Vllm,
    seen: &Shared,
    metrics: &KvEventsMetrics,
) {
    for i in 0..20 {
        post(
            client,
            vllm.url("/v1/completions"),
            json!({"model": "tiny", "prompt": text(900 + i, 300), "max_tokens": 1}),
        )
        .await;
        if eventually(Duration::from_secs(2), || {
            !seen.lock().unwrap().batches.is_empty()
        })
        .await
        {
            eprintln!(
                "the subscriber heard its first batch after {} prompt(s)",
                i + 1
            );
            return;
        }
    }
    let clears = seen.lock().unwrap().clears.len();
    panic!(
        "the subscriber heard no batch after 20 prompts sent over 40 s: {} undecodable, {clears} clears",
        metrics.decode_errors()
    );
}

fn ids(v: &Value) -> Vec<u32> {
    v["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

/// The int hashes every BlockStored of `replica` announced.
fn stored_hashes(seen: &Seen, replica: &str) -> HashSet<u64> {
    seen.batches
        .iter()
        .filter(|(r, _, _)| r == replica)
        .flat_map(|(_, _, b)| b.events.iter())
        .filter_map(|e| match e {
            Event::BlockStored(s) => Some(s.block_hashes.iter().map(|h| h.as_u64())),
            _ => None,
        })
        .flatten()
        .collect()
}

fn block_size_of(seen: &Seen, replica: &str) -> usize {
    seen.index
        .block_size(replica)
        .expect("a BlockStored told the block size")
}

fn chat(seed: usize) -> Value {
    json!([
        {"role": "system", "content": text(seed, 120)},
        {"role": "user", "content": format!("question {seed}: what is the answer?")},
        {"role": "assistant", "content": "the answer is in the document."},
        {"role": "user", "content": [{"type": "text", "text": text(seed + 1, 60)}, {"type": "text", "text": "and you?"}]},
    ])
}

#[test]
fn our_tokenizer_gives_vllms_own_ids_for_completions_and_chat() {
    let Some(_engine) = engine_test(
        "engine_state_vllm::our_tokenizer_gives_vllms_own_ids_for_completions_and_chat",
    ) else {
        return;
    };
    let vllm = Vllm::start(VllmOptions {
        port: free_port(),
        ..VllmOptions::default()
    });
    let tokenizer = Tokenizer::from_dir(&model_dir()).expect("the model's tokenizer");
    runtime().block_on(async {
        let client = reqwest::Client::new();
        let prompts = [
            text(1, 200),
            "hello".to_owned(),
            "  leading spaces, unicode é ü 😀 and <|user|> special tokens\n\nnew lines\t".to_owned(),
            "0 7 13: (0) [0] {'k': 0} 0.000 - _ # @ $ % ^ & * + = / \\ | ~ `".to_owned(),
        ];
        for p in &prompts {
            let theirs = ids(&post(&client, vllm.url("/tokenize"), json!({"model": "tiny", "prompt": p})).await);
            let ours = tokenizer.encode_completion(p).unwrap();
            assert_eq!(ours, theirs, "completion prompt {p:?}");
        }
        let chats = [
            chat(3),
            json!([{"role": "user", "content": "hi"}]),
            json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "  x  "}]),
        ];
        for messages in &chats {
            let theirs = ids(
                &post(
                    &client,
                    vllm.url("/tokenize"),
                    json!({"model": "tiny", "messages": messages, "add_generation_prompt": true}),
                )
                .await,
            );
            let ours = tokenizer
                .encode_chat(messages, &ChatOptions::chat_completions())
                .unwrap();
            assert_eq!(ours, theirs, "chat {messages}");
        }
        // And without the generation prompt.
        let messages = chat(5);
        let theirs = ids(
            &post(
                &client,
                vllm.url("/tokenize"),
                json!({"model": "tiny", "messages": messages, "add_generation_prompt": false}),
            )
            .await,
        );
        let ours = tokenizer
            .encode_chat(&messages, &ChatOptions::default())
            .unwrap();
        assert_eq!(ours, theirs);
    });
}

#[test]
fn events_bound_by_the_producer_are_indexed_with_hashes_equal_to_ours_and_a_reset_clears_them() {
    let Some(_engine) = engine_test("engine_state_vllm::events_bound_by_the_producer_are_indexed_with_hashes_equal_to_ours_and_a_reset_clears_them") else {
        return;
    };
    let events_port = free_port();
    let replay_port = free_port();
    let vllm = Vllm::start(VllmOptions {
        port: free_port(),
        kv_events: Some(json!({
            "enable_kv_cache_events": true,
            "publisher": "zmq",
            "endpoint": format!("tcp://127.0.0.1:{events_port}"),
            "replay_endpoint": format!("tcp://127.0.0.1:{replay_port}"),
            "topic": "replica-a",
        })),
        args: vec!["--prefix-caching-hash-algo".into(), "sha256_cbor".into()],
        env: vec![("VLLM_SERVER_DEV_MODE".into(), "1".into())],
        ..VllmOptions::default()
    });
    let tokenizer = Tokenizer::from_dir(&model_dir()).expect("the model's tokenizer");
    runtime().block_on(async {
        let registry = prometheus::Registry::new();
        let metrics = KvEventsMetrics::register(&registry).unwrap();
        let (_endpoints_tx, endpoints) = watch::channel(vec![endpoint("replica-a", &vllm)]);
        let (tx, rx) = mpsc::channel(1024);
        let mut config = SubscriberConfig::new(Topology::Bind {
            endpoint: format!("tcp://127.0.0.1:{events_port}"),
        });
        config.replay_address = Some(format!("tcp://{{host}}:{replay_port}"));
        let _sub = KvEventsSubscriber::spawn(config, endpoints, tx, metrics.clone())
            .await
            .expect("binding the events endpoint");
        let seen = consume(rx, metrics.clone());
        let client = reqwest::Client::new();
        until_heard(&client, &vllm, &seen, &metrics).await;

        // A completion sent straight to the replica.
        let prompt = text(11, 400);
        let prompt_ids = tokenizer.encode_completion(&prompt).unwrap();
        post(&client, vllm.url("/v1/completions"), json!({"model": "tiny", "prompt": prompt, "max_tokens": 1})).await;
        // A chat request.
        let messages = chat(21);
        let chat_ids = tokenizer.encode_chat(&messages, &ChatOptions::chat_completions()).unwrap();
        post(&client, vllm.url("/v1/chat/completions"), json!({"model": "tiny", "messages": messages, "max_tokens": 1})).await;

        for (what, ids) in [("completion", &prompt_ids), ("chat", &chat_ids)] {
            let arrived = eventually(Duration::from_secs(30), || {
                let s = seen.lock().unwrap();
                s.index.block_size("replica-a").is_some_and(|bs| {
                    s.index.held(ids).iter().any(|h| h.replica == "replica-a" && h.blocks == ids.len() / bs)
                })
            })
            .await;
            let s = seen.lock().unwrap();
            assert!(arrived, "{what}: the replica's events never showed all {} tokens' full blocks held; batches: {}", ids.len(), s.batches.len());
            let bs = block_size_of(&s, "replica-a");
            let ours: Vec<u64> = prompt_block_hashes(ids, bs, DEFAULT_NONE_HASH_SEED).iter().map(event_int).collect();
            assert!(!ours.is_empty(), "{what}: a prompt of {} tokens has a full block of {bs}", ids.len());
            let theirs = stored_hashes(&s, "replica-a");
            for (i, h) in ours.iter().enumerate() {
                assert!(theirs.contains(h), "{what}: block {i}'s sha256_cbor hash {h:#x} from our token ids is not among the engine's {theirs:x?}");
            }
        }
        assert!(metrics.events("BlockStored") > 0);
        assert_eq!(metrics.gaps(), 0);

        // A reset on the replica drops what it holds. vLLM publishes the AllBlocksCleared with
        // its next engine step's batch, so one more (short) request follows the reset.
        post(&client, vllm.url("/reset_prefix_cache"), json!({})).await;
        post(&client, vllm.url("/v1/completions"), json!({"model": "tiny", "prompt": "hello", "max_tokens": 1})).await;
        let cleared = eventually(Duration::from_secs(30), || metrics.events("AllBlocksCleared") == 1).await;
        assert!(cleared, "no AllBlocksCleared after POST /reset_prefix_cache and one more request");
        let s = seen.lock().unwrap();
        assert!(s.index.held(&prompt_ids).is_empty() && s.index.held(&chat_ids).is_empty(), "the reset replica still holds the prompts");
        assert_eq!(metrics.resets("cleared"), 1);
        assert_eq!(s.index.blocks_held("replica-a"), 0, "\"hello\" is shorter than a block");
    });
}

#[test]
fn each_engines_own_publisher_is_followed_and_a_rejoining_endpoint_replays_what_it_missed() {
    let Some(_engine) = engine_test("engine_state_vllm::each_engines_own_publisher_is_followed_and_a_rejoining_endpoint_replays_what_it_missed") else {
        return;
    };
    // Each engine binds its own publisher and replay socket. vLLM binds only addresses with "*"
    // (every interface) or IPC sockets; the tests stay off the network with IPC.
    let sockets = tempfile::tempdir().unwrap();
    let dir = sockets.path().display().to_string();
    let mut engines = Vec::new();
    for id in ["a", "b"] {
        let vllm = Vllm::start(VllmOptions {
            port: free_port(),
            kv_events: Some(json!({
                "enable_kv_cache_events": true,
                "publisher": "zmq",
                "endpoint": format!("ipc://{dir}/{id}-events.sock"),
                "replay_endpoint": format!("ipc://{dir}/{id}-replay.sock"),
                "topic": "kv",
            })),
            ..VllmOptions::default()
        });
        engines.push(vllm);
    }
    runtime().block_on(async {
        let tokenizer = Tokenizer::from_dir(&model_dir()).unwrap();
        let client = reqwest::Client::new();
        let a = endpoint("a", &engines[0]);
        let b = endpoint("b", &engines[1]);
        let metrics = KvEventsMetrics::register(&prometheus::Registry::new()).unwrap();
        let (endpoints_tx, endpoints) = watch::channel(vec![a.clone(), b.clone()]);
        let (tx, rx) = mpsc::channel(1024);
        let mut config = SubscriberConfig::new(Topology::Connect {
            address: format!("ipc://{dir}/{{id}}-events.sock"),
        });
        config.replay_address = Some(format!("ipc://{dir}/{{id}}-replay.sock"));
        let _sub = KvEventsSubscriber::spawn(config, endpoints, tx, metrics.clone())
            .await
            .unwrap();
        let seen = consume(rx, metrics.clone());
        // Give the SUB sockets a moment to connect (a batch published before would be replayed
        // on the first one after, anyway).
        tokio::time::sleep(Duration::from_millis(500)).await;

        let p1 = text(31, 300);
        let p1_ids = tokenizer.encode_completion(&p1).unwrap();
        post(
            &client,
            engines[0].url("/v1/completions"),
            json!({"model": "tiny", "prompt": p1, "max_tokens": 1}),
        )
        .await;
        let held = eventually(Duration::from_secs(30), || {
            !seen.lock().unwrap().index.held(&p1_ids).is_empty()
        })
        .await;
        assert!(
            held,
            "a prompt sent straight to engine a never showed in its events"
        );
        {
            let s = seen.lock().unwrap();
            let bs = block_size_of(&s, "a");
            let held = s.index.held(&p1_ids);
            assert_eq!(held.len(), 1, "only a holds it: {held:?}");
            assert_eq!((held[0].replica, held[0].blocks), ("a", p1_ids.len() / bs));
        }

        // b leaves the endpoint set (disconnected), gets a prompt nobody hears, and comes back:
        // its first batch after rejoining is past sequence 0, so the subscriber replays the rest.
        endpoints_tx.send(vec![a.clone()]).unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let p2 = text(41, 300);
        let p2_ids = tokenizer.encode_completion(&p2).unwrap();
        post(
            &client,
            engines[1].url("/v1/completions"),
            json!({"model": "tiny", "prompt": p2, "max_tokens": 1}),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            seen.lock().unwrap().index.held(&p2_ids).is_empty(),
            "b's events were heard while it was out of the set"
        );
        endpoints_tx.send(vec![a.clone(), b.clone()]).unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let p3 = text(51, 300);
        let p3_ids = tokenizer.encode_completion(&p3).unwrap();
        post(
            &client,
            engines[1].url("/v1/completions"),
            json!({"model": "tiny", "prompt": p3, "max_tokens": 1}),
        )
        .await;
        let both = eventually(Duration::from_secs(30), || {
            let s = seen.lock().unwrap();
            s.index.held(&p2_ids).iter().any(|h| h.replica == "b")
                && s.index.held(&p3_ids).iter().any(|h| h.replica == "b")
        })
        .await;
        assert!(
            both,
            "b holds p2 (replayed) and p3 (live); replays complete={} lost={} failed={}",
            metrics.replays("complete"),
            metrics.replays("lost"),
            metrics.replays("failed")
        );
        assert!(metrics.replays("complete") >= 1);
        let s = seen.lock().unwrap();
        let b_seqs: Vec<u64> = s
            .batches
            .iter()
            .filter(|(r, _, _)| r == "b")
            .map(|(_, seq, _)| *seq)
            .collect();
        let rejoined = b_seqs
            .iter()
            .rposition(|&q| q == 0)
            .expect("b's batches replayed from 0");
        assert!(
            b_seqs[rejoined..].windows(2).all(|w| w[1] == w[0] + 1),
            "after rejoining, b's batches are applied in sequence order: {b_seqs:?}"
        );
        assert!(
            s.index.held(&p1_ids).iter().all(|h| h.replica == "a"),
            "a's prompt is a's alone"
        );
    });
}

#[test]
fn an_engine_eviction_is_seen_as_block_removed_and_the_evicted_prompt_is_no_longer_held() {
    let Some(_engine) = engine_test("engine_state_vllm::an_engine_eviction_is_seen_as_block_removed_and_the_evicted_prompt_is_no_longer_held") else {
        return;
    };
    let events_port = free_port();
    let vllm = Vllm::start(VllmOptions {
        port: free_port(),
        kv_events: Some(json!({
            "enable_kv_cache_events": true,
            "publisher": "zmq",
            "endpoint": format!("tcp://127.0.0.1:{events_port}"),
            "topic": "e",
        })),
        // 24 blocks of 128 tokens: room for about three of the prompts below.
        args: vec!["--num-gpu-blocks-override".into(), "24".into()],
        ..VllmOptions::default()
    });
    runtime().block_on(async {
        let tokenizer = Tokenizer::from_dir(&model_dir()).unwrap();
        let registry = prometheus::Registry::new();
        let metrics = KvEventsMetrics::register(&registry).unwrap();
        let (_endpoints_tx, endpoints) = watch::channel(vec![endpoint("e", &vllm)]);
        let (tx, rx) = mpsc::channel(1024);
        let config = SubscriberConfig::new(Topology::Bind {
            endpoint: format!("tcp://127.0.0.1:{events_port}"),
        });
        let _sub = KvEventsSubscriber::spawn(config, endpoints, tx, metrics.clone())
            .await
            .unwrap();
        let seen = consume(rx, metrics.clone());
        let client = reqwest::Client::new();
        until_heard(&client, &vllm, &seen, &metrics).await;
        let prompts: Vec<String> = (0..12).map(|i| text(100 + i, 500)).collect();
        let first_ids = tokenizer.encode_completion(&prompts[0]).unwrap();
        for p in &prompts {
            post(
                &client,
                vllm.url("/v1/completions"),
                json!({"model": "tiny", "prompt": p, "max_tokens": 1}),
            )
            .await;
        }
        let evicted = eventually(Duration::from_secs(30), || {
            metrics.events("BlockRemoved") > 0
        })
        .await;
        assert!(
            evicted,
            "no BlockRemoved after {} prompts on a 24-block cache",
            prompts.len()
        );
        // The oldest prompt's blocks went first (the engine evicts least recently used).
        let gone = eventually(Duration::from_secs(30), || {
            let s = seen.lock().unwrap();
            let full = first_ids.len() / block_size_of(&s, "e");
            s.index
                .held(&first_ids)
                .iter()
                .all(|h| h.replica != "e" || h.blocks < full)
        })
        .await;
        // The newest prompt's batch may still be on its way when the oldest is seen gone.
        let last_ids = tokenizer
            .encode_completion(prompts.last().unwrap())
            .unwrap();
        let newest_held = |s: &Seen| {
            let full = last_ids.len() / block_size_of(s, "e");
            s.index.held(&last_ids).first().map(|h| h.blocks) == Some(full)
        };
        let held = eventually(Duration::from_secs(30), || {
            newest_held(&seen.lock().unwrap())
        })
        .await;
        let s = seen.lock().unwrap();
        assert!(
            gone,
            "the first prompt is still held in full: {:?}",
            s.index.held(&first_ids)
        );
        assert!(
            s.index.blocks_held("e") <= 24,
            "the index holds {} blocks, the engine at most 24",
            s.index.blocks_held("e")
        );
        assert!(
            held,
            "the newest prompt is not held in full: {:?} of {} tokens",
            s.index.held(&last_ids),
            last_ids.len()
        );
    });
}

#[test]
fn engine_load_is_scraped_from_vllms_metrics() {
    let Some(_engine) = engine_test("engine_state_vllm::engine_load_is_scraped_from_vllms_metrics")
    else {
        return;
    };
    let vllm = Vllm::start(VllmOptions {
        port: free_port(),
        ..VllmOptions::default()
    });
    runtime().block_on(async {
        let client = reqwest::Client::new();
        // A request first, so that the cache holds something.
        post(
            &client,
            vllm.url("/v1/completions"),
            json!({"model": "tiny", "prompt": text(7, 300), "max_tokens": 1}),
        )
        .await;
        let (load, counters) = scrape_load(&client, &vllm.url("/metrics"), Duration::from_secs(5))
            .await
            .expect("a scrape");
        // The counters the time cost learns a replica's speed from (docs/behaviour.md §7).
        assert!(counters.prompt_tokens >= Some(300.0), "{counters:?}");
        assert!(counters.prefill_requests >= Some(1.0), "{counters:?}");
        assert!(counters.prefill_seconds > Some(0.0), "{counters:?}");
        assert!(counters.generation_tokens >= Some(1.0), "{counters:?}");
        assert_eq!(load.len(), 1, "{load:?}");
        assert_eq!(load[0].model.as_deref(), Some("tiny"));
        assert_eq!(
            (load[0].waiting, load[0].running),
            (0.0, 0.0),
            "idle after the request: {load:?}"
        );
        assert!((0.0..=1.0).contains(&load[0].kv_cache_usage), "{load:?}");

        // The scraper, on an interval, through the endpoints watch.
        let (_tx, endpoints) = watch::channel(vec![endpoint("x", &vllm)]);
        let (sink, mut reports) = mpsc::channel(16);
        let config = LoadScraperConfig {
            interval: Duration::from_millis(200),
            ..LoadScraperConfig::default()
        };
        let task = spawn_load_scraper(config, endpoints, sink);
        for _ in 0..2 {
            let report = tokio::time::timeout(Duration::from_secs(10), reports.recv())
                .await
                .expect("a report in time")
                .expect("the scraper runs");
            assert_eq!(report.replica, "x");
            assert_eq!(
                report.load.expect("a scrape").0[0].model.as_deref(),
                Some("tiny")
            );
        }
        task.abort();
        // A port nobody listens on is an error, not a hang.
        let dead = format!("http://127.0.0.1:{}/metrics", free_port());
        assert!(scrape_load(&client, &dead, Duration::from_secs(2))
            .await
            .is_err());
    });
}

#[test]
fn a_gap_in_sequence_numbers_is_replayed_and_without_replay_the_replica_is_cleared() {
    let Some(_engine) = engine_test("engine_state_vllm::a_gap_in_sequence_numbers_is_replayed_and_without_replay_the_replica_is_cleared") else {
        return;
    };
    let rt = runtime();
    // The engine binds its publisher (connect topology); the subscriber reaches it through a
    // relay that can cut the connection. A bound ZMQ publisher drops what it publishes while a
    // subscriber is away, so the batches of a cut are really lost. (In the bind topology the
    // engine's connecting publisher queues for a lost connection and resends after it, so a
    // short cut loses nothing there.)
    let sockets = tempfile::tempdir().unwrap();
    let dir = sockets.path().display().to_string();
    let relay = rt.block_on(vllm::Relay::start(format!("unix:{dir}/events.sock")));
    let vllm = Vllm::start(VllmOptions {
        port: free_port(),
        kv_events: Some(json!({
            "enable_kv_cache_events": true,
            "publisher": "zmq",
            "endpoint": format!("ipc://{dir}/events.sock"),
            "replay_endpoint": format!("ipc://{dir}/replay.sock"),
            "topic": "kv",
        })),
        ..VllmOptions::default()
    });
    rt.block_on(async {
        let tokenizer = Tokenizer::from_dir(&model_dir()).unwrap();
        let client = reqwest::Client::new();
        let complete = |p: String| {
            let client = client.clone();
            let url = vllm.url("/v1/completions");
            async move {
                post(
                    &client,
                    url,
                    json!({"model": "tiny", "prompt": p, "max_tokens": 1}),
                )
                .await
            }
        };
        let holds = |seen: &Shared, ids: &[u32]| {
            seen.lock()
                .unwrap()
                .index
                .held(ids)
                .iter()
                .any(|h| h.replica == "g")
        };
        let subscribe = |replay: bool| {
            let (endpoints_tx, endpoints) = watch::channel(vec![endpoint("g", &vllm)]);
            let (tx, rx) = mpsc::channel(1024);
            let mut config = SubscriberConfig::new(Topology::Connect {
                address: format!("tcp://{{host}}:{}", relay.port),
            });
            config.replay_address = replay.then(|| format!("ipc://{dir}/replay.sock"));
            config.replay_on_join = false;
            let metrics = KvEventsMetrics::register(&prometheus::Registry::new()).unwrap();
            async move {
                let sub = KvEventsSubscriber::spawn(config, endpoints, tx, metrics.clone())
                    .await
                    .unwrap();
                let seen = consume(rx, metrics.clone());
                (sub, endpoints_tx, seen, metrics)
            }
        };
        let prompt = |seed| {
            let p = text(seed, 300);
            let ids = tokenizer.encode_completion(&p).unwrap();
            (p, ids)
        };
        // Cuts the relay, has the engine publish `lost` while cut, restores it, then sends
        // prompts (at most 20) until the subscriber reports a gap; the last prompt's ids.
        let cut_and_resume =
            |metrics: KvEventsMetrics, seen: Shared, lost: String, first_seed: usize| {
                let relay = &relay;
                let complete = &complete;
                let prompt = &prompt;
                async move {
                    relay.cut();
                    complete(lost).await;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    relay.restore();
                    let mut last = Vec::new();
                    for seed in first_seed..first_seed + 20 {
                        let (p, ids) = prompt(seed);
                        complete(p).await;
                        last = ids;
                        if eventually(Duration::from_secs(2), || metrics.gaps() > 0).await {
                            break;
                        }
                    }
                    assert_eq!(
                        metrics.gaps(),
                        1,
                        "one gap after the cut; batches {:?}",
                        seen.lock()
                            .unwrap()
                            .batches
                            .iter()
                            .map(|(_, q, _)| *q)
                            .collect::<Vec<_>>()
                    );
                    assert!(
                        eventually(Duration::from_secs(30), || holds(&seen, &last)).await,
                        "the live batch after the gap is applied"
                    );
                }
            };

        // With replay: the batch lost in the cut comes back from the replay socket, in order.
        let (sub, _tx, seen, metrics) = subscribe(true).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (p1, p1_ids) = prompt(61);
        complete(p1).await;
        assert!(
            eventually(Duration::from_secs(30), || holds(&seen, &p1_ids)).await,
            "p1 heard"
        );
        let (p2, p2_ids) = prompt(62);
        cut_and_resume(metrics.clone(), seen.clone(), p2, 63).await;
        assert_eq!(
            (
                metrics.replays("complete"),
                metrics.replays("lost"),
                metrics.replays("failed")
            ),
            (1, 0, 0)
        );
        assert!(holds(&seen, &p2_ids), "p2 came back through the replay");
        assert!(holds(&seen, &p1_ids), "nothing was cleared");
        {
            let s = seen.lock().unwrap();
            let seqs: Vec<u64> = s.batches.iter().map(|(_, q, _)| *q).collect();
            assert!(
                seqs.windows(2).all(|w| w[1] == w[0] + 1),
                "applied in order, none missing: {seqs:?}"
            );
            assert!(s.clears.is_empty());
        }
        drop(sub);

        // Without replay: the replica's state after a gap is unknowable, so it is cleared first.
        let (_sub, _tx, seen, metrics) = subscribe(false).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (p4, p4_ids) = prompt(81);
        complete(p4).await;
        assert!(
            eventually(Duration::from_secs(30), || holds(&seen, &p4_ids)).await,
            "p4 heard by the second subscriber"
        );
        cut_and_resume(metrics.clone(), seen.clone(), prompt(82).0, 83).await;
        assert_eq!(metrics.resets("lost"), 1);
        assert!(
            !holds(&seen, &p4_ids),
            "what was held before the gap was cleared"
        );
    });
    drop(vllm);
    drop(relay);
}
