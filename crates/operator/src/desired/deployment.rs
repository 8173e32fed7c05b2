//! The producer Deployment: the producer serving the policy's ConfigMap, hardened (non-root,
//! read-only root filesystem, no capabilities, seccomp RuntimeDefault), with probes on its admin
//! port. More than one replica spread across nodes. When they elect a leader (`ha:
//! leaderElection`, only the leader is Ready), a rolling update would wait forever for a new pod
//! to become Ready while the old leader holds the Lease (gateway-api-inference-extension#1619):
//! the strategy is then `Recreate`. Otherwise (one replica, or `ha: activeActive`, where every
//! replica is Ready) it is a rolling update that starts one new pod at a time and stops an old
//! one only once the new one is Ready. The pods mount the TLS Secrets the policy names ([`super::tls`])
//! and the model's tokenizer ([`super::tokenizer`]), open the port the producer binds for the
//! engines' KV events, and get the time to drain their requests on SIGTERM
//! (docs/behaviour.md §11).

use burst_prefix_api::policy::BurstPrefixPolicy;
use burst_prefix_runtime::flags::{POD_NAMESPACE_ENV, POD_NAME_ENV};
use burst_prefix_runtime::producer::{
    termination_grace_period_seconds, LeaseRef, ProducerCommand, DEFAULT_DRAIN_TIMEOUT_MS,
};
use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction,
    LocalObjectReference, ObjectFieldSelector, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    SeccompProfile, SecurityContext, TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use super::service::{EPP, HTTP, KV_EVENTS, METRICS};
use super::{
    child_name, elects_leader, kv_events_port, labels, metadata, selector_labels,
    serves_beside_peers, several_replicas, tls, tokenizer, ProducerDefaults,
};

/// The distroless nonroot user of the producer image.
const NONROOT_UID: i64 = 65532;
/// Its group: the pod's `fsGroup`, so that it may read the mounted Secrets (mode 0440).
const NONROOT_GID: i64 = 65532;

/// The drain the producer does on SIGTERM: the policy's `drainTimeoutMs`, else the producer's
/// default. The CRD bounds it to 0..3600000.
fn drain_timeout_ms(policy: &BurstPrefixPolicy) -> u64 {
    policy
        .spec
        .producer
        .drain_timeout_ms
        .and_then(|ms| u64::try_from(ms).ok())
        .unwrap_or(DEFAULT_DRAIN_TIMEOUT_MS)
}

pub fn build(policy: &BurstPrefixPolicy, defaults: &ProducerDefaults) -> Deployment {
    let selector = LabelSelector {
        match_labels: Some(selector_labels(policy)),
        ..LabelSelector::default()
    };
    let strategy = if elects_leader(policy) {
        DeploymentStrategy {
            type_: Some("Recreate".into()),
            rolling_update: None,
        }
    } else {
        // Spelled out, so that a later switch to Recreate drops these fields (server-side apply
        // removes what this manager stops setting; defaulted fields nobody owns would stay and
        // make the API server refuse Recreate).
        DeploymentStrategy {
            type_: Some("RollingUpdate".into()),
            rolling_update: Some(RollingUpdateDeployment {
                max_surge: Some(IntOrString::Int(1)),
                max_unavailable: Some(IntOrString::Int(0)),
            }),
        }
    };
    let producer = &policy.spec.producer;
    let pod = PodSpec {
        service_account_name: Some(child_name(policy)),
        automount_service_account_token: Some(true),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            fs_group: Some(NONROOT_GID),
            fs_group_change_policy: tokenizer::fs_group_change_policy(policy),
            seccomp_profile: Some(runtime_default()),
            ..PodSecurityContext::default()
        }),
        containers: vec![container(policy, defaults)],
        volumes: Some(
            tls::mounts(policy)
                .iter()
                .map(|m| m.volume())
                .chain(tokenizer::volume(policy))
                .collect(),
        )
        .filter(|volumes: &Vec<_>| !volumes.is_empty()),
        termination_grace_period_seconds: Some(termination_grace_period_seconds(
            u64::try_from(policy.spec.planner.window_ms()).unwrap_or_default(),
            drain_timeout_ms(policy),
        )),
        image_pull_secrets: (!defaults.image_pull_secrets.is_empty()).then(|| {
            defaults
                .image_pull_secrets
                .iter()
                .map(|name| LocalObjectReference { name: name.clone() })
                .collect()
        }),
        node_selector: (!producer.node_selector.is_empty()).then(|| producer.node_selector.clone()),
        tolerations: (!producer.tolerations.is_empty()).then(|| producer.tolerations.clone()),
        topology_spread_constraints: several_replicas(policy).then(|| {
            vec![TopologySpreadConstraint {
                max_skew: 1,
                topology_key: "kubernetes.io/hostname".into(),
                // A single-node cluster still runs every replica.
                when_unsatisfiable: "ScheduleAnyway".into(),
                label_selector: Some(selector.clone()),
                ..TopologySpreadConstraint::default()
            }]
        }),
        ..PodSpec::default()
    };
    Deployment {
        metadata: metadata(policy),
        spec: DeploymentSpec {
            replicas: Some(producer.replicas),
            selector,
            strategy: Some(strategy),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(policy)),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod),
            },
            ..DeploymentSpec::default()
        },
        status: None,
    }
}

/// The producer's command line: its ConfigMap, its three listeners, their TLS, its drain and,
/// when the replicas elect a leader, its Lease (identity: the pod name, from the downward API).
pub fn command(policy: &BurstPrefixPolicy, defaults: &ProducerDefaults) -> ProducerCommand {
    let producer = &policy.spec.producer;
    let name = child_name(policy);
    let namespace = policy.namespace().unwrap_or_default();
    // The CRD schema bounds every port to 1..65535 (and the operator checks it again).
    let port = |number: i32| u16::try_from(number).unwrap_or_default();
    ProducerCommand {
        configmap: format!("{namespace}/{name}"),
        port: port(producer.port),
        admin_port: port(producer.metrics_port),
        epp_port: port(producer.epp_port),
        log_format: defaults.log_format,
        log_level: producer.log_level.as_str().to_string(),
        drain_timeout_ms: producer.drain_timeout_ms.map(|_| drain_timeout_ms(policy)),
        epp_transport: tls::epp_transport(policy),
        api_tls: tls::api_tls(policy),
        lease: elects_leader(policy).then(|| LeaseRef {
            name: name.clone(),
            namespace: namespace.clone(),
        }),
        active_active: serves_beside_peers(policy),
    }
}

fn container(policy: &BurstPrefixPolicy, defaults: &ProducerDefaults) -> Container {
    let producer = &policy.spec.producer;
    let port = |name: &str, number: i32| ContainerPort {
        name: Some(name.into()),
        container_port: number,
        protocol: Some("TCP".into()),
        ..ContainerPort::default()
    };
    let probe = |path: &str, period: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String(METRICS.into()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        ..Probe::default()
    };
    let downward = |name: &str, field: &str| EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: field.into(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    };
    Container {
        name: "producer".into(),
        image: Some(
            producer
                .image
                .clone()
                .unwrap_or_else(|| defaults.image.clone()),
        ),
        image_pull_policy: defaults.image_pull_policy.clone(),
        args: Some(command(policy, defaults).args()),
        env: Some(vec![
            downward(POD_NAME_ENV, "metadata.name"),
            downward(POD_NAMESPACE_ENV, "metadata.namespace"),
        ]),
        ports: Some(
            [
                Some(port(HTTP, producer.port)),
                Some(port(EPP, producer.epp_port)),
                Some(port(METRICS, producer.metrics_port)),
                kv_events_port(policy).map(|number| port(KV_EVENTS, number)),
            ]
            .into_iter()
            .flatten()
            .collect(),
        ),
        volume_mounts: Some(
            tls::mounts(policy)
                .iter()
                .map(|m| m.volume_mount())
                .chain(tokenizer::volume_mount(policy))
                .collect(),
        )
        .filter(|mounts: &Vec<_>| !mounts.is_empty()),
        liveness_probe: Some(probe("/healthz", 10)),
        readiness_probe: Some(probe("/readyz", 5)),
        resources: Some(
            producer
                .resources
                .clone()
                .unwrap_or_else(|| defaults.resources.clone()),
        ),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(NONROOT_UID),
            read_only_root_filesystem: Some(true),
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Capabilities::default()
            }),
            seccomp_profile: Some(runtime_default()),
            ..SecurityContext::default()
        }),
        ..Container::default()
    }
}

fn runtime_default() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".into(),
        ..SeccompProfile::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::tests::{policy, policy_from, policy_with};
    use serde_json::json;

    #[test]
    fn runs_the_producer_hardened_on_its_configmap() {
        let deployment = build(&policy(), &ProducerDefaults::default());
        let spec = deployment.spec;
        let strategy = spec.strategy.unwrap();
        assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
        // The new pod is Ready before the old one stops.
        let rolling = strategy.rolling_update.unwrap();
        assert_eq!(rolling.max_unavailable, Some(IntOrString::Int(0)));
        let pod = spec.template.spec.unwrap();
        assert_eq!(pod.service_account_name.as_deref(), Some("rl-producer"));
        assert!(pod.topology_spread_constraints.is_none());
        // The policy's window (100 ms), the default drain (120 s), the producer's shutdown
        // timeout (10 s) and the kubelet's margin (5 s).
        assert_eq!(pod.termination_grace_period_seconds, Some(136));
        assert_eq!(pod.security_context.as_ref().unwrap().fs_group, Some(65532));
        // No TLS Secret named: nothing mounted, no TLS or drain flag (the producer's defaults).
        assert!(pod.volumes.is_none());
        assert!(pod.containers[0].volume_mounts.is_none());
        let container = &pod.containers[0];
        let args = container.args.clone().unwrap().join(" ");
        assert!(
            args.starts_with("serve --configmap ml/rl-producer --listen 0.0.0.0:8081"),
            "{args}"
        );
        assert!(args.contains("--epp-listen 0.0.0.0:9002"), "{args}");
        assert!(!args.contains("--leader-elect"), "{args}");
        assert!(!args.contains("tls") && !args.contains("--drain"), "{args}");
        let security = container.security_context.as_ref().unwrap();
        assert_eq!(security.run_as_non_root, Some(true));
        assert_eq!(security.read_only_root_filesystem, Some(true));
        assert_eq!(
            security.capabilities.as_ref().unwrap().drop,
            Some(vec!["ALL".to_string()])
        );
        assert_eq!(
            security.seccomp_profile.as_ref().unwrap().type_,
            "RuntimeDefault"
        );
        let path = |probe: &Option<Probe>| {
            probe
                .as_ref()
                .unwrap()
                .http_get
                .as_ref()
                .unwrap()
                .path
                .clone()
        };
        assert_eq!(path(&container.readiness_probe).as_deref(), Some("/readyz"));
        assert_eq!(path(&container.liveness_probe).as_deref(), Some("/healthz"));
        let ports: Vec<_> = container
            .ports
            .as_ref()
            .unwrap()
            .iter()
            .map(|p| (p.name.clone().unwrap(), p.container_port))
            .collect();
        assert_eq!(
            ports,
            [
                ("http".into(), 8081),
                ("epp".into(), 9002),
                ("metrics".into(), 9090)
            ]
        );
    }

    #[test]
    fn the_image_and_resources_come_from_the_operator_unless_the_policy_sets_them() {
        let defaults = ProducerDefaults {
            image: "mirror.local/burst-prefix-producer:1.2".into(),
            image_pull_policy: Some("Always".into()),
            image_pull_secrets: vec!["regcred".into()],
            ..ProducerDefaults::default()
        };
        let pod = build(&policy(), &defaults).spec.template.spec.unwrap();
        let container = &pod.containers[0];
        assert_eq!(
            container.image.as_deref(),
            Some("mirror.local/burst-prefix-producer:1.2")
        );
        assert_eq!(container.image_pull_policy.as_deref(), Some("Always"));
        assert_eq!(container.resources, Some(defaults.resources.clone()));
        assert_eq!(pod.image_pull_secrets.unwrap()[0].name, "regcred");

        let own = policy_with(json!({
            "image": "example.com/producer:pinned",
            "resources": {"limits": {"memory": "1Gi"}},
        }));
        let container = build(&own, &defaults)
            .spec
            .template
            .spec
            .unwrap()
            .containers[0]
            .clone();
        assert_eq!(
            container.image.as_deref(),
            Some("example.com/producer:pinned")
        );
        assert_eq!(
            container.resources.unwrap().limits.unwrap()["memory"].0,
            "1Gi"
        );
    }

    #[test]
    fn several_replicas_elect_a_leader_recreate_and_spread() {
        let deployment = build(
            &policy_with(json!({"replicas": 3})),
            &ProducerDefaults::default(),
        );
        let spec = deployment.spec;
        assert_eq!(spec.replicas, Some(3));
        let strategy = spec.strategy.unwrap();
        assert_eq!(strategy.type_.as_deref(), Some("Recreate"));
        assert!(strategy.rolling_update.is_none());
        let pod = spec.template.spec.unwrap();
        let spread = &pod.topology_spread_constraints.unwrap()[0];
        assert_eq!(spread.topology_key, "kubernetes.io/hostname");
        let container = &pod.containers[0];
        let args = container.args.clone().unwrap().join(" ");
        assert!(
            args.ends_with("--leader-elect --lease-name rl-producer --lease-namespace ml"),
            "{args}"
        );
        let env = container.env.clone().unwrap();
        let identity = env.iter().find(|e| e.name == "POD_NAME").unwrap();
        assert_eq!(
            identity
                .value_from
                .as_ref()
                .unwrap()
                .field_ref
                .as_ref()
                .unwrap()
                .field_path,
            "metadata.name"
        );
    }

    #[test]
    fn active_active_replicas_all_serve_roll_one_at_a_time_and_spread() {
        let deployment = build(
            &policy_with(json!({"replicas": 3, "ha": "activeActive"})),
            &ProducerDefaults::default(),
        );
        let spec = deployment.spec;
        assert_eq!(spec.replicas, Some(3));
        let strategy = spec.strategy.unwrap();
        assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
        let rolling = strategy.rolling_update.unwrap();
        assert_eq!(
            (rolling.max_surge, rolling.max_unavailable),
            (Some(IntOrString::Int(1)), Some(IntOrString::Int(0)))
        );
        let pod = spec.template.spec.unwrap();
        let spread = &pod.topology_spread_constraints.unwrap()[0];
        assert_eq!(spread.topology_key, "kubernetes.io/hostname");
        let args = pod.containers[0].args.clone().unwrap().join(" ");
        assert!(
            !args.contains("--leader-elect") && !args.contains("--lease"),
            "{args}"
        );
        // Each plans to agree with the others.
        assert!(args.ends_with("--active-active"), "{args}");
        // One replica has no peers, whatever the mode.
        let alone = build(
            &policy_with(json!({"replicas": 1, "ha": "activeActive"})),
            &ProducerDefaults::default(),
        );
        let alone = alone.spec.template.spec.unwrap().containers[0]
            .args
            .clone()
            .unwrap();
        assert!(!alone.contains(&"--active-active".to_string()), "{alone:?}");
        // The same drain as any producer: a rolled pod lets what it carries finish.
        assert_eq!(pod.termination_grace_period_seconds, Some(136));
    }

    #[test]
    fn the_grace_period_follows_the_policy_drain_and_the_flag_says_the_same() {
        let pod = |producer| {
            build(&policy_with(producer), &ProducerDefaults::default())
                .spec
                .template
                .spec
                .unwrap()
        };
        let short = pod(json!({"drainTimeoutMs": 30_000}));
        // 100 ms window + 30 s drain + 10 s shutdown, rounded up, + 5 s.
        assert_eq!(short.termination_grace_period_seconds, Some(46));
        let args = short.containers[0].args.clone().unwrap().join(" ");
        assert!(args.contains("--drain-timeout-ms 30000"), "{args}");
        let none = pod(json!({"drainTimeoutMs": 0}));
        assert_eq!(none.termination_grace_period_seconds, Some(16));
        let args = none.containers[0].args.clone().unwrap().join(" ");
        assert!(args.contains("--drain-timeout-ms 0"), "{args}");
    }

    #[test]
    fn named_tls_secrets_are_mounted_and_passed_to_the_producer() {
        let policy = policy_with(json!({
            "eppTls": {"secretName": "picker-cert"},
            "apiTls": {"secretName": "api-cert"},
        }));
        let pod = build(&policy, &ProducerDefaults::default())
            .spec
            .template
            .spec
            .unwrap();
        let volumes: Vec<_> = pod
            .volumes
            .unwrap()
            .into_iter()
            .map(|v| (v.name, v.secret.unwrap().secret_name.unwrap()))
            .collect();
        assert_eq!(
            volumes,
            [
                ("epp-tls".to_string(), "picker-cert".to_string()),
                ("api-tls".to_string(), "api-cert".to_string())
            ]
        );
        let container = &pod.containers[0];
        let mounts: Vec<_> = container
            .volume_mounts
            .clone()
            .unwrap()
            .into_iter()
            .map(|m| (m.name, m.mount_path, m.read_only))
            .collect();
        assert_eq!(
            mounts,
            [
                (
                    "epp-tls".to_string(),
                    "/etc/burst-prefix/epp-tls".to_string(),
                    Some(true)
                ),
                (
                    "api-tls".to_string(),
                    "/etc/burst-prefix/api-tls".to_string(),
                    Some(true)
                )
            ]
        );
        let args = container.args.clone().unwrap().join(" ");
        for expected in [
            "--epp-tls-cert /etc/burst-prefix/epp-tls/tls.crt",
            "--epp-tls-key /etc/burst-prefix/epp-tls/tls.key",
            "--tls-cert /etc/burst-prefix/api-tls/tls.crt",
            "--tls-key /etc/burst-prefix/api-tls/tls.key",
        ] {
            assert!(args.contains(expected), "{expected} in {args}");
        }
        assert!(!args.contains("--epp-plaintext"), "{args}");

        let plaintext = build(
            &policy_with(json!({"eppTls": {"plaintext": true}})),
            &ProducerDefaults::default(),
        );
        let pod = plaintext.spec.template.spec.unwrap();
        assert!(pod.volumes.is_none());
        let args = pod.containers[0].args.clone().unwrap().join(" ");
        assert!(
            args.contains("--epp-plaintext") && !args.contains("tls"),
            "{args}"
        );
    }

    #[test]
    fn a_bound_event_endpoint_is_a_container_port_and_a_tokenizer_a_read_only_mount() {
        let policy = policy_from(json!({
            "engines": {"kvEvents": {"bind": "tcp://0.0.0.0:5557", "replayPort": 5558}},
            "producer": {
                "apiTls": {"secretName": "api-cert"},
                "tokenizer": {"persistentVolumeClaim": "models", "subPath": "Qwen3-8B"},
            },
        }));
        let pod = build(&policy, &ProducerDefaults::default())
            .spec
            .template
            .spec
            .unwrap();
        let container = &pod.containers[0];
        let ports: Vec<_> = container
            .ports
            .as_ref()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p.name.clone().unwrap(),
                    p.container_port,
                    p.protocol.clone(),
                )
            })
            .collect();
        assert_eq!(
            ports[3..],
            [("kv-events".to_string(), 5557, Some("TCP".to_string()))]
        );
        let volumes: Vec<_> = pod.volumes.unwrap().into_iter().map(|v| v.name).collect();
        assert_eq!(volumes, ["api-tls", "tokenizer"]);
        let mounts: Vec<_> = container
            .volume_mounts
            .clone()
            .unwrap()
            .into_iter()
            .map(|m| (m.name, m.mount_path, m.read_only))
            .collect();
        assert_eq!(
            mounts[1],
            (
                "tokenizer".to_string(),
                "/etc/burst-prefix/tokenizer".to_string(),
                Some(true)
            )
        );
        let security = pod.security_context.unwrap();
        assert_eq!(security.fs_group, Some(65532));
        assert_eq!(
            security.fs_group_change_policy.as_deref(),
            Some("OnRootMismatch")
        );
        // The path is the producer's business (its ConfigMap), not its command line.
        let args = container.args.clone().unwrap().join(" ");
        assert!(
            !args.contains("tokenizer") && !args.contains("5557"),
            "{args}"
        );

        // Without them: the three ports, no volume, Kubernetes' fsGroup policy.
        let plain = build(&policy_with(json!({})), &ProducerDefaults::default())
            .spec
            .template
            .spec
            .unwrap();
        assert_eq!(plain.containers[0].ports.as_ref().unwrap().len(), 3);
        assert!(plain.volumes.is_none());
        assert_eq!(plain.security_context.unwrap().fs_group_change_policy, None);
    }
}
