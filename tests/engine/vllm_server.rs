//! Real vLLM servers for the engine tests, started and stopped by the test itself.
//!
//! The Python is `BURST_PREFIX_VLLM_PYTHON`, the model `BURST_PREFIX_VLLM_MODEL` (`make test`
//! sets both; by default, where `tests/vllm/setup.sh` installs them). Missing either is a test
//! failure that says how to install it, never a skip; only a CPU that cannot run vLLM skips
//! ([`engine_test`]).

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The start of a test on real vLLM: `None` where this CPU cannot run vLLM (the test says so
/// and returns; see `burst_prefix_test_support::real_engine`), else a guard that runs the
/// engine tests of this binary one at a time (each starts up to two vLLM servers of ~3 GB).
pub fn engine_test(test: &str) -> Option<MutexGuard<'static, ()>> {
    static LOCK: Mutex<()> = Mutex::new(());
    burst_prefix_test_support::real_engine::runs_on_vllm(test)
        .then(|| LOCK.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Where `tests/vllm/setup.sh` installs `what` (`--print-python` or `--print-model`).
fn installed(what: &str) -> PathBuf {
    let setup = concat!(env!("CARGO_MANIFEST_DIR"), "/vllm/setup.sh");
    let output = Command::new(setup)
        .arg(what)
        .output()
        .expect("run tests/vllm/setup.sh");
    PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
}

/// The Python of a venv with vLLM installed.
pub fn vllm_python() -> PathBuf {
    let path = std::env::var("BURST_PREFIX_VLLM_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|_| installed("--print-python"));
    assert!(
        path.exists(),
        "vLLM's Python not found at {} (run `make vllm`, or set BURST_PREFIX_VLLM_PYTHON)",
        path.display()
    );
    path
}

/// The model directory vLLM serves (and whose tokenizer the tests load).
pub fn model_dir() -> PathBuf {
    let path = std::env::var("BURST_PREFIX_VLLM_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|_| installed("--print-model"));
    assert!(
        path.join("tokenizer.json").exists(),
        "no model at {} (run `make vllm`, or set BURST_PREFIX_VLLM_MODEL)",
        path.display()
    );
    path
}

/// A free loopback TCP port (bound then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// One vLLM server on a loopback address, stopped (its whole process group) when dropped.
pub struct Vllm {
    /// The loopback address it listens on ([`VllmOptions::host`]).
    pub host: String,
    pub port: u16,
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

/// How to start one server.
#[derive(Default)]
pub struct VllmOptions {
    /// The loopback address to listen on; `None`: 127.0.0.1. Another address of 127.0.0.0/8
    /// gives a replica a host of its own, as a pod has (e.g. for a publisher on a port every
    /// replica uses).
    pub host: Option<String>,
    /// The HTTP port (see [`free_port`]).
    pub port: u16,
    /// `--kv-events-config` JSON, if any.
    pub kv_events: Option<serde_json::Value>,
    /// Extra command-line arguments.
    pub args: Vec<String>,
    /// Extra environment.
    pub env: Vec<(String, String)>,
}

impl Vllm {
    /// Starts a server and waits (bounded) until its `/health` answers 200.
    pub fn start(options: VllmOptions) -> Vllm {
        let python = vllm_python();
        let model = model_dir();
        let port = options.port;
        let host = options
            .host
            .clone()
            .unwrap_or_else(|| "127.0.0.1".to_string());
        let dir = tempfile::tempdir().expect("a temp dir");
        let log = dir.path().join("vllm.log");
        let out = std::fs::File::create(&log).expect("the log file");
        let mut command = Command::new(&python);
        command
            .args(["-m", "vllm.entrypoints.openai.api_server", "--model"])
            .arg(&model)
            .args(["--served-model-name", "tiny", "--host", &host])
            .args(["--port", &port.to_string()])
            .args(["--dtype", "bfloat16", "--max-model-len", "2048"])
            .args(["--enable-prefix-caching", "--enforce-eager"])
            .args(&options.args)
            .env("VLLM_TARGET_DEVICE", "cpu")
            .env("VLLM_CPU_KVCACHE_SPACE", "1")
            .env("VLLM_CPU_OMP_THREADS_BIND", "nobind")
            .env("OMP_NUM_THREADS", "1")
            .env("HF_HUB_OFFLINE", "1")
            .env("TRANSFORMERS_OFFLINE", "1")
            .env("VLLM_NO_USAGE_STATS", "1")
            .env("DO_NOT_TRACK", "1")
            .envs(options.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("the log file"))
            .stderr(out);
        if let Some(kv) = &options.kv_events {
            command.arg("--kv-events-config").arg(kv.to_string());
        }
        // Its own process group, so that stopping it stops vLLM's engine-core child too.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let child = command.spawn().expect("starting vLLM");
        let mut vllm = Vllm {
            host,
            port,
            child,
            log,
            _dir: dir,
        };
        vllm.wait_healthy(Duration::from_secs(300));
        vllm
    }

    fn wait_healthy(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        let url = self.url("/health");
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("vLLM exited ({status}) while starting\n{}", self.log_tail());
            }
            let ok = std::process::Command::new("curl")
                .args(["-sf", "-o", "/dev/null", "--max-time", "2", &url])
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if ok {
                return;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        panic!(
            "vLLM did not become healthy within {limit:?}\n{}",
            self.log_tail()
        );
    }

    /// `http://HOST:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}:{}{}", self.host, self.port, path)
    }

    /// The last lines of the server's log.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log, 40)
    }
}

fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    format!(
        "--- last lines of {} ---\n{}",
        path.display(),
        all[all.len().saturating_sub(lines)..].join("\n")
    )
}

impl Drop for Vllm {
    fn drop(&mut self) {
        let pgid = self.child.id();
        // SIGTERM to the group we created (the server and its engine core), a bounded wait, then
        // SIGKILL to the group.
        let signal = |sig: &str| {
            let _ = Command::new("kill")
                .args([sig, "--", &format!("-{pgid}")])
                .stderr(Stdio::null())
                .status();
        };
        signal("-TERM");
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        signal("-KILL");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback TCP relay to another address that can cut every connection and refuse new ones
/// for a while: messages a publisher sends meanwhile are lost, as in a network blip. Plumbing
/// between a real engine and the subscriber, not a stand-in for either.
pub struct Relay {
    pub port: u16,
    open: std::sync::Arc<std::sync::atomic::AtomicBool>,
    conns: std::sync::Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// Listens on 127.0.0.1 and relays each connection to `target`: `host:port`, or
    /// `unix:PATH` for a Unix socket (a ZMQ `ipc://` endpoint).
    pub async fn start(target: String) -> Relay {
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let conns = std::sync::Arc::new(Mutex::new(Vec::new()));
        let (o, c) = (open.clone(), conns.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !o.load(Ordering::SeqCst) {
                    continue; // dropped: closed at once
                }
                let target = target.clone();
                let task = tokio::spawn(async move {
                    if let Some(path) = target.strip_prefix("unix:") {
                        if let Ok(mut outbound) = tokio::net::UnixStream::connect(path).await {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    } else if let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                c.lock().unwrap().push(task);
            }
        });
        Relay {
            port,
            open,
            conns,
            accept,
        }
    }

    /// Cuts every connection and refuses new ones until [`Relay::restore`].
    pub fn cut(&self) {
        self.open.store(false, std::sync::atomic::Ordering::SeqCst);
        for t in self.conns.lock().unwrap().drain(..) {
            t.abort();
        }
    }

    /// Accepts connections again.
    pub fn restore(&self) {
        self.open.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}
