//! The burst-prefix operator. Reconcile is a pipeline: resolve (read the pods and the pool) →
//! validate → build the desired objects ([`desired`], pure) → apply ([`apply`]) → status
//! ([`status`], pure, written only when it changes). [`controller`] wires it to kube-runtime.

pub mod apply;
pub mod controller;
pub mod desired;
pub mod endpoints;
pub mod error;
pub mod metrics;
pub mod status;

/// The one server-side-apply field manager of the operator.
pub const FIELD_MANAGER: &str = "burst-prefix-operator";
