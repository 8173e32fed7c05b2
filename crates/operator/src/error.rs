//! The operator's one error type. Each failure of a reconcile has a condition reason (what
//! `kubectl get bpp` and the Event say), the condition it falsifies, and a metric label (the
//! failure counter is labelled by it).

use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The stored spec does not deserialize (e.g. a CRD newer than this operator).
    #[error("the spec cannot be read by this operator: {0}")]
    UnreadableSpec(String),
    /// The spec breaks a rule (planner config, selector, image policy).
    #[error("{0}")]
    InvalidConfig(String),
    #[error("the InferencePool API (inference.networking.k8s.io/v1) is not served by this cluster: install the Gateway API Inference Extension CRDs; the operator notices them within {recheck_seconds}s")]
    PoolApiMissing { recheck_seconds: u64 },
    #[error("InferencePool {0} not found")]
    PoolNotFound(String),
    #[error("InferencePool {name}: {problem}")]
    InvalidPool { name: String, problem: String },
    #[error("listing the endpoints failed: {}", api_message(.0))]
    Discovery(#[source] kube::Error),
    /// The API server refused a child: in the dry run (nothing of this attempt was applied) or
    /// in the real apply (the children before it were).
    #[error("{object}: {}; {}", api_message(.source), if *.dry_run {
        "nothing of this change was applied"
    } else {
        "the children before it were applied, the next attempt continues"
    })]
    Apply {
        object: String,
        dry_run: bool,
        #[source]
        source: kube::Error,
    },
    #[error("writing the status failed: {}", api_message(.0))]
    Status(#[source] kube::Error),
    #[error("policy has no namespace")]
    NoNamespace,
    #[error("the BurstPrefixPolicy CRD is not installed: kubectl apply --server-side -f crds/burstprefixpolicies.yaml (or helm install the chart)")]
    CrdMissing,
    #[error("Kubernetes API: {}", api_message(.0))]
    Kube(#[from] kube::Error),
}

/// What the API server said, without kube's debug dump of the whole Status.
pub fn api_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) if !status.message.is_empty() => {
            format!("{} ({} {})", status.message, status.code, status.reason)
        }
        other => other.to_string(),
    }
}

/// The conditions a failure makes False.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Config,
    Discovery,
    Apply,
    /// Not about the policy's config, endpoints or producer (status write, the API itself).
    Other,
}

impl Error {
    /// The condition reason (CamelCase) and Event reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::UnreadableSpec(_) | Error::InvalidConfig(_) => "InvalidConfig",
            Error::PoolApiMissing { .. } => "PoolAPIMissing",
            Error::PoolNotFound(_) => "PoolNotFound",
            Error::InvalidPool { .. } => "InvalidPool",
            Error::Discovery(_) => "DiscoveryFailed",
            Error::Apply { .. } => "ApplyFailed",
            Error::Status(_) => "StatusWriteFailed",
            Error::NoNamespace => "NoNamespace",
            Error::CrdMissing => "CRDMissing",
            Error::Kube(_) => "APIError",
        }
    }

    pub fn stage(&self) -> Stage {
        match self {
            Error::UnreadableSpec(_) | Error::InvalidConfig(_) | Error::NoNamespace => {
                Stage::Config
            }
            Error::PoolApiMissing { .. }
            | Error::PoolNotFound(_)
            | Error::InvalidPool { .. }
            | Error::Discovery(_) => Stage::Discovery,
            Error::Apply { .. } => Stage::Apply,
            Error::Status(_) | Error::CrdMissing | Error::Kube(_) => Stage::Other,
        }
    }

    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::UnreadableSpec(_) => "unreadable_spec",
            Error::InvalidConfig(_) => "invalid_config",
            Error::PoolApiMissing { .. } => "pool_api_missing",
            Error::PoolNotFound(_) => "pool_not_found",
            Error::InvalidPool { .. } => "invalid_pool",
            Error::Discovery(_) => "discovery",
            Error::Apply { .. } => "apply",
            Error::Status(_) => "status",
            Error::NoNamespace => "no_namespace",
            Error::CrdMissing => "crd_missing",
            Error::Kube(_) => "kube",
        }
    }

    /// The kube error behind this one, if any (for API-refusal tracking).
    pub fn kube_error(&self) -> Option<&kube::Error> {
        match self {
            Error::Discovery(e)
            | Error::Apply { source: e, .. }
            | Error::Status(e)
            | Error::Kube(e) => Some(e),
            _ => None,
        }
    }
}

/// A failed reconcile and when it is retried (the per-policy exponential backoff).
#[derive(Debug, thiserror::Error)]
#[error("{error} (retrying in {}s)", retry_in.as_secs_f64())]
pub struct ReconcileError {
    #[source]
    pub error: Error,
    pub retry_in: Duration,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
