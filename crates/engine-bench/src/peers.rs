//! The routers users pick instead of burst-prefix, run as they ship (bench/engine/peers/setup.sh
//! installs them): SGLang's router and vLLM's router, in front of the same replicas, on loopback.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use tokio::process::Command;

use crate::engine::{free_port, wait_healthy};
use crate::process::Process;

/// Which peer router.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Peer {
    /// `sglang-router` (PyPI), SGLang's model gateway.
    SglangRouter,
    /// `vllm-router` (PyPI), vLLM's router (derived from SGLang's).
    VllmRouter,
}

impl Peer {
    /// The Python module that launches it (the wheels' console scripts do the same).
    fn module(self) -> &'static str {
        match self {
            Peer::SglangRouter => "sglang_router.launch_router",
            Peer::VllmRouter => "vllm_router.launch_router",
        }
    }
}

/// A running peer router.
pub struct PeerRouter {
    process: Process,
    port: u16,
    metrics_port: u16,
}

impl PeerRouter {
    /// Starts `peer` on `workers` with `args` (its policy and settings; everything else stays
    /// its default), and waits until it answers `GET /health`.
    pub async fn start(
        peer: Peer,
        python: &Path,
        args: &[String],
        workers: &[String],
        log: PathBuf,
        client: &reqwest::Client,
    ) -> anyhow::Result<PeerRouter> {
        let port = free_port()?;
        let metrics_port = free_port()?;
        let mut command = Command::new(python);
        command
            .args(["-m", peer.module()])
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--prometheus-host", "127.0.0.1"])
            .args(["--prometheus-port", &metrics_port.to_string()])
            .arg("--worker-urls")
            .args(workers)
            .args(args)
            .env("HF_HUB_OFFLINE", "1")
            .env("NO_PROXY", "*");
        if peer == Peer::VllmRouter {
            // Its start-up check of the workers waits 30 s between tries by default; they are
            // up already.
            command.args(["--worker-startup-check-interval", "1"]);
        }
        let mut process = Process::start(command, &log)?;
        // vllm-router listens once its workers answer their health checks; sglang-router
        // listens at once and registers its workers in the background.
        let url = format!("http://127.0.0.1:{port}/health");
        wait_healthy(&mut process, &url, client, Duration::from_secs(120))
            .await
            .with_context(|| format!("{peer:?}"))?;
        let router = PeerRouter {
            process,
            port,
            metrics_port,
        };
        if peer == Peer::SglangRouter {
            router.wait_for_workers(workers.len(), client).await?;
        }
        Ok(router)
    }

    /// Waits until sglang-router's `GET /workers` lists `count` healthy workers.
    async fn wait_for_workers(&self, count: usize, client: &reqwest::Client) -> anyhow::Result<()> {
        let url = format!("{}/workers", self.url());
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        let mut last = serde_json::Value::Null;
        while std::time::Instant::now() < deadline {
            let answer = client
                .get(&url)
                .timeout(Duration::from_secs(5))
                .send()
                .await;
            if let Ok(answer) = answer {
                last = answer.json().await.unwrap_or_default();
                let healthy = last["workers"].as_array().map_or(0, |workers| {
                    workers
                        .iter()
                        .filter(|w| w["is_healthy"].as_bool().unwrap_or(true))
                        .count()
                });
                if healthy >= count {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        anyhow::bail!(
            "sglang-router lists fewer than {count} healthy workers after 120 s: {last}; see {}",
            self.process.log().display()
        )
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Its process group (see [`Process::group`]).
    pub fn group(&self) -> Option<u32> {
        self.process.group()
    }

    /// Its Prometheus metrics (empty when it serves none).
    pub async fn metrics(&self, client: &reqwest::Client) -> String {
        let response = client
            .get(format!("http://127.0.0.1:{}/metrics", self.metrics_port))
            .timeout(Duration::from_secs(10))
            .send()
            .await;
        match response {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    pub async fn stop(self) {
        self.process.stop(Duration::from_secs(10)).await;
    }
}
