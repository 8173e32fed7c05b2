//! The `BurstPrefixPolicy` custom resource (`burstprefix.io/v1alpha1`).
//!
//! The planner fields sit flat in `spec`; the CRD schema carries [`crate::config::RULES`] as CEL
//! (`x-kubernetes-validations`), so the API server refuses what the operator and producer would,
//! with the same message, once per broken rule. Rules that only the API server's validation of
//! the children would catch (an empty image, two producer ports on one number, a selector
//! operator Kubernetes does not know) are CEL rules here too, so that a policy is refused when
//! it is written instead of failing later in the operator.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
    ValidationRule,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::{PlannerConfig, RULES};
use crate::{kv_events, ports};

pub const GROUP: &str = "burstprefix.io";
pub const VERSION: &str = "v1alpha1";
/// The producer image of this release: the operator's `--producer-image` default (the chart
/// sets the flag). A policy names its own image only to pin or test one.
pub const DEFAULT_PRODUCER_IMAGE: &str = concat!(
    "ghcr.io/burst-prefix/burst-prefix-producer:",
    env!("CARGO_PKG_VERSION")
);

/// What `kubectl explain burstprefixpolicy` says about the kind.
const KIND_DESCRIPTION: &str = "A BurstPrefixPolicy co-locates bursts of prefix-sharing LLM \
    requests on the inference pods it selects. For each policy the operator runs a producer \
    (Deployment, Service and ConfigMap `<policy>-producer`) that collects the requests of a short \
    window, groups the ones that share a prompt prefix and places each group on one replica. \
    Clients ask it where a request goes (`POST /v1/produce`), send the request through it (the \
    OpenAI-compatible proxy), or use it as an InferencePool's endpoint picker (gRPC ext_proc).";

/// The inference pods whose prefix caches this policy fills, the planner settings, and the
/// producer that serves the placements.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "burstprefix.io",
    version = "v1alpha1",
    kind = "BurstPrefixPolicy",
    namespaced,
    shortname = "bpp",
    status = "BurstPrefixPolicyStatus",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","description":"why the policy is not Ready","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Endpoints","type":"integer","jsonPath":".status.endpoints"}"#,
    printcolumn = r#"{"name":"Window","type":"integer","description":"window duration in ms","jsonPath":".spec.windowDurationMs"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct BurstPrefixPolicySpec {
    /// The inference pods, by label, in the policy's namespace. Exactly one of `selector` and
    /// `poolRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// An InferencePool (inference.networking.k8s.io/v1) in the policy's namespace whose
    /// `selector` and `targetPorts` are used instead of this policy's. The producer can then also
    /// be that pool's endpoint picker (its `endpointPickerRef` names the producer Service).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_ref: Option<PoolRef>,
    /// The model-server ports of each pod (1 to 8); each is its own endpoint,
    /// `namespace/pod-rank-i`. Required with `selector`; with `poolRef` the pool's are used.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub target_ports: Vec<TargetPort>,
    #[serde(flatten)]
    pub planner: PlannerConfig,
    /// The producer the operator runs for this policy.
    #[serde(default)]
    pub producer: ProducerSpec,
}

/// A reference to an InferencePool in the policy's namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PoolRef {
    /// The InferencePool's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// A port, in the InferencePool v1 shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TargetPort {
    /// The port number the model server listens on (1..65535).
    #[schemars(range(min = 1, max = 65535))]
    pub number: i32,
}

/// How the producer runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProducerSpec {
    /// Producer pods (0..100). One is the default; with more, they elect a leader with the Lease
    /// `<policy>-producer` and only the leader is Ready and serves (active-passive, so that a
    /// burst stays in one window); a PodDisruptionBudget and a spread across nodes come with
    /// them. 0 stops the producer.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0, max = 100))]
    pub replicas: i32,
    /// The producer image. Leave it out to run the operator's (its `--producer-image`, which the
    /// chart sets), so that upgrading the chart upgrades every producer; set it only to pin one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// CPU and memory of the producer container. Default: the operator's
    /// `--producer-resources` (the chart's `producer.resources`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Node labels a producer pod must match (the pod's `nodeSelector`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Taints the producer pods tolerate (the pod's `tolerations`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// The API port: `/v1/produce`, `/v1/plan`, `/v1/endpoints` and the OpenAI-compatible proxy
    /// routes `/v1/completions`, `/v1/chat/completions` and `/v1/models`.
    #[serde(default = "default_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// The admin port: `/healthz`, `/readyz` and `/metrics`.
    #[serde(default = "default_metrics_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub metrics_port: i32,
    /// The gRPC endpoint-picker port (Envoy ext_proc): what an InferencePool's
    /// `endpointPickerRef` points at. It serves TLS (the Service's `appProtocol: http2`) unless
    /// `eppTls.plaintext` is set (`appProtocol: kubernetes.io/h2c`).
    #[serde(default = "default_epp_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub epp_port: i32,
    /// How the endpoint picker serves TLS. Leave it out for TLS with a self-signed certificate
    /// the producer generates at start (what gateways that follow the Gateway API Inference
    /// Extension connect to without verifying it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epp_tls: Option<EppTls>,
    /// TLS on the API port (the scoring API and the proxy). Leave it out for plain HTTP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_tls: Option<ApiTls>,
    /// On SIGTERM (a rolling update, a node drain, a leader failover), how long requests in
    /// flight and streams may run on before they are cut, in milliseconds (0 to 3600000); the
    /// pod's terminationGracePeriodSeconds follows it. Leave it out for the producer's default,
    /// 120000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 3_600_000))]
    pub drain_timeout_ms: Option<i64>,
    /// The producer's log level: error, warn, info, debug or trace.
    #[serde(default = "default_log_level")]
    pub log_level: LogLevel,
    /// The model's tokenizer files, so that the producer hashes text and chat prompts as the
    /// engines' tokens (docs/behaviour.md §7). Mounted read-only in the producer pods at
    /// `/etc/burst-prefix/tokenizer`; the config's `engines.tokenizer.path` defaults to that
    /// directory (or its `subPath`) when the policy leaves it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<TokenizerVolume>,
}

/// Where the producer pods find the model's tokenizer: a directory with `tokenizer.json`,
/// `tokenizer_config.json` and the chat template. Exactly one of `configMap`,
/// `persistentVolumeClaim` and `image`; a producer pod waits (Pending, ContainerCreating) until
/// its volume exists.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenizerVolume {
    /// A ConfigMap in the policy's namespace whose keys are the files (e.g. `kubectl create
    /// configmap NAME --from-file=DIR`). A ConfigMap holds at most 1 MiB in all, and many
    /// `tokenizer.json` files are larger: use a claim or an image for those.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), pattern(OBJECT_NAME_PATTERN))]
    pub config_map: Option<String>,
    /// A PersistentVolumeClaim in the policy's namespace that holds the model (e.g. the one the
    /// engines load it from), mounted read-only. It must be mountable on the producer's node as
    /// well: ReadOnlyMany or ReadWriteMany.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), pattern(OBJECT_NAME_PATTERN))]
    pub persistent_volume_claim: Option<String>,
    /// An OCI image or artifact with the files, mounted as an image volume (Kubernetes 1.35 or
    /// later, or 1.33 with the ImageVolume feature gate, and a container runtime that supports
    /// it), pulled with the producer's image pull secrets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The model directory inside the volume, relative to its root (e.g. `Qwen3-8B`), when the
    /// files are not at the root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub sub_path: Option<String>,
}

/// The volume a [`TokenizerVolume`] names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenizerSource<'a> {
    ConfigMap(&'a str),
    PersistentVolumeClaim(&'a str),
    Image(&'a str),
}

impl TokenizerVolume {
    /// The one volume it names, `None` unless exactly one (the CRD refuses the others).
    pub fn source(&self) -> Option<TokenizerSource<'_>> {
        let sources: Vec<TokenizerSource<'_>> = [
            self.config_map.as_deref().map(TokenizerSource::ConfigMap),
            self.persistent_volume_claim
                .as_deref()
                .map(TokenizerSource::PersistentVolumeClaim),
            self.image.as_deref().map(TokenizerSource::Image),
        ]
        .into_iter()
        .flatten()
        .collect();
        match sources[..] {
            [one] => Some(one),
            _ => None,
        }
    }

    /// Whether `subPath`, if set, stays inside the volume: relative, without a `..` element
    /// (the CRD's rule, [`TOKENIZER_RULES`]).
    pub fn sub_path_is_inside(&self) -> bool {
        self.sub_path.as_deref().is_none_or(|path| {
            !path.starts_with('/') && !path.split('/').any(|element| element == "..")
        })
    }
}

/// The endpoint picker's TLS: a certificate from a Secret, the self-signed default, or none.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EppTls {
    /// A `kubernetes.io/tls` Secret in the policy's namespace (keys `tls.crt` and `tls.key`, PEM)
    /// with the endpoint picker's certificate and key, e.g. one cert-manager renews. The producer
    /// pods mount it and reload it when it changes; a pod waits (ContainerCreating) until it
    /// exists. Leave it out for a self-signed certificate generated at start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), pattern(SECRET_NAME_PATTERN))]
    pub secret_name: Option<String>,
    /// Serve plaintext HTTP/2 (h2c) instead of TLS, for a gateway that reaches the producer over
    /// a network nobody else shares (a sidecar, a mesh that encrypts itself). Not with
    /// secretName.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub plaintext: bool,
}

/// TLS on the API port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApiTls {
    /// A `kubernetes.io/tls` Secret in the policy's namespace (keys `tls.crt` and `tls.key`, PEM)
    /// with the API port's certificate and key. The producer pods mount it and reload it when it
    /// changes; a pod waits (ContainerCreating) until it exists. status.producerUrl is then
    /// `https://`.
    #[schemars(length(min = 1, max = 253), pattern(SECRET_NAME_PATTERN))]
    pub secret_name: String,
}

/// A Secret's name: a DNS subdomain (lower case alphanumerics, '-' and '.').
const SECRET_NAME_PATTERN: &str = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$";
/// A ConfigMap's or a PersistentVolumeClaim's name: a DNS subdomain too.
const OBJECT_NAME_PATTERN: &str = SECRET_NAME_PATTERN;

/// A producer log level.
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
fn default_port() -> i32 {
    ports::API.into()
}
fn default_metrics_port() -> i32 {
    ports::ADMIN.into()
}
fn default_epp_port() -> i32 {
    ports::EPP.into()
}
fn default_log_level() -> LogLevel {
    LogLevel::Info
}

impl Default for ProducerSpec {
    fn default() -> Self {
        ProducerSpec {
            replicas: default_replicas(),
            image: None,
            resources: None,
            node_selector: BTreeMap::new(),
            tolerations: Vec::new(),
            port: default_port(),
            metrics_port: default_metrics_port(),
            epp_port: default_epp_port(),
            epp_tls: None,
            api_tls: None,
            drain_timeout_ms: None,
            log_level: default_log_level(),
            tokenizer: None,
        }
    }
}

/// What the operator observed and did.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BurstPrefixPolicyStatus {
    /// The `metadata.generation` of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, `ConfigValid`, `EndpointsDiscovered` and `ProducerAvailable`; a False one's
    /// reason says why (`InvalidConfig`, `PoolAPIMissing`, `PoolNotFound`, `ApplyFailed`, ...)
    /// and its message what to do.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Endpoints (pod, port) in the producer's config.
    #[serde(default)]
    pub endpoints: i64,
    /// In-cluster URL of the producer's API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producer_url: Option<String>,
}

/// A CEL rule with its message, on the schema node named by its place in the CRD.
struct CelRule {
    rule: &'static str,
    message: &'static str,
}

/// Rules across `spec` fields that the OpenAPI schema alone cannot say.
const SPEC_RULES: &[CelRule] = &[
    CelRule {
        rule: "has(self.selector) != has(self.poolRef)",
        message: "exactly one of selector and poolRef must be set",
    },
    CelRule {
        rule: kv_events::BIND_PORT_CLASH_CEL,
        message: kv_events::BIND_PORT_CLASH,
    },
    CelRule {
        rule: "has(self.poolRef) || (has(self.targetPorts) && size(self.targetPorts) >= 1)",
        message: "targetPorts needs 1 to 8 ports when selector is used",
    },
];

/// Rules on `spec.engines.kvEvents` (crate::kv_events).
const KV_EVENTS_RULES: &[CelRule] = &[CelRule {
    rule: kv_events::BIND_CEL,
    message: kv_events::BIND_REQUIREMENT,
}];

/// Rules on `spec.producer.tokenizer`.
const TOKENIZER_RULES: &[CelRule] = &[
    CelRule {
        rule: "[has(self.configMap), has(self.persistentVolumeClaim), has(self.image)].filter(set, set).size() == 1",
        message: "producer.tokenizer needs exactly one of configMap, persistentVolumeClaim and \
                  image",
    },
    CelRule {
        rule: "!has(self.subPath) || (!self.subPath.startsWith('/') && !self.subPath.matches('(^|/)\\\\.\\\\.(/|$)'))",
        message: "producer.tokenizer.subPath must be a relative path inside the volume, without \
                  a '..' element",
    },
];

/// Rules on `spec.producer` that the Deployment and Service would otherwise refuse later.
const PRODUCER_RULES: &[CelRule] = &[
    CelRule {
        rule: "!has(self.image) || self.image.matches('^[^\\\\s]+$')",
        message: "producer.image must be an image reference without spaces; leave it out to use \
                  the operator's --producer-image",
    },
    CelRule {
        rule: "self.port != self.metricsPort && self.port != self.eppPort && self.metricsPort != self.eppPort",
        message: "producer.port, producer.metricsPort and producer.eppPort must be three \
                  different ports",
    },
];

/// Rules on `spec.producer.eppTls`.
const EPP_TLS_RULES: &[CelRule] = &[CelRule {
    rule: "!(has(self.plaintext) && self.plaintext && has(self.secretName))",
    message: "producer.eppTls: plaintext and secretName exclude each other: a plaintext \
              endpoint picker has no certificate",
}];

/// Rules on each `spec.selector.matchExpressions[]`, as Kubernetes validates a label selector.
const SELECTOR_REQUIREMENT_RULES: &[CelRule] = &[
    CelRule {
        rule: "self.operator in ['In', 'NotIn', 'Exists', 'DoesNotExist']",
        message: "selector.matchExpressions[].operator must be In, NotIn, Exists or DoesNotExist",
    },
    CelRule {
        rule: "!(self.operator in ['In', 'NotIn']) || (has(self.values) && size(self.values) > 0)",
        message: "selector.matchExpressions[].values must not be empty for In and NotIn",
    },
    CelRule {
        rule: "!(self.operator in ['Exists', 'DoesNotExist']) || !has(self.values) || size(self.values) == 0",
        message: "selector.matchExpressions[].values must be empty for Exists and DoesNotExist",
    },
];

/// k8s-openapi's description of a Quantity is four screens long; `kubectl explain` shows it
/// under every resource.
const QUANTITY_DESCRIPTION: &str =
    "A quantity: a number with an optional suffix, e.g. 500m, 2, 512Mi or 4Gi.";

/// The CRD, with every config rule of [`RULES`] as CEL on `spec` (and no second OpenAPI bound
/// for the same rule), the rules above, and a description on every field.
pub fn crd() -> CustomResourceDefinition {
    let mut crd = BurstPrefixPolicy::crd();
    let root = crd
        .spec
        .versions
        .iter_mut()
        .filter_map(|v| v.schema.as_mut()?.open_api_v3_schema.as_mut())
        .next()
        .expect("the generated CRD has a schema");
    root.description = Some(KIND_DESCRIPTION.to_string());
    let spec = property(root, "spec").expect("the generated CRD has a spec schema");
    let mut rules: Vec<ValidationRule> = Vec::new();
    for rule in RULES {
        // One message per broken rule: the CEL rule carries it, so the field loses the OpenAPI
        // bounds generated from the same constants.
        if let Some(field) = path(spec, rule.field) {
            field.minimum = None;
            field.maximum = None;
        }
        rules.push(ValidationRule {
            rule: rule.cel.to_string(),
            message: Some(rule.message()),
            field_path: Some(format!(".{}", rule.field)),
            reason: Some("FieldValueInvalid".to_string()),
            ..ValidationRule::default()
        });
    }
    rules.extend(SPEC_RULES.iter().map(validation));
    spec.x_kubernetes_validations = Some(rules);
    let producer = property(spec, "producer").expect("spec.producer");
    producer.x_kubernetes_validations = Some(PRODUCER_RULES.iter().map(validation).collect());
    if let Some(image) = property(producer, "image") {
        image.max_length = Some(1024);
    }
    let epp_tls = property(producer, "eppTls").expect("spec.producer.eppTls");
    epp_tls.x_kubernetes_validations = Some(EPP_TLS_RULES.iter().map(validation).collect());
    let tokenizer = property(producer, "tokenizer").expect("spec.producer.tokenizer");
    tokenizer.x_kubernetes_validations = Some(TOKENIZER_RULES.iter().map(validation).collect());
    if let Some(image) = property(tokenizer, "image") {
        image.max_length = Some(1024);
        image.min_length = Some(1);
    }
    let events = path(spec, "engines.kvEvents").expect("spec.engines.kvEvents");
    events.x_kubernetes_validations = Some(
        KV_EVENTS_RULES
            .iter()
            .map(|rule| ValidationRule {
                field_path: Some(".bind".to_string()),
                ..validation(rule)
            })
            .collect(),
    );
    if let Some(bind) = property(events, "bind") {
        bind.max_length = Some(kv_events::BIND_MAX_LENGTH);
    }
    let expressions = path(spec, "selector.matchExpressions").expect("spec.selector");
    // Bounded, so that the API server's cost estimate of the CEL rules stays small.
    expressions.max_items = Some(32);
    if let Some(JSONSchemaPropsOrArray::Schema(requirement)) = expressions.items.as_mut() {
        requirement.x_kubernetes_validations =
            Some(SELECTOR_REQUIREMENT_RULES.iter().map(validation).collect());
        if let Some(values) = property(requirement, "values") {
            values.max_items = Some(256);
        }
    }
    tidy_descriptions(root);
    crd
}

fn validation(rule: &CelRule) -> ValidationRule {
    ValidationRule {
        rule: rule.rule.to_string(),
        message: Some(
            rule.message
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" "),
        ),
        reason: Some("FieldValueInvalid".to_string()),
        ..ValidationRule::default()
    }
}

fn property<'a>(schema: &'a mut JSONSchemaProps, name: &str) -> Option<&'a mut JSONSchemaProps> {
    schema.properties.as_mut()?.get_mut(name)
}

/// The schema of `a.b.c` below `schema`.
fn path<'a>(schema: &'a mut JSONSchemaProps, dotted: &str) -> Option<&'a mut JSONSchemaProps> {
    dotted
        .split('.')
        .try_fold(schema, |schema, name| property(schema, name))
}

/// Doc comments are wrapped at 100 columns; `kubectl explain` would break their sentences
/// there. Lines are joined, paragraphs kept.
fn tidy_descriptions(schema: &mut JSONSchemaProps) {
    if let Some(description) = schema.description.as_mut() {
        *description = if description.starts_with("Quantity is a fixed-point representation") {
            QUANTITY_DESCRIPTION.to_string()
        } else {
            description
                .split("\n\n")
                .map(|paragraph| paragraph.split_whitespace().collect::<Vec<_>>().join(" "))
                .collect::<Vec<_>>()
                .join("\n\n")
        };
    }
    for child in children(schema) {
        tidy_descriptions(child);
    }
}

/// The schemas directly below `schema`: properties, items, additional properties.
fn children(schema: &mut JSONSchemaProps) -> Vec<&mut JSONSchemaProps> {
    let mut children: Vec<&mut JSONSchemaProps> = Vec::new();
    if let Some(properties) = schema.properties.as_mut() {
        children.extend(properties.values_mut());
    }
    match schema.items.as_mut() {
        Some(JSONSchemaPropsOrArray::Schema(item)) => children.push(item),
        Some(JSONSchemaPropsOrArray::Schemas(items)) => children.extend(items.iter_mut()),
        None => {}
    }
    if let Some(JSONSchemaPropsOrBool::Schema(additional)) = schema.additional_properties.as_mut() {
        children.push(additional);
    }
    children
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

    fn root_schema() -> JSONSchemaProps {
        crd().spec.versions[0]
            .schema
            .clone()
            .unwrap()
            .open_api_v3_schema
            .unwrap()
    }

    fn spec_schema() -> JSONSchemaProps {
        root_schema().properties.unwrap()["spec"].clone()
    }

    #[test]
    fn spec_schema_has_flat_planner_fields_with_defaults() {
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
        assert_eq!(window.default.as_ref().unwrap().0, serde_json::json!(100));
        assert_eq!(properties["targetPorts"].max_items, Some(8));
    }

    #[test]
    fn every_config_rule_is_cel_on_spec_and_only_there() {
        let spec = spec_schema();
        let rules = spec.x_kubernetes_validations.clone().unwrap();
        for rule in RULES {
            assert!(
                rules
                    .iter()
                    .any(|r| r.rule == rule.cel && r.message.as_deref() == Some(&rule.message())),
                "{} missing",
                rule.field
            );
            // No second message from an OpenAPI bound on the same field.
            let mut spec = spec.clone();
            if let Some(field) = path(&mut spec, rule.field) {
                assert_eq!(
                    (field.minimum, field.maximum),
                    (None, None),
                    "{}",
                    rule.field
                );
            }
        }
        assert_eq!(rules.len(), RULES.len() + SPEC_RULES.len());
    }

    #[test]
    fn the_image_has_no_default_so_stored_policies_follow_the_operator() {
        let mut spec = spec_schema();
        let producer = property(&mut spec, "producer").unwrap();
        let default = producer.default.as_ref().unwrap().0.clone();
        assert!(default.get("image").is_none(), "{default}");
        assert!(property(producer, "image").unwrap().default.is_none());
        assert_eq!(default["eppPort"], 9002);
    }

    #[test]
    fn tls_and_drain_have_no_defaults_so_stored_policies_follow_the_producer() {
        let mut spec = spec_schema();
        let producer = property(&mut spec, "producer").unwrap();
        let default = producer.default.as_ref().unwrap().0.clone();
        for field in ["eppTls", "apiTls", "drainTimeoutMs"] {
            assert!(default.get(field).is_none(), "{field} in {default}");
        }
        let drain = property(producer, "drainTimeoutMs").unwrap();
        assert_eq!(
            (drain.minimum, drain.maximum),
            (Some(0.0), Some(3_600_000.0))
        );
        let epp_tls = property(producer, "eppTls").unwrap();
        let rules = epp_tls.x_kubernetes_validations.clone().unwrap();
        assert_eq!(rules.len(), EPP_TLS_RULES.len());
        assert!(rules[0].rule.contains("self.plaintext") && rules[0].rule.contains("secretName"));
        for secret in [
            path(epp_tls, "secretName").unwrap().clone(),
            path(producer, "apiTls.secretName").unwrap().clone(),
        ] {
            assert_eq!(secret.max_length, Some(253));
            assert_eq!(secret.pattern.as_deref(), Some(SECRET_NAME_PATTERN));
        }
    }

    /// Every field `kubectl explain` shows has a description, in whole sentences on one line.
    #[test]
    fn every_field_is_described_without_broken_lines() {
        fn walk(schema: &JSONSchemaProps, at: &str, missing: &mut Vec<String>) {
            let mut schema = schema.clone();
            if let Some(properties) = schema.properties.clone() {
                for (name, property) in properties {
                    let here = format!("{at}.{name}");
                    match property.description.as_deref() {
                        None | Some("") => missing.push(here.clone()),
                        Some(text) if text.contains('\n') && !text.contains("\n\n") => {
                            missing.push(format!("{here} (broken line)"))
                        }
                        Some(_) => {}
                    }
                    walk(&property, &here, missing);
                }
            }
            for child in children(&mut schema) {
                walk(child, &format!("{at}[]"), missing);
            }
        }
        let root = root_schema();
        assert!(root
            .description
            .as_deref()
            .unwrap()
            .starts_with("A BurstPrefixPolicy"));
        let mut missing = Vec::new();
        walk(&root, "", &mut missing);
        // apiVersion, kind and metadata are described by Kubernetes itself.
        missing.retain(|m| ![".apiVersion", ".kind", ".metadata"].contains(&m.as_str()));
        assert!(
            missing.is_empty(),
            "fields without a description: {missing:?}"
        );
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
        assert_eq!(spec.producer.image, None);
    }

    #[test]
    fn the_bind_and_tokenizer_rules_sit_on_their_own_fields() {
        let mut spec = spec_schema();
        let events = path(&mut spec, "engines.kvEvents").unwrap().clone();
        let rules = events.x_kubernetes_validations.clone().unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].rule, kv_events::BIND_CEL);
        assert_eq!(rules[0].field_path.as_deref(), Some(".bind"));
        assert!(rules[0]
            .message
            .as_deref()
            .unwrap()
            .starts_with("engines.kvEvents.bind must be tcp://HOST:PORT"));
        assert_eq!(
            events.properties.unwrap()["bind"].max_length,
            Some(kv_events::BIND_MAX_LENGTH)
        );
        let spec_rules = spec.x_kubernetes_validations.clone().unwrap();
        assert!(spec_rules
            .iter()
            .any(|r| r.rule == kv_events::BIND_PORT_CLASH_CEL));

        let tokenizer = path(&mut spec, "producer.tokenizer").unwrap().clone();
        let rules = tokenizer.x_kubernetes_validations.unwrap();
        assert_eq!(rules.len(), TOKENIZER_RULES.len());
        assert!(rules[0].rule.contains("size() == 1"), "{}", rules[0].rule);
        // The regex as the API server reads it: `\.` in CEL, `\.` in RE2.
        assert!(
            rules[1].rule.contains(r"'(^|/)\\.\\.(/|$)'"),
            "{}",
            rules[1].rule
        );
        let fields = tokenizer.properties.unwrap();
        for name in ["configMap", "persistentVolumeClaim"] {
            assert_eq!(
                fields[name].pattern.as_deref(),
                Some(OBJECT_NAME_PATTERN),
                "{name}"
            );
        }
        assert_eq!(fields["image"].max_length, Some(1024));
        // No default: a policy without a tokenizer mounts nothing.
        let producer_default = path(&mut spec, "producer")
            .unwrap()
            .default
            .clone()
            .unwrap()
            .0;
        assert!(
            producer_default.get("tokenizer").is_none(),
            "{producer_default}"
        );
    }

    #[test]
    fn a_tokenizer_names_exactly_one_volume_and_stays_inside_it() {
        let volume =
            |json: serde_json::Value| -> TokenizerVolume { serde_json::from_value(json).unwrap() };
        assert_eq!(
            volume(serde_json::json!({"configMap": "t"})).source(),
            Some(TokenizerSource::ConfigMap("t"))
        );
        assert_eq!(
            volume(serde_json::json!({"persistentVolumeClaim": "m"})).source(),
            Some(TokenizerSource::PersistentVolumeClaim("m"))
        );
        assert_eq!(
            volume(serde_json::json!({"image": "i:1"})).source(),
            Some(TokenizerSource::Image("i:1"))
        );
        assert_eq!(volume(serde_json::json!({})).source(), None);
        assert_eq!(
            volume(serde_json::json!({"configMap": "t", "image": "i:1"})).source(),
            None
        );
        for (sub_path, inside) in [
            ("Qwen3-8B", true),
            ("hub/models--Qwen/snapshots/abc", true),
            ("a..b/..c", true),
            ("..", false),
            ("a/../../b", false),
            ("a/..", false),
            ("/models", false),
        ] {
            let tokenizer = volume(serde_json::json!({"configMap": "t", "subPath": sub_path}));
            assert_eq!(tokenizer.sub_path_is_inside(), inside, "{sub_path}");
        }
    }
}
