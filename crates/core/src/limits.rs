//! The limits every front-end applies, with their defaults (docs/behaviour.md, "Limits").

use std::time::Duration;

use super::error::PlaceError;

/// Default limit of a request body: 8 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;
/// Default budget of the bytes the open window holds: 256 MiB.
pub const DEFAULT_MAX_WINDOW_BYTES: usize = 256 * 1024 * 1024;
/// Default of `--max-plan-replicas`.
pub const DEFAULT_MAX_PLAN_REPLICAS: usize = 10_000;
/// Default of `--body-timeout-ms`: the longest a request's body may take to arrive.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// Most bytes the open window holds: its requests' hashes, and the bodies front-ends keep
    /// while their requests wait; beyond, `window_full`.
    pub max_window_bytes: usize,
    /// Most replicas a `POST /v1/plan` batch may name.
    pub max_plan_replicas: usize,
    /// A request's body (and, at the endpoint picker, its headers and body) must arrive within
    /// this long.
    pub body_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_window_bytes: DEFAULT_MAX_WINDOW_BYTES,
            max_plan_replicas: DEFAULT_MAX_PLAN_REPLICAS,
            body_timeout: DEFAULT_BODY_TIMEOUT,
        }
    }
}

impl Limits {
    /// Refuses a body of `bytes` (read so far) beyond `max_body_bytes`.
    pub fn check_body(&self, bytes: usize) -> Result<(), PlaceError> {
        if bytes > self.max_body_bytes {
            Err(PlaceError::BodyTooLarge {
                limit: self.max_body_bytes,
            })
        } else {
            Ok(())
        }
    }
}
