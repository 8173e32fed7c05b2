//! Every request is counted once in `burst_prefix_requests_total{outcome}`, whatever front-end
//! answered it: the refusals a client saw are the `rejected` count, the requests that were placed
//! are `assigned` or `no_affinity` (also when their replica then fails them), and the outcomes
//! add up to the requests sent.

mod common;

use burst_prefix_core::Limits;
use burst_prefix_producer::epp::data_plane;
use common::ext_proc::{immediate, ExtProc};
use common::{completion, dead_address, sample, Local};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;

const MAX_BODY_BYTES: usize = 1024;

async fn local(yaml: &str) -> Local {
    let limits = Limits {
        max_body_bytes: MAX_BODY_BYTES,
        ..Limits::default()
    };
    Local::start_with_limits(yaml, limits).await
}

/// The count of each outcome: (assigned, no_affinity, rejected, cancelled).
async fn outcomes(local: &Local) -> [u64; 4] {
    let metrics = local.metrics().await;
    ["assigned", "no_affinity", "rejected", "cancelled"].map(|outcome| {
        let series = format!("burst_prefix_requests_total{{outcome=\"{outcome}\"}}");
        sample(&metrics, &series) as u64
    })
}

fn too_large() -> String {
    completion(&"x".repeat(MAX_BODY_BYTES)).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scoring_api_counts_each_refusal_once() {
    let local = local(&format!("windowDurationMs: 20\n{}", common::endpoints(2))).await;
    let post = |path: &'static str, header: Option<&'static str>, body: String| {
        let mut request = local
            .client
            .post(format!("{}{path}", local.base))
            .body(body);
        if let Some(value) = header {
            request = request.header("x-burst-prefix-group-size", value);
        }
        async move { request.send().await.unwrap().status().as_u16() }
    };
    let good = completion("fine").to_string();
    let statuses = [
        post("/v1/produce", None, "{".into()).await,
        post("/v1/produce", Some("zero"), good.clone()).await,
        post("/v1/produce?matches=some", None, good.clone()).await,
        post("/v1/produce", None, too_large()).await,
        post("/v1/produce", None, good.clone()).await,
    ];
    assert_eq!(statuses, [400, 400, 400, 413, 200]);
    assert_eq!(outcomes(&local).await, [0, 1, 4, 0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_counts_its_refusals_and_not_a_replicas_failure() {
    // One replica that nothing listens on: a placed request fails there (502), and is counted
    // as placed, not as refused.
    let yaml = format!(
        "windowDurationMs: 20\nendpoints:\n  - {{id: ns/dead, address: '{}'}}\n",
        dead_address()
    );
    let local = local(&yaml).await;
    let post = |header: Option<&'static str>, body: String| {
        let mut request = local
            .client
            .post(format!("{}/v1/completions", local.base))
            .body(body);
        if let Some(value) = header {
            request = request.header("x-burst-prefix-group-size", value);
        }
        async move { request.send().await.unwrap().status().as_u16() }
    };
    let statuses = [
        post(None, "{".into()).await,
        post(Some("-2"), completion("x").to_string()).await,
        post(None, too_large()).await,
        post(None, completion("placed, then failed upstream").to_string()).await,
    ];
    assert_eq!(statuses, [400, 400, 413, 502]);
    assert_eq!(outcomes(&local).await, [0, 1, 3, 0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_picker_counts_its_own_refusals() {
    let local = local(&format!("windowDurationMs: 20\n{}", common::endpoints(2))).await;
    let full_duplex = || {
        Some(data_plane::protocol(
            BodySendMode::FullDuplexStreamed,
            BodySendMode::FullDuplexStreamed,
        ))
    };
    let mut statuses = Vec::new();
    // A bad hint header, a body mode it cannot route by, and an empty subset: refused on the
    // headers.
    for (protocol, headers, subset) in [
        (
            full_duplex(),
            &[("x-burst-prefix-group-size", "0")][..],
            None,
        ),
        (
            Some(data_plane::protocol(
                BodySendMode::Streamed,
                BodySendMode::None,
            )),
            &[],
            None,
        ),
        (full_duplex(), &[], Some(&[][..])),
    ] {
        let mut stream = ExtProc::open(&local).await;
        let end_of_stream = subset.is_some();
        stream
            .send(data_plane::request_headers(
                protocol,
                headers,
                subset,
                end_of_stream,
            ))
            .await;
        statuses.push(immediate(&stream.next().await).0);
    }
    // A body too large, and a malformed one: refused on the body.
    for body in [too_large().into_bytes(), b"{".to_vec()] {
        let mut stream = ExtProc::open(&local).await;
        stream
            .send(data_plane::request_headers(full_duplex(), &[], None, false))
            .await;
        stream.send(data_plane::request_body(&body, true)).await;
        statuses.push(immediate(&stream.next().await).0);
    }
    assert_eq!(statuses, [400, 500, 503, 413, 400]);
    // One it routes.
    let mut stream = ExtProc::open(&local).await;
    stream
        .send(data_plane::request_headers(full_duplex(), &[], None, false))
        .await;
    let body = completion("fine").to_string();
    stream
        .send(data_plane::request_body(body.as_bytes(), true))
        .await;
    stream.next().await;
    assert_eq!(outcomes(&local).await, [0, 1, 5, 0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scoring_api_counts_a_request_past_its_bound_as_a_refusal() {
    // A window that outlasts the scoring API's bound (shortened here from 30 s), and a body
    // that never ends: both are answered 408 `request_timeout` and counted refused, not
    // cancelled.
    let producer = burst_prefix_core::Producer::with_config(
        &format!("windowDurationMs: 10000\n{}", common::endpoints(2)),
        Limits::default(),
    )
    .unwrap();
    let bound = std::time::Duration::from_millis(300);
    let app = burst_prefix_producer::scoring::router_within(producer.clone(), bound);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let client = reqwest::Client::new();
    let waits = client
        .post(format!("{base}/v1/produce"))
        .body(completion("waits for a window of 10 s").to_string())
        .send()
        .await
        .unwrap();
    let (never_ends, _sender) = {
        let (sender, receiver) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
        sender.send(Ok(b"{\"model\": ".to_vec())).await.unwrap();
        let stream = tokio_stream::wrappers::ReceiverStream::new(receiver);
        let response = client
            .post(format!("{base}/v1/produce"))
            .body(reqwest::Body::wrap_stream(stream))
            .send();
        (response.await.unwrap(), sender)
    };
    for response in [waits, never_ends] {
        assert_eq!(response.status().as_u16(), 408);
        let error: serde_json::Value = response.json().await.unwrap();
        assert_eq!(error["error"], "request_timeout", "{error}");
    }
    let metrics = producer.metrics().render();
    let count = |outcome: &str| {
        sample(
            &metrics,
            &format!("burst_prefix_requests_total{{outcome=\"{outcome}\"}}"),
        )
    };
    assert_eq!(
        (count("rejected"), count("cancelled"), count("assigned")),
        (2.0, 0.0, 0.0)
    );
    server.abort();
}
