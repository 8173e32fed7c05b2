//! What the proxy passes between clients and replicas (docs/behaviour.md §8), as the real binary
//! on loopback in front of stub engines: a replica's redirect goes back to the client and is
//! never followed; a 101 from a replica is a 502; `expect` and `proxy-connection` are not
//! forwarded and `x-forwarded-for` gets the client's address appended; a replica cools down when
//! it refuses a connection or answers 502/503/504 several times in a row, never because crafted
//! requests made it fail once each. Every loop is bounded; deadlines are generous.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;

use burst_prefix_stub_engine::{Options, StubEngine, ENGINE_ID_HEADER};
use common::{dead_address, Binary, PATIENCE};
use serde_json::{json, Value};

const ENDPOINT_HEADER: &str = "x-burst-prefix-endpoint";

/// A config naming `(id, address)` endpoints, each request alone in a 20 ms window.
fn config_of(endpoints: &[(&str, String)]) -> String {
    let mut yaml = String::from("windowDurationMs: 20\nendpoints:\n");
    for (id, address) in endpoints {
        yaml.push_str(&format!("  - {{id: {id}, address: '{address}'}}\n"));
    }
    yaml
}

/// A client that follows no redirect itself: what the proxy answers is what it gets.
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(PATIENCE)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

fn completion(prompt: &str, stub: Value) -> Value {
    json!({"model": "m", "prompt": prompt, "max_tokens": 2, "stub": stub})
}

fn header(response: &reqwest::Response, name: &str) -> Option<String> {
    response
        .headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_string())
}

/// The value of a metric sample, 0 when the series is absent.
fn sample_or_zero(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |value| value.parse().unwrap())
}

async fn metrics(client: &reqwest::Client, producer: &Binary) -> String {
    common::get_text(client, &format!("{}/metrics", producer.admin))
        .await
        .1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicas_redirect_goes_back_to_the_client_and_nothing_reaches_the_foreign_address() {
    let replica = StubEngine::start(Options::with_id("replica"))
        .await
        .unwrap();
    let foreign = StubEngine::start(Options::with_id("foreign"))
        .await
        .unwrap();
    let producer = Binary::serve_config(
        &config_of(&[("ns/replica", replica.addr().to_string())]),
        &[],
    );
    let client = client();
    let location = format!("{}/v1/completions", foreign.url());
    for status in [307, 302, 301, 308] {
        let response = client
            .post(format!("{}/v1/completions", producer.base))
            .header("x-api-key", "secret-of-the-client")
            .json(&completion(
                "redirected",
                json!({"status": status, "location": location}),
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), status);
        assert_eq!(header(&response, "location").as_deref(), Some(&*location));
        assert_eq!(
            header(&response, ENDPOINT_HEADER).as_deref(),
            Some("ns/replica")
        );
        assert_eq!(
            header(&response, ENGINE_ID_HEADER).as_deref(),
            Some("replica")
        );
        assert_eq!(response.text().await.unwrap(), "", "{status}");
    }
    assert_eq!(replica.requests().len(), 4);
    assert!(
        foreign.requests().is_empty(),
        "the proxy followed a redirect: {:#?}",
        foreign.requests()
    );
}

/// A replica that answers every request with `101 Switching Protocols` (after reading its
/// head and body), on a thread of its own; it holds each connection until the client closes it.
fn switching_replica() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        // At most a few connections: the test sends one request.
        for stream in listener.incoming().take(4) {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                stream.set_read_timeout(Some(PATIENCE)).unwrap();
                let mut request = Vec::new();
                let mut buffer = [0u8; 4096];
                while let Ok(n) = stream.read(&mut buffer) {
                    if n == 0 {
                        return;
                    }
                    request.extend_from_slice(&buffer[..n]);
                    let text = String::from_utf8_lossy(&request).to_lowercase();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let length = text
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map_or(0, |v| v.trim().parse::<usize>().unwrap());
                        if request.len() >= end + 4 + length {
                            break;
                        }
                    }
                }
                let _ = stream.write_all(
                    b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
                );
                // Hold until the proxy closes (bounded by the read timeout).
                while matches!(stream.read(&mut buffer), Ok(n) if n > 0) {}
            });
        }
    });
    address
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_101_from_a_replica_is_a_502() {
    let producer = Binary::serve_config(&config_of(&[("ns/switching", switching_replica())]), &[]);
    let response = client()
        .post(format!("{}/v1/completions", producer.base))
        .json(&completion("upgrade me", json!({})))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 502);
    assert!(header(&response, "upgrade").is_none());
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "upstream_failed", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("101 Switching Protocols"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_and_proxy_connection_stay_behind_and_x_forwarded_for_gets_the_client() {
    let replica = StubEngine::start(Options::with_id("replica"))
        .await
        .unwrap();
    let producer = Binary::serve_config(
        &config_of(&[("ns/replica", replica.addr().to_string())]),
        &[],
    );
    let client = client();
    let url = format!("{}/v1/completions", producer.base);
    let response = client
        .post(&url)
        .header("expect", "100-continue")
        .header("proxy-connection", "keep-alive")
        .header("x-forwarded-for", "203.0.113.7")
        .header("x-api-key", "k")
        .json(&completion("with headers", json!({})))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let response = client
        .post(&url)
        .json(&completion("without a chain", json!({})))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let seen = replica.requests();
    assert_eq!(seen.len(), 2);
    let first = &seen[0].headers;
    assert!(!first.contains_key("expect"), "{first:?}");
    assert!(!first.contains_key("proxy-connection"), "{first:?}");
    assert_eq!(first.get("x-api-key").map(String::as_str), Some("k"));
    assert_eq!(
        first.get("x-forwarded-for").map(String::as_str),
        Some("203.0.113.7, 127.0.0.1"),
        "{first:?}"
    );
    assert_eq!(
        seen[1].headers.get("x-forwarded-for").map(String::as_str),
        Some("127.0.0.1")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crafted_failures_cool_no_replica_down_but_failures_in_a_row_and_refusals_do() {
    let stubs = [
        StubEngine::start(Options::with_id("a")).await.unwrap(),
        StubEngine::start(Options::with_id("b")).await.unwrap(),
    ];
    let producer = Binary::serve_config(
        &config_of(&[
            ("ns/a", stubs[0].addr().to_string()),
            ("ns/b", stubs[1].addr().to_string()),
        ]),
        &[
            "--upstream-cooldown-after",
            "3",
            "--upstream-cooldown-ms",
            "600000",
        ],
    );
    let client = client();
    let url = format!("{}/v1/completions", producer.base);
    let send = |prompt: String, stub: Value| {
        let client = client.clone();
        let url = url.clone();
        async move {
            let response = client
                .post(&url)
                .json(&completion(&prompt, stub))
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let endpoint = header(&response, ENDPOINT_HEADER);
            response.bytes().await.unwrap();
            (status, endpoint)
        }
    };
    let cooldowns = |metrics: &str, endpoint: &str, reason: &str| {
        sample_or_zero(
            metrics,
            &format!(
                "burst_prefix_upstream_cooldowns_total{{endpoint=\"{endpoint}\",reason=\"{reason}\"}}"
            ),
        )
    };

    // Ten crafted requests that make every replica answer 503, among normal traffic: each is
    // tried and retried (20 failures), and no replica cools down; the normal requests all go
    // where they would have gone (the least busy, ties to the lower id: ns/a).
    for i in 0..10 {
        let crafted = send(format!("crafted {i}"), json!({"status": 503})).await;
        assert_eq!(crafted.0, 503);
        let normal = send(format!("normal {i}"), json!({})).await;
        assert_eq!(normal, (200, Some("ns/a".to_string())), "request {i}");
    }
    let seen = metrics(&client, &producer).await;
    for endpoint in ["ns/a", "ns/b"] {
        for reason in ["failed_in_a_row", "unreachable"] {
            assert_eq!(
                cooldowns(&seen, endpoint, reason),
                0.0,
                "{endpoint} {reason}\n{seen}"
            );
        }
    }
    assert_eq!(stubs[0].requests().len() + stubs[1].requests().len(), 30);

    // Three 503s in a row to first attempts cool ns/a down (their retries on ns/b do not
    // count for ns/b); the next request goes to ns/b.
    for i in 0..3 {
        assert_eq!(
            send(format!("in a row {i}"), json!({"status": 503}))
                .await
                .0,
            503
        );
    }
    let seen = metrics(&client, &producer).await;
    assert_eq!(cooldowns(&seen, "ns/a", "failed_in_a_row"), 1.0, "{seen}");
    assert_eq!(cooldowns(&seen, "ns/b", "failed_in_a_row"), 0.0, "{seen}");
    assert_eq!(
        send("after".to_string(), json!({})).await,
        (200, Some("ns/b".to_string()))
    );
    drop(producer);

    // A refused connection cools its replica down at once; the request is retried.
    let producer = Binary::serve_config(
        &config_of(&[
            ("ns/a", dead_address()),
            ("ns/b", stubs[1].addr().to_string()),
        ]),
        &[],
    );
    let url = format!("{}/v1/completions", producer.base);
    let response = client
        .post(&url)
        .json(&completion("to a dead replica", json!({})))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, ENDPOINT_HEADER).as_deref(), Some("ns/b"));
    let seen = metrics(&client, &producer).await;
    assert_eq!(cooldowns(&seen, "ns/a", "unreachable"), 1.0, "{seen}");
}
