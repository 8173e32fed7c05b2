//! Why a body is not an inference request: every error names its field once, by its path in
//! the body.

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
