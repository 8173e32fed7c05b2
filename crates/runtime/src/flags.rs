//! Command-line flag names shared by the operator and the producer (without the leading `--`).
//! The operator renders the producer's arguments from these ([`crate::producer::ProducerCommand`]),
//! and both binaries declare their flags with them (`#[arg(long = flags::LISTEN)]`), so a renamed
//! flag cannot leave the operator starting producers with an argument they refuse.

/// `--log-format text|json` ([`crate::logging::LogArgs`]).
pub const LOG_FORMAT: &str = "log-format";
/// `--log-level FILTER` ([`crate::logging::LogArgs`]).
pub const LOG_LEVEL: &str = "log-level";

/// `serve --active-active`: other producers serve the same traffic side by side.
pub const ACTIVE_ACTIVE: &str = "active-active";
/// `--leader-elect` ([`crate::leader::LeaderArgs`]).
pub const LEADER_ELECT: &str = "leader-elect";
/// `--lease-name NAME`.
pub const LEASE_NAME: &str = "lease-name";
/// `--lease-namespace NAMESPACE`.
pub const LEASE_NAMESPACE: &str = "lease-namespace";
/// `--lease-duration-seconds N`.
pub const LEASE_DURATION_SECONDS: &str = "lease-duration-seconds";
/// `--identity ID` (default: `$POD_NAME`, then the host name).
pub const IDENTITY: &str = "identity";

/// The environment variable the downward API fills with the pod's name: the Lease identity.
pub const POD_NAME_ENV: &str = "POD_NAME";
/// The environment variable the downward API fills with the pod's namespace.
pub const POD_NAMESPACE_ENV: &str = "POD_NAMESPACE";

/// The producer's `serve` subcommand.
pub const SERVE: &str = "serve";
/// `serve --configmap NAMESPACE/NAME`: the config source the operator writes.
pub const CONFIGMAP: &str = "configmap";
/// `serve --listen ADDR`: `/v1/produce`, `/v1/plan`, `/v1/endpoints` and the proxy routes
/// `/v1/completions`, `/v1/chat/completions`, `/v1/models`.
pub const LISTEN: &str = "listen";
/// `serve --admin-listen ADDR`: `/healthz`, `/readyz`, `/metrics`.
pub const ADMIN_LISTEN: &str = "admin-listen";
/// `serve --epp-listen ADDR`: the gRPC endpoint picker (Envoy ext_proc).
pub const EPP_LISTEN: &str = "epp-listen";
/// `serve --drain-timeout-ms MS`: on SIGTERM, how long requests in flight and streams may run
/// on before they are cut (the pod's `terminationGracePeriodSeconds` follows it).
pub const DRAIN_TIMEOUT_MS: &str = "drain-timeout-ms";
/// `serve --epp-tls-cert FILE`: the endpoint picker's TLS certificate chain (PEM); with
/// `--epp-tls-key`. Without them the picker serves TLS with a self-signed certificate.
pub const EPP_TLS_CERT: &str = "epp-tls-cert";
/// `serve --epp-tls-key FILE`: the private key (PEM) of `--epp-tls-cert`.
pub const EPP_TLS_KEY: &str = "epp-tls-key";
/// `serve --epp-plaintext`: serve the endpoint picker as plaintext h2c (sidecar setups).
pub const EPP_PLAINTEXT: &str = "epp-plaintext";
/// `serve --tls-cert FILE`: serve the API port (scoring API and proxy) over TLS; with
/// `--tls-key`.
pub const TLS_CERT: &str = "tls-cert";
/// `serve --tls-key FILE`: the private key (PEM) of `--tls-cert`.
pub const TLS_KEY: &str = "tls-key";
