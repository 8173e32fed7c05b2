//! `burst-prefix-producer serve`: the flags, the wiring of config source, core and listeners, and
//! graceful shutdown.
//!
//! On SIGTERM or SIGINT every listener stops accepting connections, the open window is sealed,
//! planned and answered at once, in-flight responses are written, and the process exits 0.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use axum::serve::ListenerExt;
use axum::Router;
use clap::{ArgGroup, Args, ValueEnum};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::core::{Limits, Producer, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_WINDOW_BYTES};
use crate::http;
use crate::sources::{configmap, Source};

/// How long shutdown waits for in-flight responses after the window was answered.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

#[derive(Args, Debug, Clone)]
#[command(group(ArgGroup::new("source").required(true).args(["config", "configmap"])))]
pub struct ServeArgs {
    /// Address of the API: POST /v1/produce, POST /v1/plan, GET /v1/endpoints.
    #[arg(long, env = "BURST_PREFIX_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// Address of the admin port: GET /healthz, GET /readyz, GET /metrics.
    #[arg(
        long,
        env = "BURST_PREFIX_ADMIN_LISTEN",
        default_value = "0.0.0.0:9090"
    )]
    pub admin_listen: SocketAddr,
    /// Read the producer config (YAML or JSON) from FILE, and reload it when it changes. It must
    /// be valid at startup; a later invalid change is rejected and the last good config stays.
    #[arg(long, env = "BURST_PREFIX_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Watch key `config.yaml` of this ConfigMap through the Kubernetes API (kubeconfig found
    /// the usual way: KUBECONFIG, ~/.kube/config, or the in-cluster service account). Not ready
    /// until it holds a valid config with at least one endpoint.
    #[arg(
        long,
        env = "BURST_PREFIX_CONFIGMAP",
        value_name = "NAMESPACE/NAME",
        value_parser = configmap::parse_reference
    )]
    pub configmap: Option<(String, String)>,
    /// How often --config FILE is checked for changes, in milliseconds.
    #[arg(long, env = "BURST_PREFIX_CONFIG_POLL_MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub config_poll_ms: u64,
    /// Largest request body accepted, in bytes; larger ones get 413 body_too_large.
    #[arg(long, env = "BURST_PREFIX_MAX_BODY_BYTES", default_value_t = DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// Most bytes the open window may hold: its requests' block hashes, plus the bodies the
    /// proxy keeps to forward; a request beyond gets 429 window_full with Retry-After.
    #[arg(long, env = "BURST_PREFIX_MAX_WINDOW_BYTES", default_value_t = DEFAULT_MAX_WINDOW_BYTES)]
    pub max_window_bytes: usize,
    #[command(flatten)]
    pub log: LogArgs,
}

impl ServeArgs {
    /// The config source the flags name (clap guarantees exactly one).
    pub fn source(&self) -> Source {
        match (&self.config, &self.configmap) {
            (Some(path), _) => Source::File {
                path: path.clone(),
                poll: Duration::from_millis(self.config_poll_ms),
            },
            (None, Some((namespace, name))) => Source::ConfigMap {
                namespace: namespace.clone(),
                name: name.clone(),
            },
            (None, None) => unreachable!("clap requires --config or --configmap"),
        }
    }

    pub fn limits(&self) -> Limits {
        Limits {
            max_body_bytes: self.max_body_bytes,
            max_window_bytes: self.max_window_bytes,
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct LogArgs {
    /// Log format on stderr.
    #[arg(long, env = "BURST_PREFIX_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log filter: a level (error, warn, info, debug, trace) or tracing directives such as
    /// `info,burst_prefix_producer=debug`.
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    pub log_level: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Structured logs on stderr.
pub fn init_logging(args: &LogArgs) -> Result<(), String> {
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log_level)
        .map_err(|e| format!("--log-level {:?}: {e}", args.log_level))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let result = match args.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    result.map_err(|e| format!("cannot set up logging: {e}"))
}

/// Runs `serve` to the end: exit 0 after a graceful shutdown, 2 when it cannot start.
pub fn run(args: ServeArgs) -> ExitCode {
    if let Err(message) = init_logging(&args.log) {
        eprintln!("error: {message}");
        return ExitCode::from(2);
    }
    let result = tokio::runtime::Runtime::new()
        .map_err(|e| format!("cannot start the runtime: {e}"))
        .and_then(|runtime| runtime.block_on(serve(args)));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            tracing::error!(error = %message, "cannot serve");
            ExitCode::from(2)
        }
    }
}

async fn serve(args: ServeArgs) -> Result<(), String> {
    let source = args.source();
    let producer = Producer::new(source.describe(), args.limits());
    source.start(producer.store.clone()).await?;
    let listeners = vec![
        Listener::bind(Role::Api, args.listen, "--listen").await?,
        Listener::bind(Role::Admin, args.admin_listen, "--admin-listen").await?,
    ];
    let service = Service::start(producer, listeners).map_err(|e| e.to_string())?;
    tracing::info!(
        api = %service.addr(Role::Api).expect("bound"),
        admin = %service.addr(Role::Admin).expect("bound"),
        source = %service.producer.store.source(),
        "listening"
    );
    shutdown_signal().await;
    tracing::info!("shutting down: answering the open window");
    service.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

/// Waits for SIGTERM or SIGINT.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .expect("installing a SIGTERM handler");
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}

/// What a listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The JSON API (`/v1/produce`, `/v1/plan`, `/v1/endpoints`).
    Api,
    /// `/healthz`, `/readyz`, `/metrics`.
    Admin,
}

impl Role {
    fn router(self, producer: &Producer) -> Router {
        match self {
            Role::Api => http::router(producer.clone()),
            Role::Admin => http::admin::router(producer.clone()),
        }
    }
}

/// A bound socket and what it serves.
pub struct Listener {
    pub role: Role,
    pub tcp: TcpListener,
}

impl Listener {
    /// Binds `addr`; the error names the flag.
    pub async fn bind(role: Role, addr: SocketAddr, flag: &str) -> Result<Self, String> {
        let tcp = TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen on {flag} {addr}: {e}"))?;
        Ok(Listener { role, tcp })
    }
}

/// The listeners of one producer, running on the current runtime.
pub struct Service {
    pub producer: Producer,
    addrs: Vec<(Role, SocketAddr)>,
    stop: watch::Sender<bool>,
    servers: Vec<JoinHandle<std::io::Result<()>>>,
}

impl Service {
    /// Serves `producer` on every listener until [`Service::shutdown`].
    pub fn start(producer: Producer, listeners: Vec<Listener>) -> std::io::Result<Service> {
        let (stop, stopped) = watch::channel(false);
        let mut addrs = Vec::new();
        let mut servers = Vec::new();
        for Listener { role, tcp } in listeners {
            addrs.push((role, tcp.local_addr()?));
            let mut stopped = stopped.clone();
            let tcp = tcp.tap_io(|tcp| {
                // Small responses go out at once (no Nagle delay).
                let _ = tcp.set_nodelay(true);
            });
            let server =
                axum::serve(tcp, role.router(&producer)).with_graceful_shutdown(async move {
                    let _ = stopped.wait_for(|stop| *stop).await;
                });
            servers.push(tokio::spawn(async move { server.await }));
        }
        Ok(Service {
            producer,
            addrs,
            stop,
            servers,
        })
    }

    /// The address the listener of `role` is bound to.
    pub fn addr(&self, role: Role) -> Option<SocketAddr> {
        self.addrs.iter().find(|(r, _)| *r == role).map(|(_, a)| *a)
    }

    /// Stops accepting, answers the open window, and waits for in-flight responses.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        self.producer.window.close().await;
        let servers = futures::future::join_all(self.servers);
        match tokio::time::timeout(SHUTDOWN_GRACE, servers).await {
            Ok(results) => {
                for result in results {
                    match result {
                        Ok(Ok(())) => {}
                        Ok(Err(error)) => tracing::warn!(%error, "a server stopped with an error"),
                        Err(error) => tracing::warn!(%error, "a server task failed"),
                    }
                }
            }
            Err(_) => tracing::warn!(
                grace_seconds = SHUTDOWN_GRACE.as_secs(),
                "connections still open after the grace period; exiting anyway"
            ),
        }
    }
}
