//! The test controls a request may carry under the body field `"stub"`, which no real client
//! sends: how many chunks, how slowly, which status, when to cut the connection, where to
//! redirect.

use serde::Deserialize;
use serde_json::Value;

/// The body field that holds the controls.
pub const FIELD: &str = "stub";

/// Upper bounds, so a typo in a test cannot make a request run for hours.
pub const MAX_CHUNKS: u32 = 10_000;
pub const MAX_DELAY_MS: u64 = 60_000;

/// What one request asks of the stub. Every field is optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Controls {
    /// Tokens (and so SSE chunks when streaming) in the answer; default `max_tokens`, else 8.
    pub chunks: Option<u32>,
    /// Pause before each chunk after the first, in milliseconds.
    #[serde(default)]
    pub chunk_delay_ms: u64,
    /// Pause before the answer's first byte (or the error), in milliseconds.
    #[serde(default)]
    pub delay_ms: u64,
    /// Answer with this HTTP status and an OpenAI-style error body instead (e.g. 503).
    pub status: Option<u16>,
    /// When streaming, cut the connection after this many chunks (no `[DONE]`, no terminating
    /// chunk): an engine that dies mid-stream.
    pub abort_after_chunks: Option<u32>,
    /// Answer with this `Location` header, `status` (302 when not given) and an empty body: a
    /// replica that redirects (where to, the test decides).
    pub location: Option<String>,
}

impl Controls {
    /// The controls of a request body: none when it has no `"stub"` field.
    pub fn from_body(body: &Value) -> Result<Self, String> {
        let Some(value) = body.get(FIELD) else {
            return Ok(Self::default());
        };
        let controls: Self = serde_json::from_value(value.clone())
            .map_err(|e| format!("invalid \"{FIELD}\" controls: {e}"))?;
        controls.validate()?;
        Ok(controls)
    }

    fn validate(&self) -> Result<(), String> {
        if let Some(chunks) = self.chunks {
            if !(1..=MAX_CHUNKS).contains(&chunks) {
                return Err(format!(
                    "\"{FIELD}.chunks\" must be 1..={MAX_CHUNKS}, got {chunks}"
                ));
            }
        }
        for (name, ms) in [
            ("chunkDelayMs", self.chunk_delay_ms),
            ("delayMs", self.delay_ms),
        ] {
            if ms > MAX_DELAY_MS {
                return Err(format!(
                    "\"{FIELD}.{name}\" must be at most {MAX_DELAY_MS}, got {ms}"
                ));
            }
        }
        if let Some(status) = self.status {
            if !(100..=599).contains(&status) {
                return Err(format!(
                    "\"{FIELD}.status\" must be an HTTP status 100..=599, got {status}"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn absent_controls_are_the_defaults() {
        assert_eq!(
            Controls::from_body(&json!({"prompt": "x"})).unwrap(),
            Controls::default()
        );
    }

    #[test]
    fn controls_parse() {
        let body = json!({"stub": {"chunks": 5, "chunkDelayMs": 50, "status": 503, "delayMs": 7,
                                   "abortAfterChunks": 2, "location": "http://x/"}});
        assert_eq!(
            Controls::from_body(&body).unwrap(),
            Controls {
                chunks: Some(5),
                chunk_delay_ms: 50,
                delay_ms: 7,
                status: Some(503),
                abort_after_chunks: Some(2),
                location: Some("http://x/".into()),
            }
        );
    }

    #[test]
    fn bad_controls_name_the_field() {
        for (body, needle) in [
            (json!({"stub": {"chunk": 5}}), "unknown field `chunk`"),
            (json!({"stub": {"chunks": 0}}), "stub.chunks"),
            (json!({"stub": {"delayMs": 3_600_000}}), "stub.delayMs"),
            (json!({"stub": {"status": 42}}), "stub.status"),
            (json!({"stub": 5}), "invalid \"stub\" controls"),
        ] {
            let err = Controls::from_body(&body).unwrap_err();
            assert!(err.contains(needle), "{err} should mention {needle}");
        }
    }
}
