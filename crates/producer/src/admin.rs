//! The admin port (`--admin-listen`), apart from the API: the shared admin router of
//! `burst-prefix-runtime` with the producer's readiness and registry.
//!
//! - `GET /healthz`: 200 while the process serves.
//! - `GET /readyz`: 200 when a valid config with at least one endpoint is in force, this
//!   replica leads and, the first time, it has heard each engine's `/metrics` when the config
//!   reads the engines' load; 503 with the reason before that, as a follower and while shutting
//!   down.
//! - `GET /metrics`: the Prometheus text format, from the producer's own registry.

use std::sync::Arc;

use axum::Router;

use burst_prefix_core::Producer;

pub fn router(producer: Producer) -> Router {
    let registry = producer.metrics().registry().clone();
    burst_prefix_runtime::admin::router(Arc::new(move || producer.readiness()), registry)
}
