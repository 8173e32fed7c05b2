//! The producer's side of the contract with the operator: the ConfigMap key it reads and its
//! command line as the operator renders it (its default ports are `burst_prefix_api::ports`).

use crate::flags;
use crate::logging::LogFormat;

/// The key of the producer config (YAML) in the ConfigMap the operator writes.
pub const CONFIG_KEY: &str = "config.yaml";

/// How long the producer takes at most to exit after SIGTERM (`--shutdown-timeout-ms`).
pub const DEFAULT_SHUTDOWN_TIMEOUT_MS: u64 = 10_000;

/// How long requests in flight and streams may run on after SIGTERM (`--drain-timeout-ms`), when
/// the policy does not say: the producer's default and the operator's, so that the pod's grace
/// period covers the drain the producer really does.
pub const DEFAULT_DRAIN_TIMEOUT_MS: u64 = 120_000;

/// What the kubelet and the runtime take besides the producer's own shutdown (sending the
/// signal, stopping the container): a margin, so the producer is never killed mid-answer.
const KUBELET_MARGIN_SECONDS: u64 = 5;

/// The pod's `terminationGracePeriodSeconds` for a producer whose windows last
/// `window_duration_ms` and that drains for `drain_timeout_ms`: the open window is answered
/// first, then requests in flight and streams run on for the drain, then the shutdown steps
/// take at most the shutdown timeout; plus the kubelet's margin, rounded up to whole seconds.
pub fn termination_grace_period_seconds(window_duration_ms: u64, drain_timeout_ms: u64) -> i64 {
    let millis = window_duration_ms
        .saturating_add(drain_timeout_ms)
        .saturating_add(DEFAULT_SHUTDOWN_TIMEOUT_MS);
    let seconds = millis.div_ceil(1000).saturating_add(KUBELET_MARGIN_SECONDS);
    i64::try_from(seconds).unwrap_or(i64::MAX)
}

/// A Lease the producer replicas elect their leader with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRef {
    pub name: String,
    pub namespace: String,
}

/// A certificate chain and its private key, as PEM files (a mounted `kubernetes.io/tls` Secret).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: String,
    pub key: String,
}

/// How the endpoint picker serves gRPC.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum EppTransport {
    /// TLS with a self-signed certificate the producer generates at start (no flag: the
    /// producer's default, as the reference endpoint picker's `--secure-serving`).
    #[default]
    SelfSignedTls,
    /// TLS with these files (`--epp-tls-cert`, `--epp-tls-key`), reloaded when they change.
    Tls(TlsFiles),
    /// Plaintext h2c (`--epp-plaintext`), for a gateway that runs beside the producer.
    Plaintext,
}

/// `burst-prefix-producer serve ...` as the operator runs it in a producer pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProducerCommand {
    /// `NAMESPACE/NAME` of the ConfigMap.
    pub configmap: String,
    pub port: u16,
    pub admin_port: u16,
    pub epp_port: u16,
    pub log_format: LogFormat,
    pub log_level: String,
    /// `--drain-timeout-ms`; `None`: the producer's default ([`DEFAULT_DRAIN_TIMEOUT_MS`]).
    pub drain_timeout_ms: Option<u64>,
    pub epp_transport: EppTransport,
    /// TLS on the API port (`--tls-cert`, `--tls-key`); `None`: plain HTTP.
    pub api_tls: Option<TlsFiles>,
    /// With more than one replica: the Lease; the identity comes from `$POD_NAME`.
    pub lease: Option<LeaseRef>,
    /// Several replicas serving side by side (`--active-active`).
    pub active_active: bool,
}

impl ProducerCommand {
    /// The container's `args` (the image's entrypoint is the producer binary).
    pub fn args(&self) -> Vec<String> {
        let flag = |name: &str| format!("--{name}");
        let mut args = vec![
            flags::SERVE.to_string(),
            flag(flags::CONFIGMAP),
            self.configmap.clone(),
            flag(flags::LISTEN),
            format!("0.0.0.0:{}", self.port),
            flag(flags::ADMIN_LISTEN),
            format!("0.0.0.0:{}", self.admin_port),
            flag(flags::EPP_LISTEN),
            format!("0.0.0.0:{}", self.epp_port),
            flag(flags::LOG_FORMAT),
            self.log_format.as_str().to_string(),
            flag(flags::LOG_LEVEL),
            self.log_level.clone(),
        ];
        if let Some(drain) = self.drain_timeout_ms {
            args.extend([flag(flags::DRAIN_TIMEOUT_MS), drain.to_string()]);
        }
        match &self.epp_transport {
            EppTransport::SelfSignedTls => {}
            EppTransport::Tls(files) => args.extend([
                flag(flags::EPP_TLS_CERT),
                files.cert.clone(),
                flag(flags::EPP_TLS_KEY),
                files.key.clone(),
            ]),
            EppTransport::Plaintext => args.push(flag(flags::EPP_PLAINTEXT)),
        }
        if let Some(files) = &self.api_tls {
            args.extend([
                flag(flags::TLS_CERT),
                files.cert.clone(),
                flag(flags::TLS_KEY),
                files.key.clone(),
            ]);
        }
        if self.active_active {
            args.push(flag(flags::ACTIVE_ACTIVE));
        }
        if let Some(lease) = &self.lease {
            args.extend([
                flag(flags::LEADER_ELECT),
                flag(flags::LEASE_NAME),
                lease.name.clone(),
                flag(flags::LEASE_NAMESPACE),
                lease.namespace.clone(),
            ]);
        }
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grace_period_covers_the_window_the_drain_and_the_shutdown_timeout() {
        // 100 ms window, the default 120 s drain, 10 s shutdown, 5 s margin: 130.1 s -> 131 + 5.
        assert_eq!(
            termination_grace_period_seconds(100, DEFAULT_DRAIN_TIMEOUT_MS),
            136
        );
        assert_eq!(termination_grace_period_seconds(10_000, 0), 25);
        assert_eq!(termination_grace_period_seconds(0, 30_000), 45);
        for (window, drain) in [
            (0, 0),
            (1, 1),
            (999, 0),
            (100, 120_000),
            (60_000, 3_600_000),
        ] {
            let grace_ms = termination_grace_period_seconds(window, drain) as u64 * 1000;
            assert!(
                grace_ms > window + drain + DEFAULT_SHUTDOWN_TIMEOUT_MS,
                "{window} {drain}"
            );
        }
        assert_eq!(termination_grace_period_seconds(u64::MAX, u64::MAX), {
            i64::try_from(u64::MAX / 1000 + 1 + KUBELET_MARGIN_SECONDS).unwrap_or(i64::MAX)
        });
    }

    fn command() -> ProducerCommand {
        ProducerCommand {
            configmap: "ml/rl-producer".into(),
            port: 8080,
            admin_port: 9090,
            epp_port: 9002,
            log_format: LogFormat::Json,
            log_level: "info".into(),
            drain_timeout_ms: None,
            epp_transport: EppTransport::SelfSignedTls,
            api_tls: None,
            lease: None,
            active_active: false,
        }
    }

    #[test]
    fn args_name_every_listener_and_the_lease_only_when_given() {
        let mut command = command();
        assert_eq!(
            command.args().join(" "),
            "serve --configmap ml/rl-producer --listen 0.0.0.0:8080 --admin-listen 0.0.0.0:9090 \
             --epp-listen 0.0.0.0:9002 --log-format json --log-level info"
        );
        command.lease = Some(LeaseRef {
            name: "rl-producer".into(),
            namespace: "ml".into(),
        });
        assert!(command
            .args()
            .join(" ")
            .ends_with("--leader-elect --lease-name rl-producer --lease-namespace ml"));
    }

    #[test]
    fn drain_and_tls_flags_are_rendered_only_when_they_differ_from_the_producer_defaults() {
        let files = |dir: &str| TlsFiles {
            cert: format!("{dir}/tls.crt"),
            key: format!("{dir}/tls.key"),
        };
        let tail = |command: &ProducerCommand| {
            command
                .args()
                .join(" ")
                .split_once("--log-level info")
                .map(|(_, tail)| tail.trim().to_string())
                .unwrap()
        };
        // The defaults: no drain flag, a self-signed TLS endpoint picker, a plain HTTP API.
        assert_eq!(tail(&command()), "");
        let with_files = ProducerCommand {
            drain_timeout_ms: Some(30_000),
            epp_transport: EppTransport::Tls(files("/epp")),
            api_tls: Some(files("/api")),
            ..command()
        };
        assert_eq!(
            tail(&with_files),
            "--drain-timeout-ms 30000 --epp-tls-cert /epp/tls.crt --epp-tls-key /epp/tls.key \
             --tls-cert /api/tls.crt --tls-key /api/tls.key"
        );
        let plaintext = ProducerCommand {
            drain_timeout_ms: Some(0),
            epp_transport: EppTransport::Plaintext,
            ..command()
        };
        assert_eq!(tail(&plaintext), "--drain-timeout-ms 0 --epp-plaintext");
    }
}
