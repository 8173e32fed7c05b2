//! Helpers shared by the producer's integration tests: an in-process service on loopback, the
//! real binary as a child process, and small HTTP and metrics helpers.
#![allow(dead_code)] // Each test binary uses its own part of this.

pub mod ext_proc;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use burst_prefix_core::{Limits, Producer};
use burst_prefix_producer::proxy::ProxyConfig;
use burst_prefix_producer::serve::{Role, Service};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

/// How long any wait for an event may take before the test fails (generous: a loaded machine).
pub const PATIENCE: Duration = Duration::from_secs(30);

/// `n` endpoints `ns/p{i}-rank-0`, as YAML lines for `endpoints:`.
pub fn endpoints(n: usize) -> String {
    let mut text = String::from("endpoints:\n");
    for i in 1..=n {
        text.push_str(&format!(
            "  - {{id: ns/p{i}-rank-0, address: '10.0.0.{i}:8000'}}\n"
        ));
    }
    text
}

/// The service in-process on loopback ports, with `yaml` as its config.
pub struct Local {
    pub service: Service,
    pub base: String,
    pub admin: String,
    /// `http://ip:port` of the endpoint picker (gRPC).
    pub epp: String,
    pub client: reqwest::Client,
}

impl Local {
    pub async fn start(yaml: &str) -> Local {
        Self::start_with_limits(yaml, Limits::default()).await
    }

    pub async fn start_with_limits(yaml: &str, limits: Limits) -> Local {
        Self::start_with(yaml, limits, ProxyConfig::default()).await
    }

    /// With the proxy's client to the replicas configured as `proxy` says.
    pub async fn start_with_proxy(yaml: &str, proxy: ProxyConfig) -> Local {
        Self::start_with(yaml, Limits::default(), proxy).await
    }

    async fn start_with(yaml: &str, limits: Limits, proxy: ProxyConfig) -> Local {
        let producer = Producer::with_config(yaml, limits).expect("a valid test config");
        let service = Service::on_loopback(producer, proxy).await.unwrap();
        Local {
            base: format!("http://{}", service.addr(Role::Api).unwrap()),
            admin: format!("http://{}", service.addr(Role::Admin).unwrap()),
            epp: format!("http://{}", service.addr(Role::Epp).unwrap()),
            service,
            client: reqwest::Client::builder()
                .timeout(PATIENCE)
                .build()
                .unwrap(),
        }
    }

    pub fn producer(&self) -> &Producer {
        &self.service.producer
    }

    /// POSTs a body (raw bytes) and returns status, Retry-After, and the JSON answer.
    pub async fn post(
        &self,
        path: &str,
        body: impl Into<reqwest::Body>,
    ) -> (u16, Option<String>, Value) {
        post(&self.client, &format!("{}{path}", self.base), body).await
    }

    pub async fn produce(&self, body: &Value) -> (u16, Option<String>, Value) {
        self.post("/v1/produce", body.to_string()).await
    }

    /// Waits until the open window holds `n` requests; returns its id.
    pub async fn until_window_holds(&self, n: usize) -> u64 {
        let started = Instant::now();
        loop {
            if let Some((id, live)) = self.producer().open_window() {
                if live == n {
                    return id;
                }
            }
            assert!(started.elapsed() < PATIENCE, "the window never held {n}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub async fn metrics(&self) -> String {
        get_text(&self.client, &format!("{}/metrics", self.admin))
            .await
            .1
    }
}

pub async fn post(
    client: &reqwest::Client,
    url: &str,
    body: impl Into<reqwest::Body>,
) -> (u16, Option<String>, Value) {
    let response = client
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    let text = response.text().await.unwrap();
    let json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{status} {text}: {e}"));
    (status, retry_after, json)
}

pub async fn get_text(client: &reqwest::Client, url: &str) -> (u16, String) {
    let response = client
        .get(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    (response.status().as_u16(), response.text().await.unwrap())
}

/// The value of one sample line (`name{labels} value`) of a Prometheus text exposition.
pub fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{series} missing in\n{metrics}"))
        .parse()
        .unwrap()
}

/// `n` stub engines `e0..`, and a producer config of `planner` (YAML lines) naming them
/// `ns/e{i}`.
pub async fn stub_engines(
    n: usize,
    planner: &str,
) -> (Vec<burst_prefix_stub_engine::StubEngine>, String) {
    use burst_prefix_stub_engine::{Options, StubEngine};
    let mut stubs = Vec::new();
    let mut yaml = format!("{planner}endpoints:\n");
    for i in 0..n {
        let stub = StubEngine::start(Options::with_id(format!("e{i}")))
            .await
            .unwrap();
        yaml.push_str(&format!(
            "  - {{id: ns/e{i}, address: '{}'}}\n",
            stub.addr()
        ));
        stubs.push(stub);
    }
    (stubs, yaml)
}

/// A free loopback port nothing listens on.
pub fn dead_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

/// A completions body.
pub fn completion(prompt: &str) -> Value {
    serde_json::json!({"model": "m", "prompt": prompt})
}

/// The real binary, serving on loopback ports it picked, with JSON logs captured.
pub struct Binary {
    pub child: Child,
    pub base: String,
    pub admin: String,
    /// `ip:port` of the endpoint picker (TLS by default, h2c with `--epp-plaintext`).
    pub epp: String,
    pub logs: Arc<Mutex<Vec<String>>>,
    /// The config file it serves, in a directory that goes with it.
    config: Option<(tempfile::TempDir, std::path::PathBuf)>,
}

impl Binary {
    pub fn serve(args: &[&str]) -> Binary {
        Self::serve_with_env(args, &[])
    }

    /// The binary serving the config `yaml` (`--config`, a file it keeps) with `flags`.
    pub fn serve_config(yaml: &str, flags: &[&str]) -> Binary {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, yaml).unwrap();
        let mut args = vec!["--config", path.to_str().unwrap()];
        args.extend_from_slice(flags);
        let mut binary = Self::serve(&args);
        binary.config = Some((dir, path));
        binary
    }

    /// The config file of [`Binary::serve_config`] (rewrite it to reload).
    pub fn config_path(&self) -> &std::path::Path {
        &self.config.as_ref().expect("served with serve_config").1
    }

    /// `ip:port` of the API.
    pub fn api(&self) -> String {
        self.base.trim_start_matches("http://").to_string()
    }

    pub fn serve_with_env(args: &[&str], env: &[(&str, &std::path::Path)]) -> Binary {
        Self::serve_binary(
            std::path::Path::new(env!("CARGO_BIN_EXE_burst-prefix-producer")),
            args,
            env,
        )
    }

    /// `binary` (this build's, or another build of the producer) serving on loopback.
    pub fn serve_binary(
        binary: &std::path::Path,
        args: &[&str],
        env: &[(&str, &std::path::Path)],
    ) -> Binary {
        let mut child = Command::new(binary)
            .envs(env.iter().copied())
            .arg("serve")
            .args([
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
                "--epp-listen",
                "127.0.0.1:0",
            ])
            .args(["--log-format", "json", "--log-level", "info"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the producer binary");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (found, listening) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let kept = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Ok(event) = serde_json::from_str::<Value>(&line) {
                    if event["message"] == "listening" {
                        let field =
                            |name: &str| event[name].as_str().unwrap_or_default().to_string();
                        let _ = found.send((field("api"), field("admin"), field("epp")));
                    }
                }
                kept.lock().unwrap().push(line);
            }
        });
        let (api, admin, epp) = listening.recv_timeout(PATIENCE).unwrap_or_else(|_| {
            panic!(
                "the producer never listened:\n{}",
                logs.lock().unwrap().join("\n")
            )
        });
        Binary {
            child,
            base: format!("http://{api}"),
            admin: format!("http://{admin}"),
            epp,
            logs,
            config: None,
        }
    }

    pub fn logs(&self) -> String {
        self.logs.lock().unwrap().join("\n")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn terminate(&self) {
        let pid = Pid::from_raw(i32::try_from(self.child.id()).unwrap());
        kill(pid, Signal::SIGTERM).expect("SIGTERM to our own child");
    }

    /// Waits for the process to exit; its exit code.
    pub fn wait(&mut self) -> Option<i32> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(
                started.elapsed() < PATIENCE,
                "the producer did not exit:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        // A failed test must not leave the child running.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
