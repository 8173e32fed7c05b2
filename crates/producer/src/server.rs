//! The API (`--listen`): follow one request from [`produce`] through the window to the planner
//! and back.
//!
//! - `POST /v1/produce`: the inference request body itself (optionally with `"endpoints"`); it
//!   waits for its window and gets a [`ProduceResponse`].
//! - `POST /v1/plan`: a whole batch at once, no waiting (the `plan` subcommand's format).
//! - `GET /v1/endpoints`: the replica set in force, its source and generation.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::Value;

use crate::app::App;
use crate::batch::{plan_input, HashedRequest, PlanInput, PlanOutput};
use crate::error::AppError;
use crate::metrics::Outcome;
use crate::request::{InferenceRequest, RequestError};
use crate::response::ProduceResponse;

pub fn router(app: App) -> Router {
    Router::new()
        .route("/v1/produce", post(produce))
        .route("/v1/plan", post(plan))
        .route("/v1/endpoints", get(endpoints))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(app.max_body_bytes))
        .layer(middleware::from_fn(request_timeout))
        .with_state(app)
}

/// No request takes longer than this, however slowly its client sends the body. A produce
/// request that has joined a window is answered long before (windows last at most 10 s).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

async fn request_timeout(request: Request, next: Next) -> Response {
    match tokio::time::timeout(REQUEST_TIMEOUT, next.run(request)).await {
        Ok(response) => response,
        Err(_) => AppError::Timeout {
            seconds: REQUEST_TIMEOUT.as_secs(),
        }
        .into_response(),
    }
}

/// Reads the body, or says why not (413 past `--max-body-bytes`).
fn body_bytes(app: &App, body: Result<Bytes, BytesRejection>) -> Result<Bytes, AppError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            AppError::BodyTooLarge {
                limit: app.max_body_bytes,
            }
        } else {
            AppError::BodyUnreadable(rejection.body_text())
        }
    })
}

async fn produce(
    State(app): State<App>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<ProduceResponse>, AppError> {
    let result = place(&app, body).await;
    if result.is_err() {
        app.metrics.request(Outcome::Rejected);
    }
    result.map(Json)
}

async fn place(
    app: &App,
    body: Result<Bytes, BytesRejection>,
) -> Result<ProduceResponse, AppError> {
    let request = InferenceRequest::from_slice(&body_bytes(app, body)?)?;
    // Hashed here, before joining, so planning the window is only `plan_batch`.
    let ticket = app
        .window
        .join(|config| HashedRequest::new(&request, config))?;
    // If the client goes away now, axum drops this future and the ticket leaves the window.
    let placement = ticket.placement().await.map_err(|_| {
        AppError::Internal("the window of this request was not planned".to_string())
    })?;
    Ok(ProduceResponse::new(
        &placement,
        request.endpoints.as_deref(),
    ))
}

async fn plan(
    State(app): State<App>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<PlanOutput>, AppError> {
    let body = body_bytes(&app, body)?;
    let input: PlanInput = serde_json::from_slice(&body).map_err(|error| {
        if error.is_data() {
            RequestError::Field {
                field: "body".into(),
                problem: error.to_string(),
            }
        } else {
            RequestError::Json(error.to_string())
        }
    })?;
    // A whole batch can take a while to hash: off the async workers.
    let output = tokio::task::spawn_blocking(move || plan_input(&input))
        .await
        .map_err(|error| AppError::Internal(format!("planning a batch failed: {error}")))??;
    Ok(Json(output))
}

async fn endpoints(State(app): State<App>) -> Json<Value> {
    let current = app.store.current();
    Json(serde_json::json!({
        "source": app.store.source(),
        "generation": current.as_ref().map_or(0, |snapshot| snapshot.generation),
        "ready": app.ready(),
        "endpoints": current.as_ref().map(|s| &s.config.endpoints[..]).unwrap_or(&[]),
        "config": current.as_ref().map(|s| &s.config.planner),
    }))
}

async fn not_found() -> (StatusCode, Json<Value>) {
    (
        StatusCode::NOT_FOUND,
        Json(serde_json::json!({
            "error": "not_found",
            "message": "no such route; see POST /v1/produce, POST /v1/plan, GET /v1/endpoints",
        })),
    )
}
