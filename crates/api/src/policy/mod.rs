//! The `BurstPrefixPolicy` custom resource (`burstprefix.io/v1alpha1`).
//!
//! The planner fields sit flat in `spec`; the CRD schema carries [`crate::config::RULES`] as CEL
//! (`x-kubernetes-validations`), so the API server refuses what the operator and producer would,
//! with the same message, once per broken rule. Rules that only the API server's validation of
//! the children would catch (an empty image, two producer ports on one number, a selector
//! operator Kubernetes does not know) are CEL rules here too, so that a policy is refused when
//! it is written instead of failing later in the operator.
//!
//! Here the types; [`rules`] the CEL rules beyond the config's; [`schema`] the CRD built from
//! the types with the rules on it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::PlannerConfig;
use crate::ports;

mod rules;
mod schema;

pub use schema::{crd, crd_yaml};

pub const GROUP: &str = "burstprefix.io";
pub const VERSION: &str = "v1alpha1";
/// The producer image of this release: the operator's `--producer-image` default (the chart
/// sets the flag). A policy names its own image only to pin or test one.
pub const DEFAULT_PRODUCER_IMAGE: &str = concat!(
    "ghcr.io/burst-prefix/burst-prefix-producer:",
    env!("CARGO_PKG_VERSION")
);

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
    /// Producer pods (0..100). One is the default; with more, `ha` says how they share the
    /// work, and a PodDisruptionBudget and a spread across nodes come with them. 0 stops the
    /// producer.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0, max = 100))]
    pub replicas: i32,
    /// How more than one producer replica runs (docs/behaviour.md §10). `leaderElection` (the
    /// default): one planner at a time; the replicas elect a leader with the Lease
    /// `<policy>-producer`, only it is Ready, a follower takes over when the Lease lapses, and
    /// an update stops the old pods before it starts new ones (`Recreate`); what window
    /// placement needs so that a burst stays in one window. `activeActive`: every replica is
    /// Ready and serves, no failover gap, a rolling update with none unavailable; each places
    /// from the engines' `/metrics` and KV events plus its own requests in flight, without the
    /// others' last placements. Without effect on a single replica.
    #[serde(default)]
    pub ha: HaMode,
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

/// How several producer replicas share the work (docs/behaviour.md §10).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum HaMode {
    /// One planner at a time: the replicas elect a leader with the Lease `<policy>-producer`;
    /// only the leader is Ready and serves, a follower takes over when the Lease lapses (a gap
    /// of up to the Lease's duration), and an upgrade stops every old pod before it starts a
    /// new one (`Recreate`: an outage while the old ones drain). Pick it for window placement,
    /// so that a burst stays in one window.
    #[default]
    LeaderElection,
    /// Every replica is Ready and serves: no failover gap, and a rolling update with none
    /// unavailable (surge 1). Each producer places from the engines' `/metrics` and KV events
    /// plus its own requests in flight; what the others placed in the last milliseconds it does
    /// not see. Pick it for on-arrival placement with `engines` scraped, when no gap is
    /// acceptable.
    ActiveActive,
}

impl HaMode {
    pub fn as_str(self) -> &'static str {
        match self {
            HaMode::LeaderElection => "leaderElection",
            HaMode::ActiveActive => "activeActive",
        }
    }
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
pub enum TokenizerVolumeKind<'a> {
    ConfigMap(&'a str),
    PersistentVolumeClaim(&'a str),
    Image(&'a str),
}

impl TokenizerVolume {
    /// The one volume it names, `None` unless exactly one (the CRD refuses the others).
    pub fn kind(&self) -> Option<TokenizerVolumeKind<'_>> {
        let kinds: Vec<TokenizerVolumeKind<'_>> = [
            self.config_map
                .as_deref()
                .map(TokenizerVolumeKind::ConfigMap),
            self.persistent_volume_claim
                .as_deref()
                .map(TokenizerVolumeKind::PersistentVolumeClaim),
            self.image.as_deref().map(TokenizerVolumeKind::Image),
        ]
        .into_iter()
        .flatten()
        .collect();
        match kinds[..] {
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
            ha: HaMode::default(),
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn several_producers_elect_a_leader_unless_the_policy_says_active_active() {
        assert_eq!(ProducerSpec::default().ha, HaMode::LeaderElection);
        let producer = |json: serde_json::Value| -> Result<ProducerSpec, String> {
            serde_json::from_value(json).map_err(|e| e.to_string())
        };
        let active = producer(serde_json::json!({"replicas": 3, "ha": "activeActive"})).unwrap();
        assert_eq!((active.replicas, active.ha), (3, HaMode::ActiveActive));
        assert_eq!(
            producer(serde_json::json!({"ha": "leaderElection"}))
                .unwrap()
                .ha,
            HaMode::LeaderElection
        );
        let refused = producer(serde_json::json!({"ha": "active-active"})).unwrap_err();
        assert!(refused.contains("unknown variant"), "{refused}");
        assert_eq!(
            serde_json::to_value(HaMode::ActiveActive).unwrap(),
            HaMode::ActiveActive.as_str()
        );
    }

    #[test]
    fn a_tokenizer_names_exactly_one_volume_and_stays_inside_it() {
        let volume =
            |json: serde_json::Value| -> TokenizerVolume { serde_json::from_value(json).unwrap() };
        assert_eq!(
            volume(serde_json::json!({"configMap": "t"})).kind(),
            Some(TokenizerVolumeKind::ConfigMap("t"))
        );
        assert_eq!(
            volume(serde_json::json!({"persistentVolumeClaim": "m"})).kind(),
            Some(TokenizerVolumeKind::PersistentVolumeClaim("m"))
        );
        assert_eq!(
            volume(serde_json::json!({"image": "i:1"})).kind(),
            Some(TokenizerVolumeKind::Image("i:1"))
        );
        assert_eq!(volume(serde_json::json!({})).kind(), None);
        assert_eq!(
            volume(serde_json::json!({"configMap": "t", "image": "i:1"})).kind(),
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
