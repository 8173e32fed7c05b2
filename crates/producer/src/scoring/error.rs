//! The scoring API's one error type. Every refusal answers `{"error": code, "message": ...}`
//! with the status the core gives it; internal errors are logged and answered with a generic
//! message, never leaked.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use burst_prefix_core::whole_batch::PlanError;
use burst_prefix_core::{PlaceError, Refused};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A request the core refused (and counted).
    #[error("{0}")]
    Refused(#[from] Refused),
    /// A body that could not be read, of a call that is not an inference request (`/v1/plan`,
    /// counted as a refused plan; `/v1/memory/reset`).
    #[error("{0}")]
    Body(PlaceError),
    /// A `POST /v1/plan` input that cannot be planned.
    #[error("{0}")]
    Plan(#[from] PlanError),
    #[error("the request was not complete within {seconds} s")]
    Timeout { seconds: u64 },
    /// Logged with its detail; the client sees only that something went wrong.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Refused(refused) => refused.status(),
            ApiError::Body(error) => error.status(),
            ApiError::Plan(PlanError::TooLarge { .. }) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Plan(PlanError::Abandoned) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Plan(_) => StatusCode::BAD_REQUEST,
            ApiError::Timeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// A stable, machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::Refused(refused) => refused.code(),
            ApiError::Body(error) => error.code(),
            ApiError::Plan(PlanError::Request(error)) => error.code(),
            ApiError::Plan(PlanError::Config(_)) => "invalid_config",
            ApiError::Plan(PlanError::DuplicateReplica(_)) => "invalid_request",
            ApiError::Plan(PlanError::TooLarge { .. }) => "plan_too_large",
            ApiError::Plan(PlanError::Abandoned) => "abandoned",
            ApiError::Timeout { .. } => "request_timeout",
            ApiError::Internal(_) => "internal",
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let message = match &self {
            ApiError::Internal(_) => {
                tracing::error!(error = %self, "internal error");
                "internal error; see the producer's log".to_string()
            }
            ApiError::Refused(refused) => refused.client_message(),
            other => other.to_string(),
        };
        let body = serde_json::json!({"error": self.code(), "message": message});
        let mut response = (self.status(), Json(body)).into_response();
        if let ApiError::Refused(refused) = &self {
            if let Some(seconds) = refused.retry_after_seconds() {
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
            }
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_details_are_not_leaked() {
        let response = ApiError::Internal("secret detail".into()).into_response();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
}
