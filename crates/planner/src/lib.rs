//! The heart of burst-prefix, as pure functions: no I/O, no clock, no async.
//!
//! - [`prefixhash`] turns prompts into chained block hashes, bit-identical to llm-d's `prefixhash`.
//! - [`plan`] places one window of requests on replicas so that shared prefixes are prefilled once.

pub mod plan;
pub mod prefixhash;

pub use plan::{assign, BalanceBy, BatchRequest, Plan, PlanParams, Replica};
pub use prefixhash::{chain_seed, hash_prompts, BlockHash, BlockSpec, Prompt};
