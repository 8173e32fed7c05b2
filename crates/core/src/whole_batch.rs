//! A whole batch planned at once, no window: `POST /v1/plan` and the `plan` subcommand. The
//! batch names its own config and replicas, so it is planned alone (no memory of other batches:
//! docs/behaviour.md, "Placement", exactly).

use burst_prefix_api::PlannerConfig;
use burst_prefix_planner::Replica;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::place::batch::plan_batch;
use crate::read::{HashedRequest, InferenceRequest, RequestError};

/// Input of `plan` and `POST /v1/plan`. Request bodies stay raw JSON until each is parsed.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlanInput<'a> {
    #[serde(default)]
    pub config: PlannerConfig,
    pub replicas: Vec<ReplicaInput>,
    #[serde(borrow)]
    pub requests: Vec<RequestInput<'a>>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReplicaInput {
    pub id: String,
    #[serde(default)]
    pub running_requests: u64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestInput<'a> {
    pub id: String,
    #[serde(borrow)]
    pub body: &'a RawValue,
}

impl<'a> PlanInput<'a> {
    /// Parses a plan input; errors name the field by its path (`requests[2].id`).
    pub fn parse(json: &'a [u8]) -> Result<Self, PlanError> {
        let mut deserializer = serde_json::Deserializer::from_slice(json);
        let input =
            serde_path_to_error::deserialize(&mut deserializer).map_err(RequestError::from_json)?;
        deserializer
            .end()
            .map_err(|e| RequestError::Json(e.to_string()))?;
        Ok(input)
    }
}

/// Output of `plan` and `POST /v1/plan`, in request order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanOutput {
    pub assignments: Vec<AssignmentOutput>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AssignmentOutput {
    pub id: String,
    pub endpoint: Option<String>,
    pub total_blocks: usize,
}

/// Why a batch could not be planned.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("invalid config: {0}")]
    Config(#[from] burst_prefix_api::ConfigError),
    #[error("{0}")]
    Request(#[from] RequestError),
    #[error("replicas: duplicate id {0:?}")]
    DuplicateReplica(String),
    #[error("{field}: {count} is more than the limit of {limit} ({source_of_limit})")]
    TooLarge {
        field: &'static str,
        count: usize,
        limit: usize,
        source_of_limit: &'static str,
    },
    /// The client went away or the producer is shutting down: the plan was abandoned.
    #[error("the plan was abandoned: its client went away or the producer is shutting down")]
    Abandoned,
}

/// How big a batch `plan_input` takes, and when it gives up.
pub struct PlanBounds<'a> {
    /// Most requests (the producer's `maxBatchSize`); `None`: unlimited.
    pub max_requests: Option<usize>,
    /// Most replicas (`--max-plan-replicas`).
    pub max_replicas: usize,
    /// Checked between requests while hashing and before placing: true abandons the plan.
    pub cancelled: &'a dyn Fn() -> bool,
}

impl PlanBounds<'_> {
    /// No bounds (the `plan` subcommand: the user's own machine).
    pub const NONE: PlanBounds<'static> = PlanBounds {
        max_requests: None,
        max_replicas: usize::MAX,
        cancelled: &|| false,
    };
}

/// Validates, hashes and plans a whole batch.
pub fn plan_input(input: &PlanInput<'_>, bounds: &PlanBounds<'_>) -> Result<PlanOutput, PlanError> {
    input.config.validate()?;
    if let Some(limit) = bounds.max_requests.filter(|&l| input.requests.len() > l) {
        return Err(PlanError::TooLarge {
            field: "requests",
            count: input.requests.len(),
            limit,
            source_of_limit: "the producer's maxBatchSize",
        });
    }
    if input.replicas.len() > bounds.max_replicas {
        return Err(PlanError::TooLarge {
            field: "replicas",
            count: input.replicas.len(),
            limit: bounds.max_replicas,
            source_of_limit: "--max-plan-replicas",
        });
    }
    let mut seen = std::collections::HashSet::new();
    for replica in &input.replicas {
        if !seen.insert(replica.id.as_str()) {
            return Err(PlanError::DuplicateReplica(replica.id.clone()));
        }
    }
    let spec = input.config.block_spec();
    let hashed: Vec<HashedRequest> = input
        .requests
        .iter()
        .enumerate()
        .map(|(i, request)| {
            if (bounds.cancelled)() {
                return Err(PlanError::Abandoned);
            }
            InferenceRequest::parse(request.body.get().as_bytes())
                .map(|parsed| HashedRequest::new(&parsed, spec))
                .map_err(|e| PlanError::Request(e.within(&format!("requests[{i}].body"))))
        })
        .collect::<Result<_, _>>()?;
    if (bounds.cancelled)() {
        return Err(PlanError::Abandoned);
    }
    let replicas: Vec<Replica<'_>> = input
        .replicas
        .iter()
        .map(|replica| Replica {
            id: &replica.id,
            running_requests: replica.running_requests,
        })
        .collect();
    // A batch planned on its own: no memory of other batches (docs/behaviour.md §4 exactly).
    let plan = plan_batch(&input.config.plan_params(), &replicas, &hashed, None);
    let assignments = input
        .requests
        .iter()
        .zip(&hashed)
        .zip(&plan.assignments)
        .map(|((request, hashed), assigned)| AssignmentOutput {
            id: request.id.clone(),
            endpoint: assigned.map(|r| input.replicas[r].id.clone()),
            total_blocks: hashed.blocks.len(),
        })
        .collect();
    Ok(PlanOutput { assignments })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn plan_json(value: Value) -> Result<PlanOutput, PlanError> {
        let json = value.to_string();
        plan_input(&PlanInput::parse(json.as_bytes())?, &PlanBounds::NONE)
    }

    #[test]
    fn identical_prompts_share_an_endpoint() {
        let output = plan_json(json!({
            "config": {"maxPerReplica": 2},
            "replicas": [{"id": "ns/b-rank-0"}, {"id": "ns/a-rank-0", "runningRequests": 1}],
            "requests": [
                {"id": "r1", "body": {"model": "m", "prompt": "the same prompt"}},
                {"id": "r2", "body": {"model": "m", "prompt": "the same prompt"}},
                {"id": "r3", "body": {"model": "m", "prompt": "the same prompt"}},
                {"id": "r4", "body": {"model": "m", "prompt": "a lone prompt"}},
            ],
        }))
        .unwrap();
        let endpoints: Vec<_> = output
            .assignments
            .iter()
            .map(|a| a.endpoint.as_deref())
            .collect();
        // k = 2: two on the replica with fewer running requests, the third spills.
        assert_eq!(
            endpoints,
            vec![
                Some("ns/b-rank-0"),
                Some("ns/b-rank-0"),
                Some("ns/a-rank-0"),
                None
            ]
        );
        assert_eq!(output.assignments[0].total_blocks, 1);
        assert_eq!(output.assignments[3].id, "r4");
    }

    #[test]
    fn endpoint_lists_limit_the_candidates() {
        let output = plan_json(json!({
            "replicas": [{"id": "a"}, {"id": "b"}],
            "requests": [
                {"id": "r1", "body": {"model": "m", "prompt": [1, 2, 3]}},
                {"id": "r2", "body": {"model": "m", "prompt": [1, 2, 3], "endpoints": ["b", "unknown"]}},
            ],
        }))
        .unwrap();
        assert_eq!(output.assignments[0].endpoint.as_deref(), Some("a"));
        assert_eq!(output.assignments[1].endpoint, None);
    }

    #[test]
    fn errors_name_the_request_and_field() {
        let err = plan_json(json!({
            "replicas": [{"id": "a"}],
            "requests": [{"id": "r1", "body": {"model": "m", "prompt": "x"}}, {"id": "r2", "body": {"prompt": "x"}}],
        }))
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "requests[1].body: `model` is missing (required)"
        );
        let err = plan_json(json!({
            "config": {"windowDurationMs": -1},
            "replicas": [],
            "requests": [],
        }))
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid config: windowDurationMs is -1, but must be 0 (zero-wait) or between 1 and 10000"
        );
        let err =
            plan_json(json!({"replicas": [{"id": "a"}, {"id": "a"}], "requests": []})).unwrap_err();
        assert_eq!(err.to_string(), "replicas: duplicate id \"a\"");
        let input = json!({"replicas": [{"id": "a"}, {"id": "b"}], "requests": [
            {"id": "r", "body": {"model": "m", "prompt": "x"}},
            {"id": "s", "body": {"model": "m", "prompt": "y"}}]})
        .to_string();
        let input = PlanInput::parse(input.as_bytes()).unwrap();
        let bounds =
            |max_requests, max_replicas, cancelled: &'static dyn Fn() -> bool| PlanBounds {
                max_requests,
                max_replicas,
                cancelled,
            };
        assert_eq!(
            plan_input(&input, &bounds(Some(1), 10, &|| false))
                .unwrap_err()
                .to_string(),
            "requests: 2 is more than the limit of 1 (the producer's maxBatchSize)"
        );
        assert_eq!(
            plan_input(&input, &bounds(None, 1, &|| false))
                .unwrap_err()
                .to_string(),
            "replicas: 2 is more than the limit of 1 (--max-plan-replicas)"
        );
        assert!(matches!(
            plan_input(&input, &bounds(None, 10, &|| true)),
            Err(PlanError::Abandoned)
        ));
        let err = plan_json(json!({"replicas": [{"id": 1}], "requests": []})).unwrap_err();
        assert_eq!(
            err.to_string(),
            "replicas[0].id: expected a string, got a number"
        );
        let err =
            plan_json(json!({"replicas": [], "requests": [{"id": "r", "body": [1]}]})).unwrap_err();
        assert_eq!(
            err.to_string(),
            "requests[0].body: expected a JSON object, got an array"
        );
    }
}
