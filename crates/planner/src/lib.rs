//! The heart of burst-prefix, as pure functions: no I/O, no clock, no async.
//!
//! - [`prefixhash`] turns prompts into chained block hashes, bit-identical to llm-d's `prefixhash`.
//! - [`plan`] places one window of requests on replicas so that shared prefixes are prefilled once.
//! - [`memory`] remembers what each replica probably still caches across windows.
//! - [`answers`] learns how long each prompt's answers are, for the time cost.
//! - [`agree`] chooses among replicas the cost accepts so that independent producers agree.
//! - [`cost`] prices a request on a replica in seconds (the time-balanced mode).
//! - [`in_flight`] places requests one at a time as they arrive (zero-wait mode), from the
//!   placements still in flight.

pub mod agree;
pub mod answers;
pub mod cost;
pub mod in_flight;
pub mod memory;
pub mod plan;
pub mod prefixhash;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use answers::AnswerBook;
pub use cost::{Busy, Pace, Speed};
pub use in_flight::{Arrival, ArrivalPlacement, InFlight, InFlightSettings, PlacementId};
pub use memory::{Memory, MemorySettings};
pub use plan::{
    assign, assign_with_memory, BalanceBy, BatchRequest, HeldList, HeldPrefixes, PlacementReason,
    Plan, PlanParams, Replica,
};
pub use prefixhash::{chain_seed, hash_prompts, BlockHash, BlockSpec, Prompt};
