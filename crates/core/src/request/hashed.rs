//! A request hashed into its prefix blocks: all it keeps of its body while it waits.

use burst_prefix_planner::{BlockHash, BlockSpec};

use super::InferenceRequest;

/// A request ready for the planner: all it keeps of its body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HashedRequest {
    /// Its prompts' chains, concatenated.
    pub blocks: Vec<BlockHash>,
    /// Candidate endpoint ids; `None` means all.
    pub endpoints: Option<Vec<String>>,
}

impl HashedRequest {
    /// What the request holds while it waits in a window.
    pub fn held_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.blocks.len() * std::mem::size_of::<BlockHash>()
            + self
                .endpoints
                .as_ref()
                .map_or(0, |ids| ids.iter().map(|id| id.len() + 24).sum())
    }

    pub fn new(request: &InferenceRequest<'_>, spec: BlockSpec) -> Self {
        Self::from_chains(request.block_hashes(spec), request)
    }

    /// From `request`'s chains, already hashed.
    pub fn from_chains(chains: Vec<Vec<BlockHash>>, request: &InferenceRequest<'_>) -> Self {
        HashedRequest {
            blocks: chains.concat(),
            endpoints: request
                .endpoints
                .as_ref()
                .map(|ids| ids.iter().map(|id| id.to_string()).collect()),
        }
    }
}
