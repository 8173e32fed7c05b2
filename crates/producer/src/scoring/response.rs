//! What a `POST /v1/produce` request gets back (docs/behaviour.md §5): per candidate endpoint, the
//! blocks it matches (all of them on the assigned replica; elsewhere what memory says it holds,
//! else none) and the score.

use serde::{Deserialize, Serialize};

use burst_prefix_core::Placement;

/// Which endpoints a `/v1/produce` answer lists in `matches` (`?matches=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MatchesShown {
    /// Every candidate endpoint (the default).
    #[default]
    All,
    /// Only those with `matchBlocks > 0`: at most one per request, whatever the fleet's size.
    NonZero,
    /// None: the `matches` field is left out.
    None,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProduceResponse {
    /// The replica the request was placed on, or `None` (no affinity: zero everywhere).
    pub assigned_endpoint: Option<String>,
    /// Blocks of the request, summed over its prompts.
    pub total_blocks: usize,
    pub block_size_tokens: i64,
    /// One entry per candidate endpoint, in config order (see [`MatchesShown`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matches: Option<Vec<EndpointMatch>>,
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
    /// Why the window was sealed: `timer`, `hints`, `idle`, `full` or `shutdown`.
    pub sealed_by: String,
}

impl ProduceResponse {
    /// The answer for one placed request; its candidates are the endpoints it named (`None`:
    /// every endpoint of the window's config); ids the config does not know are left out.
    pub fn new(placement: &Placement, shown: MatchesShown) -> Self {
        let config = &placement.snapshot.config;
        let assigned = placement.assigned.map(|index| &config.endpoints[index]);
        let total = placement.total_blocks;
        let candidates = placement.endpoints.as_deref();
        let matches = (shown != MatchesShown::None).then(|| {
            config
                .endpoints
                .iter()
                .enumerate()
                .filter(|(_, endpoint)| candidates.is_none_or(|ids| ids.contains(&endpoint.id)))
                .map(|(index, endpoint)| (endpoint, placement.match_blocks(index)))
                // Before building entries: at 10,000 endpoints, cloning every id and address only
                // to drop them cost ~110 ms per burst.
                .filter(|&(_, matched)| shown == MatchesShown::All || matched > 0)
                .map(|(endpoint, matched)| EndpointMatch {
                    endpoint: endpoint.id.clone(),
                    address: endpoint.address.clone(),
                    match_blocks: matched,
                    total_blocks: total,
                    score: if total == 0 {
                        0.0
                    } else {
                        matched as f64 / total as f64
                    },
                })
                .collect()
        });
        ProduceResponse {
            assigned_endpoint: assigned.map(|endpoint| endpoint.id.clone()),
            total_blocks: total,
            block_size_tokens: config.planner.block_size_tokens,
            matches,
            window: WindowInfo {
                id: placement.window_id,
                size: placement.window_size,
                waited_ms: placement.waited.as_secs_f64() * 1e3,
                sealed_by: placement.sealed_by.label().to_string(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burst_prefix_api::ProducerConfig;
    use burst_prefix_core::config_store::Snapshot;
    use burst_prefix_core::place::SealReason;
    use std::sync::Arc;
    use std::time::Duration;

    fn placement(
        assigned: Option<usize>,
        total_blocks: usize,
        endpoints: Option<&[&str]>,
    ) -> Placement {
        let config = ProducerConfig::from_yaml(
            "endpoints:\n  - {id: a, address: '10.0.0.1:8000'}\n  - {id: b, address: '10.0.0.2:8000'}\n",
        )
        .unwrap();
        Placement {
            assigned,
            total_blocks,
            group: 0,
            endpoints: endpoints.map(|ids| ids.iter().map(|id| id.to_string()).collect()),
            window_id: 3,
            window_size: 2,
            waited: Duration::from_millis(100),
            sealed_by: SealReason::Timer,
            snapshot: Arc::new(Snapshot::new(config, 1)),
            memory: None,
            finish: None,
        }
    }

    fn listed(response: &ProduceResponse) -> Vec<(&str, usize, f64)> {
        response
            .matches
            .iter()
            .flatten()
            .map(|m| (m.endpoint.as_str(), m.match_blocks, m.score))
            .collect()
    }

    #[test]
    fn full_match_on_the_assigned_replica_and_zero_elsewhere() {
        let response = ProduceResponse::new(&placement(Some(1), 4, None), MatchesShown::All);
        assert_eq!(response.assigned_endpoint.as_deref(), Some("b"));
        assert_eq!(listed(&response), vec![("a", 0, 0.0), ("b", 4, 1.0)]);
        assert_eq!(response.block_size_tokens, 64);
        assert_eq!(response.window.id, 3);
        assert_eq!(response.window.waited_ms, 100.0);
    }

    #[test]
    fn no_tokens_scores_zero_and_candidates_filter() {
        let response =
            ProduceResponse::new(&placement(None, 0, Some(&["b", "x"])), MatchesShown::All);
        assert_eq!(response.assigned_endpoint, None);
        assert_eq!(listed(&response), vec![("b", 0, 0.0)]);
    }

    #[test]
    fn matches_can_list_only_nonzero_or_nothing() {
        let nonzero = ProduceResponse::new(&placement(Some(1), 4, None), MatchesShown::NonZero);
        assert_eq!(listed(&nonzero), vec![("b", 4, 1.0)]);
        let none = ProduceResponse::new(&placement(Some(1), 4, None), MatchesShown::None);
        assert_eq!(none.matches, None);
        let json = serde_json::to_value(&none).unwrap();
        assert!(json.get("matches").is_none(), "{json}");
    }
}
