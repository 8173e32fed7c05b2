//! The burst-prefix producer: inference request bodies in, placements on replicas out.
//!
//! - [`core`]: the one operation every front-end calls, [`core::Producer::place`] (parse, join
//!   the window, wait for its plan), with the config in force and the metrics.
//! - Front-ends, thin adapters around the core: [`http`] (the JSON API and the admin port) and
//!   [`proxy`] (the OpenAI-compatible router).
//! - [`sources`]: where the config comes from (a file, a ConfigMap).
//! - [`serve`]: the wiring of source, core and listeners, and graceful shutdown; [`listen`]
//!   serves one listener under connection limits.
#![forbid(unsafe_code)]

pub mod core;
pub mod http;
pub mod listen;
pub mod proxy;
pub mod serve;
pub mod sources;
