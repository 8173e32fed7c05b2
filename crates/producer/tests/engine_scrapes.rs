//! The engines' `/metrics` scrapes are bounded and independent (docs/behaviour.md §7): one
//! replica's huge or trickling answer is a counted failure and never slows another's scrapes.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{sample, Local};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const METRICS: &str = "vllm:num_requests_running{model_name=\"m\"} 2.0\n\
                       vllm:num_requests_waiting{model_name=\"m\"} 1.0\n";

/// How an engine answers `GET /metrics`.
#[derive(Clone, Copy)]
enum Answer {
    Plain,
    /// A 6 MiB body (past the 4 MiB cap), sent as fast as it is read.
    Huge,
    /// Its headers, then a byte every 200 ms.
    Trickle,
}

/// An engine on loopback answering every connection as `answer`; counts the scrapes.
async fn engine(answer: Answer) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let scrapes = Arc::new(AtomicUsize::new(0));
    let counted = scrapes.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let counted = counted.clone();
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buffer = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buffer).await {
                        Ok(n) if n > 0 => request.extend_from_slice(&buffer[..n]),
                        _ => return,
                    }
                }
                counted.fetch_add(1, Ordering::Relaxed);
                let _ = match answer {
                    Answer::Plain => {
                        let head = format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                            METRICS.len()
                        );
                        socket.write_all((head + METRICS).as_bytes()).await
                    }
                    Answer::Huge => {
                        let line = format!("{METRICS}# {}\n", "x".repeat(1 << 16));
                        let head = "HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n";
                        let mut sent = socket.write_all(head.as_bytes()).await;
                        for _ in 0..96 {
                            sent = sent.and(socket.write_all(line.as_bytes()).await);
                        }
                        sent
                    }
                    Answer::Trickle => {
                        let head = "HTTP/1.1 200 OK\r\ncontent-length: 100000\r\nconnection: close\r\n\r\n";
                        let mut sent = socket.write_all(head.as_bytes()).await;
                        for _ in 0..50 {
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            sent = sent.and(socket.write_all(b"#").await);
                        }
                        sent
                    }
                };
            });
        }
    });
    (address, scrapes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_or_trickling_metrics_answer_is_a_counted_failure_and_delays_no_other_replica() {
    let (plain, plain_scrapes) = engine(Answer::Plain).await;
    let (huge, _) = engine(Answer::Huge).await;
    let (trickle, _) = engine(Answer::Trickle).await;
    let yaml = format!(
        "engines: {{loadIntervalMs: 100}}\nendpoints:\n  - {{id: ns/plain, address: '{plain}'}}\n  - {{id: ns/huge, address: '{huge}'}}\n  - {{id: ns/trickle, address: '{trickle}'}}\n"
    );
    let local = Local::start(&yaml).await;
    // Two seconds: the plain replica is scraped every 100 ms (about 20 times), whatever the
    // others do; each trickling scrape takes its whole 500 ms timeout.
    let from = plain_scrapes.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let scraped = plain_scrapes.load(Ordering::Relaxed) - from;
    assert!(
        scraped >= 14,
        "the plain replica was scraped {scraped} times in 2 s"
    );
    let metrics = local.metrics().await;
    let failures = |endpoint: &str, reason: &str| {
        sample(
            &metrics,
            &format!(
                "burst_prefix_engine_scrape_failures_total{{endpoint=\"{endpoint}\",reason=\"{reason}\"}}"
            ),
        )
    };
    assert!(failures("ns/huge", "too_large") >= 3.0, "{metrics}");
    assert!(failures("ns/trickle", "timeout") >= 2.0, "{metrics}");
    assert!(
        !metrics.contains("burst_prefix_engine_scrape_failures_total{endpoint=\"ns/plain\""),
        "{metrics}"
    );
    // The plain replica's load is heard: 2 running and 1 waiting.
    assert_eq!(local.producer().engines().load("ns/plain"), Some(3));
    assert_eq!(local.producer().engines().load("ns/huge"), None);
}
