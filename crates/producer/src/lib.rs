//! The burst-prefix producer: inference request bodies in, per-replica prefix-match info out.
//!
//! Follow one request: [`request`] parses the body a gateway forwards into prompts and hashes
//! them, [`batch`] maps a batch of hashed requests onto the planner and back to endpoint ids.

pub mod batch;
pub mod request;
