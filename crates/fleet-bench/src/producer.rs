//! burst-prefix's producer as users run it: its release binary (`burst-prefix-producer serve`)
//! in a process of its own, with a config file of the route's planner settings and the fleet's
//! replicas as endpoints, so that its CPU is its own.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use burst_prefix_engine_bench::engine::wait_healthy;
use burst_prefix_engine_bench::process::Process;
use tokio::process::Command;

/// A running producer.
pub struct Producer {
    process: Process,
    port: u16,
    admin_port: u16,
}

/// The endpoint id of replica `index`.
pub fn endpoint_id(index: usize) -> String {
    format!("fleet/r{index}")
}

/// The config file: the planner settings of the route, then one endpoint per replica URL.
pub fn config(planner_yaml: &str, replicas: &[String]) -> String {
    let mut yaml = planner_yaml.trim_end().to_string();
    if !yaml.is_empty() {
        yaml.push('\n');
    }
    yaml.push_str("endpoints:\n");
    for (index, url) in replicas.iter().enumerate() {
        let address = url.trim_start_matches("http://");
        yaml.push_str(&format!(
            "  - {{id: {}, address: '{address}'}}\n",
            endpoint_id(index)
        ));
    }
    yaml
}

impl Producer {
    /// Starts `binary` with `planner_yaml` and the `replicas`, and waits until `/readyz`; its
    /// config and log are `<name>.yaml` and `<name>.log` in `dir`. `beside_peers`: one of
    /// several side by side (`serve --active-active`).
    pub async fn start(
        binary: &Path,
        planner_yaml: &str,
        replicas: &[String],
        (dir, name): (&Path, &str),
        beside_peers: bool,
        client: &reqwest::Client,
    ) -> anyhow::Result<Producer> {
        let config_path: PathBuf = dir.join(format!("{name}.yaml"));
        std::fs::write(&config_path, config(planner_yaml, replicas))
            .with_context(|| format!("cannot write {}", config_path.display()))?;
        let port = crate::netns::next_port()?;
        let admin_port = crate::netns::next_port()?;
        let epp_port = crate::netns::next_port()?;
        let mut command = Command::new(binary);
        command
            .arg("serve")
            .arg("--config")
            .arg(&config_path)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--admin-listen", &format!("127.0.0.1:{admin_port}")])
            .args(["--epp-listen", &format!("127.0.0.1:{epp_port}")])
            .arg("--epp-plaintext")
            .env("RUST_LOG", "warn");
        if beside_peers {
            command.arg("--active-active");
        }
        let mut process = Process::start(command, &dir.join(format!("{name}.log")))?;
        let ready = format!("http://127.0.0.1:{admin_port}/readyz");
        wait_healthy(&mut process, &ready, client, Duration::from_secs(60))
            .await
            .with_context(|| format!("the producer ({name})"))?;
        Ok(Producer {
            process,
            port,
            admin_port,
        })
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn group(&self) -> Option<u32> {
        self.process.group()
    }

    /// Its Prometheus metrics (empty if it does not answer).
    pub async fn metrics(&self, client: &reqwest::Client) -> String {
        let url = format!("http://127.0.0.1:{}/metrics", self.admin_port);
        match client
            .get(url)
            .timeout(Duration::from_secs(10))
            .send()
            .await
        {
            Ok(response) => response.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    pub async fn stop(self) {
        self.process.stop(Duration::from_secs(10)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_lists_every_replica_after_the_planner_settings() {
        let yaml = config(
            "windowDurationMs: 0\n",
            &[
                "http://127.0.0.1:8001".into(),
                "http://127.0.0.1:8002".into(),
            ],
        );
        assert_eq!(
            yaml,
            "windowDurationMs: 0\nendpoints:\n  - {id: fleet/r0, address: '127.0.0.1:8001'}\n  \
             - {id: fleet/r1, address: '127.0.0.1:8002'}\n"
        );
        assert!(config("", &["http://a:1".into()]).starts_with("endpoints:\n"));
    }
}
