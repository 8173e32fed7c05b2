//! Placement on a real engine (`make bench-engine`): llama.cpp's llama-server replicas on
//! loopback, the simulator's workloads sent straight to them (round-robin, least-loaded) and
//! through the producer's proxy, and what the engine computed read from its own usage fields.
//!
//! - [`engine`] starts and stops the replicas; [`run`] sends a workload through one route;
//! - [`usage`] reads the engine's usage fields; [`bound`] is the lower bound on computed tokens;
//! - [`workloads`] are the simulator's generators at bench sizes; [`check`] runs the simulator on
//!   the same prompts; [`report`] and [`chart`] publish the figures.

pub mod bound;
pub mod chart;
pub mod check;
pub mod engine;
pub mod report;
pub mod run;
pub mod usage;
pub mod workloads;
