//! Placement judged step by step in BLIS (`make bench-blis`, docs/load-benches.md): llm-d's
//! discrete-event simulator of vLLM (continuous batching, chunked prefill, KV preemption, trained
//! step times) runs every route on the same traces, ours among BLIS's own routers.
//!
//! - [`placer`] is ours there: the producer's core as a BLIS routing policy, over the pipes of
//!   [`protocol`], on BLIS's simulated clock;
//! - [`workloads`] writes the traces (TraceV2) the bench runs;
//! - [`blis`] builds BLIS at its pinned commit with our policy added, and runs one route on one
//!   trace; [`report`] and [`chart`] publish the figures.

pub mod bench;
pub mod blis;
pub mod chart;
pub mod child;
pub mod generated;
pub mod placer;
pub mod protocol;
pub mod report;
pub mod routes;
pub mod tables;
pub mod workloads;
