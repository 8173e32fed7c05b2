//! What a `POST /v1/produce` request gets back (SPEC §5): per candidate endpoint, the blocks it
//! matches (all of them on the assigned replica, none elsewhere) and the score.

use serde::{Deserialize, Serialize};

use crate::window::Placement;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProduceResponse {
    /// The replica the request was placed on, or `None` (no affinity: zero everywhere).
    pub assigned_endpoint: Option<String>,
    /// Blocks of the request, summed over its prompts.
    pub total_blocks: usize,
    pub block_size_tokens: i64,
    /// One entry per candidate endpoint, in config order.
    pub matches: Vec<EndpointMatch>,
    pub window: WindowInfo,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointMatch {
    pub endpoint: String,
    pub address: String,
    pub match_blocks: usize,
    pub total_blocks: usize,
    /// `matchBlocks / totalBlocks`, 0 when `totalBlocks` is 0.
    pub score: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WindowInfo {
    pub id: u64,
    /// Requests planned in the window.
    pub size: usize,
    /// From joining the window to being released with the plan.
    pub waited_ms: f64,
}

impl ProduceResponse {
    /// The answer for one placed request. `candidates` is the request's own endpoint list
    /// (`None`: every endpoint of the window's config); ids the config does not know are left out.
    pub fn new(placement: &Placement, candidates: Option<&[String]>) -> Self {
        let config = &placement.snapshot.config;
        let assigned = placement.assigned.map(|index| &config.endpoints[index]);
        let total = placement.total_blocks;
        let matches = config
            .endpoints
            .iter()
            .filter(|endpoint| candidates.is_none_or(|ids| ids.contains(&endpoint.id)))
            .map(|endpoint| {
                let matched = if assigned.is_some_and(|a| a.id == endpoint.id) {
                    total
                } else {
                    0
                };
                EndpointMatch {
                    endpoint: endpoint.id.clone(),
                    address: endpoint.address.clone(),
                    match_blocks: matched,
                    total_blocks: total,
                    score: if total == 0 {
                        0.0
                    } else {
                        matched as f64 / total as f64
                    },
                }
            })
            .collect();
        ProduceResponse {
            assigned_endpoint: assigned.map(|endpoint| endpoint.id.clone()),
            total_blocks: total,
            block_size_tokens: config.planner.block_size_tokens,
            matches,
            window: WindowInfo {
                id: placement.window_id,
                size: placement.window_size,
                waited_ms: placement.waited.as_secs_f64() * 1e3,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config_store::Snapshot;
    use burst_prefix_api::ProducerConfig;
    use std::sync::Arc;
    use std::time::Duration;

    fn placement(assigned: Option<usize>, total_blocks: usize) -> Placement {
        let config = ProducerConfig::from_yaml(
            "endpoints:\n  - {id: a, address: '10.0.0.1:8000'}\n  - {id: b, address: '10.0.0.2:8000'}\n",
        )
        .unwrap();
        Placement {
            assigned,
            total_blocks,
            window_id: 3,
            window_size: 2,
            waited: Duration::from_millis(100),
            snapshot: Arc::new(Snapshot {
                config,
                generation: 1,
            }),
        }
    }

    #[test]
    fn full_match_on_the_assigned_replica_and_zero_elsewhere() {
        let response = ProduceResponse::new(&placement(Some(1), 4), None);
        assert_eq!(response.assigned_endpoint.as_deref(), Some("b"));
        let scores: Vec<_> = response
            .matches
            .iter()
            .map(|m| (m.endpoint.as_str(), m.match_blocks, m.score))
            .collect();
        assert_eq!(scores, vec![("a", 0, 0.0), ("b", 4, 1.0)]);
        assert_eq!(response.block_size_tokens, 64);
        assert_eq!(response.window.id, 3);
        assert_eq!(response.window.waited_ms, 100.0);
    }

    #[test]
    fn no_tokens_scores_zero_and_candidates_filter() {
        let response = ProduceResponse::new(&placement(None, 0), Some(&["b".into(), "x".into()]));
        assert_eq!(response.assigned_endpoint, None);
        assert_eq!(response.matches.len(), 1);
        assert_eq!(response.matches[0].endpoint, "b");
        assert_eq!(response.matches[0].score, 0.0);
    }
}
