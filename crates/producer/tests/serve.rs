//! `burst-prefix-producer serve` as the real binary: config reload from a file, and SIGTERM with
//! a window open.

mod common;

use std::path::Path;
use std::time::Instant;

use common::{completion, endpoints, sample, Binary, PATIENCE};
use serde_json::Value;

/// Replaces the file at once (write + rename), as editors and ConfigMap mounts do.
fn write_config(path: &Path, text: &str) {
    let staged = path.with_extension("staged");
    std::fs::write(&staged, text).unwrap();
    std::fs::rename(&staged, path).unwrap();
}

async fn get_json(client: &reqwest::Client, url: &str) -> Value {
    serde_json::from_str(&common::get_text(client, url).await.1).unwrap()
}

/// Polls `url` until `done` holds for its body.
async fn until(client: &reqwest::Client, url: &str, done: impl Fn(&str) -> bool) -> String {
    let started = Instant::now();
    loop {
        let (_, body) = common::get_text(client, url).await;
        if done(&body) {
            return body;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "{url} never got there: {body}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_config_file_is_reloaded_and_a_bad_change_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    let first = format!("windowDurationMs: 20\n{}", endpoints(1));
    write_config(&path, &first);
    let mut producer =
        Binary::serve(&["--config", path.to_str().unwrap(), "--config-poll-ms", "50"]);
    let client = reqwest::Client::builder()
        .timeout(PATIENCE)
        .build()
        .unwrap();
    let produce = format!("{}/v1/produce", producer.base);
    let endpoints_url = format!("{}/v1/endpoints", producer.base);
    let metrics_url = format!("{}/metrics", producer.admin);

    assert_eq!(
        common::get_text(&client, &format!("{}/readyz", producer.admin))
            .await
            .0,
        200
    );
    let state = get_json(&client, &endpoints_url).await;
    assert_eq!(state["generation"], 1);
    assert_eq!(state["source"]["kind"], "file");
    assert_eq!(state["source"]["path"], path.to_str().unwrap());
    let (_, _, answer) = common::post(&client, &produce, completion("x").to_string()).await;
    assert_eq!(answer["matches"][0]["endpoint"], "ns/p1-rank-0");

    // A good change: the next window uses it.
    write_config(&path, &first.replace("ns/p1-rank-0", "ns/q1-rank-0"));
    until(&client, &endpoints_url, |body| {
        body.contains("\"generation\":2")
    })
    .await;
    let (_, _, answer) = common::post(&client, &produce, completion("x").to_string()).await;
    assert_eq!(answer["matches"][0]["endpoint"], "ns/q1-rank-0");

    // A bad change: rejected, counted, and the last good config stays in force.
    write_config(&path, &format!("maxPerReplica: 0\n{}", endpoints(2)));
    until(&client, &metrics_url, |body| {
        sample(
            body,
            "burst_prefix_config_reloads_total{result=\"rejected\"}",
        ) == 1.0
    })
    .await;
    let state = get_json(&client, &endpoints_url).await;
    assert_eq!(state["generation"], 2);
    assert_eq!(state["endpoints"].as_array().unwrap().len(), 1);
    let (status, _, answer) = common::post(&client, &produce, completion("x").to_string()).await;
    assert_eq!(status, 200);
    assert_eq!(answer["matches"][0]["endpoint"], "ns/q1-rank-0");
    let metrics = common::get_text(&client, &metrics_url).await.1;
    assert_eq!(
        sample(
            &metrics,
            "burst_prefix_config_reloads_total{result=\"accepted\"}"
        ),
        2.0
    );
    assert!(
        producer.logs().contains("maxPerReplica is 0"),
        "{}",
        producer.logs()
    );

    producer.terminate();
    assert_eq!(producer.wait(), Some(0), "{}", producer.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_every_waiter_of_the_open_window_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    write_config(
        &path,
        r#"{"windowDurationMs": 5000, "endpoints": [{"id": "ns/a-rank-0", "address": "10.0.0.1:8000"}]}"#,
    );
    let mut producer = Binary::serve(&["--config", path.to_str().unwrap()]);
    let client = reqwest::Client::builder()
        .timeout(PATIENCE)
        .build()
        .unwrap();
    let produce = format!("{}/v1/produce", producer.base);
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let client = client.clone();
            let url = produce.clone();
            tokio::spawn(async move {
                common::post(&client, &url, completion("same").to_string()).await
            })
        })
        .collect();
    until(&client, &format!("{}/metrics", producer.admin), |body| {
        sample(body, "burst_prefix_window_open_requests") == 3.0
    })
    .await;

    producer.terminate();
    for waiter in waiters {
        let (status, _, answer) = waiter.await.unwrap();
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["assignedEndpoint"], "ns/a-rank-0");
        assert_eq!(answer["window"]["size"], 3);
    }
    assert_eq!(producer.wait(), Some(0), "{}", producer.logs());
    assert!(producer.logs().contains("stopped"), "{}", producer.logs());
}

#[test]
fn an_invalid_config_file_at_startup_exits_2_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, "windowDurationMs: -1\n").unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_burst-prefix-producer"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .args(["--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("windowDurationMs is -1"), "{stderr}");
}
