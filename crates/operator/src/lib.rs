//! The burst-prefix operator. Reconcile ([`reconcile`]) is a pipeline: validate ([`validate`],
//! pure) → resolve and discover ([`discover`]: the pool and the pods, then [`endpoints`], pure)
//! → build the desired objects ([`desired`], pure) → apply ([`apply`], dry run first) → status
//! ([`status`], pure, written only when it changes). Every failure becomes a condition reason, a
//! Kubernetes Event and a retry with exponential backoff per policy ([`backoff`]).
//! [`controller`] wires it to kube-runtime's watches; [`context`] is what reconciles share.

pub mod apply;
pub mod backoff;
pub mod context;
pub mod controller;
pub mod desired;
pub mod discover;
pub mod endpoints;
pub mod error;
pub mod metrics;
pub mod pool_api;
pub mod reconcile;
pub mod status;
pub mod validate;

/// The one server-side-apply field manager of the operator, and its Event reporter name.
pub const FIELD_MANAGER: &str = "burst-prefix-operator";
