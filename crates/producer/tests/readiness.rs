//! A new producer that reads the engines' load (`engines.loadIntervalMs`) is Ready only once its
//! first round of `/metrics` scrapes is done, so that a replica started by a rolling update does
//! not place blind (docs/behaviour.md §10): `/readyz` says what it waits for until then. Each
//! engine is scraped on its own: one that holds its answer delays only itself.

mod common;

use std::time::Instant;

use common::{Local, PATIENCE};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// vLLM's load gauges: 2 running and 1 waiting.
const METRICS: &str = "vllm:num_requests_running{model_name=\"m\"} 2.0\n\
                       vllm:num_requests_waiting{model_name=\"m\"} 1.0\n";

/// An engine whose `/metrics` answers only when told: it says when a scrape has arrived, then
/// holds it until `release` fires.
async fn held_engine() -> (String, oneshot::Receiver<()>, oneshot::Sender<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let (arrived_tx, arrived) = oneshot::channel();
    let (release, released) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut request = Vec::new();
        let mut buffer = [0u8; 1024];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = socket.read(&mut buffer).await.unwrap();
            assert!(n > 0, "the scraper hung up before its request was whole");
            request.extend_from_slice(&buffer[..n]);
        }
        assert!(request.starts_with(b"GET /metrics "));
        let _ = arrived_tx.send(());
        let _ = released.await;
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{METRICS}",
            METRICS.len()
        );
        let _ = socket.write_all(answer.as_bytes()).await;
    });
    (address, arrived, release)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_waits_for_the_first_metrics_round_then_serves() {
    // Two stub engines, which have no /metrics (a failed scrape is heard too), and one that
    // answers when the test says.
    let (_stubs, mut yaml) = common::stub_engines(2, "engines: {loadIntervalMs: 60000}\n").await;
    let (held, arrived, release) = held_engine().await;
    yaml.push_str(&format!("  - {{id: ns/held, address: '{held}'}}\n"));
    let local = Local::start(&yaml).await;
    let readyz = format!("{}/readyz", local.admin);

    // Each engine is scraped on its own: while the held scrape is open (up to the scraper's
    // timeout, 500 ms, far more than one loopback GET takes) the other two are heard, and the
    // producer waits for the third.
    tokio::time::timeout(PATIENCE, arrived)
        .await
        .expect("the first scrape reaches the held engine")
        .unwrap();
    let started = Instant::now();
    loop {
        let (status, body) = common::get_text(&local.client, &readyz).await;
        assert_eq!(status, 503, "{body}");
        if body.contains("waiting for the first /metrics round: 2 of 3 engines heard") {
            break;
        }
        assert!(
            body.contains("waiting for the first /metrics round"),
            "{body}"
        );
        assert!(
            started.elapsed() < PATIENCE,
            "the others never heard: {body}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }

    release.send(()).unwrap();
    let started = Instant::now();
    let body = loop {
        let (status, body) = common::get_text(&local.client, &readyz).await;
        if status == 200 {
            break body;
        }
        assert!(started.elapsed() < PATIENCE, "never Ready: {status} {body}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(body.trim(), "ready");
    // The answered engine's load was heard; the stubs' failed scrapes left theirs unknown.
    let engines = local.producer().engines();
    assert_eq!(engines.load("ns/held"), Some(3));
    assert_eq!((engines.load("ns/e0"), engines.load("ns/e1")), (None, None));
}
