//! The API's one error type. Every refusal answers `{"error": code, "message": ...}` with its
//! status; internal errors are logged and answered with a generic message, never leaked.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::batch::PlanError;
use crate::request::RequestError;
use crate::window::JoinError;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The body is not a valid request; the message names the field.
    #[error("{0}")]
    BadRequest(#[from] RequestError),
    /// A `POST /v1/plan` input that cannot be planned.
    #[error("{0}")]
    Plan(#[from] PlanError),
    #[error("the request body is larger than the limit of {limit} bytes (--max-body-bytes)")]
    BodyTooLarge { limit: usize },
    #[error("the body could not be read: {0}")]
    BodyUnreadable(String),
    #[error(
        "the open window already holds maxBatchSize = {limit} requests; retry after it is planned"
    )]
    BatchFull { limit: usize, retry_after: Duration },
    #[error("no endpoints are known yet: no valid config with at least one endpoint is loaded")]
    NoEndpoints,
    #[error("the request was not complete within {seconds} s")]
    Timeout { seconds: u64 },
    #[error("the service is shutting down")]
    ShuttingDown,
    /// Logged with its detail; the client sees only that something went wrong.
    #[error("internal error: {0}")]
    Internal(String),
}

impl AppError {
    pub fn status(&self) -> StatusCode {
        match self {
            AppError::BadRequest(_) | AppError::Plan(_) | AppError::BodyUnreadable(_) => {
                StatusCode::BAD_REQUEST
            }
            AppError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            AppError::BatchFull { .. } => StatusCode::TOO_MANY_REQUESTS,
            AppError::Timeout { .. } => StatusCode::REQUEST_TIMEOUT,
            AppError::NoEndpoints | AppError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            AppError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// A stable, machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            AppError::BadRequest(error) => error.code(),
            AppError::Plan(PlanError::Request(error)) => error.code(),
            AppError::Plan(PlanError::Config(_)) => "invalid_config",
            AppError::Plan(PlanError::DuplicateReplica(_)) => "invalid_request",
            AppError::BodyTooLarge { .. } => "body_too_large",
            AppError::BodyUnreadable(_) => "invalid_body",
            AppError::BatchFull { .. } => "batch_full",
            AppError::Timeout { .. } => "request_timeout",
            AppError::NoEndpoints => "no_endpoints",
            AppError::ShuttingDown => "shutting_down",
            AppError::Internal(_) => "internal",
        }
    }
}

impl From<JoinError> for AppError {
    fn from(error: JoinError) -> Self {
        match error {
            JoinError::NoEndpoints => AppError::NoEndpoints,
            JoinError::BatchFull { limit, retry_after } => {
                AppError::BatchFull { limit, retry_after }
            }
            JoinError::ShuttingDown => AppError::ShuttingDown,
        }
    }
}

/// `Retry-After` is in whole seconds: round the rest of the window up, at least 1.
fn retry_after_seconds(retry_after: Duration) -> u64 {
    retry_after.as_secs_f64().ceil().max(1.0) as u64
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let message = match &self {
            AppError::Internal(detail) => {
                tracing::error!(error = %detail, "internal error");
                "internal error; see the producer's log".to_string()
            }
            other => other.to_string(),
        };
        let body = serde_json::json!({"error": self.code(), "message": message});
        let mut response = (self.status(), Json(body)).into_response();
        if let AppError::BatchFull { retry_after, .. } = &self {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(retry_after_seconds(*retry_after)),
            );
        }
        if let AppError::ShuttingDown | AppError::NoEndpoints = &self {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_seconds(Duration::ZERO), 1);
        assert_eq!(retry_after_seconds(Duration::from_millis(40)), 1);
        assert_eq!(retry_after_seconds(Duration::from_millis(1001)), 2);
    }

    #[test]
    fn internal_details_are_not_leaked() {
        let response = AppError::Internal("secret detail".into()).into_response();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn batch_full_names_the_limit() {
        let error = AppError::BatchFull {
            limit: 7,
            retry_after: Duration::from_millis(10),
        };
        assert_eq!(error.code(), "batch_full");
        assert!(error.to_string().contains("maxBatchSize = 7"));
        let response = error.into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
    }
}
