//! The official OpenAI Python client (installed by `tests/python/setup.sh`) against the
//! producer's proxy in front of two stub engines: what users run, end to end on loopback.

use std::time::Duration;

use burst_prefix_core::{Limits, Producer};
use burst_prefix_producer::proxy::ProxyConfig;
use burst_prefix_producer::serve::{Role, Service};
use burst_prefix_stub_engine::{Options, StubEngine};
use serde_json::{json, Value};

const PATIENCE: Duration = Duration::from_secs(60);

/// The venv python `tests/python/setup.sh` installed the OpenAI client into (`make test` runs
/// it and passes the path in BURST_PREFIX_CLIENTS_PYTHON).
fn clients_python() -> std::path::PathBuf {
    let path = std::env::var_os("BURST_PREFIX_CLIENTS_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            let setup = concat!(env!("CARGO_MANIFEST_DIR"), "/python/setup.sh");
            let output = std::process::Command::new(setup)
                .arg("--print-python")
                .output()
                .expect("run tests/python/setup.sh --print-python");
            String::from_utf8(output.stdout).unwrap().trim().into()
        });
    assert!(
        path.exists(),
        "{} is missing: run `make python-clients` (tests/python/setup.sh) first",
        path.display()
    );
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_python_client_works_against_the_proxy() {
    let mut stubs = Vec::new();
    let mut yaml = String::from("windowDurationMs: 20\nendpoints:\n");
    for i in 0..2 {
        let stub = StubEngine::start(Options::with_id(format!("e{i}")))
            .await
            .unwrap();
        yaml.push_str(&format!(
            "  - {{id: ns/e{i}, address: '{}'}}\n",
            stub.addr()
        ));
        stubs.push(stub);
    }
    let producer = Producer::with_config(&yaml, Limits::default()).unwrap();
    let service = Service::on_loopback(producer, ProxyConfig::default())
        .await
        .unwrap();
    let base = format!("http://{}", service.addr(Role::Api).unwrap());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/openai_client.py");
    let output = tokio::process::Command::new(clients_python())
        .arg(script)
        .arg(&base)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(PATIENCE, output)
        .await
        .expect("the client script finished in time")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let out: Value =
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let endpoint = out["completion"]["endpoint"].as_str().unwrap();
    assert!(endpoint.starts_with("ns/e"), "{out}");
    // The stub's text names the engine that generated it: the one the header names.
    let engine = endpoint.strip_prefix("ns/").unwrap();
    assert!(
        out["completion"]["text"].as_str().unwrap().contains(engine),
        "{out}"
    );
    assert!(
        out["completion"]["window"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .is_ok(),
        "{out}"
    );
    assert!(out["chat"].as_str().unwrap().contains("#1"), "{out}");
    assert_eq!(out["stream"].as_array().unwrap().len(), 4, "{out}");
    assert_eq!(
        out["completion_stream"].as_array().unwrap().len(),
        3,
        "{out}"
    );
    assert_eq!(out["models"], json!(["stub-model"]));
    let bad = &out["bad_request"];
    assert_eq!(bad["status"], 400, "{out}");
    assert_eq!(bad["body"]["code"], "invalid_request", "{out}");
    assert!(
        bad["message"].as_str().unwrap().contains("messages[0]"),
        "{out}"
    );
}
