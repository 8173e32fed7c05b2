//! What the producer may do: read its own ConfigMap; when the replicas elect a leader, also hold
//! their own Lease (which the operator creates, so no `create`: RBAC cannot limit `create` to a
//! name).

use burst_prefix_api::policy::BurstPrefixPolicy;
use burst_prefix_runtime::leader::LEASE_VERBS;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role};

use super::{child_name, elects_leader, metadata};

pub fn build(policy: &BurstPrefixPolicy) -> Role {
    let name = child_name(policy);
    let rule = |group: &str, resource: &str, verbs: &[&str]| PolicyRule {
        api_groups: Some(vec![group.to_string()]),
        resources: Some(vec![resource.to_string()]),
        resource_names: Some(vec![name.clone()]),
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        ..PolicyRule::default()
    };
    let mut rules = vec![rule("", "configmaps", &["get", "list", "watch"])];
    if elects_leader(policy) {
        rules.push(rule("coordination.k8s.io", "leases", LEASE_VERBS));
    }
    Role {
        metadata: metadata(policy),
        rules: Some(rules),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::tests::{policy, policy_with};
    use serde_json::json;

    #[test]
    fn one_replica_may_only_read_its_own_configmap() {
        let rules = build(&policy()).rules.unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].resources, Some(vec!["configmaps".to_string()]));
        assert_eq!(
            rules[0].resource_names,
            Some(vec!["rl-producer".to_string()])
        );
        assert_eq!(rules[0].verbs, ["get", "list", "watch"]);
    }

    #[test]
    fn active_active_replicas_may_only_read_their_configmap() {
        let rules = build(&policy_with(json!({"replicas": 3, "ha": "activeActive"})))
            .rules
            .unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].resources, Some(vec!["configmaps".to_string()]));
    }

    #[test]
    fn several_replicas_may_also_hold_their_own_lease() {
        let rules = build(&policy_with(json!({"replicas": 2}))).rules.unwrap();
        assert_eq!(rules.len(), 2);
        assert_eq!(
            rules[1].api_groups,
            Some(vec!["coordination.k8s.io".to_string()])
        );
        assert_eq!(rules[1].resources, Some(vec!["leases".to_string()]));
        assert_eq!(
            rules[1].resource_names,
            Some(vec!["rl-producer".to_string()])
        );
        assert_eq!(rules[1].verbs, ["get", "patch"]);
    }
}
