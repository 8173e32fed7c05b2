//! With more than one producer replica, a drain takes at most one at a time. With `ha:
//! activeActive` every replica is Ready, so the budget keeps all but one of them serving
//! through a drain. With `leaderElection` only the leader is Ready (docs/behaviour.md §10), so
//! the followers are "unhealthy" to the budget: `AlwaysAllow` lets them be evicted whenever,
//! and the budget then protects the leader while no follower is Ready. In both modes a pod that
//! is not Ready (starting, or waiting for the engines) never blocks a drain.

use burst_prefix_api::policy::BurstPrefixPolicy;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{metadata, selector_labels};

pub fn build(policy: &BurstPrefixPolicy) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: metadata(policy),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(policy)),
                ..LabelSelector::default()
            }),
            unhealthy_pod_eviction_policy: Some("AlwaysAllow".into()),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    }
}
