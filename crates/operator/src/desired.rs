//! Pure builders: (policy, endpoints) → the objects the operator owns for that policy.

use burst_prefix_api::policy::BurstPrefixPolicy;
use burst_prefix_api::{Endpoint, ProducerConfig};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

/// The key of the producer config in its ConfigMap (the producer's `--configmap` format).
pub const CONFIG_KEY: &str = "config.yaml";

/// Everything one policy owns, named `<policy>-producer`.
#[derive(Clone, Debug, PartialEq)]
pub struct Desired {
    pub config_map: ConfigMap,
    pub service_account: ServiceAccount,
    pub role: Role,
    pub role_binding: RoleBinding,
    pub deployment: Deployment,
    pub service: Service,
}

/// The name of every child of `policy`.
pub fn child_name(policy: &BurstPrefixPolicy) -> String {
    format!("{}-producer", policy.name_any())
}

/// The producer's in-cluster API URL.
pub fn producer_url(policy: &BurstPrefixPolicy) -> String {
    format!(
        "http://{}.{}.svc:{}",
        child_name(policy),
        policy.namespace().unwrap_or_default(),
        policy.spec.producer.port
    )
}

/// Builds the children of a policy whose config is valid, for the given endpoints.
pub fn desired(policy: &BurstPrefixPolicy, endpoints: Vec<Endpoint>) -> Desired {
    let name = child_name(policy);
    let namespace = policy.namespace().unwrap_or_default();
    let producer = &policy.spec.producer;
    let labels = json!({
        "app.kubernetes.io/name": "burst-prefix-producer",
        "app.kubernetes.io/instance": policy.name_any(),
        "app.kubernetes.io/managed-by": "burst-prefix-operator",
    });
    let selector = json!({
        "app.kubernetes.io/name": "burst-prefix-producer",
        "app.kubernetes.io/instance": policy.name_any(),
    });
    let metadata = json!({
        "name": name,
        "namespace": namespace,
        "labels": labels,
        "ownerReferences": [owner_reference(policy)],
    });
    let config = ProducerConfig {
        planner: policy.spec.planner.clone(),
        endpoints,
    };
    let object = |kind_fields: Value| -> Value {
        let mut object = json!({"metadata": metadata});
        object
            .as_object_mut()
            .unwrap()
            .extend(kind_fields.as_object().unwrap().clone());
        object
    };
    let container = json!({
        "name": "producer",
        "image": producer.image,
        "args": [
            "serve",
            "--configmap", format!("{namespace}/{name}"),
            "--listen", format!("0.0.0.0:{}", producer.port),
            "--admin-listen", format!("0.0.0.0:{}", producer.metrics_port),
            "--log-format", "json",
            "--log-level", producer.log_level.as_str(),
        ],
        "ports": [
            {"name": "http", "containerPort": producer.port},
            {"name": "metrics", "containerPort": producer.metrics_port},
        ],
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "metrics"}, "periodSeconds": 10},
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics"}, "periodSeconds": 5},
        "resources": producer.resources.clone().map(|r| serde_json::to_value(r).unwrap())
            .unwrap_or_else(|| json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}})),
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": 65532,
            "readOnlyRootFilesystem": true,
            "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    });
    Desired {
        config_map: typed(object(json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "data": {CONFIG_KEY: config.to_yaml()},
        }))),
        service_account: typed(object(
            json!({"apiVersion": "v1", "kind": "ServiceAccount"}),
        )),
        // The producer may read its own ConfigMap and nothing else.
        role: typed(object(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "rules": [{
                "apiGroups": [""],
                "resources": ["configmaps"],
                "resourceNames": [name],
                "verbs": ["get", "list", "watch"],
            }],
        }))),
        role_binding: typed(object(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        }))),
        deployment: typed(object(json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "spec": {
                "replicas": producer.replicas,
                "selector": {"matchLabels": selector},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": name,
                        "automountServiceAccountToken": true,
                        "securityContext": {
                            "runAsNonRoot": true,
                            "seccompProfile": {"type": "RuntimeDefault"},
                        },
                        "containers": [container],
                        "nodeSelector": producer.node_selector,
                        "tolerations": producer.tolerations,
                    },
                },
            },
        }))),
        service: typed(object(json!({
            "apiVersion": "v1",
            "kind": "Service",
            "spec": {
                "selector": selector,
                "ports": [
                    {"name": "http", "port": producer.port, "targetPort": "http"},
                    {"name": "metrics", "port": producer.metrics_port, "targetPort": "metrics"},
                ],
            },
        }))),
    }
}

fn owner_reference(policy: &BurstPrefixPolicy) -> OwnerReference {
    policy
        .controller_owner_ref(&())
        .expect("a policy read from the API server has a name and uid")
}

/// The builders above are literal JSON; this turns one into its typed object.
fn typed<T: DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).expect("desired objects are well-formed")
}

#[cfg(test)]
mod tests {
    use super::*;
    use burst_prefix_api::policy::BurstPrefixPolicySpec;

    fn policy() -> BurstPrefixPolicy {
        let spec: BurstPrefixPolicySpec = serde_json::from_value(json!({
            "selector": {"matchLabels": {"app": "vllm"}},
            "targetPorts": [{"number": 8000}],
            "maxPerReplica": 4,
            "producer": {"port": 8081},
        }))
        .unwrap();
        let mut policy = BurstPrefixPolicy::new("rl", spec);
        policy.metadata.namespace = Some("ml".into());
        policy.metadata.uid = Some("uid-1".into());
        policy
    }

    fn endpoint(id: &str) -> Endpoint {
        Endpoint {
            id: id.into(),
            address: "10.0.0.1:8000".into(),
            running_requests: None,
        }
    }

    #[test]
    fn config_map_holds_the_config_and_endpoints_in_the_producer_format() {
        let desired = desired(&policy(), vec![endpoint("ml/a-rank-0")]);
        let yaml = &desired.config_map.data.as_ref().unwrap()[CONFIG_KEY];
        let config = ProducerConfig::from_yaml(yaml).unwrap();
        assert_eq!(config.planner.max_per_replica, 4);
        assert_eq!(config.endpoints, vec![endpoint("ml/a-rank-0")]);
        assert_eq!(
            desired.config_map.metadata.name.as_deref(),
            Some("rl-producer")
        );
    }

    #[test]
    fn every_child_is_owned_by_the_policy() {
        let desired = desired(&policy(), vec![]);
        let owners = [
            &desired.config_map.metadata,
            &desired.service_account.metadata,
            &desired.role.metadata,
            &desired.role_binding.metadata,
            &desired.deployment.metadata,
            &desired.service.metadata,
        ];
        for meta in owners {
            let owner = &meta.owner_references.as_ref().unwrap()[0];
            assert_eq!(
                (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
                ("BurstPrefixPolicy", "rl", "uid-1")
            );
            assert_eq!(owner.controller, Some(true));
            assert_eq!(meta.namespace.as_deref(), Some("ml"));
        }
    }

    #[test]
    fn deployment_runs_the_producer_hardened_on_its_configmap() {
        let desired = desired(&policy(), vec![]);
        let pod = desired.deployment.spec.template.spec.unwrap();
        assert_eq!(pod.service_account_name.as_deref(), Some("rl-producer"));
        let container = &pod.containers[0];
        let args = container.args.clone().unwrap();
        assert_eq!(&args[..3], ["serve", "--configmap", "ml/rl-producer"]);
        assert!(args.contains(&"0.0.0.0:8081".to_string()));
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
        let readiness = container
            .readiness_probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap();
        assert_eq!(readiness.path.as_deref(), Some("/readyz"));
        let liveness = container
            .liveness_probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap();
        assert_eq!(liveness.path.as_deref(), Some("/healthz"));
    }

    #[test]
    fn role_may_only_read_its_own_configmap() {
        let desired = desired(&policy(), vec![]);
        let rules = desired.role.rules.unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].resources, Some(vec!["configmaps".to_string()]));
        assert_eq!(
            rules[0].resource_names,
            Some(vec!["rl-producer".to_string()])
        );
        assert_eq!(rules[0].verbs, ["get", "list", "watch"]);
    }

    #[test]
    fn service_exposes_http_and_metrics() {
        let desired = desired(&policy(), vec![]);
        let ports = desired.service.spec.unwrap().ports.unwrap();
        assert_eq!(
            ports
                .iter()
                .map(|p| (p.name.clone().unwrap(), p.port))
                .collect::<Vec<_>>(),
            [("http".to_string(), 8081), ("metrics".to_string(), 9090)]
        );
        assert_eq!(producer_url(&policy()), "http://rl-producer.ml.svc:8081");
    }
}
