//! `POST /v1/produce`, `POST /v1/plan`, `GET /v1/endpoints` and the admin port, over real TCP
//! against the service in-process on loopback.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use burst_prefix_core::Limits;
use common::{completion, endpoints, sample, Local};
use serde_json::{json, Value};

/// Sends `n` copies of `body` at once and waits until they all joined one window.
async fn burst(local: &Local, body: &Value, n: usize) -> Vec<Value> {
    let sends: Vec<_> = (0..n)
        .map(|_| {
            let client = local.client.clone();
            let url = format!("{}/v1/produce", local.base);
            let body = body.to_string();
            tokio::spawn(async move { common::post(&client, &url, body).await })
        })
        .collect();
    local.until_window_holds(n).await;
    let mut answers = Vec::new();
    for send in sends {
        let (status, _, answer) = send.await.unwrap();
        assert_eq!(status, 200, "{answer}");
        answers.push(answer);
    }
    answers
}

/// Requests per assigned endpoint.
fn spread(answers: &[Value]) -> Vec<usize> {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for answer in answers {
        *counts
            .entry(answer["assignedEndpoint"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    counts.into_values().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_identical_prompts_lands_on_one_endpoint() {
    let local = Local::start(&format!(
        "windowDurationMs: 1500\nbalanceBy: requests\n{}",
        endpoints(4)
    ))
    .await;
    let prompt = "You are a helpful assistant. ".repeat(40); // 1120 bytes: 280 tokens, 5 blocks.
    let answers = burst(&local, &completion(&prompt), 8).await;

    let assigned = answers[0]["assignedEndpoint"].as_str().unwrap().to_string();
    for answer in &answers {
        assert_eq!(answer["assignedEndpoint"], assigned.as_str());
        assert_eq!(answer["totalBlocks"], 5);
        assert_eq!(answer["blockSizeTokens"], 64);
        assert_eq!(answer["window"]["size"], 8);
        assert_eq!(answer["window"]["id"], answers[0]["window"]["id"]);
        assert!(answer["window"]["waitedMs"].as_f64().unwrap() >= 0.0);
        let matches = answer["matches"].as_array().unwrap();
        assert_eq!(matches.len(), 4);
        for m in matches {
            let here = m["endpoint"] == assigned.as_str();
            assert_eq!(m["matchBlocks"], if here { 5 } else { 0 }, "{m}");
            assert_eq!(m["totalBlocks"], 5);
            assert_eq!(m["score"], if here { 1.0 } else { 0.0 });
            assert!(m["address"].as_str().unwrap().ends_with(":8000"));
        }
    }
    let metrics = local.metrics().await;
    assert_eq!(
        sample(
            &metrics,
            "burst_prefix_requests_total{outcome=\"assigned\"}"
        ),
        8.0
    );
    assert_eq!(
        sample(&metrics, "burst_prefix_units_total{kind=\"group\"}"),
        1.0
    );
    assert_eq!(sample(&metrics, "burst_prefix_window_size_sum"), 8.0);
    assert_eq!(
        sample(&metrics, "burst_prefix_window_plan_seconds_count"),
        1.0
    );
    assert_eq!(
        sample(&metrics, "burst_prefix_request_wait_seconds_count"),
        8.0
    );
    assert_eq!(sample(&metrics, "burst_prefix_endpoints"), 4.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k_splits_a_group_as_the_spec_says() {
    for (k, expected) in [(2, vec![2, 2, 2, 2]), (4, vec![4, 4])] {
        let local = Local::start(&format!(
            "windowDurationMs: 1500\nbalanceBy: requests\nmaxPerReplica: {k}\n{}",
            endpoints(4)
        ))
        .await;
        let answers = burst(&local, &completion("the same rollout prompt"), 8).await;
        assert_eq!(spread(&answers), expected, "k = {k}");
        local.service.shutdown(Duration::from_secs(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_request_and_an_empty_prompt_get_no_affinity() {
    let local = Local::start(&format!(
        "windowDurationMs: 20\nbalanceBy: requests\n{}",
        endpoints(2)
    ))
    .await;
    for body in [
        completion("alone"),
        json!({"model": "m", "prompt": []}),
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "endpoints": ["ns/p2-rank-0", "unknown"]}),
    ] {
        let (status, _, answer) = local.produce(&body).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["assignedEndpoint"], Value::Null);
        for m in answer["matches"].as_array().unwrap() {
            assert_eq!(m["matchBlocks"], 0);
            assert_eq!(m["score"], 0.0);
        }
    }
    // The endpoint list limits the candidates listed.
    let (_, _, answer) = local
        .produce(&json!({"model": "m", "prompt": "x", "endpoints": ["ns/p2-rank-0"]}))
        .await;
    assert_eq!(answer["matches"].as_array().unwrap().len(), 1);
    assert_eq!(answer["matches"][0]["endpoint"], "ns/p2-rank-0");
    let (_, _, answer) = local.produce(&json!({"model": "m", "prompt": []})).await;
    assert_eq!(answer["totalBlocks"], 0);
    let metrics = local.metrics().await;
    assert_eq!(
        sample(
            &metrics,
            "burst_prefix_requests_total{outcome=\"no_affinity\"}"
        ),
        5.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_window_a_request_sharing_nothing_gets_no_affinity_whatever_the_balance() {
    // The seed's settings: 12 copies of a ~3,000-token prompt and one unrelated request, at
    // once, in every balance mode and with `balanceBy` left to its default (`time`).
    for balance in [
        "balanceBy: requests\n",
        "balanceBy: tokens\n",
        "balanceBy: time\n",
        "",
    ] {
        let local = Local::start(&format!(
            "windowDurationMs: 300\nmaxPerReplica: -1\nblockSizeTokens: 16\nminColocateBlocks: 0\n{balance}{}",
            endpoints(3)
        ))
        .await;
        let shared = completion(&"Solve the following problem step by step. ".repeat(280));
        let lone = completion("What is the capital of France?");
        let mut sends: Vec<_> = (0..12)
            .map(|_| (true, shared.clone()))
            .chain([(false, lone)])
            .map(|(copy, body)| {
                let client = local.client.clone();
                let url = format!("{}/v1/produce", local.base);
                tokio::spawn(
                    async move { (copy, common::post(&client, &url, body.to_string()).await) },
                )
            })
            .collect();
        local.until_window_holds(13).await;
        let mut copies = Vec::new();
        for send in sends.drain(..) {
            let (copy, (status, _, answer)) = send.await.unwrap();
            assert_eq!(status, 200, "{answer}");
            if copy {
                copies.push(answer["assignedEndpoint"].clone());
            } else {
                assert_eq!(
                    answer["assignedEndpoint"],
                    Value::Null,
                    "{balance}: {answer}"
                );
                assert!(answer["matches"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|m| m["matchBlocks"] == 0));
            }
        }
        assert!(copies[0].is_string(), "{balance}: {copies:?}");
        assert!(
            copies.iter().all(|c| *c == copies[0]),
            "{balance}: {copies:?}"
        );
        local.service.shutdown(Duration::from_secs(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_its_status_and_code() {
    let local = Local::start_with_limits(
        &format!(
            "windowDurationMs: 20\nbalanceBy: requests\n{}",
            endpoints(2)
        ),
        Limits {
            max_body_bytes: 1024,
            ..Limits::default()
        },
    )
    .await;
    let cases: Vec<(&str, String, u16, &str, &str)> = vec![
        (
            "/v1/produce",
            "{".into(),
            400,
            "invalid_json",
            "malformed JSON",
        ),
        (
            "/v1/produce",
            "".into(),
            400,
            "invalid_json",
            "malformed JSON",
        ),
        (
            "/v1/produce",
            "[1, 2]".into(),
            400,
            "invalid_request",
            "body: expected a JSON object",
        ),
        (
            "/v1/produce",
            r#"{"prompt": "x"}"#.into(),
            400,
            "invalid_request",
            "body: `model` is missing",
        ),
        (
            "/v1/produce",
            r#"{"model": 5, "prompt": "x"}"#.into(),
            400,
            "invalid_request",
            "model: expected a string",
        ),
        (
            "/v1/produce",
            r#"{"model": "m"}"#.into(),
            400,
            "invalid_request",
            "body: `prompt` (completions) or `messages` (chat) is missing",
        ),
        (
            "/v1/produce",
            r#"{"model": "m", "prompt": 5}"#.into(),
            400,
            "invalid_request",
            "prompt: expected",
        ),
        (
            "/v1/produce",
            r#"{"model": "m", "prompt": [1, -1]}"#.into(),
            400,
            "invalid_request",
            "prompt[1]: expected a token ID",
        ),
        (
            "/v1/produce",
            r#"{"model": "m", "messages": [{"content": "x"}]}"#.into(),
            400,
            "invalid_request",
            "messages[0]: `role` is missing",
        ),
        (
            "/v1/produce",
            r#"{"model": "m", "prompt": "x", "endpoints": "a"}"#.into(),
            400,
            "invalid_request",
            "endpoints: expected",
        ),
        (
            "/v1/produce",
            format!(r#"{{"model": "m", "prompt": "{}"}}"#, "x".repeat(2000)),
            413,
            "body_too_large",
            "1024 bytes",
        ),
        (
            "/v1/plan",
            "{".into(),
            400,
            "invalid_json",
            "malformed JSON",
        ),
        (
            "/v1/plan",
            r#"{"replicas": []}"#.into(),
            400,
            "invalid_request",
            "missing field `requests`",
        ),
        (
            "/v1/plan",
            r#"{"config": {"windowDurationMs": -1}, "replicas": [], "requests": []}"#.into(),
            400,
            "invalid_config",
            "windowDurationMs is -1",
        ),
        (
            "/v1/plan",
            r#"{"replicas": [], "requests": [{"id": "a", "body": {"model": "m"}}]}"#.into(),
            400,
            "invalid_request",
            "requests[0].body: `prompt` (completions) or `messages` (chat) is missing",
        ),
        (
            "/v1/plan",
            "x".repeat(2000),
            413,
            "body_too_large",
            "--max-body-bytes",
        ),
    ];
    let count = cases.iter().filter(|c| c.0 == "/v1/produce").count();
    for (path, body, status, code, needle) in cases {
        let (got, _, answer) = local.post(path, body.clone()).await;
        assert_eq!(got, status, "{path} {body:.80}: {answer}");
        assert_eq!(answer["error"], code, "{path} {body:.80}: {answer}");
        let message = answer["message"].as_str().unwrap();
        assert!(
            message.contains(needle),
            "{path} {body:.80}: {message} lacks {needle}"
        );
    }
    let metrics = local.metrics().await;
    assert_eq!(
        sample(
            &metrics,
            "burst_prefix_requests_total{outcome=\"rejected\"}"
        ),
        count as f64
    );
    // The server is unharmed.
    let (status, _, _) = local.produce(&completion("fine")).await;
    assert_eq!(status, 200);
    let (status, _) = common::get_text(&local.client, &format!("{}/nowhere", local.base)).await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_endpoints_is_503_and_not_ready() {
    let local = Local::start("endpoints: []\n").await;
    let (status, retry_after, answer) = local.produce(&completion("x")).await;
    assert_eq!(status, 503);
    assert_eq!(answer["error"], "no_endpoints");
    assert!(retry_after.is_some());
    let (status, body) = common::get_text(&local.client, &format!("{}/readyz", local.admin)).await;
    assert_eq!(status, 503, "{body}");
    let (status, _) = common::get_text(&local.client, &format!("{}/healthz", local.admin)).await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_window_is_planned_at_once() {
    // A 10 s window: only `maxBatchSize` can answer these within the test's patience.
    let local = Local::start(&format!(
        "windowDurationMs: 10000\nbalanceBy: requests\nmaxBatchSize: 2\n{}",
        endpoints(2)
    ))
    .await;
    let sends: Vec<_> = (0..4)
        .map(|_| {
            let client = local.client.clone();
            let url = format!("{}/v1/produce", local.base);
            tokio::spawn(
                async move { common::post(&client, &url, completion("x").to_string()).await },
            )
        })
        .collect();
    let mut windows = BTreeMap::new();
    for send in sends {
        let (status, _, answer) = send.await.unwrap();
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["window"]["size"], 2, "{answer}");
        assert_eq!(answer["window"]["sealedBy"], "full", "{answer}");
        *windows
            .entry(answer["window"]["id"].as_u64().unwrap())
            .or_insert(0) += 1;
    }
    assert_eq!(windows.values().collect::<Vec<_>>(), [&2, &2]);
    let metrics = local.metrics().await;
    assert_eq!(
        sample(
            &metrics,
            "burst_prefix_windows_sealed_total{reason=\"full\"}"
        ),
        2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_is_removed_before_planning() {
    let local = Local::start(&format!(
        "windowDurationMs: 3000\nbalanceBy: requests\n{}",
        endpoints(2)
    ))
    .await;
    let client = local.client.clone();
    let url = format!("{}/v1/produce", local.base);
    let gone =
        tokio::spawn(async move { common::post(&client, &url, completion("x").to_string()).await });
    let window = local.until_window_holds(1).await;
    gone.abort(); // Drops the connection, as a client timing out would.
    assert!(gone.await.unwrap_err().is_cancelled());
    assert_eq!(local.until_window_holds(0).await, window);

    let (status, _, answer) = local.produce(&completion("x")).await;
    assert_eq!(status, 200);
    assert_eq!(answer["window"]["id"], window);
    assert_eq!(answer["window"]["size"], 1);
    let metrics = local.metrics().await;
    assert_eq!(
        sample(
            &metrics,
            "burst_prefix_requests_total{outcome=\"cancelled\"}"
        ),
        1.0
    );
    assert_eq!(sample(&metrics, "burst_prefix_window_size_sum"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_change_applies_from_the_next_window() {
    let one =
        "windowDurationMs: 1500\nbalanceBy: requests\nendpoints:\n  - {id: ns/a-rank-0, address: '10.0.0.1:8000'}\n";
    let local = Local::start(one).await;
    let send = || {
        let client = local.client.clone();
        let url = format!("{}/v1/produce", local.base);
        tokio::spawn(
            async move { common::post(&client, &url, completion("same").to_string()).await },
        )
    };
    let first = send();
    let window = local.until_window_holds(1).await;
    local
        .producer()
        .config_store()
        .apply_text(
            &one.replace("ns/a-rank-0", "ns/b-rank-0")
                .replace("1500", "20"),
        )
        .unwrap();
    let second = send();
    assert_eq!(local.until_window_holds(2).await, window);
    for send in [first, second] {
        let (_, _, answer) = send.await.unwrap();
        assert_eq!(answer["assignedEndpoint"], "ns/a-rank-0");
        assert_eq!(answer["window"]["id"], window);
    }
    let (_, _, answer) = local.produce(&completion("same")).await;
    assert_eq!(answer["matches"][0]["endpoint"], "ns/b-rank-0");
    assert_eq!(answer["window"]["id"], window + 1);

    let (_, text) = common::get_text(&local.client, &format!("{}/v1/endpoints", local.base)).await;
    let endpoints: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(endpoints["generation"], 2);
    assert_eq!(endpoints["source"], json!({"kind": "demo"}));
    assert_eq!(endpoints["ready"], true);
    assert_eq!(
        endpoints["endpoints"],
        json!([{"id": "ns/b-rank-0", "address": "10.0.0.1:8000"}])
    );
    assert_eq!(endpoints["config"]["windowDurationMs"], 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_answers_a_whole_batch_at_once() {
    let local = Local::start(&endpoints(1)).await;
    let input = json!({
        "config": {"maxPerReplica": 2},
        "replicas": [{"id": "b"}, {"id": "a", "runningRequests": 1}],
        "requests": [
            {"id": "r1", "body": completion("the same prompt")},
            {"id": "r2", "body": completion("the same prompt")},
            {"id": "r3", "body": completion("the same prompt")},
            {"id": "r4", "body": completion("a lone prompt")},
        ],
    });
    let (status, _, answer) = local.post("/v1/plan", input.to_string()).await;
    assert_eq!(status, 200, "{answer}");
    let endpoints: Vec<&Value> = answer["assignments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| &a["endpoint"])
        .collect();
    assert_eq!(
        endpoints,
        [&json!("b"), &json!("b"), &json!("a"), &Value::Null]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_port_serves_health_readiness_and_metrics() {
    let local = Local::start(&endpoints(3)).await;
    let admin = |path: &str| format!("{}{path}", local.admin);
    assert_eq!(
        common::get_text(&local.client, &admin("/healthz")).await.0,
        200
    );
    assert_eq!(
        common::get_text(&local.client, &admin("/readyz")).await.0,
        200
    );
    let metrics = local.metrics().await;
    assert_eq!(sample(&metrics, "burst_prefix_endpoints"), 3.0);
    assert_eq!(
        sample(
            &metrics,
            "burst_prefix_config_reloads_total{result=\"accepted\"}"
        ),
        1.0
    );
    // The API port does not serve them.
    let (status, _) = common::get_text(&local.client, &format!("{}/metrics", local.base)).await;
    assert_eq!(status, 404);
}
