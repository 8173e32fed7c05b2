//! Placement on a real engine (`make bench-engine`): vLLM or llama.cpp's llama-server replicas on
//! loopback, the simulator's workloads sent straight to them (round-robin, least-loaded), through
//! the producer's proxy and through the routers users pick instead (SGLang's, vLLM's), and what
//! the engines computed read from their own counters and answers.
//!
//! - [`engine`] starts, resets and stops the replicas and reads their counters ([`metrics`]);
//!   [`process`] is a child process stopped by its id; [`producer`] runs the proxy; [`peers`]
//!   the peer routers; [`routes`] are the routes as data; [`run`] sends a workload through one,
//!   [`second_path`] choosing the requests that go straight to a replica instead;
//! - [`prompts`] turns the workloads into what clients send (text, chat, or token IDs);
//!   [`usage`] reads the engine's usage fields; [`bound`] is the lower bound on computed tokens;
//! - [`workloads`] are the simulator's generators at bench sizes; [`check`] runs the simulator on
//!   the same prompts; [`report`] and [`chart`] publish the figures, with [`provenance`]: when,
//!   from which commit, on how many cores.

pub mod bound;
pub mod chart;
pub mod check;
pub mod engine;
pub mod metrics;
pub mod peers;
pub mod process;
pub mod producer;
pub mod prompts;
pub mod provenance;
pub mod report;
pub mod routes;
pub mod run;
pub mod second_path;
pub mod usage;
pub mod workloads;
