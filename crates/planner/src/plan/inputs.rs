//! What a window's placement takes: the requests, the replicas and the knobs.

use crate::cost::Pace;
use crate::prefixhash::BlockHash;

/// What the window load of a replica counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BalanceBy {
    /// Requests placed on the replica.
    #[default]
    Requests,
    /// Blocks to prefill on the replica: a unit's blocks minus the prefix it already holds there.
    Tokens,
    /// Seconds (`crate::cost`): each request goes where it is predicted to be answered first,
    /// counting the time it takes from the requests already there, from each replica's
    /// [`Replica::pace`]. Needs memory in a window (a window without memory is llm-d's).
    Time,
}

/// The placement knobs of docs/behaviour.md §2, already validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanParams {
    /// k: at most this many members of one unit on one replica; `None` is unlimited (-1).
    pub max_per_replica: Option<usize>,
    /// N: blocks a single request must share with another request to be co-located with it;
    /// 0 co-locates identical prompts only.
    pub min_colocate_blocks: usize,
    pub balance_by: BalanceBy,
    /// Tokens per prefix block (the time cost's prefill is priced in tokens).
    pub block_tokens: u32,
    /// The answer length the time cost expects of a request, in tokens, when it asks for no
    /// fewer ([`PlanParams::answer_tokens`]).
    pub output_tokens: u32,
    /// Other producers share this one's traffic (active-active): in time mode, a prompt no
    /// replica holds whole goes where they would all put it (`crate::agree`) rather than to
    /// the cheapest replica.
    pub agree_with_peers: bool,
}

impl Default for PlanParams {
    /// The config's defaults: unlimited k, N = 0, requests, 64-token blocks, 256-token answers,
    /// no peers.
    fn default() -> Self {
        PlanParams {
            max_per_replica: None,
            min_colocate_blocks: 0,
            balance_by: BalanceBy::Requests,
            block_tokens: 64,
            output_tokens: 256,
            agree_with_peers: false,
        }
    }
}

impl PlanParams {
    /// The answer length the time cost prices a request at: what its prompt's answers took
    /// (`expected`, learned: `crate::answers`), else `output_tokens`; never more than the
    /// request's own `max_tokens` (a 4-token answer decodes beside a group in next to no time;
    /// pricing it at 256 would split the group for nothing).
    pub fn answer_tokens(&self, max_answer_tokens: Option<u32>, expected: Option<f64>) -> f64 {
        let expected = expected
            .filter(|tokens| tokens.is_finite() && *tokens >= 1.0)
            .unwrap_or(f64::from(self.output_tokens));
        max_answer_tokens.map_or(expected, |max| expected.min(f64::from(max)))
    }
}

/// A candidate replica (one inference endpoint).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Replica<'a> {
    /// Endpoint id; the last tie-break compares these byte-wise, and memory is keyed by it.
    pub id: &'a str,
    /// Live running-request count, when known (else 0); a tie-break only.
    pub running_requests: u64,
    /// How fast it works and what it is busy with, for [`BalanceBy::Time`].
    pub pace: Pace,
}

impl<'a> Replica<'a> {
    /// A replica of the default speed with nothing running.
    pub fn new(id: &'a str) -> Self {
        Replica {
            id,
            running_requests: 0,
            pace: Pace::default(),
        }
    }
}

/// One request of the window, in arrival order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchRequest<'a> {
    /// All its block hashes (its prompts' chains, concatenated).
    pub blocks: &'a [BlockHash],
    /// Indices of the replicas it may use; `None` means all of them.
    pub allowed_replicas: Option<&'a [usize]>,
}
