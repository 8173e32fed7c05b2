//! The stub over real HTTP on loopback: in-process (as the proxy tests use it) and as the binary.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use burst_prefix_stub_engine::{Options, RecordedRequest, StubEngine, ENGINE_ID_HEADER};
use serde_json::{json, Value};

const DEADLINE: Duration = Duration::from_secs(20);

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(DEADLINE)
        .build()
        .unwrap()
}

async fn post(engine: &StubEngine, path: &str, body: Value) -> reqwest::Response {
    client()
        .post(format!("{}{path}", engine.url()))
        .header("x-test", "yes")
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// The `data:` payloads of an SSE body.
fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter(|event| !event.is_empty())
        .map(|event| {
            event
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not an SSE data event: {event:?}"))
                .to_owned()
        })
        .collect()
}

/// Polls the record until `done` holds for the request with `seq` (bounded by DEADLINE).
async fn eventually_recorded(
    engine: &StubEngine,
    seq: u64,
    done: impl Fn(&RecordedRequest) -> bool,
) -> RecordedRequest {
    let start = Instant::now();
    loop {
        let requests = engine.requests();
        if let Some(request) = requests.iter().find(|r| r.seq == seq && done(r)) {
            return request.clone();
        }
        assert!(
            start.elapsed() < DEADLINE,
            "request {seq} never reached the expected state: {requests:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn completion_answers_in_openai_shape_and_names_the_replica() {
    let engine = StubEngine::start(Options::with_id("replica-a"))
        .await
        .unwrap();
    let response = post(
        &engine,
        "/v1/completions",
        json!({"model": "llama", "prompt": "one two three", "max_tokens": 3}),
    )
    .await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()[ENGINE_ID_HEADER], "replica-a");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["id"], "cmpl-replica-a-1");
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["model"], "llama");
    assert_eq!(body["stub_engine_id"], "replica-a");
    assert_eq!(
        body["choices"][0]["text"],
        "replica-a#1 replica-a#2 replica-a#3 "
    );
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6})
    );

    let [recorded] = engine.requests().try_into().unwrap();
    assert_eq!(recorded.method, "POST");
    assert_eq!(recorded.path, "/v1/completions");
    assert_eq!(recorded.headers["x-test"], "yes");
    assert_eq!(recorded.body["prompt"], "one two three");
    assert_eq!(recorded.status, 200);
    assert!(!recorded.stream && recorded.completed && !recorded.client_disconnected);
}

#[tokio::test]
async fn chat_stream_sends_the_asked_chunks_then_done() {
    let engine = StubEngine::start(Options::with_id("replica-b"))
        .await
        .unwrap();
    let response = post(
        &engine,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hi"}], "stream": true,
               "stream_options": {"include_usage": true},
               "stub": {"chunks": 5, "chunkDelayMs": 20}}),
    )
    .await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()[ENGINE_ID_HEADER], "replica-b");
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let data = sse_data(&response.text().await.unwrap());
    assert_eq!(data.len(), 7, "5 chunks, the usage, [DONE]: {data:?}");
    assert_eq!(data[6], "[DONE]");
    let chunks: Vec<Value> = data[..6]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let text: String = chunks[..5]
        .iter()
        .map(|c| c["choices"][0]["delta"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(
        text,
        "replica-b#1 replica-b#2 replica-b#3 replica-b#4 replica-b#5 "
    );
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk"
        && c["id"] == "chatcmpl-replica-b-1"
        && c["model"] == "stub-model"));
    assert_eq!(chunks[4]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks[5]["usage"]["completion_tokens"], 5);

    let recorded = eventually_recorded(&engine, 1, |r| r.completed).await;
    assert!(recorded.stream && !recorded.client_disconnected);
    assert_eq!(recorded.chunks_sent, 5);
    let (first, last) = (
        recorded.first_chunk_unix_micros.unwrap(),
        recorded.last_chunk_unix_micros.unwrap(),
    );
    // Four pauses of 20 ms lie between the first and the last chunk.
    assert!(last - first >= 80_000, "first {first}, last {last}");
    assert!(first >= recorded.received_unix_micros);
}

#[tokio::test]
async fn a_client_that_goes_away_mid_stream_is_recorded() {
    let engine = StubEngine::start(Options::with_id("replica-c"))
        .await
        .unwrap();
    let mut response = post(
        &engine,
        "/v1/completions",
        json!({"prompt": "x", "stream": true, "stub": {"chunks": 200, "chunkDelayMs": 20}}),
    )
    .await;
    assert_eq!(response.status(), 200);
    let first = response.chunk().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: {"));
    drop(response); // closes the connection

    let recorded = eventually_recorded(&engine, 1, |r| r.client_disconnected).await;
    assert!(!recorded.completed);
    assert!(recorded.chunks_sent < 200, "{recorded:?}");
}

#[tokio::test]
async fn abort_after_chunks_cuts_the_stream() {
    let engine = StubEngine::start(Options::with_id("replica-d"))
        .await
        .unwrap();
    let mut response = post(
        &engine,
        "/v1/completions",
        json!({"prompt": "x", "stream": true, "stub": {"chunks": 5, "abortAfterChunks": 2}}),
    )
    .await;
    assert_eq!(response.status(), 200);
    let mut received = Vec::new();
    let error = loop {
        match response.chunk().await {
            Ok(Some(bytes)) => received.extend_from_slice(&bytes),
            Ok(None) => panic!(
                "the stream ended cleanly: {:?}",
                String::from_utf8_lossy(&received)
            ),
            Err(error) => break error,
        }
    };
    let data = sse_data(&String::from_utf8(received).unwrap());
    assert_eq!(
        data.len(),
        2,
        "two chunks, then the cut ({error}): {data:?}"
    );
    let recorded = eventually_recorded(&engine, 1, |r| r.aborted).await;
    assert_eq!(recorded.chunks_sent, 2);
    assert!(!recorded.completed);
}

#[tokio::test]
async fn status_controls_and_fail_status() {
    let engine = StubEngine::start(Options {
        fail_status: Some(503),
        ..Options::with_id("replica-e")
    })
    .await
    .unwrap();
    let failed = post(&engine, "/v1/completions", json!({"prompt": "x"})).await;
    assert_eq!(failed.status(), 503);
    assert_eq!(failed.headers()[ENGINE_ID_HEADER], "replica-e");
    let body: Value = failed.json().await.unwrap();
    assert_eq!(body["error"]["type"], "server_error");
    assert_eq!(body["error"]["code"], 503);

    // The request's own status wins over the flag.
    let ok = post(
        &engine,
        "/v1/completions",
        json!({"prompt": "x", "stub": {"status": 200}}),
    )
    .await;
    assert_eq!(ok.status(), 200);
    let throttled = post(
        &engine,
        "/v1/chat/completions",
        json!({"messages": [{"content": "x"}], "stub": {"status": 429, "delayMs": 30}}),
    )
    .await;
    assert_eq!(throttled.status(), 429);

    let statuses: Vec<u16> = engine.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [503, 200, 429]);
}

#[tokio::test]
async fn bad_requests_get_400_naming_the_problem() {
    let engine = StubEngine::start(Options::with_id("replica-f"))
        .await
        .unwrap();
    let not_json = client()
        .post(format!("{}/v1/completions", engine.url()))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(not_json.status(), 400);
    let body: Value = not_json.json().await.unwrap();
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("not valid JSON"));

    for (path, request, needle) in [
        (
            "/v1/completions",
            json!({"model": "m"}),
            "\"prompt\" is required",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": 3}),
            "\"messages\"",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "stub": {"chunkz": 1}}),
            "unknown field `chunkz`",
        ),
    ] {
        let response = post(&engine, path, request).await;
        assert_eq!(response.status(), 400);
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["type"], "invalid_request_error");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(needle),
            "{message} should mention {needle}"
        );
    }
    let recorded = engine.requests();
    assert_eq!(recorded.len(), 4);
    assert_eq!(recorded[0].body, json!("{not json"));
    assert!(recorded.iter().all(|r| r.status == 400 && r.completed));
}

#[tokio::test]
async fn models_health_and_the_record_over_http() {
    let engine = StubEngine::start(Options {
        model: "llama-3".into(),
        ..Options::with_id("replica-g")
    })
    .await
    .unwrap();
    let http = client();
    let models: Value = http
        .get(format!("{}/v1/models", engine.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "llama-3");
    let health = http
        .get(format!("{}/healthz", engine.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);

    post(&engine, "/v1/completions", json!({"prompt": "x"})).await;
    let record: Value = http
        .get(format!("{}/stub/requests", engine.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(record["engineId"], "replica-g");
    let requests: Vec<RecordedRequest> =
        serde_json::from_value(record["requests"].clone()).unwrap();
    assert_eq!(requests, engine.requests());
    assert_eq!(requests[0].body["model"], Value::Null);

    let cleared = http
        .delete(format!("{}/stub/requests", engine.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(cleared.status(), 204);
    assert!(engine.requests().is_empty());
    engine.shutdown().await.unwrap();
}

/// Kills the child when the test ends, however it ends.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn the_binary_serves_and_stops_on_sigterm() {
    let mut child = Child(
        Command::new(env!("CARGO_BIN_EXE_burst-prefix-stub-engine"))
            .args(["--listen", "127.0.0.1:0", "--id", "bin-a"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut stderr = BufReader::new(child.0.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    let addr = line
        .split_whitespace()
        .find_map(|field| field.strip_prefix("addr="))
        .unwrap_or_else(|| panic!("no addr= in the first log line: {line:?}"))
        .to_owned();
    assert!(line.contains("id=bin-a"), "{line}");

    let response = client()
        .post(format!("http://{addr}/v1/completions"))
        .json(&json!({"prompt": "x", "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()[ENGINE_ID_HEADER], "bin-a");

    let killed = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(start.elapsed() < DEADLINE, "still running after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
}

#[test]
fn help_and_bad_flags() {
    let help = Command::new(env!("CARGO_BIN_EXE_burst-prefix-stub-engine"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(help.status.success());
    let text = String::from_utf8(help.stdout).unwrap();
    for needle in [
        "/v1/chat/completions",
        "/stub/requests",
        "chunkDelayMs",
        "--fail-status",
        "--listen",
        "x-stub-engine-id",
    ] {
        assert!(text.contains(needle), "--help should mention {needle}");
    }
    let bad = Command::new(env!("CARGO_BIN_EXE_burst-prefix-stub-engine"))
        .args(["--fail-status", "42"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--fail-status"));
}

#[tokio::test]
async fn a_client_that_goes_away_during_the_delay_is_recorded() {
    let engine = StubEngine::start(Options::with_id("replica-h"))
        .await
        .unwrap();
    let request = reqwest::Client::new()
        .post(format!("{}/v1/completions", engine.url()))
        .json(&json!({"prompt": "x", "stub": {"delayMs": 5000}}))
        .timeout(Duration::from_millis(200))
        .send()
        .await;
    assert!(request.unwrap_err().is_timeout());
    let recorded = eventually_recorded(&engine, 1, |r| r.client_disconnected).await;
    assert!(!recorded.completed && recorded.status == 0, "{recorded:?}");
}
