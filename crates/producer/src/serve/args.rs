//! The command line of `burst-prefix-producer serve`: every flag, its environment variable and
//! its default, grouped as `--help` shows them.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use burst_prefix_api::ports;
use burst_prefix_runtime::flags;
use burst_prefix_runtime::leader::LeaderArgs;
use burst_prefix_runtime::logging::LogArgs;
use burst_prefix_runtime::producer::DEFAULT_DRAIN_TIMEOUT_MS;
use clap::{ArgGroup, Args};

use crate::config_sources::{configmap, ConfigSource};
use crate::listen::ConnectionLimits;
use crate::proxy::{ProxyConfig, DEFAULT_MAX_IDLE_PER_UPSTREAM};
use crate::serve::Role;
use crate::tls::{self, ServingCertificate};
use burst_prefix_core::admit::{
    DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_PLAN_REPLICAS,
    DEFAULT_MAX_WINDOW_BYTES,
};
use burst_prefix_core::Limits;
use tokio_rustls::TlsAcceptor;

/// Every interface, on `port`.
fn any(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::UNSPECIFIED, port))
}

#[derive(Args, Debug, Clone)]
#[command(group(ArgGroup::new("source").required(true).args(["config", "configmap"])))]
pub struct ServeArgs {
    /// Address of the API: POST /v1/produce, POST /v1/plan, GET /v1/endpoints, and the
    /// OpenAI-compatible proxy: POST /v1/completions, POST /v1/chat/completions, GET /v1/models.
    #[arg(long = flags::LISTEN, env = "BURST_PREFIX_LISTEN", default_value_t = any(ports::API))]
    pub listen: SocketAddr,
    /// Address of the endpoint picker for Gateway API Inference Extension gateways: Envoy's
    /// ext_proc gRPC service (h2c), and gRPC health for `liveness`, `readiness` and
    /// `envoy.service.ext_proc.v3.ExternalProcessor`.
    #[arg(long = flags::EPP_LISTEN, env = "BURST_PREFIX_EPP_LISTEN", default_value_t = any(ports::EPP))]
    pub epp_listen: SocketAddr,
    /// Address of the admin port: GET /healthz, GET /readyz, GET /metrics.
    #[arg(
        long = flags::ADMIN_LISTEN,
        env = "BURST_PREFIX_ADMIN_LISTEN",
        default_value_t = any(ports::ADMIN)
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
    /// Most bytes requests may hold before they are placed: bodies while they are read, the
    /// block hashes in the open window, and the bodies the proxy keeps to forward. A request
    /// beyond gets 429 window_full with Retry-After, before more of its body is read.
    #[arg(long, env = "BURST_PREFIX_MAX_WINDOW_BYTES", default_value_t = DEFAULT_MAX_WINDOW_BYTES)]
    pub max_window_bytes: usize,
    /// A request's body must arrive within this many milliseconds (at the endpoint picker: its
    /// headers and body); beyond, 408 body_timeout. Slow or stalled bodies cannot hold
    /// connections or memory longer.
    #[arg(long, env = "BURST_PREFIX_BODY_TIMEOUT_MS", default_value_t = DEFAULT_BODY_TIMEOUT.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub body_timeout_ms: u64,
    /// Most replicas a POST /v1/plan batch may name; beyond, 413 plan_too_large. (It takes at
    /// most the config's maxBatchSize requests.)
    #[arg(long, env = "BURST_PREFIX_MAX_PLAN_REPLICAS", default_value_t = DEFAULT_MAX_PLAN_REPLICAS)]
    pub max_plan_replicas: usize,
    /// On SIGTERM or SIGINT: not ready at once (and the Lease released, with
    /// --leader-elect, so a follower takes over), the open window answered, no new
    /// connections; requests in flight and streams run to completion for at most this many
    /// milliseconds, then what is left is cut and the process exits 0. Keep it above your
    /// longest completion; the pod's terminationGracePeriodSeconds must exceed it.
    #[arg(
        long = flags::DRAIN_TIMEOUT_MS,
        alias = "shutdown-timeout-ms",
        env = "BURST_PREFIX_DRAIN_TIMEOUT_MS",
        default_value_t = DEFAULT_DRAIN_TIMEOUT_MS
    )]
    pub drain_timeout_ms: u64,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub connections: ConnectionArgs,
    #[command(flatten)]
    pub proxy: ProxyArgs,
    /// Other producers serve the same traffic side by side, each request to any of them
    /// (`spec.producer.ha: activeActive`, which the operator renders as this flag): in time
    /// mode a prompt no replica holds yet goes to the replica every producer would choose (its
    /// rendezvous ranking among the replicas the time cost accepts, docs/behaviour.md §4)
    /// rather than the cheapest by this producer's own view. Off for a lone producer or a
    /// leader.
    #[arg(
        long = flags::ACTIVE_ACTIVE,
        env = "BURST_PREFIX_ACTIVE_ACTIVE",
        conflicts_with = "leader_elect",
        help_heading = "High availability"
    )]
    pub active_active: bool,
    /// Several producer replicas of one policy elect a leader with a Lease: only the
    /// leader is ready and plans windows; followers keep their config current and take over
    /// when the Lease lapses. The Lease must exist (the operator creates it).
    #[command(flatten, next_help_heading = "High availability")]
    pub leader: LeaderArgs,
    #[command(flatten)]
    pub log: LogArgs,
}

/// TLS on the endpoint picker (on by default) and the API port (off by default).
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "TLS")]
pub struct TlsArgs {
    /// The endpoint picker's certificate chain (PEM), with --epp-tls-key; read again when it
    /// changes (a mounted Secret). Without it the picker serves a self-signed certificate
    /// generated at start (the gateway then skips verification, as for the reference picker).
    #[arg(long = flags::EPP_TLS_CERT, env = "BURST_PREFIX_EPP_TLS_CERT", value_name = "FILE",
          requires = "epp_tls_key", conflicts_with = "epp_plaintext")]
    pub epp_tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --epp-tls-cert.
    #[arg(long = flags::EPP_TLS_KEY, env = "BURST_PREFIX_EPP_TLS_KEY", value_name = "FILE",
          requires = "epp_tls_cert")]
    pub epp_tls_key: Option<PathBuf>,
    /// Serve the endpoint picker as plaintext HTTP/2 (h2c), for a gateway beside it in the pod
    /// or on a trusted network.
    #[arg(long = flags::EPP_PLAINTEXT, env = "BURST_PREFIX_EPP_PLAINTEXT")]
    pub epp_plaintext: bool,
    /// Serve the API port (scoring API and proxy) over TLS with this certificate chain (PEM),
    /// with --tls-key; read again when it changes. Without it the API port is plaintext.
    #[arg(long = flags::TLS_CERT, env = "BURST_PREFIX_TLS_CERT", value_name = "FILE",
          requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long = flags::TLS_KEY, env = "BURST_PREFIX_TLS_KEY", value_name = "FILE",
          requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

/// The TLS acceptors of the API port and the endpoint picker (`None`: plaintext).
pub struct Acceptors {
    pub api: Option<TlsAcceptor>,
    pub epp: Option<TlsAcceptor>,
}

impl TlsArgs {
    /// Where the endpoint picker's certificate comes from; `None`: plaintext.
    pub fn epp_certificate(&self) -> Option<ServingCertificate> {
        match (&self.epp_tls_cert, &self.epp_tls_key) {
            _ if self.epp_plaintext => None,
            (Some(cert), Some(key)) => Some(ServingCertificate::Files {
                cert: cert.clone(),
                key: key.clone(),
            }),
            _ => Some(ServingCertificate::SelfSigned),
        }
    }

    /// How the endpoint picker serves, for the logs.
    pub fn epp_description(&self) -> &'static str {
        match self.epp_certificate() {
            None => "plaintext",
            Some(ServingCertificate::SelfSigned) => "self-signed",
            Some(ServingCertificate::Files { .. }) => "files",
        }
    }

    /// The acceptors, their certificates read (or made) now; needs a runtime (files are
    /// reloaded in the background).
    pub fn acceptors(&self) -> Result<Acceptors, String> {
        let api = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(tls::acceptor(
                &ServingCertificate::Files {
                    cert: cert.clone(),
                    key: key.clone(),
                },
                &[b"h2", b"http/1.1"],
            )?),
            _ => None,
        };
        let epp = self
            .epp_certificate()
            .map(|source| tls::acceptor(&source, &[b"h2"]))
            .transpose()?;
        Ok(Acceptors { api, epp })
    }
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

    /// The limits of the listener of `role`: the admin port has its own cap, so that health
    /// checks and metrics answer while the API and the endpoint picker are saturated.
    pub fn of(&self, role: Role) -> ConnectionLimits {
        match role {
            Role::Api | Role::Epp => self.limits(self.max_connections),
            Role::Admin => self.limits(self.admin_max_connections),
        }
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
    /// How long an unwell replica is left out of planning and routing, in milliseconds. A
    /// replica is unwell when it refuses a connection, or after --upstream-cooldown-after
    /// answers 502, 503 or 504 in a row (answers to retries do not count).
    #[arg(
        long,
        env = "BURST_PREFIX_UPSTREAM_COOLDOWN_MS",
        default_value_t = 10_000
    )]
    pub upstream_cooldown_ms: u64,
    /// Answers 502, 503 or 504 in a row after which a replica cools down (one answer never
    /// does: a request can make any replica answer so).
    #[arg(long, env = "BURST_PREFIX_UPSTREAM_COOLDOWN_AFTER", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(2..))]
    pub upstream_cooldown_after: u32,
    /// Idle connections to a replica are closed after this many milliseconds. Keep it below
    /// the inference servers' keep-alive timeout (5 s for vLLM, SGLang and llama-server): a
    /// request sent on a connection the server is closing fails and is not retried.
    #[arg(long, env = "BURST_PREFIX_UPSTREAM_IDLE_TIMEOUT_MS", default_value_t = 3000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub upstream_idle_timeout_ms: u64,
    /// Idle connections kept open to each replica; beyond, a connection is closed as soon as
    /// its answer ends. A thread-per-connection server such as llama-server (cpp-httplib) gives
    /// each open connection a thread until it closes, so idle connections kept after a burst
    /// hold the threads the next requests wait for. 0 opens a connection per request.
    #[arg(long, env = "BURST_PREFIX_UPSTREAM_MAX_IDLE", default_value_t = DEFAULT_MAX_IDLE_PER_UPSTREAM)]
    pub upstream_max_idle: usize,
}

impl ProxyArgs {
    pub fn config(&self) -> ProxyConfig {
        ProxyConfig {
            connect_timeout: Duration::from_millis(self.upstream_connect_timeout_ms),
            upstream_timeout: Duration::from_millis(self.upstream_timeout_ms),
            retries: self.upstream_retries,
            cooldown: Duration::from_millis(self.upstream_cooldown_ms),
            cooldown_after_5xx: self.upstream_cooldown_after,
            idle_timeout: Duration::from_millis(self.upstream_idle_timeout_ms),
            max_idle_per_upstream: self.upstream_max_idle,
        }
    }
}

impl ServeArgs {
    /// The config source the flags name (clap guarantees exactly one).
    pub fn source(&self) -> ConfigSource {
        match (&self.config, &self.configmap) {
            (Some(path), _) => ConfigSource::File {
                path: path.clone(),
                poll: Duration::from_millis(self.config_poll_ms),
                max_bytes: self.max_config_bytes,
            },
            (None, Some((namespace, name))) => ConfigSource::ConfigMap {
                namespace: namespace.clone(),
                name: name.clone(),
                max_bytes: self.max_config_bytes,
            },
            (None, None) => unreachable!("clap requires --config or --configmap"),
        }
    }

    /// The address the listener of `role` binds to.
    pub fn addr(&self, role: Role) -> SocketAddr {
        match role {
            Role::Api => self.listen,
            Role::Epp => self.epp_listen,
            Role::Admin => self.admin_listen,
        }
    }

    pub fn limits(&self) -> Limits {
        Limits {
            max_body_bytes: self.max_body_bytes,
            max_window_bytes: self.max_window_bytes,
            max_plan_replicas: self.max_plan_replicas,
            body_timeout: Duration::from_millis(self.body_timeout_ms),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burst_prefix_runtime::logging::LogFormat;
    use burst_prefix_runtime::producer::{EppTransport, LeaseRef, ProducerCommand, TlsFiles};
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
            drain_timeout_ms: Some(30_000),
            epp_transport: EppTransport::Tls(TlsFiles {
                cert: "/etc/epp/tls.crt".into(),
                key: "/etc/epp/tls.key".into(),
            }),
            api_tls: Some(TlsFiles {
                cert: "/etc/api/tls.crt".into(),
                key: "/etc/api/tls.key".into(),
            }),
            lease: Some(LeaseRef {
                name: "rl-producer".into(),
                namespace: "ml".into(),
            }),
            active_active: false,
        };
        for lease in [true, false] {
            if !lease {
                // The other shapes: the defaults, plaintext, and side by side.
                command.lease = None;
                command.active_active = true;
                command.drain_timeout_ms = None;
                command.epp_transport = EppTransport::Plaintext;
                command.api_tls = None;
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
            assert_eq!(serve.active_active, !lease);
            if lease {
                assert_eq!(serve.leader.lease_name.as_deref(), Some("rl-producer"));
                assert_eq!(serve.leader.lease_namespace, "ml");
                assert_eq!(serve.drain_timeout_ms, 30_000);
                assert_eq!(
                    serve.tls.epp_certificate(),
                    Some(ServingCertificate::Files {
                        cert: "/etc/epp/tls.crt".into(),
                        key: "/etc/epp/tls.key".into(),
                    })
                );
                assert_eq!(serve.tls.tls_key, Some("/etc/api/tls.key".into()));
            } else {
                assert_eq!(serve.drain_timeout_ms, DEFAULT_DRAIN_TIMEOUT_MS);
                assert_eq!(serve.tls.epp_certificate(), None, "plaintext");
                assert_eq!(serve.tls.tls_cert, None);
                // The proxy flags' defaults are the library's (tests and benches use those).
                assert_eq!(serve.proxy.config(), ProxyConfig::default());
            }
        }
    }
}
