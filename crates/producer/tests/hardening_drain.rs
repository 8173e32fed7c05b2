//! SIGTERM drains (docs/behaviour.md §11), as the real binary on loopback: not ready at once,
//! no new connections, and a streaming completion through the proxy, or an endpoint-picker
//! stream carrying its response, in flight at SIGTERM runs to completion; then exit 0. Every
//! loop is bounded; deadlines are generous.

mod common;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use burst_prefix_producer::epp::data_plane;
use burst_prefix_stub_engine::{Options, StubEngine};
use common::ext_proc::ExtProc;
use common::{Binary, PATIENCE};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response;
use futures::StreamExt;
use serde_json::json;

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
}

/// Polls `/readyz` until it answers 503 (bounded).
async fn until_not_ready(client: &reqwest::Client, producer: &Binary) {
    let started = Instant::now();
    loop {
        let (status, _) = common::get_text(client, &format!("{}/readyz", producer.admin)).await;
        if status == 503 {
            return;
        }
        assert!(started.elapsed() < PATIENCE, "still ready after SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls until connecting to `address` is refused (bounded).
async fn until_refused(address: &str) {
    let started = Instant::now();
    loop {
        if TcpStream::connect(address).is_err() {
            return;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "{address} still accepts connections while draining"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (off the runtime) for the process to exit; its exit code.
async fn exit_code(mut producer: Binary) -> (Option<i32>, Binary) {
    tokio::task::spawn_blocking(move || (producer.wait(), producer))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_completion_in_flight_at_sigterm_completes_then_the_producer_exits_0() {
    let engine = StubEngine::start(Options::with_id("e0")).await.unwrap();
    let producer = Binary::serve_config(
        &format!(
            "windowDurationMs: 20\nendpoints:\n  - {{id: ns/e0, address: '{}'}}\n",
            engine.addr()
        ),
        &["--drain-timeout-ms", "60000"],
    );
    let api = producer.base.trim_start_matches("http://").to_string();
    let client = client();
    // 40 chunks, 250 ms apart: a 10 s completion.
    let response = client
        .post(format!("{}/v1/completions", producer.base))
        .json(&json!({"model": "m", "prompt": "long", "stream": true,
                      "stub": {"chunks": 40, "chunkDelayMs": 250}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut chunks = response.bytes_stream();
    let mut received = chunks.next().await.unwrap().unwrap().to_vec();

    let sigterm = Instant::now();
    producer.terminate();
    until_not_ready(&client, &producer).await;
    until_refused(&api).await;
    let not_accepting = sigterm.elapsed();
    assert!(
        !String::from_utf8_lossy(&received).contains("[DONE]"),
        "the completion ended before the drain could be seen; make it longer"
    );
    while let Some(chunk) = chunks.next().await {
        received.extend_from_slice(&chunk.expect("the stream is not cut"));
    }
    let completed = sigterm.elapsed();
    let text = String::from_utf8_lossy(&received);
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert_eq!(text.matches("data: {").count(), 40);
    let (code, producer) = exit_code(producer).await;
    assert_eq!(code, Some(0), "{}", producer.logs());
    let exited = sigterm.elapsed();
    assert!(engine.requests()[0].completed);
    println!(
        "after SIGTERM: not ready and not accepting within {:.2} s, the completion ended at \
         {:.2} s, exit 0 at {:.2} s",
        not_accepting.as_secs_f64(),
        completed.as_secs_f64(),
        exited.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ext_proc_stream_carrying_a_response_at_sigterm_completes_then_the_producer_exits_0() {
    let producer = Binary::serve_config(
        "windowDurationMs: 20\nendpoints:\n  - {id: ns/e1, address: '10.0.0.1:8000'}\n",
        &["--epp-plaintext", "--drain-timeout-ms", "60000"],
    );
    let client = client();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", producer.epp))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut stream = ExtProc::on(channel).await;
    let mode = BodySendMode::FullDuplexStreamed;
    stream
        .send(data_plane::request_headers(
            Some(data_plane::protocol(mode, mode)),
            &[(":method", "POST"), (":path", "/v1/completions")],
            None,
            false,
        ))
        .await;
    let body = json!({"model": "m", "prompt": "p"}).to_string();
    stream
        .send(data_plane::request_body(body.as_bytes(), true))
        .await;
    stream.next().await; // routed (headers)
    stream.next().await; // the body handed back
    stream
        .send(data_plane::response_headers(Some("10.0.0.1:8000")))
        .await;
    assert!(matches!(
        stream.next().await.response,
        Some(processing_response::Response::ResponseHeaders(_))
    ));

    let sigterm = Instant::now();
    producer.terminate();
    until_not_ready(&client, &producer).await;
    until_refused(&producer.epp).await;
    // The response keeps streaming through the picker: every chunk is answered.
    for i in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        stream
            .send(data_plane::response_body(
                format!("data: {i}\n\n").as_bytes(),
                i == 19,
            ))
            .await;
        assert!(
            matches!(
                stream.next_or_end().await,
                Ok(Some(ref answer)) if matches!(answer.response, Some(processing_response::Response::ResponseBody(_)))
            ),
            "chunk {i} after SIGTERM got no answer"
        );
    }
    let completed = sigterm.elapsed();
    drop(stream);
    let (code, producer) = exit_code(producer).await;
    assert_eq!(code, Some(0), "{}", producer.logs());
    println!(
        "after SIGTERM: the stream ended at {:.2} s, exit 0 at {:.2} s",
        completed.as_secs_f64(),
        sigterm.elapsed().as_secs_f64()
    );
}
