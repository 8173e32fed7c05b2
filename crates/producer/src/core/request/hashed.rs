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
        HashedRequest {
            blocks: request.block_hashes(spec).concat(),
            endpoints: request
                .endpoints
                .as_ref()
                .map(|ids| ids.iter().map(|id| id.to_string()).collect()),
        }
    }
}
