//! The operator's one error type; `metric_label` labels the failure counter.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("InferencePool {0} not found")]
    PoolNotFound(String),
    #[error("InferencePool {name}: {problem}")]
    InvalidPool { name: String, problem: String },
    #[error("invalid selector: {0}")]
    InvalidSelector(String),
    #[error("policy has no namespace")]
    NoNamespace,
    #[error("the BurstPrefixPolicy CRD is not installed: kubectl apply --server-side -f crds/burstprefixpolicies.yaml (or helm install the chart)")]
    CrdMissing,
}

impl Error {
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::PoolNotFound(_) => "pool_not_found",
            Error::InvalidPool { .. } => "invalid_pool",
            Error::InvalidSelector(_) => "invalid_selector",
            Error::NoNamespace => "no_namespace",
            Error::CrdMissing => "crd_missing",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
