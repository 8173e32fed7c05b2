//! Pure builders: (policy, endpoints, the operator's producer defaults) → the objects the
//! operator owns for that policy, each a typed k8s-openapi struct from its own small builder.
//! Every child is named `<policy>-producer`, labelled with [`MANAGED_BY`] (the operator's child
//! watches select on it) and owned by the policy (the garbage collector removes it with it).

mod config_map;
mod deployment;
mod lease;
mod network_policy;
mod pod_disruption_budget;
mod role;
mod role_binding;
mod service;
mod service_account;
mod tls;
mod tokenizer;

use std::collections::BTreeMap;

use burst_prefix_api::policy::{BurstPrefixPolicy, HaMode};
use burst_prefix_api::Endpoint;
use burst_prefix_runtime::logging::LogFormat;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, ResourceRequirements, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::{Resource, ResourceExt};

pub use burst_prefix_runtime::producer::CONFIG_KEY;
pub use network_policy::NetworkPolicyPeers;
pub use tokenizer::TOKENIZER_DIR;

/// `app.kubernetes.io/managed-by` of every child: what the child watches select.
pub const MANAGED_BY: &str = "burst-prefix-operator";
/// The label selector of the child watches.
pub const CHILD_SELECTOR: &str = "app.kubernetes.io/managed-by=burst-prefix-operator";

/// What the operator's flags say about producers a policy does not say itself.
#[derive(Clone, Debug, PartialEq)]
pub struct ProducerDefaults {
    /// `--producer-image`.
    pub image: String,
    /// `--producer-image-pull-policy` (`None`: Kubernetes' default for the tag).
    pub image_pull_policy: Option<String>,
    /// `--producer-image-pull-secret`, repeated.
    pub image_pull_secrets: Vec<String>,
    /// `--producer-resources`, when the policy has none.
    pub resources: ResourceRequirements,
    /// The producers' log format.
    pub log_format: LogFormat,
    /// `--producer-network-policy`: who may reach each producer port (`None`: no
    /// NetworkPolicy).
    pub network_policy: Option<NetworkPolicyPeers>,
}

impl Default for ProducerDefaults {
    fn default() -> Self {
        ProducerDefaults {
            image: burst_prefix_api::policy::DEFAULT_PRODUCER_IMAGE.to_string(),
            image_pull_policy: None,
            image_pull_secrets: Vec::new(),
            resources: default_resources(),
            log_format: LogFormat::Json,
            network_policy: None,
        }
    }
}

/// 100m CPU and 64Mi requested, 512Mi memory limit: a window of 1,000 requests with their
/// block hashes fits many times over.
pub fn default_resources() -> ResourceRequirements {
    let quantities = |pairs: &[(&str, &str)]| {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect(),
        )
    };
    ResourceRequirements {
        requests: quantities(&[("cpu", "100m"), ("memory", "64Mi")]),
        limits: quantities(&[("memory", "512Mi")]),
        ..ResourceRequirements::default()
    }
}

/// Everything one policy owns, named `<policy>-producer`. The PodDisruptionBudget exists only
/// with more than one producer replica, the Lease only when they elect a leader, the
/// NetworkPolicy only when the operator is given one.
#[derive(Clone, Debug, PartialEq)]
pub struct Desired {
    pub config_map: ConfigMap,
    pub service_account: ServiceAccount,
    pub role: Role,
    pub role_binding: RoleBinding,
    pub lease: Option<Lease>,
    pub service: Service,
    pub pod_disruption_budget: Option<PodDisruptionBudget>,
    pub network_policy: Option<NetworkPolicy>,
    pub deployment: Deployment,
}

/// The name of every child of `policy`, and of the producers' Lease.
pub fn child_name(policy: &BurstPrefixPolicy) -> String {
    format!("{}-producer", policy.name_any())
}

/// The producer's in-cluster API URL (`https` when its API port serves TLS).
pub fn producer_url(policy: &BurstPrefixPolicy) -> String {
    format!(
        "{}://{}.{}.svc:{}",
        service::api_scheme(policy),
        child_name(policy),
        policy.namespace().unwrap_or_default(),
        policy.spec.producer.port
    )
}

/// Whether more than one producer replica runs: they spread across nodes and get a
/// PodDisruptionBudget, in either `ha` mode.
pub fn several_replicas(policy: &BurstPrefixPolicy) -> bool {
    policy.spec.producer.replicas > 1
}

/// Whether the producers elect a leader with their Lease: several replicas in `ha:
/// leaderElection`. With `activeActive` every replica serves, and no Lease is rendered (one
/// left from a former leaderElection policy is pruned like any child no longer desired).
pub fn elects_leader(policy: &BurstPrefixPolicy) -> bool {
    several_replicas(policy) && policy.spec.producer.ha == HaMode::LeaderElection
}

/// Whether several producers serve side by side (`ha: activeActive` with more than one
/// replica): each then plans to agree with the others (`serve --active-active`).
pub fn serves_beside_peers(policy: &BurstPrefixPolicy) -> bool {
    several_replicas(policy) && policy.spec.producer.ha == HaMode::ActiveActive
}

/// The port the producer binds for the engines' KV events (`engines.kvEvents.bind`), which its
/// container, Service and NetworkPolicy open; `None` without a bind (or with one the
/// validation refuses).
pub fn kv_events_port(policy: &BurstPrefixPolicy) -> Option<i32> {
    let bind = policy
        .spec
        .planner
        .engines
        .kv_events
        .as_ref()?
        .bind
        .as_deref()?;
    burst_prefix_api::kv_events::bind_port(bind)
        .ok()
        .map(i32::from)
}

/// Builds the children of a policy whose config is valid, for the given endpoints, whose pods
/// `engines` selects (the policy's or its InferencePool's selector).
pub fn desired(
    policy: &BurstPrefixPolicy,
    endpoints: Vec<Endpoint>,
    engines: &LabelSelector,
    defaults: &ProducerDefaults,
) -> Desired {
    Desired {
        config_map: config_map::build(policy, endpoints),
        service_account: service_account::build(policy),
        role: role::build(policy),
        role_binding: role_binding::build(policy),
        lease: elects_leader(policy).then(|| lease::build(policy)),
        service: service::build(policy),
        pod_disruption_budget: several_replicas(policy)
            .then(|| pod_disruption_budget::build(policy)),
        network_policy: defaults
            .network_policy
            .as_ref()
            .map(|peers| network_policy::build(policy, peers, engines)),
        deployment: deployment::build(policy, defaults),
    }
}

/// The labels that select a policy's producer pods (the Deployment's immutable selector).
pub fn selector_labels(policy: &BurstPrefixPolicy) -> BTreeMap<String, String> {
    [
        (
            "app.kubernetes.io/name",
            "burst-prefix-producer".to_string(),
        ),
        ("app.kubernetes.io/instance", policy.name_any()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// The labels of every child and of the producer pods.
pub fn labels(policy: &BurstPrefixPolicy) -> BTreeMap<String, String> {
    let mut labels = selector_labels(policy);
    for (key, value) in [
        ("app.kubernetes.io/managed-by", MANAGED_BY),
        ("app.kubernetes.io/component", "producer"),
        ("app.kubernetes.io/part-of", "burst-prefix"),
    ] {
        labels.insert(key.to_string(), value.to_string());
    }
    labels
}

/// Name, namespace, labels and the controller owner reference of a child.
fn metadata(policy: &BurstPrefixPolicy) -> ObjectMeta {
    ObjectMeta {
        name: Some(child_name(policy)),
        namespace: policy.namespace(),
        labels: Some(labels(policy)),
        owner_references: Some(vec![policy
            .controller_owner_ref(&())
            .expect("a policy read from the API server has a name and uid")]),
        ..ObjectMeta::default()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use burst_prefix_api::policy::BurstPrefixPolicySpec;
    use serde_json::json;

    pub fn policy_with(producer: serde_json::Value) -> BurstPrefixPolicy {
        policy_from(json!({"producer": producer}))
    }

    /// The test policy with `extra` spec fields (e.g. `engines`) over its own.
    pub fn policy_from(extra: serde_json::Value) -> BurstPrefixPolicy {
        let mut spec = json!({
            "selector": {"matchLabels": {"app": "vllm"}},
            "targetPorts": [{"number": 8000}],
            "maxPerReplica": 4,
        });
        spec.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let spec: BurstPrefixPolicySpec = serde_json::from_value(spec).unwrap();
        let mut policy = BurstPrefixPolicy::new("rl", spec);
        policy.metadata.namespace = Some("ml".into());
        policy.metadata.uid = Some("uid-1".into());
        policy
    }

    pub fn policy() -> BurstPrefixPolicy {
        policy_with(json!({"port": 8081}))
    }

    #[test]
    fn every_child_is_named_labelled_and_owned_by_the_policy() {
        let with_network_policy = ProducerDefaults {
            network_policy: Some(NetworkPolicyPeers::default()),
            ..ProducerDefaults::default()
        };
        let desired = desired(
            &policy_with(json!({"replicas": 3})),
            vec![],
            &LabelSelector::default(),
            &with_network_policy,
        );
        let metas = [
            &desired.config_map.metadata,
            &desired.service_account.metadata,
            &desired.role.metadata,
            &desired.role_binding.metadata,
            &desired.lease.as_ref().unwrap().metadata,
            &desired.service.metadata,
            &desired.pod_disruption_budget.as_ref().unwrap().metadata,
            &desired.network_policy.as_ref().unwrap().metadata,
            &desired.deployment.metadata,
        ];
        for meta in metas {
            assert_eq!(meta.name.as_deref(), Some("rl-producer"));
            assert_eq!(meta.namespace.as_deref(), Some("ml"));
            let owner = &meta.owner_references.as_ref().unwrap()[0];
            assert_eq!(
                (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
                ("BurstPrefixPolicy", "rl", "uid-1")
            );
            assert_eq!(owner.controller, Some(true));
            let labels = meta.labels.as_ref().unwrap();
            assert_eq!(labels["app.kubernetes.io/managed-by"], MANAGED_BY);
            assert_eq!(
                CHILD_SELECTOR,
                format!("app.kubernetes.io/managed-by={MANAGED_BY}")
            );
        }
    }

    #[test]
    fn one_replica_has_no_lease_and_no_disruption_budget() {
        let desired = desired(
            &policy(),
            vec![],
            &LabelSelector::default(),
            &ProducerDefaults::default(),
        );
        assert!(desired.lease.is_none());
        assert!(desired.pod_disruption_budget.is_none());
        assert!(desired.network_policy.is_none(), "not asked for");
        assert_eq!(producer_url(&policy()), "http://rl-producer.ml.svc:8081");
    }

    #[test]
    fn active_active_replicas_have_a_disruption_budget_and_no_lease() {
        let desired = desired(
            &policy_with(json!({"replicas": 3, "ha": "activeActive"})),
            vec![],
            &LabelSelector::default(),
            &ProducerDefaults::default(),
        );
        assert!(desired.lease.is_none());
        assert!(desired.pod_disruption_budget.is_some());
        // A single replica elects nobody, whatever the mode says.
        let single = policy_with(json!({"replicas": 1, "ha": "leaderElection"}));
        assert!(!elects_leader(&single) && !several_replicas(&single));
    }

    #[test]
    fn the_url_is_https_when_the_api_port_serves_tls() {
        let policy = policy_with(json!({"port": 8443, "apiTls": {"secretName": "api-cert"}}));
        assert_eq!(producer_url(&policy), "https://rl-producer.ml.svc:8443");
    }
}
