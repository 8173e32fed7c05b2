//! Pure validation of a policy before anything is applied: the planner rules (docs/behaviour.md §2,
//! the one rule table), the selector, and whether this operator lets a policy choose its image. The
//! CRD's CEL rules refuse most of this when the policy is written; this catches what an older
//! CRD let through.

use burst_prefix_api::policy::BurstPrefixPolicy;
use kube::core::Selector;

use crate::error::Error;

/// Image rules from the operator's flags.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImagePolicy {
    /// `--allowed-producer-image-prefix`, repeated: a policy's own `producer.image` must start
    /// with one of them. Empty: any image.
    pub allowed_prefixes: Vec<String>,
}

pub fn validate(policy: &BurstPrefixPolicy, images: &ImagePolicy) -> Result<(), Error> {
    let mut problems = Vec::new();
    if let Err(error) = policy.spec.planner.validate() {
        problems.push(error.to_string());
    }
    if let Some(selector) = &policy.spec.selector {
        if let Err(error) = Selector::try_from(selector.clone()) {
            problems.push(format!("selector: {error}"));
        }
    }
    if let Some(image) = &policy.spec.producer.image {
        if !images.allowed_prefixes.is_empty()
            && !images.allowed_prefixes.iter().any(|p| image.starts_with(p))
        {
            problems.push(format!(
                "producer.image {image:?} is not allowed by this operator: it must start with \
                 one of {:?} (--allowed-producer-image-prefix); leave it out to use the \
                 operator's image",
                images.allowed_prefixes
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::InvalidConfig(problems.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::tests::policy_with;
    use serde_json::json;

    #[test]
    fn planner_rules_selector_and_image_policy_are_checked_together() {
        let mut policy = policy_with(json!({"image": "evil.example/x:1"}));
        policy.spec.planner.max_per_replica = 0;
        policy.spec.selector = Some(
            serde_json::from_value(json!({"matchExpressions": [{"key": "a", "operator": "Foo"}]}))
                .unwrap(),
        );
        let images = ImagePolicy {
            allowed_prefixes: vec!["ghcr.io/burst-prefix/".into()],
        };
        let message = validate(&policy, &images).unwrap_err().to_string();
        assert!(message.contains("maxPerReplica is 0"), "{message}");
        assert!(message.contains("selector:"), "{message}");
        assert!(message.contains("evil.example/x:1"), "{message}");
        assert!(validate(&policy_with(json!({})), &images).is_ok());
        assert!(validate(
            &policy_with(json!({"image": "ghcr.io/burst-prefix/p:2"})),
            &images
        )
        .is_ok());
    }
}
