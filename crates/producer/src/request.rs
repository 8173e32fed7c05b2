//! An inference request body (OpenAI completions or chat completions, as a gateway forwards it)
//! turned into prompts and prefix blocks (SPEC §1).

use burst_prefix_planner::{hash_prompts, BlockHash, BlockSpec, Prompt};
use serde_json::{Map, Value};

/// What the producer needs from an inference request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InferenceRequest {
    pub model: String,
    pub cache_salt: String,
    pub prompts: Vec<PromptInput>,
    /// Candidate endpoint ids (`"endpoints"` in the body); `None` means all.
    pub endpoints: Option<Vec<String>>,
}

/// One prompt, as the request gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PromptInput {
    /// Text: hashed as estimate tokens; chat messages are flattened into one.
    Text(String),
    /// Token IDs: hashed as they are.
    Tokens(Vec<u32>),
}

impl PromptInput {
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

    /// The same error, with its field path under `prefix` (e.g. `requests[3].body`).
    pub fn within(self, prefix: &str) -> Self {
        match self {
            RequestError::Field { field, problem } => RequestError::Field {
                field: format!("{prefix}.{field}"),
                problem,
            },
            RequestError::Json(message) => RequestError::Field {
                field: prefix.to_string(),
                problem: message,
            },
        }
    }
}

fn field_error(field: impl Into<String>, problem: impl Into<String>) -> RequestError {
    RequestError::Field {
        field: field.into(),
        problem: problem.into(),
    }
}

fn expected(field: impl Into<String>, what: &str, got: &Value) -> RequestError {
    field_error(field, format!("expected {what}, got {}", kind(got)))
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl InferenceRequest {
    /// Parses raw body bytes.
    pub fn from_slice(body: &[u8]) -> Result<Self, RequestError> {
        let value: Value =
            serde_json::from_slice(body).map_err(|e| RequestError::Json(e.to_string()))?;
        Self::from_value(&value)
    }

    /// Parses a body already read as JSON.
    pub fn from_value(body: &Value) -> Result<Self, RequestError> {
        let Value::Object(body) = body else {
            return Err(expected("body", "a JSON object", body));
        };
        let model = match body.get("model") {
            None => return Err(field_error("model", "missing (required)")),
            Some(Value::String(model)) if model.is_empty() => {
                return Err(field_error("model", "must not be empty"))
            }
            Some(Value::String(model)) => model.clone(),
            Some(other) => return Err(expected("model", "a string", other)),
        };
        let cache_salt = match body.get("cache_salt") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(salt)) => salt.clone(),
            Some(other) => return Err(expected("cache_salt", "a string", other)),
        };
        let prompts =
            match (body.get("prompt"), body.get("messages")) {
                (Some(_), Some(_)) => return Err(field_error(
                    "prompt",
                    "not allowed together with `messages` (send a completions or a chat request)",
                )),
                (Some(prompt), None) => completion_prompts(prompt)?,
                (None, Some(messages)) => vec![PromptInput::Text(flatten_chat(body, messages)?)],
                (None, None) => {
                    return Err(field_error(
                        "prompt",
                        "missing: a completions request needs `prompt`, a chat request `messages`",
                    ))
                }
            };
        let endpoints = match body.get("endpoints") {
            None | Some(Value::Null) => None,
            Some(Value::Array(items)) => Some(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| match item {
                        Value::String(id) => Ok(id.clone()),
                        other => Err(expected(
                            format!("endpoints[{i}]"),
                            "an endpoint id string",
                            other,
                        )),
                    })
                    .collect::<Result<_, _>>()?,
            ),
            Some(other) => return Err(expected("endpoints", "an array of endpoint ids", other)),
        };
        Ok(InferenceRequest {
            model,
            cache_salt,
            prompts,
            endpoints,
        })
    }

    /// Block hashes per non-empty prompt (SPEC §1).
    pub fn block_hashes(&self, spec: BlockSpec) -> Vec<Vec<BlockHash>> {
        let prompts: Vec<Prompt<'_>> = self.prompts.iter().map(PromptInput::as_prompt).collect();
        hash_prompts(&self.model, &self.cache_salt, &prompts, spec)
    }
}

/// `prompt`: a string, a list of strings, a list of token IDs, or a list of token-ID lists.
fn completion_prompts(prompt: &Value) -> Result<Vec<PromptInput>, RequestError> {
    match prompt {
        Value::String(text) => Ok(vec![PromptInput::Text(text.clone())]),
        Value::Array(items) => match items.first() {
            None => Ok(Vec::new()),
            Some(Value::String(_)) => items
                .iter()
                .enumerate()
                .map(|(i, item)| match item {
                    Value::String(text) => Ok(PromptInput::Text(text.clone())),
                    other => Err(expected(
                        format!("prompt[{i}]"),
                        "a string like prompt[0]",
                        other,
                    )),
                })
                .collect(),
            Some(Value::Number(_)) => Ok(vec![PromptInput::Tokens(token_ids("prompt", items)?)]),
            Some(Value::Array(_)) => items
                .iter()
                .enumerate()
                .map(|(i, item)| match item {
                    Value::Array(tokens) => Ok(PromptInput::Tokens(token_ids(
                        &format!("prompt[{i}]"),
                        tokens,
                    )?)),
                    other => Err(expected(
                        format!("prompt[{i}]"),
                        "a list of token IDs like prompt[0]",
                        other,
                    )),
                })
                .collect(),
            Some(other) => Err(expected(
                "prompt[0]",
                "a string, a token ID or a list of token IDs",
                other,
            )),
        },
        other => Err(expected(
            "prompt",
            "a string, a list of strings, a list of token IDs or a list of token-ID lists",
            other,
        )),
    }
}

fn token_ids(field: &str, items: &[Value]) -> Result<Vec<u32>, RequestError> {
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            item.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| {
                    field_error(
                        format!("{field}[{i}]"),
                        format!(
                            "expected a token ID (an integer from 0 to {}), got {item}",
                            u32::MAX
                        ),
                    )
                })
        })
        .collect()
}

/// The chat estimate text: compact JSON of `tools` (if non-empty), then each message's role
/// immediately followed by its content (a string, or its `text` parts concatenated).
fn flatten_chat(body: &Map<String, Value>, messages: &Value) -> Result<String, RequestError> {
    let Value::Array(messages) = messages else {
        return Err(expected("messages", "an array of messages", messages));
    };
    let mut text = String::new();
    match body.get("tools") {
        None | Some(Value::Null) => {}
        Some(Value::Array(tools)) if tools.is_empty() => {}
        Some(tools @ Value::Array(_)) => text.push_str(&tools.to_string()),
        Some(other) => return Err(expected("tools", "an array", other)),
    }
    for (i, message) in messages.iter().enumerate() {
        let Value::Object(message) = message else {
            return Err(expected(format!("messages[{i}]"), "an object", message));
        };
        match message.get("role") {
            Some(Value::String(role)) => text.push_str(role),
            None => {
                return Err(field_error(
                    format!("messages[{i}].role"),
                    "missing (required)",
                ))
            }
            Some(other) => return Err(expected(format!("messages[{i}].role"), "a string", other)),
        }
        match message.get("content") {
            None | Some(Value::Null) => {}
            Some(Value::String(content)) => text.push_str(content),
            Some(Value::Array(parts)) => {
                for (j, part) in parts.iter().enumerate() {
                    let field = || format!("messages[{i}].content[{j}]");
                    let Value::Object(part) = part else {
                        return Err(expected(field(), "a content part object", part));
                    };
                    if part.get("type").and_then(Value::as_str) == Some("text") {
                        match part.get("text") {
                            Some(Value::String(part_text)) => text.push_str(part_text),
                            Some(other) => {
                                return Err(expected(
                                    format!("{}.text", field()),
                                    "a string",
                                    other,
                                ))
                            }
                            None => {
                                return Err(field_error(
                                    format!("{}.text", field()),
                                    "missing in a text part",
                                ))
                            }
                        }
                    }
                }
            }
            Some(other) => {
                return Err(expected(
                    format!("messages[{i}].content"),
                    "a string or an array of content parts",
                    other,
                ))
            }
        }
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(body: Value) -> Result<InferenceRequest, RequestError> {
        InferenceRequest::from_value(&body)
    }

    fn error(body: Value) -> String {
        parse(body).unwrap_err().to_string()
    }

    fn hex(request: &InferenceRequest, block: usize) -> Vec<Vec<u64>> {
        request.block_hashes(BlockSpec::new(block, 0))
    }

    #[test]
    fn chat_matches_the_spec_vector() {
        let request = parse(json!({
            "model": "llama",
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": [{"type": "text", "text": "Hello!"}]},
            ],
        }))
        .unwrap();
        assert_eq!(
            request.prompts,
            vec![PromptInput::Text(
                "systemYou are a helpful assistant.userHello!".into()
            )]
        );
        assert_eq!(
            hex(&request, 4),
            vec![vec![
                0xe77a870ac50a0797,
                0x24079cc05ca07818,
                0x7a8b7d23187ae718
            ]]
        );
        assert_eq!(hex(&request, 64), vec![vec![0x0fafa73bef220adc]]);
    }

    #[test]
    fn token_prompt_and_salt_match_the_spec_vectors() {
        let request = parse(
            json!({"model": "m", "prompt": (1..=10).collect::<Vec<u32>>(), "cache_salt": "salt"}),
        )
        .unwrap();
        assert_eq!(
            hex(&request, 4),
            vec![vec![
                0x71966444900f601d,
                0x2df7485150fcee96,
                0xa760a4765b4d3be5
            ]]
        );
    }

    #[test]
    fn every_completions_prompt_shape() {
        let prompts = |prompt: Value| {
            parse(json!({"model": "m", "prompt": prompt}))
                .unwrap()
                .prompts
        };
        assert_eq!(prompts(json!("hi")), vec![PromptInput::Text("hi".into())]);
        assert_eq!(
            prompts(json!(["a", "b"])),
            vec![PromptInput::Text("a".into()), PromptInput::Text("b".into())]
        );
        assert_eq!(
            prompts(json!([1, 2])),
            vec![PromptInput::Tokens(vec![1, 2])]
        );
        assert_eq!(
            prompts(json!([[1], [2, 3]])),
            vec![
                PromptInput::Tokens(vec![1]),
                PromptInput::Tokens(vec![2, 3])
            ]
        );
        assert_eq!(prompts(json!([])), vec![]);
    }

    #[test]
    fn tools_are_flattened_first_as_compact_json() {
        let request = parse(json!({
            "model": "m",
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": null}],
        }))
        .unwrap();
        assert_eq!(
            request.prompts,
            vec![PromptInput::Text(
                r#"[{"function":{"name":"f"},"type":"function"}]userxassistant"#.into()
            )]
        );
    }

    #[test]
    fn endpoints_and_salt_are_read() {
        let request = parse(
            json!({"model": "m", "prompt": "x", "cache_salt": "s", "endpoints": ["ns/a-rank-0"]}),
        )
        .unwrap();
        assert_eq!(request.cache_salt, "s");
        assert_eq!(request.endpoints, Some(vec!["ns/a-rank-0".to_string()]));
    }

    #[test]
    fn bad_bodies_name_the_field() {
        assert_eq!(
            InferenceRequest::from_slice(b"{").unwrap_err().code(),
            "invalid_json"
        );
        assert_eq!(
            error(json!([1])),
            "body: expected a JSON object, got an array"
        );
        assert_eq!(error(json!({"prompt": "x"})), "model: missing (required)");
        assert_eq!(
            error(json!({"model": 3, "prompt": "x"})),
            "model: expected a string, got a number"
        );
        assert!(error(json!({"model": "m"})).starts_with("prompt: missing"));
        assert!(error(json!({"model": "m", "prompt": "x", "messages": []}))
            .starts_with("prompt: not allowed"));
        assert!(error(json!({"model": "m", "prompt": {"a": 1}}))
            .starts_with("prompt: expected a string"));
        assert_eq!(
            error(json!({"model": "m", "prompt": ["a", 1]})),
            "prompt[1]: expected a string like prompt[0], got a number"
        );
        assert!(error(json!({"model": "m", "prompt": [1, -1]}))
            .starts_with("prompt[1]: expected a token ID"));
        assert!(error(json!({"model": "m", "prompt": [1, 4294967296u64]}))
            .starts_with("prompt[1]: expected a token ID"));
        assert!(error(json!({"model": "m", "prompt": [[1], [1.5]]}))
            .starts_with("prompt[1][0]: expected a token ID"));
        assert_eq!(
            error(json!({"model": "m", "messages": [{"content": "x"}]})),
            "messages[0].role: missing (required)"
        );
        assert_eq!(
            error(json!({"model": "m", "messages": [{"role": "user", "content": 5}]})),
            "messages[0].content: expected a string or an array of content parts, got a number"
        );
        assert_eq!(
            error(json!({"model": "m", "messages": "hi"})),
            "messages: expected an array of messages, got a string"
        );
        assert_eq!(
            error(json!({"model": "m", "prompt": "x", "endpoints": [1]})),
            "endpoints[0]: expected an endpoint id string, got a number"
        );
        assert_eq!(
            error(json!({"model": "m", "prompt": "x", "cache_salt": 1})),
            "cache_salt: expected a string, got a number"
        );
    }
}
