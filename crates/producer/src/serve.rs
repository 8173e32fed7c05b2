//! `burst-prefix-producer serve`: the flags, the wiring of config source, core and listeners, and
//! graceful shutdown.
//!
//! On SIGTERM or SIGINT every listener stops accepting connections, the open window is sealed,
//! planned and answered at once, idle connections are closed, in-flight responses are written,
//! and the process exits 0, within `--shutdown-timeout-ms` whatever clients hold.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use axum::Router;
use burst_prefix_runtime::flags;
use burst_prefix_runtime::leader::{LeaderArgs, Leadership};
pub use burst_prefix_runtime::logging::{LogArgs, LogFormat};
use clap::{ArgGroup, Args};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::core::{
    Limits, Producer, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_PLAN_REPLICAS, DEFAULT_MAX_WINDOW_BYTES,
};
use crate::listen::{self, ConnectionLimits};
use crate::proxy::{self, ProxyConfig};
use crate::sources::{configmap, Source};
use crate::{epp, http};

#[derive(Args, Debug, Clone)]
#[command(group(ArgGroup::new("source").required(true).args(["config", "configmap"])))]
pub struct ServeArgs {
    /// Address of the API: POST /v1/produce, POST /v1/plan, GET /v1/endpoints, and the
    /// OpenAI-compatible proxy: POST /v1/completions, POST /v1/chat/completions, GET /v1/models.
    #[arg(long = flags::LISTEN, env = "BURST_PREFIX_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// Address of the endpoint picker for Gateway API Inference Extension gateways: Envoy's
    /// ext_proc gRPC service (h2c), and gRPC health for `liveness`, `readiness` and
    /// `envoy.service.ext_proc.v3.ExternalProcessor`.
    #[arg(long = flags::EPP_LISTEN, env = "BURST_PREFIX_EPP_LISTEN", default_value = "0.0.0.0:9002")]
    pub epp_listen: SocketAddr,
    /// Address of the admin port: GET /healthz, GET /readyz, GET /metrics.
    #[arg(
        long = flags::ADMIN_LISTEN,
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
        long = flags::CONFIGMAP,
        env = "BURST_PREFIX_CONFIGMAP",
        value_name = "NAMESPACE/NAME",
        value_parser = configmap::parse_reference
    )]
    pub configmap: Option<(String, String)>,
    /// A config (the file, or the ConfigMap key) larger than this many bytes is refused.
    #[arg(long, env = "BURST_PREFIX_MAX_CONFIG_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub max_config_bytes: u64,
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
    /// Most replicas a POST /v1/plan batch may name; beyond, 413 plan_too_large. (It takes at
    /// most the config's maxBatchSize requests.)
    #[arg(long, env = "BURST_PREFIX_MAX_PLAN_REPLICAS", default_value_t = DEFAULT_MAX_PLAN_REPLICAS)]
    pub max_plan_replicas: usize,
    /// On SIGTERM or SIGINT, exit within this many milliseconds, whatever clients hold: stop
    /// accepting, answer the open window, close idle connections, wait for responses in flight.
    #[arg(
        long,
        env = "BURST_PREFIX_SHUTDOWN_TIMEOUT_MS",
        default_value_t = burst_prefix_runtime::producer::DEFAULT_SHUTDOWN_TIMEOUT_MS
    )]
    pub shutdown_timeout_ms: u64,
    #[command(flatten)]
    pub connections: ConnectionArgs,
    #[command(flatten)]
    pub proxy: ProxyArgs,
    /// Several producer replicas of one policy elect a leader with a Lease (SPEC §10): only the
    /// leader is ready and plans windows; followers keep their config current and take over
    /// when the Lease lapses. The Lease must exist (the operator creates it).
    #[command(flatten, next_help_heading = "High availability")]
    pub leader: LeaderArgs,
    #[command(flatten)]
    pub log: LogArgs,
}

/// Limits that keep slow or silent clients from holding the service.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Connections")]
pub struct ConnectionArgs {
    /// A client must send a request's headers within this many milliseconds, and an HTTP/1
    /// connection idle between requests is closed after as long.
    #[arg(long, env = "BURST_PREFIX_HEADER_READ_TIMEOUT_MS", default_value_t = 5000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub header_read_timeout_ms: u64,
    /// Most connections open at once on --listen; more wait in the kernel's accept queue.
    #[arg(long, env = "BURST_PREFIX_MAX_CONNECTIONS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections: u64,
    /// Most connections open at once on --admin-listen, counted apart so that health checks
    /// and metrics answer while the API is saturated.
    #[arg(long, env = "BURST_PREFIX_ADMIN_MAX_CONNECTIONS", default_value_t = 64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub admin_max_connections: u64,
}

impl ConnectionArgs {
    fn limits(&self, max_connections: u64) -> ConnectionLimits {
        ConnectionLimits {
            header_read_timeout: Duration::from_millis(self.header_read_timeout_ms),
            max_connections: usize::try_from(max_connections).unwrap_or(usize::MAX),
            ..ConnectionLimits::default()
        }
    }

    pub fn api(&self) -> ConnectionLimits {
        self.limits(self.max_connections)
    }

    pub fn admin(&self) -> ConnectionLimits {
        self.limits(self.admin_max_connections)
    }
}

/// How the proxy routes talk to the replicas.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Proxy")]
pub struct ProxyArgs {
    /// Connecting to a replica may take this long, in milliseconds; a refused connection is
    /// retried on the next replica.
    #[arg(long, env = "BURST_PREFIX_UPSTREAM_CONNECT_TIMEOUT_MS", default_value_t = 5000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub upstream_connect_timeout_ms: u64,
    /// The longest wait for the next bytes from a replica, in milliseconds: its response head
    /// (a non-streaming completion sends it only when done), then each chunk. Beyond, 504.
    #[arg(long, env = "BURST_PREFIX_UPSTREAM_TIMEOUT_MS", default_value_t = 300_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub upstream_timeout_ms: u64,
    /// How many times a request a replica refused (connection refused, 502 or 503 before any
    /// byte) is sent to the next replica; 0 never retries.
    #[arg(long, env = "BURST_PREFIX_UPSTREAM_RETRIES", default_value_t = 1)]
    pub upstream_retries: usize,
    /// How long a replica that refused is left out of planning and routing, in milliseconds.
    #[arg(
        long,
        env = "BURST_PREFIX_UPSTREAM_COOLDOWN_MS",
        default_value_t = 10_000
    )]
    pub upstream_cooldown_ms: u64,
    /// Idle connections to a replica are closed after this many milliseconds. Keep it below
    /// the inference servers' keep-alive timeout (5 s for vLLM, SGLang and llama-server): a
    /// request sent on a connection the server is closing fails and is not retried.
    #[arg(long, env = "BURST_PREFIX_UPSTREAM_IDLE_TIMEOUT_MS", default_value_t = 3000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub upstream_idle_timeout_ms: u64,
}

impl ProxyArgs {
    pub fn config(&self) -> ProxyConfig {
        ProxyConfig {
            connect_timeout: Duration::from_millis(self.upstream_connect_timeout_ms),
            upstream_timeout: Duration::from_millis(self.upstream_timeout_ms),
            retries: self.upstream_retries,
            cooldown: Duration::from_millis(self.upstream_cooldown_ms),
            idle_timeout: Duration::from_millis(self.upstream_idle_timeout_ms),
        }
    }
}

impl ServeArgs {
    /// The config source the flags name (clap guarantees exactly one).
    pub fn source(&self) -> Source {
        match (&self.config, &self.configmap) {
            (Some(path), _) => Source::File {
                path: path.clone(),
                poll: Duration::from_millis(self.config_poll_ms),
                max_bytes: self.max_config_bytes,
            },
            (None, Some((namespace, name))) => Source::ConfigMap {
                namespace: namespace.clone(),
                name: name.clone(),
                max_bytes: self.max_config_bytes,
            },
            (None, None) => unreachable!("clap requires --config or --configmap"),
        }
    }

    pub fn limits(&self) -> Limits {
        Limits {
            max_body_bytes: self.max_body_bytes,
            max_window_bytes: self.max_window_bytes,
            max_plan_replicas: self.max_plan_replicas,
        }
    }
}

/// Runs `serve` to the end: exit 0 after a graceful shutdown, 2 when it cannot start.
pub fn run(args: ServeArgs) -> ExitCode {
    if let Err(message) = burst_prefix_runtime::logging::init(&args.log) {
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
    raise_fd_limit();
    let source = args.source();
    let producer = Producer::new(source.describe(), args.limits());
    source.start(producer.store.clone()).await?;
    // Held to the end: dropping it releases the Lease, so a follower takes over at once.
    let leadership = match args.leader.leader_elect {
        true => Some(elect(&producer, &args.leader).await?),
        false => None,
    };
    let listeners = vec![
        Listener::bind(
            Role::Api,
            args.listen,
            "--listen",
            api_router(&producer, args.proxy.config()),
            args.connections.api(),
        )
        .await?,
        Listener::bind(
            Role::Epp,
            args.epp_listen,
            "--epp-listen",
            epp::router(producer.clone()),
            args.connections.api(),
        )
        .await?,
        Listener::bind(
            Role::Admin,
            args.admin_listen,
            "--admin-listen",
            http::admin::router(producer.clone()),
            args.connections.admin(),
        )
        .await?,
    ];
    let service = Service::start(producer, listeners).map_err(|e| e.to_string())?;
    tracing::info!(
        api = %service.addr(Role::Api).expect("bound"),
        epp = %service.addr(Role::Epp).expect("bound"),
        admin = %service.addr(Role::Admin).expect("bound"),
        source = %service.producer.store.source(),
        "listening"
    );
    shutdown_signal().await;
    tracing::info!("shutting down: answering the open window");
    service
        .shutdown(Duration::from_millis(args.shutdown_timeout_ms))
        .await;
    drop(leadership);
    tracing::info!("stopped");
    Ok(())
}

/// Starts competing for the Lease; the producer follows until it leads, and leads until it
/// loses the Lease.
async fn elect(producer: &Producer, args: &LeaderArgs) -> Result<Leadership, String> {
    let client = kube::Client::try_default().await.map_err(|e| {
        format!(
            "cannot reach the Kubernetes API for --{}: {e}",
            flags::LEADER_ELECT
        )
    })?;
    let name = args
        .lease_name
        .clone()
        .unwrap_or_else(|| "burst-prefix-producer".to_string());
    let identity = args.identity_or("burst-prefix-producer");
    producer.set_leading(false);
    let leadership = Leadership::start(
        client,
        &name,
        &args.lease_namespace,
        &identity,
        Duration::from_secs(args.lease_duration_seconds),
    )
    .await?;
    let mut leading = leadership.subscribe();
    let producer = producer.clone();
    let lease = leadership.lease.clone();
    tokio::spawn(async move {
        loop {
            let now = *leading.borrow_and_update();
            if now != producer.leading() {
                producer.set_leading(now);
                if now {
                    tracing::info!(%lease, %identity, "leading: ready, planning windows");
                } else {
                    tracing::warn!(%lease, %identity, "following: not ready, refusing requests");
                }
            }
            if leading.changed().await.is_err() {
                producer.set_leading(false);
                tracing::error!(%lease, "the Lease manager stopped; following from now on");
                return;
            }
        }
    });
    tracing::info!(lease = %leadership.lease, identity = %leadership.identity, "competing for the Lease");
    Ok(leadership)
}

/// Every connection is an fd: raise the soft limit to the hard one, so that the connection
/// caps, not the fd limit, are what bounds the service.
fn raise_fd_limit() {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => tracing::info!(
            open_files = limit,
            "raised the open-file limit to its hard limit"
        ),
        Err(error) => tracing::warn!(%error, "cannot raise the open-file limit"),
    }
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

/// The API port: the JSON API and the OpenAI-compatible proxy.
pub fn api_router(producer: &Producer, proxy: ProxyConfig) -> Router {
    http::router(producer.clone()).merge(proxy::router(producer.clone(), proxy))
}

/// What a listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The JSON API and the proxy ([`api_router`]).
    Api,
    /// The endpoint picker (gRPC).
    Epp,
    /// `/healthz`, `/readyz`, `/metrics`.
    Admin,
}

/// A bound socket, what it serves and under which limits.
pub struct Listener {
    pub role: Role,
    pub tcp: TcpListener,
    pub router: Router,
    pub limits: ConnectionLimits,
}

impl Listener {
    /// Binds `addr`; the error names the flag.
    pub async fn bind(
        role: Role,
        addr: SocketAddr,
        flag: &str,
        router: Router,
        limits: ConnectionLimits,
    ) -> Result<Self, String> {
        let tcp = TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen on {flag} {addr}: {e}"))?;
        Ok(Listener {
            role,
            tcp,
            router,
            limits,
        })
    }
}

/// The listeners of one producer, running on the current runtime.
pub struct Service {
    pub producer: Producer,
    addrs: Vec<(Role, SocketAddr)>,
    stop: watch::Sender<bool>,
    servers: Vec<JoinHandle<()>>,
}

impl Service {
    /// Serves `producer` on every listener until [`Service::shutdown`].
    pub fn start(producer: Producer, listeners: Vec<Listener>) -> std::io::Result<Service> {
        let (stop, stopped) = watch::channel(false);
        let mut addrs = Vec::new();
        let mut servers = Vec::new();
        for listener in listeners {
            addrs.push((listener.role, listener.tcp.local_addr()?));
            servers.push(tokio::spawn(listen::serve(
                listener.tcp,
                listener.router,
                listener.limits,
                stopped.clone(),
            )));
        }
        Ok(Service {
            producer,
            addrs,
            stop,
            servers,
        })
    }

    /// The API, endpoint picker and admin listeners on ephemeral loopback ports, default limits: for the demo,
    /// benches and tests.
    pub async fn on_loopback(producer: Producer, proxy: ProxyConfig) -> Result<Service, String> {
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        let listeners = vec![
            Listener::bind(
                Role::Api,
                loopback,
                "the API port",
                api_router(&producer, proxy),
                ConnectionLimits::default(),
            )
            .await?,
            Listener::bind(
                Role::Epp,
                loopback,
                "the endpoint picker port",
                epp::router(producer.clone()),
                ConnectionLimits::default(),
            )
            .await?,
            Listener::bind(
                Role::Admin,
                loopback,
                "the admin port",
                http::admin::router(producer.clone()),
                ConnectionLimits::default(),
            )
            .await?,
        ];
        Service::start(producer, listeners).map_err(|e| e.to_string())
    }

    /// The address the listener of `role` is bound to.
    pub fn addr(&self, role: Role) -> Option<SocketAddr> {
        self.addrs.iter().find(|(r, _)| *r == role).map(|(_, a)| *a)
    }

    /// Stops accepting, answers the open window, closes idle connections and waits for the
    /// responses in flight, for at most `timeout` in all.
    pub async fn shutdown(self, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        let _ = self.stop.send(true);
        let closed = async {
            self.producer.window.close().await;
            futures::future::join_all(self.servers).await
        };
        match tokio::time::timeout_at(deadline, closed).await {
            Ok(results) => {
                for error in results.into_iter().filter_map(Result::err) {
                    tracing::warn!(%error, "a listener task failed");
                }
            }
            Err(_) => tracing::warn!(
                timeout_ms = timeout.as_millis() as u64,
                "connections still open at the shutdown timeout; exiting anyway"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burst_prefix_runtime::producer::{LeaseRef, ProducerCommand};
    use clap::{Parser, Subcommand};

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(Subcommand)]
    enum Command {
        Serve(Box<ServeArgs>),
    }

    /// The contract with the operator: the producer accepts the command line it renders.
    #[test]
    fn the_operators_command_line_parses() {
        let mut command = ProducerCommand {
            configmap: "ml/rl-producer".into(),
            port: 8080,
            admin_port: 9090,
            epp_port: 9002,
            log_format: LogFormat::Json,
            log_level: "info".into(),
            lease: Some(LeaseRef {
                name: "rl-producer".into(),
                namespace: "ml".into(),
            }),
        };
        for lease in [true, false] {
            if !lease {
                command.lease = None;
            }
            let args = std::iter::once("burst-prefix-producer".to_string()).chain(command.args());
            let Command::Serve(serve) = Cli::try_parse_from(args)
                .unwrap_or_else(|e| panic!("{e}"))
                .command;
            assert_eq!(
                serve.configmap,
                Some(("ml".to_string(), "rl-producer".to_string()))
            );
            assert_eq!(serve.epp_listen.port(), 9002);
            assert_eq!(serve.leader.leader_elect, lease);
            if lease {
                assert_eq!(serve.leader.lease_name.as_deref(), Some("rl-producer"));
                assert_eq!(serve.leader.lease_namespace, "ml");
            }
        }
    }
}
