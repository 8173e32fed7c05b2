//! Requests in transfer are bounded (docs/behaviour.md §9, §11), as the real binary on loopback:
//! a body that stalls or drips is answered 408 at `--body-timeout-ms` and frees its connection;
//! the bytes of bodies still being read count in `--max-window-bytes`; an endpoint-picker stream
//! that sends no body is answered 408 and closed; a body over tonic's default 4 MiB in one
//! `BUFFERED` message is routed, and one over the body limit gets 413, never a silent close; a
//! connection full of idle streams is emptied by the body timeout and other connections are
//! served meanwhile. Every loop is bounded; deadlines are generous ("eventually").

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use burst_prefix_producer::epp::data_plane;
use common::ext_proc::{immediate, ExtProc};
use common::{endpoints, sample, Binary, PATIENCE};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::{processing_response, ProcessingRequest};
use serde_json::json;

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(PATIENCE)
        .build()
        .unwrap()
}

/// Everything the server sends on `stream` until it closes it (bounded by PATIENCE).
fn read_to_close(stream: &mut TcpStream) -> String {
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buffer[..n]),
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                panic!(
                    "not closed within {PATIENCE:?}; got so far: {}",
                    String::from_utf8_lossy(&answer)
                )
            }
            Err(_) => break,
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

/// The head of a `POST` to `path` declaring `length` bytes of body.
fn head(path: &str, length: usize) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    )
}

/// A valid produce body of exactly `length` bytes.
fn body_of(length: usize) -> Vec<u8> {
    let shell = json!({"model": "m", "prompt": ""}).to_string();
    let prompt = "p".repeat(length - shell.len());
    let body = json!({"model": "m", "prompt": prompt}).to_string();
    assert_eq!(body.len(), length);
    body.into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_and_dripped_bodies_get_408_at_the_body_timeout_and_a_normal_request_is_answered() {
    let producer = Binary::serve_config(
        &format!("windowDurationMs: 20\n{}", endpoints(2)),
        &["--max-connections", "20", "--body-timeout-ms", "1000"],
    );
    let api = producer.api();

    // The attack: every connection the cap allows sends a head (content-length 100) and
    // 9 bytes of body, then nothing; one of them drips its body at 2 bytes a second instead.
    // To the proxy's route, which has no request timeout of its own (the scoring API's 30 s
    // would answer them too).
    let mut stalled: Vec<TcpStream> = (0..19)
        .map(|_| {
            let mut stream = TcpStream::connect(&api).unwrap();
            stream
                .write_all(head("/v1/completions", 100).as_bytes())
                .unwrap();
            stream.write_all(b"{\"model\":").unwrap();
            stream
        })
        .collect();
    let mut dripping = TcpStream::connect(&api).unwrap();
    dripping
        .write_all(head("/v1/completions", 100).as_bytes())
        .unwrap();
    let mut drip = dripping.try_clone().unwrap();
    let dripper = std::thread::spawn(move || {
        // 2 B/s for at most as long as the test waits; it stops when the server closes.
        for _ in 0..(PATIENCE.as_secs() * 2) {
            if drip.write_all(b" ").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    });

    // A normal request on a connection of its own (it waits for one of the 20 to free) is
    // answered, and the admin port answers meanwhile.
    let client = client();
    let (status, _, answer) = common::post(
        &client,
        &format!("{}/v1/produce", producer.base),
        common::completion("a normal request").to_string(),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let (ready, _) = common::get_text(&client, &format!("{}/readyz", producer.admin)).await;
    assert_eq!(ready, 200);

    // Each stalled body and the dripped one got 408 body_timeout, and its connection closed.
    let answers = tokio::task::spawn_blocking(move || {
        stalled.push(dripping);
        stalled.iter_mut().map(read_to_close).collect::<Vec<_>>()
    })
    .await
    .unwrap();
    for answer in &answers {
        assert!(
            answer.starts_with("HTTP/1.1 408") && answer.contains("body_timeout"),
            "{answer}"
        );
    }
    dripper.join().unwrap();
    let metrics = common::get_text(&client, &format!("{}/metrics", producer.admin))
        .await
        .1;
    assert_eq!(
        sample(
            &metrics,
            "burst_prefix_requests_total{outcome=\"rejected\"}"
        ),
        20.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_still_being_read_count_in_the_window_budget() {
    let producer = Binary::serve_config(
        &format!("windowDurationMs: 20\n{}", endpoints(2)),
        &[
            "--max-window-bytes",
            "1000000",
            "--body-timeout-ms",
            "60000",
        ],
    );
    let api = producer.api();
    // 800 kB of a 900 kB body, then nothing: held while it is read.
    let mut held = TcpStream::connect(&api).unwrap();
    held.write_all(head("/v1/produce", 900_000).as_bytes())
        .unwrap();
    held.write_all(&body_of(900_000)[..800_000]).unwrap();

    // A whole 300 kB request is placed until the held bytes are read; from then on it is
    // refused (it would take the budget past 1 MB).
    let client = client();
    let url = format!("{}/v1/produce", producer.base);
    let started = Instant::now();
    loop {
        let (status, retry_after, answer) = common::post(&client, &url, body_of(300_000)).await;
        if status == 429 {
            assert_eq!(answer["error"], "window_full", "{answer}");
            assert!(retry_after.is_some());
            break;
        }
        assert_eq!(status, 200, "{answer}");
        assert!(
            started.elapsed() < PATIENCE,
            "the 800 kB being read never counted against the 1 MB budget"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Refused before it is read: 250 kB of a 300 kB body get their 429 while the rest is held.
    let api_clone = api.clone();
    let answer = tokio::task::spawn_blocking(move || {
        let mut partial = TcpStream::connect(&api_clone).unwrap();
        partial
            .write_all(head("/v1/produce", 300_000).as_bytes())
            .unwrap();
        partial.write_all(&body_of(300_000)[..250_000]).unwrap();
        read_to_close(&mut partial)
    })
    .await
    .unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 429") && answer.contains("window_full"),
        "{answer}"
    );

    // The held body's bytes come back when its client leaves.
    drop(held);
    let started = Instant::now();
    loop {
        let (status, _, answer) = common::post(&client, &url, body_of(300_000)).await;
        if status == 200 {
            break;
        }
        assert_eq!(status, 429, "{answer}");
        assert!(
            started.elapsed() < PATIENCE,
            "the budget was never given back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Request headers of a completion, in `mode`, with no body yet.
fn headers(mode: BodySendMode) -> ProcessingRequest {
    data_plane::request_headers(
        Some(data_plane::protocol(mode, mode)),
        &[
            (":method", "POST"),
            (":path", "/v1/completions"),
            ("content-type", "application/json"),
        ],
        None,
        false,
    )
}

/// A plaintext (h2c) channel to the binary's endpoint picker: one HTTP/2 connection.
async fn channel(producer: &Binary) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{}", producer.epp))
        .unwrap()
        .connect()
        .await
        .expect("connect to the endpoint picker")
}

/// A routing answer (headers in full duplex, body in buffered mode).
fn routed(response: &ProcessingResponse) -> bool {
    matches!(
        response.response,
        Some(processing_response::Response::RequestHeaders(ref h))
            if h.response.as_ref().is_some_and(|c| c.header_mutation.is_some())
    ) || matches!(
        response.response,
        Some(processing_response::Response::RequestBody(ref b))
            if b.response.as_ref().is_some_and(|c| c.header_mutation.is_some())
    )
}

use envoy_types::pb::envoy::service::ext_proc::v3::ProcessingResponse;

fn completion_bytes(prompt: &str) -> Vec<u8> {
    json!({"model": "m", "prompt": prompt})
        .to_string()
        .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ext_proc_stream_without_its_body_is_answered_408_and_closed() {
    let producer = Binary::serve_config(
        &format!("windowDurationMs: 20\n{}", endpoints(2)),
        &["--epp-plaintext", "--body-timeout-ms", "1000"],
    );
    let channel = channel(&producer).await;
    // Headers and never a body; and headers with half a body.
    let mut idle = ExtProc::on(channel.clone()).await;
    idle.send(headers(BodySendMode::FullDuplexStreamed)).await;
    let mut half = ExtProc::on(channel.clone()).await;
    half.send(headers(BodySendMode::FullDuplexStreamed)).await;
    half.send(data_plane::request_body(b"{\"model\":", false))
        .await;
    for stream in [&mut idle, &mut half] {
        let (status, body) = immediate(&stream.next().await);
        assert_eq!(
            (status, body["error"].as_str()),
            (408, Some("body_timeout"))
        );
        stream.ends().await;
    }
    // The connection serves the next request.
    let mut next = ExtProc::on(channel).await;
    next.send(headers(BodySendMode::FullDuplexStreamed)).await;
    next.send(data_plane::request_body(&completion_bytes("after"), true))
        .await;
    assert!(routed(&next.next().await));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buffered_body_over_4_mib_is_routed_and_one_over_the_limit_gets_413() {
    let producer = Binary::serve_config(
        &format!("windowDurationMs: 20\n{}", endpoints(2)),
        &["--epp-plaintext"],
    );
    let channel = channel(&producer).await;
    // 4.2 MB (tonic's default limit is 4 MiB), 8.5 MB (over --max-body-bytes, 8 MiB, within
    // the decoder's room) and 10 MB (over the decoder's limit too), each in one message.
    for (size, expected) in [
        (4_200_000, None),
        (8_500_000, Some(413)),
        (10_000_000, Some(413)),
    ] {
        let mut stream = ExtProc::on(channel.clone()).await;
        stream.send(headers(BodySendMode::Buffered)).await;
        let continued = stream.next().await;
        assert!(matches!(
            continued.response,
            Some(processing_response::Response::RequestHeaders(_))
        ));
        let body = completion_bytes(&"w ".repeat(size / 2));
        stream.send(data_plane::request_body(&body, true)).await;
        let answer = stream.next_or_end().await;
        let answer = match answer {
            Ok(Some(answer)) => answer,
            other => panic!("{size} bytes: no answer but {other:?}"),
        };
        match expected {
            None => assert!(routed(&answer), "{size} bytes: {answer:?}"),
            Some(status) => {
                let (got, body) = immediate(&answer);
                assert_eq!(
                    (got, body["error"].as_str()),
                    (status, Some("body_too_large")),
                    "{size} bytes"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_full_of_idle_streams_is_emptied_and_others_are_served_meanwhile() {
    let producer = Binary::serve_config(
        &format!("windowDurationMs: 20\n{}", endpoints(2)),
        &["--epp-plaintext", "--body-timeout-ms", "3000"],
    );
    // 256 streams (the cap per connection) on one connection, each with headers only.
    let full = channel(&producer).await;
    let mut idle = Vec::new();
    for _ in 0..256 {
        let stream = ExtProc::on(full.clone()).await;
        stream.send(headers(BodySendMode::FullDuplexStreamed)).await;
        idle.push(stream);
    }
    // A 257th on that connection waits for room: it is served once idle ones were answered
    // (their 408s are counted before their streams close and make room).
    let waiting = {
        let full = full.clone();
        let metrics = format!("{}/metrics", producer.admin);
        tokio::spawn(async move {
            let mut stream = ExtProc::on(full).await;
            stream.send(headers(BodySendMode::FullDuplexStreamed)).await;
            stream
                .send(data_plane::request_body(&completion_bytes("257th"), true))
                .await;
            let routed = routed(&stream.next().await);
            let metrics = common::get_text(&client(), &metrics).await.1;
            let refused = sample(
                &metrics,
                "burst_prefix_requests_total{outcome=\"rejected\"}",
            );
            (routed, refused)
        })
    };
    // Another connection is served meanwhile.
    let mut other = ExtProc::on(channel(&producer).await).await;
    other.send(headers(BodySendMode::FullDuplexStreamed)).await;
    other
        .send(data_plane::request_body(&completion_bytes("other"), true))
        .await;
    assert!(routed(&other.next().await));

    let (routed, refused_before) = tokio::time::timeout(PATIENCE, waiting)
        .await
        .expect("the 257th stream on the full connection was never served")
        .unwrap();
    assert!(routed);
    assert!(
        refused_before >= 1.0,
        "the 257th stream was served before any idle one was closed: no cap of 256"
    );
    for stream in &mut idle {
        let (status, body) = immediate(&stream.next().await);
        assert_eq!(
            (status, body["error"].as_str()),
            (408, Some("body_timeout"))
        );
    }
}

/// Opens an ext_proc stream on `client` and sends `sent` bytes of one gRPC message declaring
/// `declared`, never the rest: what tonic buffers before the picker sees the message.
async fn partial_message(
    client: h2::client::SendRequest<bytes::Bytes>,
    epp: &str,
    declared: u32,
    sent: usize,
) -> (
    h2::client::SendRequest<bytes::Bytes>,
    h2::client::ResponseFuture,
    h2::SendStream<bytes::Bytes>,
) {
    let mut client = client.ready().await.unwrap();
    let request = http::Request::post(format!(
        "http://{epp}/envoy.service.ext_proc.v3.ExternalProcessor/Process"
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(())
    .unwrap();
    let (response, mut send) = client.send_request(request, false).unwrap();
    let mut frame = vec![0u8];
    frame.extend_from_slice(&declared.to_be_bytes());
    frame.resize(5 + sent, b' ');
    send.reserve_capacity(frame.len());
    send.send_data(frame.into(), false).unwrap();
    (client, response, send)
}

/// The first message of an ext_proc stream's answer (`None`: the stream ended without one).
async fn first_answer(response: h2::client::ResponseFuture) -> Option<ProcessingResponse> {
    use prost::Message;
    let mut body = response.await.unwrap().into_body();
    let mut bytes = Vec::new();
    while let Some(data) = body.data().await {
        let data = data.unwrap();
        body.flow_control().release_capacity(data.len()).unwrap();
        bytes.extend_from_slice(&data);
        if bytes.len() >= 5 {
            let length = u32::from_be_bytes(bytes[1..5].try_into().unwrap()) as usize;
            if bytes.len() >= 5 + length {
                return Some(ProcessingResponse::decode(&bytes[5..5 + length]).unwrap());
            }
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_picker_has_not_received_whole_counts_in_the_window_budget() {
    let producer = Binary::serve_config(
        &format!("windowDurationMs: 20\n{}", endpoints(2)),
        &[
            "--epp-plaintext",
            "--max-window-bytes",
            "4000000",
            "--body-timeout-ms",
            "120000",
        ],
    );
    let tcp = tokio::net::TcpStream::connect(&producer.epp).await.unwrap();
    let (client, connection) = h2::client::Builder::new()
        .initial_window_size(16 << 20)
        .initial_connection_window_size(64 << 20)
        .handshake(tcp)
        .await
        .unwrap();
    let driver = tokio::spawn(connection);
    // Two messages of which 3 MB of 5 MB are sent: the first whose bytes the producer reads is
    // held by the decoder, in the 4 MB budget; the other would take the budget past 4 MB, and
    // its stream is answered 429 at once (before, it got nothing until the body timeout, 120 s
    // here). Which one is read first is the producer's scheduling (on a loaded machine, the
    // second can be): the test takes either.
    let (client, first, first_send) =
        partial_message(client, &producer.epp, 5_000_000, 3_000_000).await;
    let (client, second, second_send) =
        partial_message(client, &producer.epp, 5_000_000, 3_000_000).await;
    let mut first = Box::pin(first_answer(first));
    let mut second = Box::pin(first_answer(second));
    let (answer, held_send) = tokio::time::timeout(PATIENCE, async {
        tokio::select! {
            answer = &mut second => (answer, first_send),
            answer = &mut first => (answer, second_send),
        }
    })
    .await
    .expect("no answer to a message in transit over the budget");
    let answer = answer.expect("the stream ended without an answer");
    let (status, body) = immediate(&answer);
    assert_eq!(
        (status, body["error"].as_str()),
        (429, Some("window_full")),
        "{body}"
    );

    // The held message's bytes come back when its stream is reset: a 3 MB partial message fits
    // again (it stays unanswered: it never ends).
    drop(held_send);
    drop((first, second));
    let started = Instant::now();
    let mut client = client;
    loop {
        let (next, response, send) =
            partial_message(client, &producer.epp, 5_000_000, 3_000_000).await;
        client = next;
        match tokio::time::timeout(Duration::from_millis(500), first_answer(response)).await {
            Err(_) => break, // held, not refused
            Ok(answer) => {
                let (status, _) = immediate(&answer.expect("an answer"));
                assert_eq!(status, 429);
                drop(send);
                assert!(
                    started.elapsed() < PATIENCE,
                    "the held message's bytes were never given back"
                );
            }
        }
    }
    let metrics = reqwest::get(format!("{}/metrics", producer.admin))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        sample(
            &metrics,
            "burst_prefix_requests_total{outcome=\"rejected\"}"
        ) >= 1.0,
        "the refusal is counted"
    );
    driver.abort();
}
