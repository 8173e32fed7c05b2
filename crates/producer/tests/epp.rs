//! Endpoint picker mode (docs/behaviour.md §9) over real gRPC on loopback, with an ext_proc client
//! built from Envoy's own protos, driving each stream as Envoy does: request headers (with the
//! subset hint in filter metadata), the body in chunks until end of stream, trailers, and the
//! response path.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use burst_prefix_producer::epp::data_plane;
use common::ext_proc::{immediate, ExtProc};
use common::{sample, Local, PATIENCE};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation, processing_response, ProcessingRequest, ProcessingResponse,
};
use envoy_types::pb::google::protobuf::value::Kind;
use serde_json::json;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

const DESTINATION: &str = "x-gateway-destination-endpoint";

/// `n` endpoints `ns/e{i}` at `10.0.0.{i}:8000` (never contacted: the gateway routes, not us).
fn endpoints(n: usize, window_ms: u64) -> String {
    let mut yaml = format!("windowDurationMs: {window_ms}\nbalanceBy: requests\nendpoints:\n");
    for i in 1..=n {
        yaml.push_str(&format!(
            "  - {{id: ns/e{i}, address: '10.0.0.{i}:8000'}}\n"
        ));
    }
    yaml
}

/// Request headers of a completion, with an optional subset hint and the body mode the data
/// plane uses.
fn headers(
    end_of_stream: bool,
    subset: Option<&[&str]>,
    mode: Option<BodySendMode>,
) -> ProcessingRequest {
    let headers = [
        (":method", "POST"),
        (":path", "/v1/completions"),
        ("content-type", "application/json"),
    ];
    data_plane::request_headers(
        mode.map(|mode| data_plane::protocol(mode, mode)),
        &headers,
        subset,
        end_of_stream,
    )
}

fn body(bytes: &[u8], end_of_stream: bool) -> ProcessingRequest {
    data_plane::request_body(bytes, end_of_stream)
}

/// Sends `payload` as the body in chunks of `chunk` bytes.
async fn send_body(stream: &ExtProc, payload: &[u8], chunk: usize) {
    let chunks: Vec<&[u8]> = payload.chunks(chunk).collect();
    for (i, piece) in chunks.iter().enumerate() {
        stream.send(body(piece, i + 1 == chunks.len())).await;
    }
}

/// The destination a routing answer sets, in its header and its dynamic metadata (the same).
fn destination(response: &ProcessingResponse) -> String {
    let common = match response.response.as_ref().expect("a response") {
        processing_response::Response::RequestHeaders(h) => h.response.as_ref(),
        processing_response::Response::RequestBody(b) => b.response.as_ref(),
        other => panic!("not a routing answer: {other:?}"),
    }
    .expect("a common response");
    let header = common
        .header_mutation
        .as_ref()
        .expect("a header mutation")
        .set_headers
        .iter()
        .find_map(|h| {
            let h = h.header.as_ref()?;
            (h.key == DESTINATION).then(|| String::from_utf8(h.raw_value.clone()).unwrap())
        })
        .expect("the destination header");
    let metadata = &response
        .dynamic_metadata
        .as_ref()
        .expect("dynamic metadata")
        .fields["envoy.lb"];
    let Some(Kind::StructValue(lb)) = &metadata.kind else {
        panic!("{metadata:?}")
    };
    let Some(Kind::StringValue(value)) = &lb.fields[DESTINATION].kind else {
        panic!("{lb:?}")
    };
    assert_eq!(&header, value, "header and metadata differ");
    header
}

/// The streamed body a full-duplex body answer hands back, and its end-of-stream flag.
fn streamed_body(response: &ProcessingResponse) -> (Vec<u8>, bool) {
    let Some(processing_response::Response::RequestBody(body)) = &response.response else {
        panic!("not a body answer: {response:?}");
    };
    let mutation = body
        .response
        .as_ref()
        .unwrap()
        .body_mutation
        .as_ref()
        .unwrap();
    let Some(body_mutation::Mutation::StreamedResponse(streamed)) = &mutation.mutation else {
        panic!("{mutation:?}");
    };
    (streamed.body.clone(), streamed.end_of_stream)
}

fn payload(prompt: &str) -> Vec<u8> {
    json!({"model": "m", "prompt": prompt, "max_tokens": 4})
        .to_string()
        .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_streams_get_the_same_destination_and_the_body_back() {
    let local = Local::start(&endpoints(4, 300)).await;
    let payload = payload(&"one shared rollout prompt ".repeat(40));
    let streams = (0..8).map(|_| {
        let local_epp = &local;
        let payload = payload.clone();
        async move {
            let mut stream = ExtProc::open(local_epp).await;
            stream
                .send(headers(false, None, Some(BodySendMode::FullDuplexStreamed)))
                .await;
            send_body(&stream, &payload, 100).await;
            let routed = stream.next().await;
            let picked = destination(&routed);
            let (returned, end) = streamed_body(&stream.next().await);
            assert_eq!(returned, payload, "the body goes back unchanged");
            assert!(end);
            picked
        }
    });
    let picked: Vec<String> = futures::future::join_all(streams).await;
    let firsts: BTreeSet<&str> = picked
        .iter()
        .map(|p| p.split(',').next().unwrap())
        .collect();
    assert_eq!(firsts.len(), 1, "{picked:?}");
    // The pick first, then fallbacks: distinct, known addresses.
    let list: Vec<&str> = picked[0].split(',').collect();
    assert!(list.len() >= 2 && list.len() <= 4, "{list:?}");
    assert_eq!(list.iter().collect::<BTreeSet<_>>().len(), list.len());
    assert!(list
        .iter()
        .all(|a| a.starts_with("10.0.0.") && a.ends_with(":8000")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_window_a_request_sharing_nothing_gets_no_affinity_whatever_the_balance() {
    for balance in ["requests", "tokens", "time"] {
        let yaml = endpoints(3, 300).replace(
            "balanceBy: requests\n",
            &format!("balanceBy: {balance}\nblockSizeTokens: 16\n"),
        );
        let local = Local::start(&yaml).await;
        let shared = payload(&"Solve the following problem step by step. ".repeat(280));
        let lone = payload("What is the capital of France?");
        let streams = (0..13).map(|i| {
            let local = &local;
            let payload = if i < 12 { shared.clone() } else { lone.clone() };
            async move {
                let mut stream = ExtProc::open(local).await;
                stream.send(headers(false, None, None)).await;
                send_body(&stream, &payload, 4096).await;
                destination(&stream.next().await)
            }
        });
        let destinations = futures::future::join_all(streams).await;
        assert!(
            destinations[..12].iter().all(|d| *d == destinations[0]),
            "{balance}: {destinations:?}"
        );
        let metrics = local.metrics().await;
        let count = |outcome: &str| {
            sample(
                &metrics,
                &format!("burst_prefix_requests_total{{outcome=\"{outcome}\"}}"),
            )
        };
        // The lone request is routed by load, not by the plan.
        assert_eq!(
            (count("assigned"), count("no_affinity")),
            (12.0, 1.0),
            "{balance}"
        );
        local.service.shutdown(Duration::from_secs(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subset_hint_is_obeyed_and_an_empty_one_gets_503() {
    let local = Local::start(&endpoints(4, 20)).await;
    let mut stream = ExtProc::open(&local).await;
    stream
        .send(headers(false, Some(&["10.0.0.3:8000", "10.9.9.9:1"]), None))
        .await;
    send_body(&stream, &payload("x"), 1000).await;
    assert_eq!(destination(&stream.next().await), "10.0.0.3:8000");

    for subset in [&[][..], &["10.9.9.9:1"][..]] {
        let mut stream = ExtProc::open(&local).await;
        stream.send(headers(false, Some(subset), None)).await;
        send_body(&stream, &payload("x"), 1000).await;
        let (status, body) = immediate(&stream.next().await);
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["error"], "no_eligible_endpoint");
        stream.ends().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_bodies_get_400_naming_the_field_and_a_clean_end() {
    let local = Local::start(&endpoints(2, 20)).await;
    for (payload, field) in [
        (
            br#"{"model": "m", "prompt": [1, "x"]}"#.to_vec(),
            "prompt[1]",
        ),
        (b"{not json".to_vec(), "malformed JSON"),
        (br#"{"prompt": "x"}"#.to_vec(), "`model`"),
    ] {
        let mut stream = ExtProc::open(&local).await;
        stream.send(headers(false, None, None)).await;
        send_body(&stream, &payload, 4).await;
        let (status, body) = immediate(&stream.next().await);
        assert_eq!(status, 400, "{body}");
        assert!(body["message"].as_str().unwrap().contains(field), "{body}");
        stream.ends().await;
    }
    let metrics = local.metrics().await;
    assert_eq!(
        sample(
            &metrics,
            "burst_prefix_epp_immediate_responses_total{status=\"400\"}"
        ),
        3.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_window_gets_429_with_retry_after() {
    let local = Local::start_with_limits(
        &endpoints(2, 3000),
        burst_prefix_core::Limits {
            max_window_bytes: 2000,
            ..Default::default()
        },
    )
    .await;
    let mut waiting = ExtProc::open(&local).await;
    waiting.send(headers(false, None, None)).await;
    send_body(&waiting, &payload(&"a".repeat(1500)), 500).await;
    local.until_window_holds(1).await;
    let mut refused = ExtProc::open(&local).await;
    refused.send(headers(false, None, None)).await;
    send_body(&refused, &payload(&"b".repeat(1500)), 500).await;
    let response = refused.next().await;
    let (status, body) = immediate(&response);
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"], "window_full");
    let Some(processing_response::Response::ImmediateResponse(answer)) = &response.response else {
        unreachable!()
    };
    let retry_after = answer
        .headers
        .as_ref()
        .unwrap()
        .set_headers
        .iter()
        .find(|h| h.header.as_ref().unwrap().key == "retry-after");
    assert!(retry_after.is_some(), "{answer:?}");
    refused.ends().await;
    // The waiting one is routed when its window seals.
    assert!(destination(&waiting.next().await).starts_with("10.0.0."));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffered_mode_trailers_and_the_response_path() {
    let local = Local::start(&endpoints(2, 20)).await;
    // Buffered: the headers are answered at once, the routing comes with the body's answer.
    let mut stream = ExtProc::open(&local).await;
    stream
        .send(headers(false, None, Some(BodySendMode::Buffered)))
        .await;
    let continued = stream.next().await;
    assert!(matches!(
        continued.response,
        Some(processing_response::Response::RequestHeaders(_))
    ));
    assert!(continued.dynamic_metadata.is_none());
    stream.send(body(&payload("buffered"), true)).await;
    let picked = destination(&stream.next().await);
    let served = picked.split(',').next().unwrap().to_string();

    // The response path: headers carry the served endpoint; the body passes through.
    stream
        .send(data_plane::response_headers(Some(&served)))
        .await;
    assert!(matches!(
        stream.next().await.response,
        Some(processing_response::Response::ResponseHeaders(_))
    ));
    stream
        .send(data_plane::response_body(b"data: {}\n\n", true))
        .await;
    assert!(matches!(
        stream.next().await.response,
        Some(processing_response::Response::ResponseBody(_))
    ));
    drop(stream);
    let metrics = local.metrics().await;
    let endpoint = if served == "10.0.0.1:8000" {
        "ns/e1"
    } else {
        "ns/e2"
    };
    assert_eq!(
        sample(
            &metrics,
            &format!("burst_prefix_epp_served_total{{endpoint=\"{endpoint}\"}}")
        ),
        1.0
    );

    // Full duplex with trailers: the body's last chunk does not say end of stream.
    let mut stream = ExtProc::open(&local).await;
    stream
        .send(headers(false, None, Some(BodySendMode::FullDuplexStreamed)))
        .await;
    stream.send(body(&payload("with trailers"), false)).await;
    stream.send(data_plane::request_trailers()).await;
    destination(&stream.next().await);
    let (_, end) = streamed_body(&stream.next().await);
    assert!(!end);
    assert!(matches!(
        stream.next().await.response,
        Some(processing_response::Response::RequestTrailers(_))
    ));

    // No body at all (a GET): routed on the headers.
    let mut stream = ExtProc::open(&local).await;
    stream.send(headers(true, None, None)).await;
    assert!(destination(&stream.next().await).starts_with("10.0.0."));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_health_answers_liveness_readiness_and_the_service() {
    let check = |epp: String, service: &'static str| async move {
        let channel = tonic::transport::Endpoint::from_shared(epp)
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = HealthClient::new(channel);
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            let status = client
                .check(HealthCheckRequest {
                    service: service.to_string(),
                })
                .await
                .map(|r| r.into_inner().status());
            if let Ok(status) = status {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{service}: {status:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let ready = Local::start(&endpoints(2, 20)).await;
    for service in [
        "liveness",
        "readiness",
        "envoy.service.ext_proc.v3.ExternalProcessor",
    ] {
        assert_eq!(
            check(ready.epp.clone(), service).await,
            ServingStatus::Serving,
            "{service}"
        );
    }
    let empty = Local::start("endpoints: []\n").await;
    assert_eq!(
        check(empty.epp.clone(), "liveness").await,
        ServingStatus::Serving
    );
    assert_eq!(
        check(empty.epp.clone(), "readiness").await,
        ServingStatus::NotServing
    );
    let mut stream = ExtProc::open(&empty).await;
    stream.send(headers(false, None, None)).await;
    send_body(&stream, &payload("x"), 1000).await;
    let (status, body) = immediate(&stream.next().await);
    assert_eq!(
        (status, body["error"].as_str()),
        (503, Some("no_endpoints"))
    );
}
