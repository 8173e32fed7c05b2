//! The producer's config: the validated planner config and the endpoints in force. A policy
//! that mounts a tokenizer (`spec.producer.tokenizer`) but names no `engines.tokenizer` gets the
//! mounted directory as `engines.tokenizer.path`.

use burst_prefix_api::policy::BurstPrefixPolicy;
use burst_prefix_api::{Endpoint, ProducerConfig, TokenizerConfig};
use k8s_openapi::api::core::v1::ConfigMap;

use super::{metadata, tokenizer, CONFIG_KEY};

pub fn build(policy: &BurstPrefixPolicy, endpoints: Vec<Endpoint>) -> ConfigMap {
    let mut planner = policy.spec.planner.clone();
    if planner.engines.tokenizer.is_none() {
        planner.engines.tokenizer = tokenizer::dir(policy).map(|path| TokenizerConfig { path });
    }
    let config = ProducerConfig { planner, endpoints };
    ConfigMap {
        metadata: metadata(policy),
        data: Some([(CONFIG_KEY.to_string(), config.to_yaml())].into()),
        ..ConfigMap::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::tests::{policy, policy_from};
    use serde_json::json;

    fn rendered(policy: &BurstPrefixPolicy) -> ProducerConfig {
        ProducerConfig::from_yaml(&build(policy, vec![]).data.unwrap()[CONFIG_KEY]).unwrap()
    }

    #[test]
    fn holds_the_config_and_endpoints_in_the_producer_format() {
        let endpoint = Endpoint {
            id: "ml/a-rank-0".into(),
            address: "10.0.0.1:8000".into(),
            running_requests: None,
        };
        let config_map = build(&policy(), vec![endpoint.clone()]);
        let config = ProducerConfig::from_yaml(&config_map.data.unwrap()[CONFIG_KEY]).unwrap();
        assert_eq!(config.planner.max_per_replica, 4);
        assert_eq!(config.endpoints, vec![endpoint]);
    }

    #[test]
    fn a_mounted_tokenizer_is_the_config_path_unless_the_policy_names_one() {
        assert_eq!(rendered(&policy()).planner.engines.tokenizer, None);
        let mounted = policy_from(json!({
            "producer": {"tokenizer": {"configMap": "qwen-tokenizer"}},
        }));
        assert_eq!(
            rendered(&mounted).planner.engines.tokenizer,
            Some(TokenizerConfig {
                path: "/etc/burst-prefix/tokenizer".into()
            })
        );
        let in_a_claim = policy_from(json!({
            "producer": {"tokenizer": {"persistentVolumeClaim": "models", "subPath": "Qwen3-8B"}},
            "engines": {"kvEvents": {"connectPort": 5557}, "loadIntervalMs": 500},
        }));
        let config = rendered(&in_a_claim);
        assert_eq!(
            config.planner.engines.tokenizer.unwrap().path,
            "/etc/burst-prefix/tokenizer/Qwen3-8B"
        );
        // The rest of `engines` is passed as it is.
        assert_eq!(config.planner.engines.load_interval_ms, 500);
        assert_eq!(config.planner.engines.kv_events.unwrap().connect_port, 5557);
        let named = policy_from(json!({
            "producer": {"tokenizer": {"configMap": "qwen-tokenizer"}},
            "engines": {"tokenizer": {"path": "/etc/burst-prefix/tokenizer/chat"}},
        }));
        assert_eq!(
            rendered(&named).planner.engines.tokenizer.unwrap().path,
            "/etc/burst-prefix/tokenizer/chat"
        );
    }
}
