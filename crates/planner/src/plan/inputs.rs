//! What a window's placement takes: the requests, the replicas and the knobs.

use crate::prefixhash::BlockHash;

/// What the window load of a replica counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BalanceBy {
    /// Requests placed on the replica.
    #[default]
    Requests,
    /// Blocks to prefill on the replica: a unit's blocks minus the prefix it already holds there.
    Tokens,
}

/// The placement knobs of docs/behaviour.md §2, already validated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlanParams {
    /// k: at most this many members of one unit on one replica; `None` is unlimited (-1).
    pub max_per_replica: Option<usize>,
    /// N: blocks a single request must share with another request to be co-located with it;
    /// 0 co-locates identical prompts only.
    pub min_colocate_blocks: usize,
    pub balance_by: BalanceBy,
}

/// A candidate replica (one inference endpoint).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replica<'a> {
    /// Endpoint id; the last tie-break compares these byte-wise, and memory is keyed by it.
    pub id: &'a str,
    /// Live running-request count, when known (else 0); a tie-break only.
    pub running_requests: u64,
}

/// One request of the window, in arrival order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchRequest<'a> {
    /// All its block hashes (its prompts' chains, concatenated).
    pub blocks: &'a [BlockHash],
    /// Indices of the replicas it may use; `None` means all of them.
    pub allowed_replicas: Option<&'a [usize]>,
}
