//! The fleet bench (`make bench-fleet`, bench/fleet/README.md): placement measured in time on
//! 16 and 64 replicas of llm-d's vLLM simulator, llm-d-inference-sim, with latencies from BLIS's
//! calibrated profiles of a named model on named GPUs (a fast and a slow class in one fleet).
//!
//! - [`fleet`] reads the fleet's classes and derives each replica's simulator flags; [`sim`]
//!   starts the replicas and reads their own metrics back;
//! - [`front`] is the direct routes' forwarding process, [`producer`] runs burst-prefix's
//!   release binary; the peer routers and the routes as data come from the engine bench
//!   (`burst_prefix_engine_bench::{peers, routes}`);
//! - [`load`] is the bench's own driver (RL steps, agent fan-outs), [`inference_perf`] runs the
//!   field's load generator; [`cpu`] reads each process's CPU from /proc;
//! - [`run`] runs one workload through one route; [`report`] and [`chart`] publish the figures;
//!   [`netns`] puts the whole bench in a network namespace of its own.

pub mod chart;
pub mod cpu;
pub mod fleet;
pub mod front;
pub mod inference_perf;
pub mod load;
pub mod netns;
pub mod producer;
pub mod report;
pub mod run;
pub mod sim;
