//! Proxy mode (docs/behaviour.md §8) over real HTTP on loopback, in front of real upstream servers:
//! stub engines (`crates/stub-engine`) that record what reached them and stream SSE.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use burst_prefix_producer::proxy::ProxyConfig;
use burst_prefix_stub_engine::{Options, RecordedRequest, StubEngine, ENGINE_ID_HEADER};
use common::{dead_address, sample, Local, PATIENCE};
use futures::StreamExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use serde_json::{json, Value};

/// `n` stub engines `e0..`, and the producer config that names them `ns/e{i}`.
async fn engines(n: usize, window_ms: u64) -> (Vec<StubEngine>, String) {
    common::stub_engines(
        n,
        &format!("windowDurationMs: {window_ms}\nbalanceBy: requests\n"),
    )
    .await
}

fn completion(prompt: &str) -> Value {
    json!({"model": "m", "prompt": prompt, "max_tokens": 2})
}

async fn send(local: &Local, path: &str, body: &Value) -> reqwest::Response {
    local
        .client
        .post(format!("{}{path}", local.base))
        .json(body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {path}: {e}"))
}

fn header(response: &reqwest::Response, name: &str) -> String {
    response
        .headers()
        .get(name)
        .unwrap_or_else(|| panic!("no {name} in {:?}", response.headers()))
        .to_str()
        .unwrap()
        .to_string()
}

/// Polls a stub's record until `done` holds for some request (bounded by PATIENCE).
async fn eventually(stub: &StubEngine, done: impl Fn(&RecordedRequest) -> bool) -> RecordedRequest {
    let started = Instant::now();
    loop {
        if let Some(request) = stub.requests().into_iter().find(|r| done(r)) {
            return request;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "never seen: {:#?}",
            stub.requests()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_lands_as_planned_and_each_request_reaches_one_upstream_once() {
    let (stubs, yaml) = engines(4, 2000).await;
    let local = Local::start(&yaml).await;
    let mut sends = Vec::new();
    // 6 prompts x 8 samples, interleaved as a rollout driver sends them, with group hints.
    for sample in 0..8 {
        for prompt in 0..6 {
            let client = local.client.clone();
            let url = format!("{}/v1/completions", local.base);
            let body = completion(&format!("rollout prompt {prompt}: {}", "x".repeat(300)));
            sends.push(tokio::spawn(async move {
                let response = client
                    .post(url)
                    .header("x-burst-prefix-group-size", "8")
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status(), 200);
                let endpoint = header(&response, "x-burst-prefix-endpoint");
                let engine = header(&response, ENGINE_ID_HEADER);
                let window: u64 = header(&response, "x-burst-prefix-window").parse().unwrap();
                let answer: Value = response.json().await.unwrap();
                assert_eq!(answer["object"], "text_completion");
                (prompt, sample, endpoint, engine, window)
            }));
        }
    }
    let mut by_prompt: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
    for send in sends {
        let (prompt, _, endpoint, engine, window) = send.await.unwrap();
        // The header names the endpoint whose engine answered.
        assert_eq!(endpoint, format!("ns/{engine}"));
        assert!(window >= 1);
        by_prompt.entry(prompt).or_default().insert(endpoint);
    }
    for (prompt, endpoints) in &by_prompt {
        assert_eq!(
            endpoints.len(),
            1,
            "prompt {prompt} split over {endpoints:?}"
        );
    }
    // Every request reached exactly one upstream, once.
    let reached: usize = stubs.iter().map(|s| s.requests().len()).sum();
    assert_eq!(reached, 48);
    for stub in &stubs {
        for request in stub.requests() {
            assert_eq!(request.path, "/v1/completions");
            assert_eq!(
                request
                    .headers
                    .get("x-burst-prefix-group-size")
                    .map(String::as_str),
                Some("8")
            );
            assert!(
                !request.headers.contains_key("connection"),
                "{:?}",
                request.headers
            );
        }
    }
    let metrics = local.metrics().await;
    let served: f64 = (0..4)
        .map(|i| {
            sample(
                &metrics,
                &format!(
                    "burst_prefix_upstream_requests_total{{class=\"2xx\",endpoint=\"ns/e{i}\"}}"
                ),
            )
        })
        .sum();
    assert_eq!(served, 48.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_passes_chunks_through_as_they_come() {
    let (stubs, yaml) = engines(1, 20).await;
    let local = Local::start(&yaml).await;
    let body = json!({"model": "m", "prompt": "stream me", "stream": true,
                      "stub": {"chunks": 5, "chunkDelayMs": 300}});
    let response = send(&local, "/v1/completions", &body).await;
    assert_eq!(response.status(), 200);
    assert!(header(&response, "content-type").starts_with("text/event-stream"));
    let mut chunks = response.bytes_stream();
    let first = chunks.next().await.expect("a first chunk").unwrap();
    let first_seen = now_micros();
    assert!(
        String::from_utf8_lossy(&first).starts_with("data: "),
        "{first:?}"
    );
    let mut rest = Vec::new();
    while let Some(chunk) = chunks.next().await {
        rest.extend_from_slice(&chunk.unwrap());
    }
    assert!(String::from_utf8_lossy(&rest)
        .trim_end()
        .ends_with("data: [DONE]"));
    let recorded = eventually(&stubs[0], |r| r.completed).await;
    let last_sent = recorded.last_chunk_unix_micros.expect("chunks were sent");
    // Not buffered: the client had the first chunk before the stub sent its last one.
    assert!(
        first_seen < last_sent,
        "first chunk seen at {first_seen}, last chunk sent at {last_sent}"
    );
}

fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_cancels_the_upstream_request() {
    let (stubs, yaml) = engines(1, 20).await;
    let local = Local::start(&yaml).await;
    let body = json!({"model": "m", "prompt": "long answer", "stream": true,
                      "stub": {"chunks": 100, "chunkDelayMs": 100}});
    let response = send(&local, "/v1/completions", &body).await;
    let mut chunks = response.bytes_stream();
    chunks.next().await.expect("a first chunk").unwrap();
    drop(chunks);
    let recorded = eventually(&stubs[0], |r| r.client_disconnected).await;
    assert!(!recorded.completed);
    assert!(recorded.chunks_sent < 100, "{recorded:?}");
    // Nothing stays in flight.
    let started = Instant::now();
    loop {
        let metrics = local.metrics().await;
        if sample(
            &metrics,
            "burst_prefix_upstream_in_flight{endpoint=\"ns/e0\"}",
        ) == 0.0
        {
            break;
        }
        assert!(started.elapsed() < PATIENCE, "{metrics}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_replica_is_retried_and_a_group_fails_over_together() {
    let stubs = [
        StubEngine::start(Options::with_id("b")).await.unwrap(),
        StubEngine::start(Options::with_id("c")).await.unwrap(),
    ];
    // `ns/a` sorts first: the planner's tie-break puts the group there.
    let yaml = format!(
        "windowDurationMs: 300\nbalanceBy: requests\nendpoints:\n  - {{id: ns/a, address: '{}'}}\n  - {{id: ns/b, address: '{}'}}\n  - {{id: ns/c, address: '{}'}}\n",
        dead_address(),
        stubs[0].addr(),
        stubs[1].addr()
    );
    let local = Local::start(&yaml).await;
    let sends: Vec<_> = (0..6)
        .map(|_| {
            let client = local.client.clone();
            let url = format!("{}/v1/completions", local.base);
            tokio::spawn(async move {
                let response = client
                    .post(url)
                    .json(&completion("the group"))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status(), 200);
                header(&response, "x-burst-prefix-endpoint")
            })
        })
        .collect();
    let mut served = BTreeSet::new();
    for send in sends {
        served.insert(send.await.unwrap());
    }
    assert_eq!(served.len(), 1, "the group split on failover: {served:?}");
    assert!(!served.contains("ns/a"));
    let metrics = local.metrics().await;
    // Members forwarded before the first refusal are retried; later ones skip the cooling
    // replica and go straight to the same fallback.
    let retries = sample(&metrics, "burst_prefix_upstream_retries_total");
    assert!((1.0..=6.0).contains(&retries), "{retries}");
    assert!(
        sample(
            &metrics,
            "burst_prefix_upstream_cooldowns_total{endpoint=\"ns/a\",reason=\"unreachable\"}"
        ) >= 1.0
    );
    // Cooling down: the next request is not sent to `ns/a` at all.
    let response = send(&local, "/v1/completions", &completion("next")).await;
    assert_eq!(response.status(), 200);
    assert_ne!(header(&response, "x-burst-prefix-endpoint"), "ns/a");
    let metrics = local.metrics().await;
    assert_eq!(
        sample(&metrics, "burst_prefix_upstream_retries_total"),
        retries
    );
    // No request reached a live upstream twice.
    let reached: usize = stubs.iter().map(|s| s.requests().len()).sum();
    assert_eq!(reached, 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_before_any_byte_is_retried_once_then_passed_on() {
    let mut failing = Options::with_id("failing");
    failing.fail_status = Some(503);
    let stubs = [
        StubEngine::start(failing.clone()).await.unwrap(),
        StubEngine::start(Options::with_id("fine")).await.unwrap(),
    ];
    let yaml = format!(
        "windowDurationMs: 20\nbalanceBy: requests\nendpoints:\n  - {{id: ns/a, address: '{}'}}\n  - {{id: ns/b, address: '{}'}}\n",
        stubs[0].addr(),
        stubs[1].addr()
    );
    let local = Local::start(&yaml).await;
    let response = send(&local, "/v1/completions", &completion("x")).await;
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, ENGINE_ID_HEADER), "fine");
    assert_eq!(stubs[0].requests().len(), 1);

    // Every replica refuses: the last refusal is passed on as the engine gave it.
    let both = [
        StubEngine::start(failing.clone()).await.unwrap(),
        StubEngine::start(failing).await.unwrap(),
    ];
    let yaml = format!(
        "windowDurationMs: 20\nbalanceBy: requests\nendpoints:\n  - {{id: ns/a, address: '{}'}}\n  - {{id: ns/b, address: '{}'}}\n",
        both[0].addr(),
        both[1].addr()
    );
    let local = Local::start(&yaml).await;
    let response = send(&local, "/v1/completions", &completion("x")).await;
    assert_eq!(response.status(), 503);
    let reached: usize = both.iter().map(|s| s.requests().len()).sum();
    assert_eq!(reached, 2, "tried once, retried once");
}

/// An OpenAI-shaped error: `(status, code, message, param)`.
async fn openai_error(response: reqwest::Response) -> (u16, String, String, Value) {
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap();
    let error = &body["error"];
    assert!(error["type"].is_string(), "{body}");
    (
        status,
        error["code"].as_str().unwrap().to_string(),
        error["message"].as_str().unwrap().to_string(),
        error["param"].clone(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_a_client_can_act_on_in_openai_shape() {
    // No endpoints: 503 with Retry-After.
    let local = Local::start("endpoints: []\n").await;
    let response = send(&local, "/v1/chat/completions", &completion("x")).await;
    assert_eq!(response.headers()["retry-after"], "1");
    let (status, code, _, _) = openai_error(response).await;
    assert_eq!((status, code.as_str()), (503, "no_endpoints"));

    // Bad body: 400 naming the field.
    let (_stubs, yaml) = engines(1, 20).await;
    let local = Local::start(&yaml).await;
    let response = send(
        &local,
        "/v1/chat/completions",
        &json!({"model": "m", "messages": [{"content": "x"}]}),
    )
    .await;
    let (status, code, message, param) = openai_error(response).await;
    assert_eq!((status, code.as_str()), (400, "invalid_request"));
    assert_eq!(param, "messages[0]");
    assert!(message.contains("`role` is missing"), "{message}");

    // Upstream failed: 502 naming the endpoint.
    let yaml = format!(
        "windowDurationMs: 20\nbalanceBy: requests\nendpoints:\n  - {{id: ns/gone, address: '{}'}}\n",
        dead_address()
    );
    let local = Local::start(&yaml).await;
    let response = send(&local, "/v1/completions", &completion("x")).await;
    let (status, code, message, _) = openai_error(response).await;
    assert_eq!((status, code.as_str()), (502, "upstream_failed"));
    assert!(message.contains("ns/gone"), "{message}");

    // Window full: 429 with Retry-After.
    let (_stubs, yaml) = engines(1, 3000).await;
    let local = Local::start_with_limits(
        &yaml,
        burst_prefix_core::Limits {
            max_window_bytes: 2000,
            ..Default::default()
        },
    )
    .await;
    let waiting = {
        let client = local.client.clone();
        let url = format!("{}/v1/completions", local.base);
        tokio::spawn(async move {
            client
                .post(url)
                .json(&completion(&"y".repeat(1500)))
                .send()
                .await
        })
    };
    local.until_window_holds(1).await;
    let response = send(&local, "/v1/completions", &completion(&"z".repeat(1500))).await;
    assert!(response.headers().contains_key("retry-after"));
    let (status, code, message, _) = openai_error(response).await;
    assert_eq!((status, code.as_str()), (429, "window_full"), "{message}");
    assert_eq!(waiting.await.unwrap().unwrap().status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_are_forwarded_to_a_replica() {
    let (_stubs, yaml) = engines(2, 20).await;
    let local = Local::start(&yaml).await;
    let response = local
        .client
        .get(format!("{}/v1/models", local.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(header(&response, "x-burst-prefix-endpoint").starts_with("ns/e"));
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["object"], "list");
    assert_eq!(body["data"][0]["id"], "stub-model");
}

/// An upstream that counts the connections open to it, as a thread-per-connection server
/// (llama-server's cpp-httplib) feels them: each holds one of its threads until the client
/// closes it. Every completion waits until `burst` of them are in flight at once, so a client
/// must open `burst` connections to it.
struct CountingUpstream {
    addr: std::net::SocketAddr,
    accepted: Arc<AtomicUsize>,
    open: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl CountingUpstream {
    async fn start(burst: usize) -> CountingUpstream {
        let barrier = Arc::new(tokio::sync::Barrier::new(burst));
        let router = axum::Router::new().route(
            "/v1/completions",
            axum::routing::post(move || {
                let barrier = barrier.clone();
                async move {
                    barrier.wait().await;
                    axum::Json(json!({"object": "text_completion", "choices": []}))
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicUsize::new(0));
        let (accepted_, open_) = (accepted.clone(), open.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                accepted_.fetch_add(1, Ordering::SeqCst);
                open_.fetch_add(1, Ordering::SeqCst);
                let (open, router) = (open_.clone(), router.clone());
                tokio::spawn(async move {
                    // Served until the client closes it: no server-side idle timeout.
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), TowerToHyperService::new(router))
                        .await;
                    open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        CountingUpstream {
            addr,
            accepted,
            open,
            task,
        }
    }
}

impl Drop for CountingUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Issue 40: after a burst, the proxy keeps at most `max_idle_per_upstream` connections open to
/// a replica (counted on the replica's side), not one per request of the burst: on
/// llama-server each would keep one of its few HTTP threads from the requests behind it. The
/// idle timeout is made long here, so only the bound can close them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_burst_the_proxy_keeps_at_most_the_bound_of_idle_connections_to_a_replica() {
    const BURST: usize = 8;
    let bound = ProxyConfig::default().max_idle_per_upstream;
    assert!(bound < BURST, "the burst must open more than the bound");
    let upstream = CountingUpstream::start(BURST).await;
    let yaml = format!(
        "windowDurationMs: 0\nendpoints:\n  - {{id: ns/a, address: '{}'}}\n",
        upstream.addr
    );
    let proxy = ProxyConfig {
        idle_timeout: Duration::from_secs(600),
        ..ProxyConfig::default()
    };
    let local = Local::start_with_proxy(&yaml, proxy).await;
    let sends: Vec<_> = (0..BURST)
        .map(|i| {
            let client = local.client.clone();
            let url = format!("{}/v1/completions", local.base);
            tokio::spawn(async move {
                let response = client
                    .post(url)
                    .json(&completion(&format!("request {i}")))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status(), 200);
                response.bytes().await.unwrap();
            })
        })
        .collect();
    for send in sends {
        send.await.unwrap();
    }
    // The burst was in flight at once: one connection each.
    assert_eq!(upstream.accepted.load(Ordering::SeqCst), BURST);
    let started = Instant::now();
    loop {
        let open = upstream.open.load(Ordering::SeqCst);
        if open <= bound {
            break;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "{open} connections stay open to the replica after the burst, bound {bound}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
