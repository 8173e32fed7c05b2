//! An offline simulator of a cluster of inference replicas with block-level prefix caches, to
//! compare routing policies on the same seeded bursts of requests (`burst-prefix-producer
//! simulate`).
//!
//! - [`workload`] generates steps of requests (GRPO, agentic fan-out, multi-turn) and hashes
//!   them with the real [`burst_prefix_planner::hash_prompts`].
//! - [`cache`] is a replica's LRU block cache, as vLLM's.
//! - [`policy`] holds the routers compared: round-robin, least-loaded, approx-prefix,
//!   cache-aware, and burst (the real [`burst_prefix_planner::assign`]).
//! - [`arrivals`] serves requests arriving over time inside a step, for zero-wait policies.
//! - [`simulate`] serves each step on the replicas and accounts for prefill tokens, imbalance
//!   and co-location, and defines the lower bound; the metrics are defined there.
//! - [`report`] and [`chart`] print the table or JSON and draw the SVG; [`cli`] is the command.

pub mod arrivals;
pub mod cache;
pub mod chart;
pub mod cli;
pub mod policy;
pub mod report;
pub mod rng;
pub mod simulate;
pub mod workload;
