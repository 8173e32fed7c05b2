//! The producer's config file: the planner config plus the replica set in force. The operator
//! renders it into the `config.yaml` key of the producer's ConfigMap; `--config FILE` reads the
//! same format.

use std::collections::HashSet;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::{ConfigError, PlannerConfig, Violation};

/// One inference endpoint (docs/behaviour.md §6): a (pod, target port) pair.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Endpoint {
    /// `namespace/pod-rank-i`.
    pub id: String,
    /// `podIP:port`.
    pub address: String,
    /// Live running-request count, when known; used only to break ties.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_requests: Option<u64>,
}

impl Endpoint {
    /// Its address as an IP and a port: what the engine feeds (KV events, `/metrics`) reach.
    /// `None` for a host name, which they skip.
    pub fn socket_addr(&self) -> Option<std::net::SocketAddr> {
        self.address.parse().ok()
    }
}

/// The whole producer config: docs/behaviour.md §2 fields, flat, plus `endpoints`. Unknown fields
/// are refused by name (serde cannot deny unknown fields through `flatten`, hence the `try_from`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", try_from = "serde_yaml::Mapping")]
pub struct ProducerConfig {
    #[serde(flatten)]
    pub planner: PlannerConfig,
    #[serde(default)]
    pub endpoints: Vec<Endpoint>,
}

impl ProducerConfig {
    /// Parses YAML or JSON (JSON is YAML) and validates it. A config is a mapping that names
    /// `endpoints` (an empty list is valid: no pod is ready): an empty document, comments only,
    /// a bare `---`, `{}`, a list or a scalar is refused, so that a truncated or mistaken file
    /// never empties the replica set.
    pub fn from_yaml(text: &str) -> Result<Self, ProducerConfigError> {
        let value: serde_yaml::Value =
            serde_yaml::from_str(text).map_err(|e| ProducerConfigError::Parse(e.to_string()))?;
        let shape = match &value {
            serde_yaml::Value::Mapping(_) => None,
            serde_yaml::Value::Null => {
                Some("an empty document (nothing, comments only, or a bare `---`)")
            }
            serde_yaml::Value::Sequence(_) => Some("a list"),
            serde_yaml::Value::Tagged(_) => Some("a tagged value"),
            _ => Some("a scalar"),
        };
        if let Some(shape) = shape {
            return Err(ProducerConfigError::Parse(format!(
                "expected a mapping with `endpoints`, got {shape}"
            )));
        }
        let names_endpoints = value.get("endpoints").is_some();
        let config: ProducerConfig =
            serde_yaml::from_value(value).map_err(|e| ProducerConfigError::Parse(e.to_string()))?;
        config.validate()?;
        if !names_endpoints {
            return Err(ProducerConfigError::Parse(
                "`endpoints` is missing (write `endpoints: []` for a config with no replica yet)"
                    .into(),
            ));
        }
        Ok(config)
    }

    /// The planner rules plus: endpoint ids unique and non-empty, addresses `host:port`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut violations = match self.planner.validate() {
            Ok(()) => Vec::new(),
            Err(ConfigError(violations)) => violations,
        };
        let mut seen = HashSet::new();
        for (i, endpoint) in self.endpoints.iter().enumerate() {
            if endpoint.id.is_empty() {
                violations.push(Violation {
                    field: "endpoints[].id",
                    value: format!("\"\" (endpoint {i})"),
                    requirement: "must not be empty",
                });
            } else if !seen.insert(endpoint.id.as_str()) {
                violations.push(Violation {
                    field: "endpoints[].id",
                    value: format!("{:?}", endpoint.id),
                    requirement: "must be unique",
                });
            }
            if !valid_address(&endpoint.address) {
                violations.push(Violation {
                    field: "endpoints[].address",
                    value: format!("{:?} (endpoint {:?})", endpoint.address, endpoint.id),
                    requirement: "must be host:port",
                });
            }
        }
        if violations.is_empty() {
            Ok(())
        } else {
            Err(ConfigError(violations))
        }
    }

    /// The YAML the operator writes and the producer reads.
    pub fn to_yaml(&self) -> String {
        serde_yaml::to_string(self).expect("a producer config always serializes")
    }
}

impl TryFrom<serde_yaml::Mapping> for ProducerConfig {
    type Error = serde_yaml::Error;

    fn try_from(mut fields: serde_yaml::Mapping) -> Result<Self, Self::Error> {
        let endpoints = match fields.remove("endpoints") {
            Some(endpoints) => serde_yaml::from_value(endpoints)?,
            None => Vec::new(),
        };
        let planner = serde_yaml::from_value(serde_yaml::Value::Mapping(fields))?;
        Ok(ProducerConfig { planner, endpoints })
    }
}

fn valid_address(address: &str) -> bool {
    match address.rsplit_once(':') {
        Some((host, port)) => !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0),
        None => false,
    }
}

/// Why a producer config was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProducerConfigError {
    #[error("cannot parse config: {0}")]
    Parse(String),
    #[error("invalid config: {0}")]
    Invalid(#[from] ConfigError),
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
windowDurationMs: 50
maxPerReplica: 4
endpoints:
  - id: ns/pod-a-rank-0
    address: 10.0.0.1:8000
  - id: ns/pod-b-rank-0
    address: 10.0.0.2:8000
    runningRequests: 3
"#;

    #[test]
    fn parses_flat_fields_and_endpoints() {
        let config = ProducerConfig::from_yaml(GOOD).unwrap();
        assert_eq!(config.planner.window_duration_ms, Some(50));
        assert_eq!(config.planner.max_per_replica, 4);
        assert_eq!(config.planner.block_size_tokens, 64);
        assert_eq!(config.endpoints.len(), 2);
        assert_eq!(config.endpoints[1].running_requests, Some(3));
        assert_eq!(
            ProducerConfig::from_yaml(&config.to_yaml()).unwrap(),
            config
        );
    }

    #[test]
    fn json_is_accepted() {
        let json =
            r#"{"blockSizeTokens": 16, "endpoints": [{"id": "a", "address": "127.0.0.1:1"}]}"#;
        assert_eq!(
            ProducerConfig::from_yaml(json)
                .unwrap()
                .planner
                .block_size_tokens,
            16
        );
    }

    #[test]
    fn unknown_fields_are_refused_by_name() {
        let err = ProducerConfig::from_yaml("windowMs: 5\n").unwrap_err();
        assert!(err.to_string().contains("windowMs"), "{err}");
        let err = ProducerConfig::from_yaml(
            "endpoints:\n  - id: a\n    address: 1.2.3.4:80\n    weight: 2\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("weight"), "{err}");
    }

    #[test]
    fn only_a_mapping_that_names_endpoints_is_a_config() {
        for (text, reason) in [
            ("", "an empty document"),
            ("# only a comment\n", "an empty document"),
            ("---\n", "an empty document"),
            ("- endpoints: []\n", "a list"),
            ("42\n", "a scalar"),
            ("{}", "`endpoints` is missing"),
            ("windowDurationMs: 50\n", "`endpoints` is missing"),
        ] {
            let err = ProducerConfig::from_yaml(text).unwrap_err().to_string();
            assert!(err.contains(reason), "{text:?}: {err}");
        }
        assert!(ProducerConfig::from_yaml("endpoints: []\n")
            .unwrap()
            .endpoints
            .is_empty());
    }

    #[test]
    fn invalid_values_name_the_field() {
        let err = ProducerConfig::from_yaml("maxPerReplica: 0\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid config: maxPerReplica is 0, but must be -1 (unlimited) or >= 1"
        );
        let err = ProducerConfig::from_yaml(
            "endpoints:\n  - {id: a, address: '1.2.3.4:80'}\n  - {id: a, address: nowhere}\n",
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("endpoints[].id is \"a\", but must be unique"),
            "{text}"
        );
        assert!(
            text.contains("endpoints[].address is \"nowhere\""),
            "{text}"
        );
    }
}
