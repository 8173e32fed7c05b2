//! The core's one error: why a request could not be placed. Each front-end maps it to its
//! protocol (a JSON error, the OpenAI error shape, an ext_proc `ImmediateResponse`).

use std::time::Duration;

use super::request::RequestError;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlaceError {
    /// The body is not an inference request; the message names the field.
    #[error("{0}")]
    BadRequest(#[from] RequestError),
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
    /// Another replica holds the Lease and plans the windows (SPEC §10).
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
            PlaceError::NoEndpoints => "no_endpoints",
            PlaceError::NoEligibleEndpoint => "no_eligible_endpoint",
            PlaceError::BatchFull { .. } => "batch_full",
            PlaceError::WindowFull { .. } => "window_full",
            PlaceError::ShuttingDown => "shutting_down",
            PlaceError::NotLeader => "not_leader",
            PlaceError::Abandoned => "internal",
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
}

/// `Retry-After` is in whole seconds: round up, at least 1.
pub fn retry_after_seconds(retry_after: Duration) -> u64 {
    retry_after.as_secs_f64().ceil().max(1.0) as u64
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
    fn batch_full_names_the_limit_and_when_to_retry() {
        let error = PlaceError::BatchFull {
            limit: 7,
            retry_after: Duration::from_millis(10),
        };
        assert_eq!(error.code(), "batch_full");
        assert!(error.to_string().contains("maxBatchSize = 7"));
        assert_eq!(error.retry_after(), Some(Duration::from_millis(10)));
        assert_eq!(PlaceError::NoEligibleEndpoint.retry_after(), None);
    }
}
