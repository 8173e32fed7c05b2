//! The burst-prefix producer: inference request bodies in, placements on replicas out.
//!
//! The core (every rule a request meets, the config in force, the metrics) is its own crate,
//! `burst-prefix-core`, which knows no front-end; docs/architecture.md follows a request through it.
//! - Front-ends, thin adapters around the core that import nothing from each other:
//!   [`scoring`] (`/v1/produce`, `/v1/plan`, `/v1/endpoints`), [`proxy`] (the OpenAI-compatible
//!   router) and [`epp`] (the gateway endpoint picker, gRPC); and [`admin`] (health, metrics).
//! - [`config_sources`]: where the config comes from (a file, a ConfigMap); [`engine_feeds`]:
//!   what the engines say (KV events, load), as the config asks.
//! - [`serve`]: the command line, the listeners, leader election and graceful shutdown;
//!   [`listen`] serves one listener under connection limits, [`tls`] with TLS.

pub mod admin;
pub mod config_sources;
pub mod engine_feeds;
pub mod epp;
pub mod listen;
pub mod proxy;
pub mod scoring;
pub mod serve;
pub mod tls;
