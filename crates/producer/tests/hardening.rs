//! The producer under misbehaving clients and careless configs (docs/behaviour.md §11), as the real
//! binary on loopback: slow clients are closed, the admin port answers while the API is saturated,
//! fds come back after a flood, bad configs are refused at start and on reload, `/v1/plan` is
//! bounded and abandoned when its client leaves, and SIGTERM exits 0 within the shutdown timeout
//! whatever clients hold. Every loop is bounded in count and time; deadlines are generous
//! ("eventually").

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{endpoints, sample, Binary, PATIENCE};

fn config_file(dir: &Path, text: &str) -> String {
    let path = dir.join("config.yaml");
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

/// Open fds of a process.
fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// True once the server closed `stream` (read gives EOF or an error), within PATIENCE.
fn closed_by_server(stream: &mut TcpStream) -> bool {
    stream
        .set_read_timeout(Some(PATIENCE))
        .expect("a read timeout");
    let mut buffer = [0u8; 512];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return true,
            // A 408 or similar answer before closing is fine: keep reading to the end.
            Ok(_) => continue,
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(error) if error.kind() == std::io::ErrorKind::TimedOut => return false,
            Err(_) => return true,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_closed_and_health_answers_under_a_flood() {
    let producer = Binary::serve_config(
        &endpoints(2),
        &["--header-read-timeout-ms", "500", "--max-connections", "50"],
    );
    let api = producer.api();

    // Part of a request head, then silence: closed after the header-read timeout.
    let mut slow = TcpStream::connect(&api).unwrap();
    slow.write_all(b"POST /v1/produce HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    assert!(
        closed_by_server(&mut slow),
        "a half-sent head was never closed"
    );

    // An idle kept-alive connection is closed too.
    let mut idle = TcpStream::connect(&api).unwrap();
    idle.write_all(b"GET /v1/endpoints HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert!(
        closed_by_server(&mut idle),
        "an idle keep-alive connection was never closed"
    );

    // A flood of silent connections, past the cap of 50: the admin port still answers. Those
    // beyond the cap wait in the kernel's accept queue; past it, connecting times out (bounded).
    let pid = producer.child.id();
    let before = fds(pid);
    let addr: std::net::SocketAddr = api.parse().unwrap();
    let flood: Vec<TcpStream> = (0..200)
        .filter_map(|_| TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok())
        .collect();
    assert!(flood.len() >= 50, "only {} connections opened", flood.len());
    let client = reqwest::Client::builder()
        .timeout(PATIENCE)
        .build()
        .unwrap();
    let (status, _) = common::get_text(&client, &format!("{}/healthz", producer.admin)).await;
    assert_eq!(status, 200);
    let held = fds(pid);
    assert!(
        held <= before + 60,
        "{held} fds with the cap at 50 (was {before})"
    );
    // The silent ones time out; fds come back.
    let started = Instant::now();
    loop {
        if fds(pid) <= before + 5 {
            break;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "fds stayed at {} (was {before})",
            fds(pid)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(flood);
    let (status, _) = common::get_text(&client, &format!("{}/v1/endpoints", producer.base)).await;
    assert_eq!(status, 200, "the API serves again");
}

#[test]
fn configs_that_are_not_a_mapping_naming_endpoints_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    for (text, reason) in [
        ("", "empty document"),
        ("# nothing here\n", "empty document"),
        ("---\n", "empty document"),
        ("{}", "`endpoints` is missing"),
        ("- a\n", "a list"),
        ("7\n", "a scalar"),
    ] {
        let config = config_file(dir.path(), text);
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_burst-prefix-producer"))
            .args(["serve", "--config", &config, "--listen", "127.0.0.1:0"])
            .args([
                "--admin-listen",
                "127.0.0.1:0",
                "--epp-listen",
                "127.0.0.1:0",
            ])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{text:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("ERROR")).collect();
        assert_eq!(errors.len(), 1, "{stderr}");
        assert!(
            errors[0].contains(reason) && errors[0].contains(&config),
            "{stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_to_an_empty_config_is_rejected_and_the_last_good_stays() {
    let producer = Binary::serve_config(&endpoints(2), &["--config-poll-ms", "50"]);
    let config = producer.config_path().to_str().unwrap().to_string();
    let client = reqwest::Client::builder()
        .timeout(PATIENCE)
        .build()
        .unwrap();
    let metrics_url = format!("{}/metrics", producer.admin);
    for (i, text) in ["", "{}\n", "---\n"].iter().enumerate() {
        std::fs::write(&config, text).unwrap();
        let started = Instant::now();
        loop {
            let metrics = common::get_text(&client, &metrics_url).await.1;
            if sample(
                &metrics,
                "burst_prefix_config_reloads_total{result=\"rejected\"}",
            ) == (i + 1) as f64
            {
                break;
            }
            assert!(started.elapsed() < PATIENCE, "{metrics}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let (status, _) = common::get_text(&client, &format!("{}/readyz", producer.admin)).await;
    assert_eq!(status, 200, "the last good config is still in force");
    let logs = producer.logs();
    assert!(
        logs.contains("config update rejected") && logs.contains(&config),
        "{logs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_are_bounded_and_abandoned_when_their_client_leaves() {
    let producer = Binary::serve_config(
        &format!("maxBatchSize: 3\n{}", endpoints(2)),
        &["--max-plan-replicas", "2"],
    );
    let client = reqwest::Client::builder()
        .timeout(PATIENCE)
        .build()
        .unwrap();
    let plan = |requests: usize, replicas: usize| {
        serde_json::json!({
            "replicas": (0..replicas).map(|i| serde_json::json!({"id": format!("r{i}")})).collect::<Vec<_>>(),
            "requests": (0..requests).map(|i| serde_json::json!({"id": format!("q{i}"), "body": {"model": "m", "prompt": "x"}})).collect::<Vec<_>>(),
        })
        .to_string()
    };
    let url = format!("{}/v1/plan", producer.base);
    for (body, needle) in [
        (plan(4, 2), "requests: 4 is more than the limit of 3"),
        (
            plan(1, 3),
            "replicas: 3 is more than the limit of 2 (--max-plan-replicas)",
        ),
    ] {
        let (status, _, answer) = common::post(&client, &url, body).await;
        assert_eq!(status, 413, "{answer}");
        assert_eq!(answer["error"], "plan_too_large");
        assert!(
            answer["message"].as_str().unwrap().contains(needle),
            "{answer}"
        );
    }
    let (status, _, _) = common::post(&client, &url, plan(3, 2)).await;
    assert_eq!(status, 200);
    drop(producer);

    // A batch that takes a while to hash, whose client leaves once it has sent all of it: the
    // plan is abandoned. (Sent on a raw connection, so that the whole body arrives however
    // loaded the machine is; a client timeout could cut the body short instead.)
    let producer = Binary::serve_config(
        &format!("maxBatchSize: -1\n{}", endpoints(2)),
        &["--max-body-bytes", "67108864"],
    );
    let prompt = "y".repeat(4096);
    let big = serde_json::json!({
        "replicas": [{"id": "a"}],
        "requests": (0..6000).map(|i| serde_json::json!({"id": i.to_string(), "body": {"model": "m", "prompt": format!("{i}{prompt}")}})).collect::<Vec<_>>(),
    })
    .to_string();
    let api = producer.api();
    let metrics_url = format!("{}/metrics", producer.admin);
    // hyper drops the handler as soon as it reads the end of the connection, possibly while
    // the body is still being read: the producer counts that as abandoned too.
    let (api, big) = (api.clone(), big.clone());
    tokio::task::spawn_blocking(move || {
        let mut impatient = TcpStream::connect(&api).unwrap();
        let head = format!(
            "POST /v1/plan HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            big.len()
        );
        impatient.write_all(head.as_bytes()).unwrap();
        impatient.write_all(big.as_bytes()).unwrap();
        // Dropped at once: the client is gone before its plan is done.
    })
    .await
    .unwrap();
    let started = Instant::now();
    let mut abandoned = false;
    while started.elapsed() < PATIENCE {
        let metrics = common::get_text(&client, &metrics_url).await.1;
        assert_eq!(
            sample(&metrics, "burst_prefix_plans_total{result=\"planned\"}"),
            0.0,
            "a plan whose client left was completed:\n{metrics}"
        );
        if sample(&metrics, "burst_prefix_plans_total{result=\"abandoned\"}") == 1.0 {
            abandoned = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        abandoned,
        "the plan whose client left was never counted as abandoned"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_0_within_the_shutdown_timeout_whatever_clients_hold() {
    let mut producer = Binary::serve_config(
        &format!("windowDurationMs: 5000\n{}", endpoints(2)),
        &["--shutdown-timeout-ms", "1000"],
    );
    let api = producer.api();
    // A request stuck mid-body, an idle connection, and a request waiting in an open window.
    let mut stuck = TcpStream::connect(&api).unwrap();
    stuck
        .write_all(b"POST /v1/produce HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\":")
        .unwrap();
    let _idle = TcpStream::connect(&api).unwrap();
    let client = reqwest::Client::builder()
        .timeout(PATIENCE)
        .build()
        .unwrap();
    let waiting = {
        let client = client.clone();
        let url = format!("{}/v1/produce", producer.base);
        tokio::spawn(async move {
            common::post(&client, &url, common::completion("x").to_string()).await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    producer.terminate();
    let (status, _, answer) = waiting.await.unwrap();
    assert_eq!(status, 200, "the open window is answered: {answer}");
    assert_eq!(producer.wait(), Some(0), "{}", producer.logs());
    println!(
        "exited {:.2} s after SIGTERM (--shutdown-timeout-ms 1000)",
        started.elapsed().as_secs_f64()
    );
}

/// The accept queue of the socket listening on `addr`, as the kernel reports it (`ss`: a
/// listening socket's Send-Q is its backlog).
fn accept_queue(addr: &str) -> usize {
    let port = addr.rsplit(':').next().unwrap();
    let output = std::process::Command::new("ss")
        .args(["-Hltn", &format!("sport = :{port}")])
        .output()
        .expect("ss (iproute2) runs");
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text
        .lines()
        .next()
        .unwrap_or_else(|| panic!("no listener on {addr}: {text}"));
    // State, Recv-Q, Send-Q, local address, peer address.
    line.split_whitespace().nth(2).unwrap().parse().unwrap()
}

#[test]
fn a_burst_of_connections_waits_in_an_accept_queue_as_long_as_the_connection_cap() {
    // An RL step of 4,096 requests opens as many connections at once; a queue of the usual 1,024
    // dropped the handshakes beyond it while the producer was busy (they came back 31 s later,
    // or failed). The kernel caps the queue at net.core.somaxconn.
    let somaxconn: usize = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let producer = Binary::serve_config(&endpoints(2), &["--max-connections", "3000"]);
    assert_eq!(accept_queue(&producer.api()), 3000.min(somaxconn));
    let producer = Binary::serve_config(&endpoints(2), &[]);
    assert_eq!(accept_queue(&producer.api()), 10_000.min(somaxconn));
}
