//! Memory across windows (docs/behaviour.md §7) through the service: a conversation's next turn, in
//! a later window, goes where its first turn was placed; the metrics say so.

mod common;

use std::collections::BTreeMap;

use common::{endpoints, sample, Local};
use serde_json::{json, Value};

const SYSTEM: &str = "You are a careful assistant. Answer in short sentences, cite your sources \
    and say so when you do not know. Never invent a reference. Keep code samples minimal. ";

fn chat(messages: &[(&str, String)]) -> Value {
    let messages: Vec<Value> = messages
        .iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    json!({"model": "m", "messages": messages})
}

/// Session `s` after `turns` user turns (each answered but the last).
fn conversation(s: usize, turns: usize) -> Value {
    let mut messages = vec![("system", SYSTEM.repeat(3))];
    for t in 0..turns {
        messages.push((
            "user",
            format!("Session {s}, question {t}: {}", "why? ".repeat(60)),
        ));
        if t + 1 < turns {
            messages.push((
                "assistant",
                format!("Answer {t} to session {s}. ").repeat(20),
            ));
        }
    }
    chat(&messages)
}

/// Sends one request per session at once, waits until they all joined one window, and returns
/// the answers by session.
async fn window_of(local: &Local, bodies: Vec<Value>) -> Vec<Value> {
    let count = bodies.len();
    let sends: Vec<_> = bodies
        .into_iter()
        .map(|body| {
            let client = local.client.clone();
            let url = format!("{}/v1/produce", local.base);
            tokio::spawn(async move { common::post(&client, &url, body.to_string()).await })
        })
        .collect();
    local.until_window_holds(count).await;
    let mut answers = Vec::new();
    for send in sends {
        let (status, _, answer) = send.await.unwrap();
        assert_eq!(status, 200, "{answer}");
        answers.push(answer);
    }
    answers
}

fn assigned(answer: &Value) -> Option<String> {
    answer["assignedEndpoint"].as_str().map(str::to_string)
}

fn matches(answer: &Value) -> BTreeMap<String, u64> {
    answer["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["endpoint"].as_str().unwrap().to_string(),
                m["matchBlocks"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_turn_goes_where_the_first_was_placed() {
    let local = Local::start(&format!("windowDurationMs: 400\n{}", endpoints(4))).await;
    let first = window_of(&local, (0..4).map(|s| conversation(s, 1)).collect()).await;
    // Four sessions on one system prompt: spread by the fair share, one per replica.
    let served: Vec<String> = first.iter().map(|a| assigned(a).unwrap()).collect();
    let mut distinct = served.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 4, "{served:?}");

    // The second turns, in another order, in the next window.
    let order = [2, 0, 3, 1];
    let second = window_of(&local, order.iter().map(|&s| conversation(s, 2)).collect()).await;
    assert_ne!(second[0]["window"]["id"], first[0]["window"]["id"]);
    for (answer, &s) in second.iter().zip(&order) {
        assert_eq!(
            assigned(answer).as_deref(),
            Some(served[s].as_str()),
            "session {s}"
        );
        // matches reflect memory: the assigned endpoint everything, the others the system
        // prompt they hold (the other sessions' first turns), never more than the first turn.
        let total = answer["totalBlocks"].as_u64().unwrap();
        let first_turn = first[s]["totalBlocks"].as_u64().unwrap();
        for (endpoint, blocks) in matches(answer) {
            if endpoint == served[s] {
                assert_eq!(blocks, total);
            } else {
                assert!(blocks > 0 && blocks < first_turn, "{endpoint}: {blocks}");
            }
        }
    }
    let metrics = local.metrics().await;
    assert_eq!(
        sample(&metrics, "burst_prefix_placements_total{source=\"memory\"}"),
        4.0
    );
    for endpoint in &served {
        let series = format!("burst_prefix_memory_blocks{{endpoint=\"{endpoint}\"}}");
        assert!(sample(&metrics, &series) > 0.0, "{series}");
    }

    // An endpoint that leaves the config loses its model (and its series).
    local
        .producer()
        .config_store()
        .apply_text(&format!("windowDurationMs: 400\n{}", endpoints(3)))
        .unwrap();
    window_of(&local, vec![conversation(9, 1)]).await;
    let metrics = local.metrics().await;
    assert!(!metrics.contains("burst_prefix_memory_blocks{endpoint=\"ns/p4-rank-0\"}"));
    assert!(metrics.contains("burst_prefix_memory_blocks{endpoint=\"ns/p1-rank-0\"}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_memory_the_second_turn_is_on_its_own() {
    let yaml = format!(
        "windowDurationMs: 400\nmemory: {{enabled: false}}\n{}",
        endpoints(4)
    );
    let local = Local::start(&yaml).await;
    let first = window_of(&local, (0..4).map(|s| conversation(s, 1)).collect()).await;
    // docs/behaviour.md §4 with N = 0: distinct prompts are no units; nothing is remembered either.
    assert!(first.iter().all(|a| assigned(a).is_none()));
    let second = window_of(&local, (0..4).map(|s| conversation(s, 2)).collect()).await;
    for answer in &second {
        assert_eq!(assigned(answer), None);
        assert!(matches(answer).values().all(|&blocks| blocks == 0));
    }
    let metrics = local.metrics().await;
    assert_eq!(
        sample(&metrics, "burst_prefix_placements_total{source=\"memory\"}"),
        0.0
    );
    assert!(!metrics.contains("burst_prefix_memory_blocks{"));
}
