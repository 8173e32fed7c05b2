//! Pure validation of a policy before anything is applied: the planner rules (docs/behaviour.md §2,
//! the one rule table), the selector, the KV-event endpoint the producer binds and the tokenizer it
//! mounts, and whether this operator lets a policy choose its image. The CRD's CEL rules refuse
//! most of this when the policy is written; this catches what an older CRD let through, and what
//! CEL cannot see (the policy's name).

use burst_prefix_api::kv_events::{bind_port, BIND_PORT_CLASH};
use burst_prefix_api::policy::BurstPrefixPolicy;
use kube::core::Selector;

use crate::desired::child_name;
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
    problems.extend(kv_events_problem(policy));
    problems.extend(tokenizer_problems(policy));
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

/// A bind that is not `tcp://HOST:PORT` on every interface, or whose port is one of the
/// producer's others.
fn kv_events_problem(policy: &BurstPrefixPolicy) -> Option<String> {
    let bind = policy
        .spec
        .planner
        .engines
        .kv_events
        .as_ref()?
        .bind
        .as_deref()?;
    let producer = &policy.spec.producer;
    match bind_port(bind) {
        Err(invalid) => Some(invalid.to_string()),
        Ok(port)
            if [producer.port, producer.metrics_port, producer.epp_port]
                .contains(&i32::from(port)) =>
        {
            Some(format!("{BIND_PORT_CLASH} (it is {port})"))
        }
        Ok(_) => None,
    }
}

/// A tokenizer volume that names no source or several, leaves its volume, or is the
/// producer's own ConfigMap (whose only key is its config).
fn tokenizer_problems(policy: &BurstPrefixPolicy) -> Vec<String> {
    let Some(tokenizer) = &policy.spec.producer.tokenizer else {
        return Vec::new();
    };
    let mut problems = Vec::new();
    if tokenizer.kind().is_none() {
        problems.push(
            "producer.tokenizer needs exactly one of configMap, persistentVolumeClaim and image"
                .to_string(),
        );
    }
    if !tokenizer.sub_path_is_inside() {
        problems.push(format!(
            "producer.tokenizer.subPath {:?} must be a relative path inside the volume, without \
             a '..' element",
            tokenizer.sub_path.as_deref().unwrap_or_default()
        ));
    }
    if tokenizer.config_map.as_deref() == Some(child_name(policy).as_str()) {
        problems.push(format!(
            "producer.tokenizer.configMap {:?} is the producer's own ConfigMap, which the \
             operator writes: put the tokenizer's files in a ConfigMap of another name",
            child_name(policy)
        ));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::tests::{policy_from, policy_with};
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

    fn problems(extra: serde_json::Value) -> Option<String> {
        validate(&policy_from(extra), &ImagePolicy::default())
            .err()
            .map(|e| e.to_string())
    }

    #[test]
    fn a_bind_must_be_tcp_on_every_interface_on_a_port_of_its_own() {
        let bind = |bind: &str, producer: serde_json::Value| {
            problems(json!({
                "engines": {"kvEvents": {"bind": bind}},
                "producer": producer,
            }))
        };
        assert_eq!(bind("tcp://0.0.0.0:5557", json!({})), None);
        assert_eq!(bind("tcp://[::]:9091", json!({"metricsPort": 9090})), None);
        // libzmq's wildcard, but not the producer's ZeroMQ's.
        assert!(bind("tcp://*:5557", json!({})).is_some());
        let message = bind("0.0.0.0:5557", json!({})).unwrap();
        assert!(
            message.starts_with(
                "engines.kvEvents.bind is \"0.0.0.0:5557\", but must be tcp://HOST:PORT"
            ),
            "{message}"
        );
        for (bind_to, producer) in [
            ("tcp://0.0.0.0:8080", json!({})),
            ("tcp://0.0.0.0:9090", json!({})),
            ("tcp://[::]:9002", json!({})),
            ("tcp://:::7000", json!({"eppPort": 7000})),
        ] {
            let message = bind(bind_to, producer).unwrap();
            assert!(
                message.starts_with("the port of engines.kvEvents.bind must differ from"),
                "{bind_to}: {message}"
            );
        }
        // connectPort has its own rule in the planner's table.
        assert!(
            problems(json!({"engines": {"kvEvents": {"connectPort": 70000}}}))
                .unwrap()
                .contains("engines.kvEvents.connectPort is 70000")
        );
    }

    #[test]
    fn a_tokenizer_names_one_volume_inside_it_and_not_the_producers_config() {
        let tokenizer =
            |tokenizer: serde_json::Value| problems(json!({"producer": {"tokenizer": tokenizer}}));
        assert_eq!(tokenizer(json!({"configMap": "qwen-tokenizer"})), None);
        assert_eq!(
            tokenizer(json!({"persistentVolumeClaim": "models", "subPath": "hub/Qwen3-8B"})),
            None
        );
        assert_eq!(
            tokenizer(json!({"image": "models/qwen:1", "subPath": "a..b"})),
            None
        );
        for (volume, expected) in [
            (
                json!({}),
                "exactly one of configMap, persistentVolumeClaim and image",
            ),
            (
                json!({"configMap": "a", "persistentVolumeClaim": "b"}),
                "exactly one of",
            ),
            (
                json!({"configMap": "a", "subPath": "../secrets"}),
                "subPath \"../secrets\" must be a relative path",
            ),
            (
                json!({"image": "m:1", "subPath": "/etc"}),
                "must be a relative path",
            ),
            (
                json!({"image": "m:1", "subPath": "a/../../b"}),
                "must be a relative path",
            ),
            (
                json!({"configMap": "rl-producer"}),
                "producer.tokenizer.configMap \"rl-producer\" is the producer's own ConfigMap",
            ),
        ] {
            let message = tokenizer(volume.clone()).unwrap_or_default();
            assert!(message.contains(expected), "{volume}: {message}");
        }
    }
}
