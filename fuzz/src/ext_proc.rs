//! The endpoint picker's request path (docs/behaviour.md §9): the ext_proc messages of one HTTP
//! request, as the data plane sends them on the wire (length-delimited protobuf, as gRPC frames
//! carry them), in; what the picker answers out. No network: the picker only names endpoints, and
//! the producer's windows hold one request each (`maxBatchSize: 1`), so a body is planned at once.

use std::collections::HashSet;
use std::sync::OnceLock;

use burst_prefix_api::ProducerConfig;
use burst_prefix_core::read::InferenceRequest;
use burst_prefix_core::ConfigOrigin;
use burst_prefix_core::{Limits, Producer};
use burst_prefix_producer::epp::data_plane::{
    protocol, request_body as body, request_headers as headers, request_trailers as trailers,
    response_body, response_headers,
};
use burst_prefix_producer::epp::{self, messages};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation, processing_request, processing_response, CommonResponse, ProcessingRequest,
    ProcessingResponse,
};
use envoy_types::pb::google::protobuf::{value::Kind, Struct};
use futures::StreamExt;
use prost::Message;
use tonic::Status;

/// Three replicas; windows of one request, planned at once, without memory.
const CONFIG: &str = "\
maxBatchSize: 1
memory: {enabled: false}
endpoints:
  - {id: ns/a-rank-0, address: '10.0.0.1:8000'}
  - {id: ns/b-rank-0, address: '10.0.0.2:8000'}
  - {id: ns/c-rank-0, address: '10.0.0.3:8000'}
";

/// Small, so that the fuzzer reaches `413 body_too_large`.
const MAX_BODY_BYTES: usize = 4096;
/// Messages read from one input, at most.
const MAX_MESSAGES: usize = 64;

fn config() -> &'static ProducerConfig {
    static CONFIG_PARSED: OnceLock<ProducerConfig> = OnceLock::new();
    CONFIG_PARSED.get_or_init(|| ProducerConfig::from_yaml(CONFIG).expect("a valid config"))
}

/// The stream the data plane would send: each message as a gRPC frame holds it; bytes that do
/// not decode end the stream with an error, as tonic reports a bad frame.
pub fn decode(mut data: &[u8]) -> Vec<Result<ProcessingRequest, Status>> {
    let mut messages = Vec::new();
    while !data.is_empty() && messages.len() < MAX_MESSAGES {
        match ProcessingRequest::decode_length_delimited(&mut data) {
            Ok(message) => messages.push(Ok(message)),
            Err(error) => {
                messages.push(Err(Status::internal(error.to_string())));
                break;
            }
        }
    }
    messages
}

/// The wire form of `messages` (for seeds).
pub fn encode(messages: &[ProcessingRequest]) -> Vec<u8> {
    let mut data = Vec::new();
    for message in messages {
        message
            .encode_length_delimited(&mut data)
            .expect("a Vec grows");
    }
    data
}

thread_local! {
    /// One runtime and one producer for the whole run, as a producer serves stream after
    /// stream: between streams nothing is in flight (checked below), windows hold one request
    /// and memory is off, so an answer depends on its input alone.
    static PICKER: (tokio::runtime::Runtime, Producer) = {
        let producer = Producer::new(
            ConfigOrigin::Demo,
            Limits {
                max_body_bytes: MAX_BODY_BYTES,
                ..Limits::default()
            },
        );
        producer
            .config_store()
            .apply(config().clone())
            .expect("a valid config");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime");
        (runtime, producer)
    };
}

pub fn check(data: &[u8]) {
    let inbound = decode(data);
    let answers: Vec<ProcessingResponse> = PICKER.with(|(runtime, producer)| {
        let answers = runtime.block_on(async {
            let sent = futures::stream::iter(inbound.clone());
            epp::process(producer.clone(), sent)
                .map(|answer| answer.expect("the picker answers, or ends the stream"))
                .collect()
                .await
        });
        for endpoint in &config().endpoints {
            assert_eq!(
                producer.in_flight(&endpoint.id),
                0,
                "a stream that ended is no longer in flight on {}",
                endpoint.id
            );
        }
        answers
    });
    check_answers(&inbound, &answers);
}

/// What the picker did, checked against what it was sent.
fn check_answers(inbound: &[Result<ProcessingRequest, Status>], answers: &[ProcessingResponse]) {
    let addresses: HashSet<&str> = config()
        .endpoints
        .iter()
        .map(|e| e.address.as_str())
        .collect();
    // Everything the data plane sent before it failed (a bad frame ends the stream).
    let sent: Vec<&ProcessingRequest> = inbound.iter().map_while(|m| m.as_ref().ok()).collect();
    // The frame that broke the stream, if one did.
    let broken = inbound.iter().find_map(|m| m.as_ref().err());
    // A message yields one answer at most, but the one that completes the body in full duplex:
    // the routing headers, the body handed back, and the trailers' own answer.
    assert!(answers.len() <= sent.len() + 2, "answers for each message");
    let is_headers = |m: &ProcessingRequest| {
        matches!(
            m.request,
            Some(processing_request::Request::RequestHeaders(_))
        )
    };
    // As Envoy sends a request: its headers once, first. Other streams (a data plane that
    // misbehaves) only get the checks of every answer.
    let well_formed = sent.first().is_some_and(|m| is_headers(m))
        && sent.iter().filter(|m| is_headers(m)).count() == 1;
    let subset = sent
        .first()
        .filter(|_| well_formed)
        .and_then(|m| messages::subset(m.metadata_context.as_ref()));
    let chunks: Vec<&[u8]> = sent
        .iter()
        .filter_map(|m| match &m.request {
            Some(processing_request::Request::RequestBody(body)) => Some(body.body.as_slice()),
            _ => None,
        })
        .collect();
    let mut routed = 0;
    for (i, answer) in answers.iter().enumerate() {
        let response = answer
            .response
            .as_ref()
            .expect("every answer says what it answers");
        if let processing_response::Response::ImmediateResponse(immediate) = response {
            assert_eq!(
                i,
                answers.len() - 1,
                "an immediate response ends the stream"
            );
            let status = immediate.status.as_ref().expect("a status").code;
            let body: serde_json::Value =
                serde_json::from_slice(&immediate.body).expect("a JSON body");
            let code = body["error"].as_str().expect("a code");
            let message = body["message"].as_str().expect("a message");
            assert_eq!(immediate.details, format!("burst_prefix_{code}"));
            match status {
                400 => check_bad_request(code, message, &chunks, broken),
                413 => assert_eq!(code, "body_too_large"),
                500 => assert_eq!(code, "unsupported_body_mode"),
                503 => assert_eq!(code, "no_eligible_endpoint", "{message}"),
                other => panic!("unexpected status {other}: {message}"),
            }
            continue;
        }
        let (common, metadata) = match response {
            processing_response::Response::RequestHeaders(headers) => {
                (headers.response.as_ref(), answer.dynamic_metadata.as_ref())
            }
            processing_response::Response::RequestBody(body) => {
                (body.response.as_ref(), answer.dynamic_metadata.as_ref())
            }
            _ => continue,
        };
        let Some(destinations) = common.and_then(destination_header) else {
            continue;
        };
        routed += 1;
        let picked: Vec<&str> = destinations.split(',').collect();
        let distinct: HashSet<&str> = picked.iter().copied().collect();
        assert!(
            (1..=epp::MAX_DESTINATIONS).contains(&picked.len()) && distinct.len() == picked.len(),
            "the pick, then distinct fallbacks: {destinations}"
        );
        assert!(
            picked.iter().all(|a| addresses.contains(a)),
            "only configured endpoints: {destinations}"
        );
        if let Some(subset) = &subset {
            assert!(
                picked.iter().all(|a| subset.iter().any(|s| s == a)),
                "only the subset {subset:?}: {destinations}"
            );
        }
        assert_eq!(
            metadata.and_then(destination_metadata),
            Some(destinations),
            "the header and the metadata agree"
        );
        // Full duplex: the body goes back unchanged (as much of it as came before the
        // decision), with its length.
        if let Some(length) = common.and_then(|c| header_value(c, "content-length")) {
            let body = answers
                .get(i + 1)
                .and_then(handed_back)
                .expect("the body follows the routing headers");
            assert_eq!(length, body.len().to_string());
            assert!(
                (0..=chunks.len()).any(|n| chunks[..n].concat() == body),
                "the body is handed back unchanged"
            );
            assert!(
                InferenceRequest::parse(&body).is_ok(),
                "a routed body is a request"
            );
        }
    }
    if well_formed {
        assert!(routed <= 1, "a request is routed once");
    }
}

/// A 400 names the field: the header hint, the body's first broken field, or the frame that
/// broke the stream before the request was routed.
fn check_bad_request(code: &str, message: &str, chunks: &[&[u8]], broken: Option<&Status>) {
    if message.starts_with("header x-burst-prefix-group-size: ") {
        assert_eq!(code, "invalid_request");
        return;
    }
    if let Some(status) = broken {
        if code == "invalid_body" {
            assert_eq!(
                message,
                format!("the request body could not be read: {}", status.message())
            );
            return;
        }
    }
    // The body is the chunks up to the one that ended it.
    let explained = (0..=chunks.len()).any(|n| {
        InferenceRequest::parse(&chunks[..n].concat())
            .is_err_and(|e| e.code() == code && e.to_string() == message)
    });
    assert!(explained, "400 {code}: {message} is the parser's refusal");
}

fn header_value<'a>(common: &'a CommonResponse, name: &str) -> Option<&'a str> {
    let mutation = common.header_mutation.as_ref()?;
    let header = mutation
        .set_headers
        .iter()
        .filter_map(|h| h.header.as_ref())
        .find(|h| h.key == name)?;
    std::str::from_utf8(&header.raw_value).ok()
}

fn destination_header(common: &CommonResponse) -> Option<&str> {
    header_value(common, messages::DESTINATION_KEY)
}

fn destination_metadata(metadata: &Struct) -> Option<&str> {
    let lb = metadata.fields.get(messages::DESTINATION_NAMESPACE)?;
    let Some(Kind::StructValue(lb)) = &lb.kind else {
        return None;
    };
    match &lb.fields.get(messages::DESTINATION_KEY)?.kind {
        Some(Kind::StringValue(value)) => Some(value),
        _ => None,
    }
}

fn handed_back(answer: &ProcessingResponse) -> Option<Vec<u8>> {
    let Some(processing_response::Response::RequestBody(body)) = &answer.response else {
        return None;
    };
    match body
        .response
        .as_ref()?
        .body_mutation
        .as_ref()?
        .mutation
        .as_ref()?
    {
        body_mutation::Mutation::StreamedResponse(streamed) => Some(streamed.body.clone()),
        _ => None,
    }
}

/// Seeds: realistic streams (`BURST_PREFIX_FUZZ_WRITE_SEEDS=DIR` writes them; see the README).
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let full_duplex = Some(protocol(
        BodySendMode::FullDuplexStreamed,
        BodySendMode::FullDuplexStreamed,
    ));
    let buffered = Some(protocol(BodySendMode::Buffered, BodySendMode::None));
    let chat = br#"{"model": "llama", "messages": [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Hello!"}], "stream": true}"#;
    let completion = br#"{"model": "llama", "prompt": "Solve step by step: what is 17 * 23?", "n": 1, "burst_prefix": {"group_size": 1}}"#;
    let seeds = [
        (
            "full_duplex_chat",
            vec![
                headers(
                    full_duplex,
                    &[(":path", "/v1/chat/completions")],
                    None,
                    false,
                ),
                body(&chat[..40], false),
                body(&chat[40..], true),
                response_headers(Some("10.0.0.2:8000")),
                response_body(b"data: {}\n\n", true),
            ],
        ),
        (
            "buffered_completion_in_subset",
            vec![
                headers(
                    buffered,
                    &[("x-burst-prefix-group-size", "1")],
                    Some(&["10.0.0.3:8000", "10.0.0.9:1"]),
                    false,
                ),
                body(completion, true),
                trailers(),
            ],
        ),
        (
            "headers_only",
            vec![headers(None, &[(":method", "GET")], None, true)],
        ),
        (
            "bad_body",
            vec![
                headers(full_duplex, &[], None, false),
                body(br#"{"model": "m", "prompt": [1, -1]}"#, true),
            ],
        ),
    ];
    seeds
        .into_iter()
        .map(|(name, messages)| (name, encode(&messages)))
        .collect()
}
