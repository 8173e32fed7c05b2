//! The proxy's request path (docs/behaviour.md §8) up to the choice of a replica: a request (route,
//! headers, body) through the proxy's router, whose producer has no config yet, so no request ever
//! leaves the process; and the headers the proxy would forward.
//!
//! Input: a first line that names the route (chat completions if it says `chat`), then
//! `name: value` header lines up to an empty line, then the body (the seeds in
//! `fuzz/seeds/proxy` read as plain text).

use std::cell::RefCell;
use std::num::NonZeroU32;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode};
use axum::Router;
use burst_prefix_core::admit::GROUP_SIZE_HEADER;
use burst_prefix_core::read::InferenceRequest;
use burst_prefix_core::ConfigOrigin;
use burst_prefix_core::{Limits, Producer};
use burst_prefix_producer::proxy::{self, ProxyConfig};
use tower::ServiceExt;

/// Small, so that the fuzzer reaches `413 body_too_large`.
const MAX_BODY_BYTES: usize = 4096;

const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// The client's address the checks forward for.
const PEER: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 7));

thread_local! {
    /// One runtime and one router for the whole run: with no config, a request changes nothing
    /// but counters.
    static PROXY: RefCell<Option<(tokio::runtime::Runtime, Router)>> = const { RefCell::new(None) };
}

/// A fuzzer's input as a request.
pub struct Input<'a> {
    pub path: &'static str,
    pub headers: HeaderMap,
    pub body: &'a [u8],
}

pub fn read(data: &[u8]) -> Input<'_> {
    let (route, mut rest) = split_line(data);
    let path = if route.windows(4).any(|w| w == b"chat") {
        "/v1/chat/completions"
    } else {
        "/v1/completions"
    };
    let mut headers = HeaderMap::new();
    loop {
        let (line, after) = split_line(rest);
        rest = after;
        if line.is_empty() {
            break;
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let value = &line[colon + 1..];
        let value = value.strip_prefix(b" ").unwrap_or(value);
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(&line[..colon]),
            HeaderValue::from_bytes(value),
        ) {
            // Framing is the server's (hyper checks it before the router sees a request).
            if name != header::CONTENT_LENGTH {
                headers.append(name, value);
            }
        }
    }
    Input {
        path,
        headers,
        body: rest,
    }
}

/// The first line of `data`, and what follows it.
fn split_line(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|&b| b == b'\n') {
        Some(end) => (&data[..end], &data[end + 1..]),
        None => (data, &[]),
    }
}

pub fn check(data: &[u8]) {
    let input = read(data);
    check_forwarded(&input.headers);
    let (status, retry_after, answer) = PROXY.with(|proxy| {
        let mut proxy = proxy.borrow_mut();
        let (runtime, router) = proxy.get_or_insert_with(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            let producer = Producer::new(
                ConfigOrigin::Demo,
                Limits {
                    max_body_bytes: MAX_BODY_BYTES,
                    ..Limits::default()
                },
            );
            let router =
                runtime.block_on(async { proxy::router(producer, ProxyConfig::default()) });
            (runtime, router)
        });
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(input.path)
            .body(Body::from(input.body.to_vec()))
            .expect("a request");
        *request.headers_mut() = input.headers.clone();
        runtime.block_on(async {
            let response = router.clone().oneshot(request).await.expect("infallible");
            let status = response.status();
            let retry_after = response.headers().get(header::RETRY_AFTER).cloned();
            let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .expect("an answer in memory");
            (status, retry_after, body)
        })
    });
    let answer: serde_json::Value =
        serde_json::from_slice(&answer).expect("an error in OpenAI's shape is JSON");
    let error = &answer["error"];
    let message = error["message"].as_str().expect("a message");
    let code = error["code"].as_str().expect("a code");
    let kind = error["type"].as_str().expect("a type");
    let param = &error["param"];

    // What the proxy must answer, in the order it looks: the body's size, the hint header,
    // the body, and then (valid, but no replica is known) 503.
    if input.body.len() > MAX_BODY_BYTES {
        assert_eq!(
            (status, code),
            (StatusCode::PAYLOAD_TOO_LARGE, "body_too_large")
        );
        return;
    }
    if let Some(hint) = input.headers.get(GROUP_SIZE_HEADER) {
        let valid = hint
            .to_str()
            .ok()
            .is_some_and(|t| t.trim().parse::<NonZeroU32>().is_ok());
        if !valid {
            assert_eq!((status, code), (StatusCode::BAD_REQUEST, "invalid_request"));
            assert!(message.contains(GROUP_SIZE_HEADER), "{message}");
            return;
        }
    }
    match InferenceRequest::parse(input.body) {
        Err(refused) => {
            assert_eq!(status, StatusCode::BAD_REQUEST, "{message}");
            assert_eq!(kind, "invalid_request_error");
            assert_eq!(code, refused.code());
            assert_eq!(message, refused.to_string());
            assert_eq!(
                param.as_str(),
                Some(refused.field()),
                "param names the field"
            );
        }
        Ok(_) => {
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{message}");
            assert_eq!((kind, code), ("server_error", "no_endpoints"));
            assert!(param.is_null());
            assert_eq!(retry_after.as_ref().map(|v| v.as_bytes()), Some(&b"1"[..]));
        }
    }
}

/// The headers passed on: all but the hop-by-hop ones, those `connection` names, `host`,
/// `content-length` and `expect`; `x-forwarded-for` with the client's address appended; the
/// others whole, in order.
fn check_forwarded(headers: &HeaderMap) {
    let forwarded = proxy::upstream::forwarded(headers, Some(PEER));
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .collect();
    let dropped = |name: &HeaderName| {
        HOP_BY_HOP.contains(&name.as_str())
            || name == header::HOST
            || name == header::CONTENT_LENGTH
            || name == header::EXPECT
            || named.iter().any(|n| n == name.as_str())
    };
    let chain = forwarded
        .get("x-forwarded-for")
        .expect("the client's address is forwarded")
        .to_str()
        .expect("text");
    assert!(chain.ends_with(&PEER.to_string()), "{chain}");
    for name in headers
        .keys()
        .filter(|name| name.as_str() != "x-forwarded-for")
    {
        let sent: Vec<&HeaderValue> = forwarded.get_all(name).iter().collect();
        if dropped(name) {
            assert!(sent.is_empty(), "{name} is not passed on");
        } else {
            let received: Vec<&HeaderValue> = headers.get_all(name).iter().collect();
            assert_eq!(sent, received, "{name} is passed on whole");
        }
    }
    assert!(
        forwarded
            .keys()
            .all(|name| headers.contains_key(name) || name.as_str() == "x-forwarded-for"),
        "nothing but x-forwarded-for is added"
    );
}
