//! Zero-wait mode (`windowDurationMs: 0`, docs/behaviour.md §3): each request is placed the
//! moment it arrives, siblings following the ones already placed, through every front-end.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use burst_prefix_producer::epp::data_plane;
use common::ext_proc::ExtProc;
use common::{completion, sample, Local};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response;
use serde_json::{json, Value};

/// Six prompts x eight samples, sent one after the other as a driver's loop sends them.
async fn rollout(local: &Local, hinted: bool) -> BTreeMap<String, BTreeSet<String>> {
    let mut landed: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for prompt in 0..6 {
        let text = format!("prompt {prompt}: ").repeat(40);
        for _ in 0..8 {
            let mut body = completion(&text);
            if hinted {
                body["burst_prefix"] = json!({"group_size": 8});
            }
            let (status, _, answer) = local.produce(&body).await;
            assert_eq!(status, 200, "{answer}");
            assert_eq!(answer["window"]["sealedBy"], "arrival", "{answer}");
            assert!(answer["window"]["waitedMs"].as_f64().unwrap() < 1_000.0);
            let endpoint = answer["assignedEndpoint"].as_str().unwrap().to_string();
            landed.entry(text.clone()).or_default().insert(endpoint);
        }
    }
    landed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_to_produce_follows_its_first_members_and_spreads_groups_without_a_window() {
    for hinted in [false, true] {
        let local = Local::start(&format!(
            "windowDurationMs: 0\nbalanceBy: requests\n{}",
            common::endpoints(4)
        ))
        .await;
        let landed = rollout(&local, hinted).await;
        for (prompt, endpoints) in &landed {
            assert_eq!(endpoints.len(), 1, "{prompt:.20} split: {endpoints:?}");
        }
        let used: BTreeSet<&String> = landed.values().flatten().collect();
        // No window saw the six groups together: their spread comes from the work in flight
        // (each group's requests still count when the next group arrives).
        assert_eq!(used.len(), 4, "hinted {hinted}: {landed:?}");
        let metrics = local.metrics().await;
        assert_eq!(
            sample(
                &metrics,
                "burst_prefix_requests_total{outcome=\"assigned\"}"
            ),
            48.0
        );
        assert_eq!(
            sample(&metrics, "burst_prefix_window_size_count"),
            0.0,
            "no window was planned"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k_splits_a_group_on_arrival() {
    let local = Local::start(&format!(
        "windowDurationMs: 0\nbalanceBy: requests\nmaxPerReplica: 2\n{}",
        common::endpoints(4)
    ))
    .await;
    let text = "one prompt, eight samples ".repeat(20);
    let mut per: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..8 {
        let (status, _, answer) = local.produce(&completion(&text)).await;
        assert_eq!(status, 200, "{answer}");
        *per.entry(answer["assignedEndpoint"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    assert_eq!(per.values().copied().collect::<Vec<_>>(), vec![2, 2, 2, 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_places_on_arrival_and_a_finished_request_stops_counting() {
    let (_stubs, yaml) =
        common::stub_engines(2, "windowDurationMs: 0\nbalanceBy: requests\n").await;
    let local = Local::start(&yaml).await;
    let send = |prompt: String| {
        let client = local.client.clone();
        let url = format!("{}/v1/completions", local.base);
        async move {
            let response = client
                .post(url)
                .json(&json!({"model": "m", "prompt": prompt, "max_tokens": 2}))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
            let endpoint = response.headers()["x-burst-prefix-endpoint"]
                .to_str()
                .unwrap()
                .to_string();
            let _: Value = response.json().await.unwrap();
            endpoint
        }
    };
    // Lone prompts one after the other: each finished before the next arrives, so none counts
    // against the other replica, and the tie-break (lower id) takes every one.
    let mut lone = BTreeSet::new();
    for i in 0..4 {
        lone.insert(send(format!("lone prompt {i} ").repeat(20)).await);
    }
    assert_eq!(lone, BTreeSet::from(["ns/e0".to_string()]), "{lone:?}");
    // The same prompt again and again follows its first placement.
    let text = "a conversation's system prompt ".repeat(20);
    let first = send(text.clone()).await;
    for _ in 0..3 {
        assert_eq!(send(text.clone()).await, first);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_picker_places_on_arrival() {
    let local = Local::start(&format!(
        "windowDurationMs: 0\nbalanceBy: requests\n{}",
        common::endpoints(4)
    ))
    .await;
    let full_duplex = || {
        Some(data_plane::protocol(
            BodySendMode::FullDuplexStreamed,
            BodySendMode::FullDuplexStreamed,
        ))
    };
    let body = completion(&"picked on arrival ".repeat(20)).to_string();
    let mut picked = BTreeSet::new();
    let mut streams = Vec::new();
    for _ in 0..4 {
        let mut stream = ExtProc::open(&local).await;
        stream
            .send(data_plane::request_headers(full_duplex(), &[], None, false))
            .await;
        stream
            .send(data_plane::request_body(body.as_bytes(), true))
            .await;
        let answer = stream.next().await;
        let Some(processing_response::Response::RequestHeaders(headers)) = &answer.response else {
            panic!("not a routing answer: {answer:?}");
        };
        let mutation = headers.response.as_ref().unwrap().header_mutation.as_ref();
        let destination = mutation
            .unwrap()
            .set_headers
            .iter()
            .find_map(|h| {
                let h = h.header.as_ref()?;
                (h.key == "x-gateway-destination-endpoint")
                    .then(|| String::from_utf8(h.raw_value.clone()).unwrap())
            })
            .unwrap();
        picked.insert(destination.split(',').next().unwrap().to_string());
        // Kept open: its request is still in flight.
        streams.push(stream);
    }
    assert_eq!(picked.len(), 1, "siblings followed the first: {picked:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_follows_its_history_after_a_quiet_pause() {
    // Eight conversations through the proxy, a round of turns at a time, the turns of a round
    // sent together and held in flight together (the stub answers after 100 ms), a pause between
    // rounds: as an RL driver's multi-turn rollout sends them. Every placement of a round is
    // finished before the next round, so what each replica holds is known from the memory alone
    // (its touches must be merged before the next round's first placement, however close
    // together the last round's were).
    // Tokens mode: a turn's price on a replica is the blocks it prefills there (in requests mode
    // the fair share of the work in flight would move the second turn to arrive on a replica).
    let (_stubs, yaml) = common::stub_engines(4, "windowDurationMs: 0\nbalanceBy: tokens\n").await;
    let local = Local::start(&yaml).await;
    let send = |prompt: String| {
        let client = local.client.clone();
        let url = format!("{}/v1/completions", local.base);
        async move {
            let response = client
                .post(url)
                .json(&json!({"model": "m", "prompt": prompt, "max_tokens": 2,
                              "stub": {"delayMs": 100}}))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
            let endpoint = response.headers()["x-burst-prefix-endpoint"]
                .to_str()
                .unwrap()
                .to_string();
            let _: Value = response.json().await.unwrap();
            endpoint
        }
    };
    // A long history (many blocks) and short new turns: a turn is cheaper where its history is
    // than anywhere else, even behind the other conversation on that replica.
    let mut histories: Vec<String> = (0..8)
        .map(|c| format!("conversation {c} has a long history. ").repeat(60))
        .collect();
    let mut homes: Vec<String> =
        futures::future::join_all(histories.iter().cloned().map(send)).await;
    let spread: BTreeSet<&String> = homes.iter().collect();
    assert_eq!(
        spread.len(),
        4,
        "the first turns in flight together spread: {homes:?}"
    );
    for turn in 1..=4 {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        for (c, history) in histories.iter_mut().enumerate() {
            history.push_str(&format!("turn {turn} of conversation {c}. "));
        }
        let landed = futures::future::join_all(histories.iter().cloned().map(send)).await;
        assert_eq!(
            landed, homes,
            "turn {turn}: every conversation where its history is"
        );
        homes = landed;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_answers_asked_for_keep_a_group_on_fewer_replicas() {
    // The defaults (on arrival, priced in seconds): 64 samples of a ~2,000-token prompt. Priced
    // at the configured 256-token answers, the decoding they slow outweighs another prefill
    // after a few dozen on one replica; asking for 4 tokens each, it never does.
    let text = "a long shared rollout prompt ".repeat(280);
    let mut used = Vec::new();
    for max_tokens in [None, Some(4)] {
        let local = Local::start(&common::endpoints(4)).await;
        let mut on = BTreeSet::new();
        for _ in 0..64 {
            let mut body = completion(&text);
            if let Some(max_tokens) = max_tokens {
                body["max_tokens"] = json!(max_tokens);
            }
            let (status, _, answer) = local.produce(&body).await;
            assert_eq!(status, 200, "{answer}");
            on.insert(answer["assignedEndpoint"].as_str().unwrap().to_string());
        }
        used.push(on.len());
    }
    assert!(used[0] > 1, "256-token answers kept together: {used:?}");
    assert_eq!(used[1], 1, "{used:?}");
}
