//! The producer's config: the validated planner config and the endpoints in force.

use burst_prefix_api::policy::BurstPrefixPolicy;
use burst_prefix_api::{Endpoint, ProducerConfig};
use k8s_openapi::api::core::v1::ConfigMap;

use super::{metadata, CONFIG_KEY};

pub fn build(policy: &BurstPrefixPolicy, endpoints: Vec<Endpoint>) -> ConfigMap {
    let config = ProducerConfig {
        planner: policy.spec.planner.clone(),
        endpoints,
    };
    ConfigMap {
        metadata: metadata(policy),
        data: Some([(CONFIG_KEY.to_string(), config.to_yaml())].into()),
        ..ConfigMap::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::tests::policy;

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
}
