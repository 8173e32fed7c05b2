//! Producers side by side (active-active, docs/behaviour.md §10), as the real binary on
//! loopback: without `--leader-elect` each serves alone, sharing nothing with the others, so a
//! producer SIGKILLed under a steady load changes nothing for the others: every request sent to
//! them is answered whole and they stay Ready throughout; the requests in flight on the killed
//! one end with an error at once (none waits for a timeout), and the requests sent to it after
//! get no answer at all (refused, or reset on a kept-alive connection before it is read), which
//! a gateway's retry (Envoy's `connect-failure` and `reset`) sends elsewhere. Every loop is
//! bounded.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Binary, PATIENCE};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::json;

/// What became of one request of the load.
#[derive(Debug)]
struct Sent {
    to: usize,
    started: Instant,
    ended: Instant,
    outcome: Result<(), Failure>,
}

/// How a request failed.
#[derive(Debug)]
struct Failure {
    /// Before any answer came (the connection refused, or reset before the request was
    /// read): nothing reached the producer, so a front may send it elsewhere.
    unanswered: bool,
    /// By the client's own timeout.
    timeout: bool,
    error: String,
}

impl Failure {
    fn new(unanswered: bool, error: reqwest::Error) -> Failure {
        Failure {
            unanswered,
            timeout: error.is_timeout(),
            error: error.to_string(),
        }
    }
}

/// One streamed completion of 10 chunks 20 ms apart through `base`, read whole.
async fn complete(client: &reqwest::Client, base: &str, prompt: &str) -> Result<(), Failure> {
    let body = json!({
        "model": "m",
        "prompt": prompt,
        "stream": true,
        "stub": {"chunks": 10, "chunkDelayMs": 20},
    });
    let response = client
        .post(format!("{base}/v1/completions"))
        .json(&body)
        .send()
        .await
        .map_err(|e| Failure::new(true, e))?
        .error_for_status()
        .map_err(|e| Failure::new(false, e))?;
    let text = response.text().await.map_err(|e| Failure::new(false, e))?;
    assert!(
        text.contains("[DONE]"),
        "a whole answer ends with [DONE]: {text}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_killed_under_load_leaves_the_others_serving() {
    let (_stubs, yaml) = common::stub_engines(4, "").await;
    let producers = [
        Binary::serve_config(&yaml, &[]),
        Binary::serve_config(&yaml, &[]),
    ];
    let client = reqwest::Client::builder()
        .timeout(PATIENCE)
        .no_proxy()
        .build()
        .unwrap();
    for producer in &producers {
        let started = Instant::now();
        while common::get_text(&client, &format!("{}/readyz", producer.admin))
            .await
            .0
            != 200
        {
            assert!(
                started.elapsed() < PATIENCE,
                "never ready:\n{}",
                producer.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let bases: Vec<String> = producers.iter().map(|p| p.base.clone()).collect();
    let survivor_ready = format!("{}/readyz", producers[1].admin);

    // The survivor's readiness, sampled every 20 ms while the load runs.
    let load_done = Arc::new(AtomicBool::new(false));
    let (samples, not_ready) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let poller = {
        let (client, url) = (client.clone(), survivor_ready.clone());
        let (done, samples, not_ready) = (load_done.clone(), samples.clone(), not_ready.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            while !done.load(Ordering::Relaxed) && started.elapsed() < PATIENCE * 2 {
                samples.fetch_add(1, Ordering::Relaxed);
                if common::get_text(&client, &url).await.0 != 200 {
                    not_ready.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };

    // The steady load: 120 requests, one every 25 ms, in turn to each producer (each in flight
    // ~200 ms); producer 0 is SIGKILLed after the 60th is sent.
    let mut tasks = Vec::new();
    let mut killed_at = None;
    for i in 0..120usize {
        if i == 60 {
            let pid = Pid::from_raw(i32::try_from(producers[0].pid()).unwrap());
            kill(pid, Signal::SIGKILL).expect("SIGKILL to our own child");
            killed_at = Some(Instant::now());
        }
        let to = i % 2;
        let (client, base) = (client.clone(), bases[to].clone());
        tasks.push(tokio::spawn(async move {
            let started = Instant::now();
            let result = complete(&client, &base, &format!("prompt {i} of the steady load")).await;
            Sent {
                to,
                started,
                ended: Instant::now(),
                outcome: result,
            }
        }));
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let mut sent = Vec::new();
    for task in tasks {
        sent.push(task.await.unwrap());
    }
    load_done.store(true, Ordering::Relaxed);
    poller.await.unwrap();
    let killed_at = killed_at.unwrap();

    // The survivor answered every request whole, and was Ready at every sample.
    let to_survivor: Vec<&Sent> = sent.iter().filter(|s| s.to == 1).collect();
    assert_eq!(to_survivor.len(), 60);
    for s in &to_survivor {
        assert!(s.outcome.is_ok(), "{s:?}\n{}", producers[1].logs());
    }
    assert!(samples.load(Ordering::Relaxed) > 10);
    assert_eq!(
        not_ready.load(Ordering::Relaxed),
        0,
        "the survivor was not Ready at a sample"
    );
    // The killed one: what ended before the kill was answered; what was in flight ended with
    // an error, none by the client's timeout; what came after got no answer at all (refused,
    // or its kept-alive connection reset), so it never reached a producer.
    let to_killed: Vec<&Sent> = sent.iter().filter(|s| s.to == 0).collect();
    let before: Vec<&&Sent> = to_killed.iter().filter(|s| s.ended < killed_at).collect();
    assert!(before.len() > 10, "{} before the kill", before.len());
    for s in &before {
        assert!(s.outcome.is_ok(), "{s:?}");
    }
    let after: Vec<&&Sent> = to_killed.iter().filter(|s| s.started > killed_at).collect();
    assert_eq!(after.len(), 30);
    for s in &after {
        assert!(s.outcome.as_ref().is_err_and(|f| f.unanswered), "{s:?}");
    }
    let in_flight: Vec<&&Sent> = to_killed
        .iter()
        .filter(|s| s.started <= killed_at && s.ended >= killed_at)
        .collect();
    for failure in in_flight.iter().filter_map(|s| s.outcome.as_ref().err()) {
        assert!(
            !failure.timeout,
            "in flight at the kill, it waited for the client's timeout: {}",
            failure.error
        );
    }
    assert!(
        in_flight.iter().any(|s| s.outcome.is_err()),
        "no request was in flight at the kill ({} were)",
        in_flight.len()
    );
}
