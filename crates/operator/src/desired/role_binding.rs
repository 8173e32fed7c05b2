//! Binds the producer's Role to its ServiceAccount.

use burst_prefix_api::policy::BurstPrefixPolicy;
use k8s_openapi::api::rbac::v1::{RoleBinding, RoleRef, Subject};
use kube::ResourceExt;

use super::{child_name, metadata};

pub fn build(policy: &BurstPrefixPolicy) -> RoleBinding {
    let name = child_name(policy);
    RoleBinding {
        metadata: metadata(policy),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: name.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name,
            namespace: policy.namespace(),
            ..Subject::default()
        }]),
    }
}
