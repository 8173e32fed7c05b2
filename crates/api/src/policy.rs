//! The `BurstPrefixPolicy` custom resource (`burstprefix.io/v1alpha1`).
//!
//! The planner fields sit flat in `spec`; the CRD schema carries [`crate::config::RULES`] as CEL
//! (`x-kubernetes-validations`), so the API server refuses what the operator and producer would.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, ValidationRule,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::{PlannerConfig, RULES};

pub const GROUP: &str = "burstprefix.io";
pub const VERSION: &str = "v1alpha1";
/// The producer image the operator deploys unless `spec.producer.image` says otherwise.
pub const DEFAULT_PRODUCER_IMAGE: &str = concat!(
    "ghcr.io/burst-prefix/burst-prefix-producer:",
    env!("CARGO_PKG_VERSION")
);

/// Co-locate bursts of prefix-sharing requests on the inference pods this policy selects.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "burstprefix.io",
    version = "v1alpha1",
    kind = "BurstPrefixPolicy",
    namespaced,
    shortname = "bpp",
    status = "BurstPrefixPolicyStatus",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Endpoints","type":"integer","jsonPath":".status.endpoints"}"#,
    printcolumn = r#"{"name":"Window","type":"integer","description":"window duration in ms","jsonPath":".spec.windowDurationMs"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct BurstPrefixPolicySpec {
    /// The inference pods, in the policy's namespace. Exactly one of `selector` and `poolRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// An `InferencePool` (inference.networking.k8s.io/v1) whose `selector` and `targetPorts`
    /// are used instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_ref: Option<PoolRef>,
    /// The model-server ports of each pod (1 to 8); each is its own endpoint,
    /// `namespace/pod-rank-i`. Required with `selector`; with `poolRef` the pool's are used.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub target_ports: Vec<TargetPort>,
    #[serde(flatten)]
    pub planner: PlannerConfig,
    /// The producer Deployment the operator runs for this policy.
    #[serde(default)]
    pub producer: ProducerSpec,
}

/// A reference to an `InferencePool` in the policy's namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PoolRef {
    #[schemars(length(min = 1))]
    pub name: String,
}

/// A port, in the InferencePool v1 shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TargetPort {
    #[schemars(range(min = 1, max = 65535))]
    pub number: i32,
}

/// How the producer runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProducerSpec {
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0, max = 100))]
    pub replicas: i32,
    #[serde(default = "default_image")]
    pub image: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// The API port (`/v1/produce`, `/v1/plan`).
    #[serde(default = "default_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// The admin port (`/healthz`, `/readyz`, `/metrics`).
    #[serde(default = "default_metrics_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub metrics_port: i32,
    #[serde(default = "default_log_level")]
    pub log_level: LogLevel,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Error,
    Warn,
    #[default]
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

fn default_replicas() -> i32 {
    1
}
fn default_image() -> String {
    DEFAULT_PRODUCER_IMAGE.to_string()
}
fn default_port() -> i32 {
    8080
}
fn default_metrics_port() -> i32 {
    9090
}
fn default_log_level() -> LogLevel {
    LogLevel::Info
}

impl Default for ProducerSpec {
    fn default() -> Self {
        ProducerSpec {
            replicas: default_replicas(),
            image: default_image(),
            resources: None,
            node_selector: BTreeMap::new(),
            tolerations: Vec::new(),
            port: default_port(),
            metrics_port: default_metrics_port(),
            log_level: default_log_level(),
        }
    }
}

/// What the operator observed and did.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BurstPrefixPolicyStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, `ConfigValid`, `EndpointsDiscovered`, `ProducerAvailable`.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Endpoints in the producer's config.
    #[serde(default)]
    pub endpoints: i64,
    /// In-cluster URL of the producer's API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producer_url: Option<String>,
}

/// Rules across `spec` fields that the OpenAPI schema alone cannot say.
const SPEC_RULES: &[(&str, &str)] = &[
    (
        "has(self.selector) != has(self.poolRef)",
        "exactly one of selector and poolRef must be set",
    ),
    (
        "has(self.poolRef) || (has(self.targetPorts) && size(self.targetPorts) >= 1)",
        "targetPorts needs 1 to 8 ports when selector is used",
    ),
];

/// The CRD, with every config rule of [`RULES`] and [`SPEC_RULES`] as CEL on `spec`.
pub fn crd() -> CustomResourceDefinition {
    let mut crd = BurstPrefixPolicy::crd();
    let spec = crd
        .spec
        .versions
        .iter_mut()
        .filter_map(|v| v.schema.as_mut()?.open_api_v3_schema.as_mut())
        .filter_map(|schema| schema.properties.as_mut()?.get_mut("spec"))
        .next()
        .expect("the generated CRD has a spec schema");
    let rules = RULES
        .iter()
        .map(|rule| ValidationRule {
            rule: rule.cel.to_string(),
            message: Some(rule.message()),
            field_path: Some(format!(".{}", rule.field)),
            reason: Some("FieldValueInvalid".to_string()),
            ..ValidationRule::default()
        })
        .chain(SPEC_RULES.iter().map(|(rule, message)| ValidationRule {
            rule: rule.to_string(),
            message: Some(message.to_string()),
            reason: Some("FieldValueInvalid".to_string()),
            ..ValidationRule::default()
        }));
    spec.x_kubernetes_validations = Some(rules.collect());
    crd
}

/// The CRD as the YAML checked into `crds/` and the chart.
pub fn crd_yaml() -> String {
    let mut yaml = String::from(
        "# Generated by `burst-prefix-operator crd` from crates/api/src/policy.rs: do not edit.\n",
    );
    yaml.push_str(&serde_yaml::to_string(&crd()).expect("a CRD always serializes"));
    yaml
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps;

    fn spec_schema() -> JSONSchemaProps {
        crd().spec.versions[0]
            .schema
            .clone()
            .unwrap()
            .open_api_v3_schema
            .unwrap()
            .properties
            .unwrap()["spec"]
            .clone()
    }

    #[test]
    fn spec_schema_has_flat_planner_fields_with_defaults_and_bounds() {
        let spec = spec_schema();
        let properties = spec.properties.as_ref().unwrap();
        for field in [
            "selector",
            "poolRef",
            "targetPorts",
            "windowDurationMs",
            "maxPerReplica",
            "blockSizeTokens",
            "maxPrefixTokensToMatch",
            "minColocateBlocks",
            "maxBatchSize",
            "balanceBy",
            "producer",
        ] {
            assert!(properties.contains_key(field), "spec.{field} missing");
        }
        let window = &properties["windowDurationMs"];
        assert_eq!(window.minimum, Some(1.0));
        assert_eq!(window.maximum, Some(10_000.0));
        assert_eq!(window.default.as_ref().unwrap().0, serde_json::json!(100));
        assert_eq!(properties["targetPorts"].max_items, Some(8));
    }

    #[test]
    fn every_config_rule_is_cel_on_spec() {
        let spec = spec_schema();
        let rules = spec.x_kubernetes_validations.unwrap();
        for rule in RULES {
            assert!(
                rules
                    .iter()
                    .any(|r| r.rule == rule.cel && r.message.as_deref() == Some(&rule.message())),
                "{} missing",
                rule.field
            );
        }
        assert_eq!(rules.len(), RULES.len() + SPEC_RULES.len());
    }

    #[test]
    fn a_minimal_policy_gets_every_default() {
        let spec: BurstPrefixPolicySpec = serde_json::from_value(serde_json::json!({
            "selector": {"matchLabels": {"app": "vllm"}},
            "targetPorts": [{"number": 8000}],
        }))
        .unwrap();
        assert_eq!(spec.planner, PlannerConfig::default());
        assert_eq!(spec.producer, ProducerSpec::default());
    }
}
