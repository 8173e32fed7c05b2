//! An inference request body (OpenAI completions or chat completions, as a client or a gateway
//! sends it) read into prompts and prefix blocks (SPEC §1).
//!
//! The body is parsed straight into typed, borrowed values (strings point into the body wherever
//! JSON escapes allow), never into a `serde_json::Value` tree: parsing costs about the body's own
//! size, and fields the producer does not read are skipped without being kept. Once hashed, a
//! request holds only its block hashes. Every error names its field once, by its path in the body
//! (`prompt[1]: expected a string like prompt[0], got a number`).
//!
//! Here: what the producer keeps of a request and its errors; in [`body`]: the streaming
//! deserializer that reads a body into it.

mod body;

use std::borrow::Cow;

use burst_prefix_planner::{hash_prompts, BlockHash, BlockSpec, Prompt};

use super::hints::Hints;

/// What the producer needs from an inference request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InferenceRequest<'a> {
    pub model: Cow<'a, str>,
    pub cache_salt: Cow<'a, str>,
    pub prompts: Vec<PromptInput<'a>>,
    /// Candidate endpoint ids (`"endpoints"` in the body); `None` means all.
    pub endpoints: Option<Vec<Cow<'a, str>>>,
    pub hints: Hints,
}

/// One prompt, as the request gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PromptInput<'a> {
    /// Text: hashed as estimate tokens; chat messages are flattened into one.
    Text(Cow<'a, str>),
    /// Token IDs: hashed as they are.
    Tokens(Vec<u32>),
}

impl PromptInput<'_> {
    fn as_prompt(&self) -> Prompt<'_> {
        match self {
            PromptInput::Text(text) => Prompt::Text(text),
            PromptInput::Tokens(tokens) => Prompt::Tokens(tokens),
        }
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

impl<'a> InferenceRequest<'a> {
    /// Parses a body (JSON bytes); strings borrow from `body` where they have no escapes.
    pub fn parse(body: &'a [u8]) -> Result<Self, RequestError> {
        let mut deserializer = serde_json::Deserializer::from_slice(body);
        let request =
            serde_path_to_error::deserialize(&mut deserializer).map_err(RequestError::from_json)?;
        deserializer
            .end()
            .map_err(|e| RequestError::Json(e.to_string()))?;
        Ok(request)
    }

    /// Block hashes per non-empty prompt (SPEC §1).
    pub fn block_hashes(&self, spec: BlockSpec) -> Vec<Vec<BlockHash>> {
        let prompts: Vec<Prompt<'_>> = self.prompts.iter().map(PromptInput::as_prompt).collect();
        hash_prompts(&self.model, &self.cache_salt, &prompts, spec)
    }
}

#[cfg(test)]
mod tests;
