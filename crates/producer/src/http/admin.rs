//! The admin port (`--admin-listen`), apart from the API: liveness, readiness and metrics.
//!
//! - `GET /healthz`: 200 while the process serves.
//! - `GET /readyz`: 200 once a valid config with at least one endpoint is in force, 503 before
//!   that and while shutting down.
//! - `GET /metrics`: the Prometheus text format, from the app's own registry.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use crate::core::Producer;

pub fn router(producer: Producer) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(producer)
}

async fn readyz(State(producer): State<Producer>) -> (StatusCode, &'static str) {
    if producer.ready() {
        (StatusCode::OK, "ready\n")
    } else if producer.window.is_closed() {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: no valid config with at least one endpoint is loaded\n",
        )
    }
}

async fn metrics(State(producer): State<Producer>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)],
        producer.metrics.render(),
    )
}
