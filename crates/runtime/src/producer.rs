//! The producer's side of the contract with the operator: the ConfigMap key it reads and its
//! command line as the operator renders it (its default ports are `burst_prefix_api::ports`).

use crate::flags;
use crate::logging::LogFormat;

/// The key of the producer config (YAML) in the ConfigMap the operator writes.
pub const CONFIG_KEY: &str = "config.yaml";

/// How long the producer takes at most to exit after SIGTERM (`--shutdown-timeout-ms`).
pub const DEFAULT_SHUTDOWN_TIMEOUT_MS: u64 = 10_000;

/// The pod's `terminationGracePeriodSeconds` for a producer whose windows last
/// `window_duration_ms`: the shutdown timeout, plus one window (the open one is answered
/// first), plus 5 s for the kubelet's own steps, so the producer is never killed mid-answer.
pub fn termination_grace_period_seconds(window_duration_ms: u64) -> i64 {
    let millis = DEFAULT_SHUTDOWN_TIMEOUT_MS + window_duration_ms;
    (millis.div_ceil(1000) + 5) as i64
}

/// A Lease the producer replicas elect their leader with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRef {
    pub name: String,
    pub namespace: String,
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
    /// With more than one replica: the Lease; the identity comes from `$POD_NAME`.
    pub lease: Option<LeaseRef>,
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
    fn grace_period_covers_the_shutdown_timeout_and_one_window() {
        assert_eq!(termination_grace_period_seconds(100), 16);
        assert_eq!(termination_grace_period_seconds(10_000), 25);
        assert!(termination_grace_period_seconds(0) as u64 * 1000 > DEFAULT_SHUTDOWN_TIMEOUT_MS);
    }

    #[test]
    fn args_name_every_listener_and_the_lease_only_when_given() {
        let mut command = ProducerCommand {
            configmap: "ml/rl-producer".into(),
            port: 8080,
            admin_port: 9090,
            epp_port: 9002,
            log_format: LogFormat::Json,
            log_level: "info".into(),
            lease: None,
        };
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
}
