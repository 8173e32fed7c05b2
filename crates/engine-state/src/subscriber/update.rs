//! What the subscriber sends the index's owner, in each replica's order.

use crate::decode::Batch;

/// Why a replica's state was dropped by the subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClearReason {
    /// The publisher's sequence went backwards: the engine restarted.
    Restarted,
    /// Batches were lost and could not be replayed.
    Lost,
    /// A batch did not decode.
    Undecodable,
}

impl ClearReason {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            ClearReason::Restarted => "restarted",
            ClearReason::Lost => "lost",
            ClearReason::Undecodable => "undecodable",
        }
    }
}

/// What the subscriber sends the index's owner, in each replica's order.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineUpdate {
    /// Apply this batch to the replica (`EngineIndex::apply`).
    Batch {
        /// The replica (endpoint) id.
        replica: String,
        /// The publisher's sequence number of the batch.
        seq: u64,
        /// The batch.
        batch: Batch,
    },
    /// Drop what the replica holds (`EngineIndex::clear`).
    Clear {
        /// The replica (endpoint) id.
        replica: String,
        /// Why.
        reason: ClearReason,
    },
}
