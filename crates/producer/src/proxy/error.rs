//! The proxy's errors, in OpenAI's shape (`{"error": {"message", "type", "code", "param"}}`), so
//! that OpenAI clients raise them as they would for OpenAI (and retry 429 and 503 after
//! `Retry-After`).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use burst_prefix_core::Refused;

/// Why the proxy answered instead of a replica.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The core refused the request (and counted it).
    #[error("{0}")]
    Refused(#[from] Refused),
    /// The request was placed, then its replica failed it: counted by the upstream metrics.
    #[error("upstream {endpoint} ({address}) failed: {detail}")]
    UpstreamFailed {
        endpoint: String,
        address: String,
        detail: String,
    },
    #[error(
        "upstream {endpoint} ({address}) sent nothing for {seconds} s (--upstream-timeout-ms)"
    )]
    UpstreamTimeout {
        endpoint: String,
        address: String,
        seconds: u64,
    },
}

impl ProxyError {
    fn status(&self) -> StatusCode {
        match self {
            ProxyError::Refused(refused) => refused.status(),
            ProxyError::UpstreamFailed { .. } => StatusCode::BAD_GATEWAY,
            ProxyError::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    fn code(&self) -> &'static str {
        match self {
            ProxyError::Refused(refused) => refused.code(),
            ProxyError::UpstreamFailed { .. } => "upstream_failed",
            ProxyError::UpstreamTimeout { .. } => "upstream_timeout",
        }
    }
}

impl IntoResponse for ProxyError {
    fn into_response(self) -> Response {
        let status = self.status();
        let kind = match status.as_u16() {
            429 => "rate_limit_error",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        };
        let (message, param, retry_after) = match &self {
            ProxyError::Refused(refused) => (
                refused.client_message(),
                refused.field().map(str::to_string),
                refused.retry_after_seconds(),
            ),
            other => (other.to_string(), None, None),
        };
        let body = serde_json::json!({"error": {
            "message": message, "type": kind, "code": self.code(), "param": param,
        }});
        let mut response = (status, Json(body)).into_response();
        if let Some(seconds) = retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
