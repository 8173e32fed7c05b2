//! llama-server replicas as child processes on loopback: started, waited for, and stopped.
//!
//! Each replica is killed when its [`Replica`] is dropped (`kill_on_drop`), so a bench that
//! fails half-way leaves no process behind; [`Replica::stop`] is the orderly way.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio::process::{Child, Command};

/// How every replica is started (the flags that matter for prefix caching, SPEC-free).
#[derive(Clone, Debug)]
pub struct EngineOptions {
    pub llama_server: PathBuf,
    pub model: PathBuf,
    /// `-np`: requests a replica computes at once; more wait in its queue.
    pub slots: usize,
    /// Context (KV) tokens per slot (`-c` is slots x this, `--no-kv-unified`).
    pub ctx_per_slot: usize,
    /// `-t` and `-tb`.
    pub threads: usize,
    /// `--cache-ram`: the host-memory prompt cache, in MiB (0 disables it).
    pub cache_ram_mib: usize,
    /// Where each replica's log goes (`replica-<i>.log`).
    pub log_dir: PathBuf,
}

impl EngineOptions {
    fn args(&self, port: u16) -> Vec<String> {
        let mut args: Vec<String> = [
            "--model",
            &self.model.to_string_lossy(),
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--parallel",
            &self.slots.to_string(),
            "--ctx-size",
            &(self.slots * self.ctx_per_slot).to_string(),
            "--threads",
            &self.threads.to_string(),
            "--threads-batch",
            &self.threads.to_string(),
            "--cache-ram",
            &self.cache_ram_mib.to_string(),
        ]
        .map(String::from)
        .into();
        args.extend(
            [
                "--no-kv-unified",
                "--cache-prompt",
                "--metrics",
                "--no-warmup",
                "--no-webui",
            ]
            .map(String::from),
        );
        args
    }
}

/// One running llama-server.
pub struct Replica {
    pub index: usize,
    pub addr: SocketAddr,
    child: Child,
    log: PathBuf,
}

/// A free loopback port (bound, read and released; llama-server binds it right after).
fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl Replica {
    pub async fn start(options: &EngineOptions, index: usize) -> anyhow::Result<Replica> {
        let port = free_port()?;
        let log = options.log_dir.join(format!("replica-{index}.log"));
        let file = std::fs::File::create(&log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let child = Command::new(&options.llama_server)
            .args(options.args(port))
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", options.llama_server.display()))?;
        Ok(Replica {
            index,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            child,
            log,
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Waits until `GET /health` answers 200, at most `timeout`.
    pub async fn wait_ready(
        &mut self,
        client: &reqwest::Client,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "replica {} exited with {status} while starting; see {}",
                    self.index,
                    self.log.display()
                );
            }
            let health = client
                .get(format!("{}/health", self.url()))
                .timeout(Duration::from_secs(2))
                .send()
                .await;
            if matches!(&health, Ok(r) if r.status().is_success()) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!(
            "replica {} not ready within {timeout:?}; see {}",
            self.index,
            self.log.display()
        )
    }

    /// SIGTERM (so that its log is flushed), then SIGKILL if it has not exited within `grace`.
    pub async fn stop(mut self, grace: Duration) {
        if let Some(pid) = self.child.id() {
            // kill(1) rather than libc: the pid is our unreaped child's, so it names no other
            // process.
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .await;
        }
        if tokio::time::timeout(grace, self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }

    pub fn log(&self) -> &Path {
        &self.log
    }
}

/// Starts `count` replicas and waits for all of them; stops those started if one fails.
pub async fn start_replicas(
    options: &EngineOptions,
    count: usize,
    client: &reqwest::Client,
) -> anyhow::Result<Vec<Replica>> {
    let mut replicas = Vec::with_capacity(count);
    for index in 0..count {
        replicas.push(Replica::start(options, index).await?);
    }
    for replica in &mut replicas {
        replica.wait_ready(client, Duration::from_secs(120)).await?;
    }
    Ok(replicas)
}

/// Stops every replica, all at once.
pub async fn stop_replicas(replicas: Vec<Replica>) {
    futures::future::join_all(replicas.into_iter().map(|r| r.stop(Duration::from_secs(5)))).await;
}
