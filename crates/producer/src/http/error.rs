//! The JSON API's one error type. Every refusal answers `{"error": code, "message": ...}` with its
//! status; internal errors are logged and answered with a generic message, never leaked.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::core::batch::PlanError;
use crate::core::error::retry_after_seconds;
use crate::core::request::RequestError;
use crate::core::PlaceError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    Place(#[from] PlaceError),
    /// A `POST /v1/plan` input that cannot be planned.
    #[error("{0}")]
    Plan(#[from] PlanError),
    #[error("the request body is larger than the limit of {limit} bytes (--max-body-bytes)")]
    BodyTooLarge { limit: usize },
    #[error("the body could not be read: {0}")]
    BodyUnreadable(String),
    #[error("query parameter {parameter}: {problem}")]
    BadQuery {
        parameter: &'static str,
        problem: String,
    },
    #[error("the request was not complete within {seconds} s")]
    Timeout { seconds: u64 },
    /// Logged with its detail; the client sees only that something went wrong.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<RequestError> for ApiError {
    fn from(error: RequestError) -> Self {
        ApiError::Place(PlaceError::BadRequest(error))
    }
}

/// The HTTP status of a core refusal; every front-end speaking HTTP uses this one mapping.
pub fn place_status(error: &PlaceError) -> StatusCode {
    match error {
        PlaceError::BadRequest(_) => StatusCode::BAD_REQUEST,
        PlaceError::BatchFull { .. } | PlaceError::WindowFull { .. } => {
            StatusCode::TOO_MANY_REQUESTS
        }
        PlaceError::NoEndpoints
        | PlaceError::NoEligibleEndpoint
        | PlaceError::ShuttingDown
        | PlaceError::NotLeader => StatusCode::SERVICE_UNAVAILABLE,
        PlaceError::Abandoned => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Place(error) => place_status(error),
            ApiError::BodyTooLarge { .. } | ApiError::Plan(PlanError::TooLarge { .. }) => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            ApiError::Plan(PlanError::Abandoned) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Plan(_) | ApiError::BodyUnreadable(_) | ApiError::BadQuery { .. } => {
                StatusCode::BAD_REQUEST
            }
            ApiError::Timeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// A stable, machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::Place(error) => error.code(),
            ApiError::Plan(PlanError::Request(error)) => error.code(),
            ApiError::Plan(PlanError::Config(_)) => "invalid_config",
            ApiError::Plan(PlanError::DuplicateReplica(_)) => "invalid_request",
            ApiError::Plan(PlanError::TooLarge { .. }) => "plan_too_large",
            ApiError::Plan(PlanError::Abandoned) => "abandoned",
            ApiError::BodyTooLarge { .. } => "body_too_large",
            ApiError::BodyUnreadable(_) => "invalid_body",
            ApiError::BadQuery { .. } => "invalid_query",
            ApiError::Timeout { .. } => "request_timeout",
            ApiError::Internal(_) => "internal",
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let message = match &self {
            ApiError::Internal(_) | ApiError::Place(PlaceError::Abandoned) => {
                tracing::error!(error = %self, "internal error");
                "internal error; see the producer's log".to_string()
            }
            other => other.to_string(),
        };
        let body = serde_json::json!({"error": self.code(), "message": message});
        let mut response = (self.status(), Json(body)).into_response();
        if let ApiError::Place(error) = &self {
            if let Some(retry_after) = error.retry_after() {
                response.headers_mut().insert(
                    header::RETRY_AFTER,
                    HeaderValue::from(retry_after_seconds(retry_after)),
                );
            }
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn internal_details_are_not_leaked() {
        let response = ApiError::Internal("secret detail".into()).into_response();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn batch_full_is_429_with_retry_after() {
        let response = ApiError::from(PlaceError::BatchFull {
            limit: 7,
            retry_after: Duration::from_millis(10),
        })
        .into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
    }
}
