//! Why a request was not placed, for every front-end alike: the reason ([`PlaceError`]) with its
//! stable code, HTTP status and retry advice, and the proof that it was counted ([`Refused`]);
//! and why a body is not an inference request ([`RequestError`]): every error names its field
//! once, by its path in the body.
//! Each front-end turns a [`Refused`] into its protocol (a JSON error, the OpenAI error shape,
//! an ext_proc `ImmediateResponse`) and never decides a status of its own.

use std::time::Duration;

use http::StatusCode;

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PlaceError {
    /// The body (or a hint) is not a valid inference request; the message names the field.
    #[error("{0}")]
    BadRequest(#[from] RequestError),
    #[error("the request body is larger than the limit of {limit} bytes (--max-body-bytes)")]
    BodyTooLarge { limit: usize },
    #[error("the request body could not be read: {0}")]
    BodyUnreadable(String),
    #[error("the request body did not arrive within {seconds} s (--body-timeout-ms)")]
    BodyTimeout { seconds: f64 },
    /// A front-end's bound on the whole request passed (the scoring API's 30 s).
    #[error("the request was not complete within {seconds} s")]
    RequestTimeout { seconds: u64 },
    /// The gateway sends the body in a way a router by prompt cannot use.
    #[error(
        "request_body_mode {mode} cannot be routed by prompt; configure FULL_DUPLEX_STREAMED or BUFFERED"
    )]
    UnsupportedBodyMode { mode: i32 },
    #[error("no endpoints are known yet: no valid config with at least one endpoint is loaded")]
    NoEndpoints,
    /// None of the endpoints the request (or its gateway) allows is in the config in force.
    #[error("none of the endpoints this request may use is in the config in force")]
    NoEligibleEndpoint,
    #[error(
        "the open window already holds maxBatchSize = {limit} requests; retry after it is planned"
    )]
    BatchFull { limit: usize, retry_after: Duration },
    #[error(
        "the open window already holds its limit of {limit} bytes (--max-window-bytes); retry after it is planned"
    )]
    WindowFull { limit: usize, retry_after: Duration },
    #[error("the service is shutting down")]
    ShuttingDown,
    /// Another replica holds the Lease and plans the windows (docs/behaviour.md, "High
    /// availability").
    #[error(
        "this producer replica is a follower; the leader serves (retry: the Service routes to it)"
    )]
    NotLeader,
    /// The planning of the request's window was lost (logged where it happened).
    #[error("the window of this request was not planned")]
    Abandoned,
}

impl PlaceError {
    /// A stable, machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            PlaceError::BadRequest(error) => error.code(),
            PlaceError::BodyTooLarge { .. } => "body_too_large",
            PlaceError::BodyUnreadable(_) => "invalid_body",
            PlaceError::BodyTimeout { .. } => "body_timeout",
            PlaceError::RequestTimeout { .. } => "request_timeout",
            PlaceError::UnsupportedBodyMode { .. } => "unsupported_body_mode",
            PlaceError::NoEndpoints => "no_endpoints",
            PlaceError::NoEligibleEndpoint => "no_eligible_endpoint",
            PlaceError::BatchFull { .. } => "batch_full",
            PlaceError::WindowFull { .. } => "window_full",
            PlaceError::ShuttingDown => "shutting_down",
            PlaceError::NotLeader => "not_leader",
            PlaceError::Abandoned => "internal",
        }
    }

    /// The HTTP status every front-end answers this refusal with.
    pub fn status(&self) -> StatusCode {
        match self {
            PlaceError::BadRequest(_) | PlaceError::BodyUnreadable(_) => StatusCode::BAD_REQUEST,
            PlaceError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            PlaceError::BodyTimeout { .. } | PlaceError::RequestTimeout { .. } => {
                StatusCode::REQUEST_TIMEOUT
            }
            PlaceError::BatchFull { .. } | PlaceError::WindowFull { .. } => {
                StatusCode::TOO_MANY_REQUESTS
            }
            PlaceError::NoEndpoints
            | PlaceError::NoEligibleEndpoint
            | PlaceError::ShuttingDown
            | PlaceError::NotLeader => StatusCode::SERVICE_UNAVAILABLE,
            PlaceError::UnsupportedBodyMode { .. } | PlaceError::Abandoned => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }

    /// How long a client should wait before retrying, for the refusals a retry can cure.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            PlaceError::BatchFull { retry_after, .. }
            | PlaceError::WindowFull { retry_after, .. } => Some(*retry_after),
            PlaceError::NoEndpoints | PlaceError::ShuttingDown | PlaceError::NotLeader => {
                Some(Duration::from_secs(1))
            }
            _ => None,
        }
    }

    /// `Retry-After` in whole seconds, rounded up, at least 1.
    pub fn retry_after_seconds(&self) -> Option<u64> {
        self.retry_after()
            .map(|after| after.as_secs_f64().ceil().max(1.0) as u64)
    }

    /// The field a bad request is about (the OpenAI error shape's `param`).
    pub fn field(&self) -> Option<&str> {
        match self {
            PlaceError::BadRequest(error) => Some(error.field()),
            _ => None,
        }
    }

    /// A message for the client: internal details stay in the producer's log.
    pub fn client_message(&self) -> String {
        match self {
            PlaceError::Abandoned => "internal error; see the producer's log".to_string(),
            other => other.to_string(),
        }
    }
}

/// A refusal that was counted (`burst_prefix_requests_total{outcome="rejected"}`). Only the core
/// makes one (the path's stages, [`crate::Producer::refuse`]), so a front-end cannot answer a
/// refusal without counting it.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(PlaceError);

impl Refused {
    /// Only the core counts: see [`crate::Producer::refuse`].
    pub(crate) fn counted(error: PlaceError) -> Self {
        Refused(error)
    }

    pub fn error(&self) -> &PlaceError {
        &self.0
    }
}

impl std::ops::Deref for Refused {
    type Target = PlaceError;

    fn deref(&self) -> &PlaceError {
        &self.0
    }
}

/// Why a body is not an inference request; the message names the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("malformed JSON: {0}")]
    Json(String),
    #[error("{field}: {problem}")]
    Field { field: String, problem: String },
}

impl RequestError {
    /// A stable, machine-readable code for API clients.
    pub fn code(&self) -> &'static str {
        match self {
            RequestError::Json(_) => "invalid_json",
            RequestError::Field { .. } => "invalid_request",
        }
    }

    /// The field the error is about (`body` for the body as a whole or malformed JSON).
    pub fn field(&self) -> &str {
        match self {
            RequestError::Json(_) => "body",
            RequestError::Field { field, .. } => field,
        }
    }

    /// The same error with its field path under `prefix` (e.g. `requests[3].body`): the path
    /// names the field once (`requests[3].body.prompt`, and `requests[3].body` for the body).
    pub fn within(self, prefix: &str) -> Self {
        match self {
            RequestError::Field { field, problem } => RequestError::Field {
                field: match field.strip_prefix(BODY) {
                    Some(rest) => format!("{prefix}{rest}"),
                    None => format!("{prefix}.{field}"),
                },
                problem,
            },
            RequestError::Json(message) => RequestError::Field {
                field: prefix.to_string(),
                problem: format!("malformed JSON: {message}"),
            },
        }
    }

    pub(crate) fn from_json(error: serde_path_to_error::Error<serde_json::Error>) -> Self {
        let path = error.path().to_string();
        let inner = error.into_inner();
        if !inner.is_data() {
            return RequestError::Json(inner.to_string());
        }
        RequestError::Field {
            // serde_path_to_error names the root ".".
            field: if path == "." { BODY.to_string() } else { path },
            problem: plain_problem(&inner),
        }
    }
}

/// The field name of the body as a whole.
const BODY: &str = "body";

/// serde_json's data error without its position, and its `invalid type: X, expected Y` turned
/// into `expected Y, got <what X is>`.
fn plain_problem(error: &serde_json::Error) -> String {
    let text = error.to_string();
    let position = format!(" at line {} column {}", error.line(), error.column());
    let text = text.strip_suffix(&position).unwrap_or(&text);
    let Some((got, expected)) = text
        .strip_prefix("invalid type: ")
        .and_then(|rest| rest.split_once(", expected "))
    else {
        return text.to_string();
    };
    let kind = match got.split_whitespace().next().unwrap_or(got) {
        "null" => "null",
        "boolean" => "a boolean",
        "integer" | "floating" => "a number",
        "string" => "a string",
        "sequence" => "an array",
        "map" => "an object",
        _ => got,
    };
    format!("expected {expected}, got {kind}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        let after = |ms| PlaceError::BatchFull {
            limit: 1,
            retry_after: Duration::from_millis(ms),
        };
        assert_eq!(after(0).retry_after_seconds(), Some(1));
        assert_eq!(after(40).retry_after_seconds(), Some(1));
        assert_eq!(after(1001).retry_after_seconds(), Some(2));
        assert_eq!(PlaceError::NoEligibleEndpoint.retry_after_seconds(), None);
    }

    #[test]
    fn batch_full_names_the_limit_and_when_to_retry() {
        let error = PlaceError::BatchFull {
            limit: 7,
            retry_after: Duration::from_millis(10),
        };
        assert_eq!(error.code(), "batch_full");
        assert_eq!(error.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(error.to_string().contains("maxBatchSize = 7"));
        assert_eq!(error.retry_after(), Some(Duration::from_millis(10)));
    }

    #[test]
    fn internal_details_are_not_shown_to_clients() {
        assert_eq!(
            PlaceError::Abandoned.client_message(),
            "internal error; see the producer's log"
        );
        assert_eq!(
            PlaceError::Abandoned.status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }
}
