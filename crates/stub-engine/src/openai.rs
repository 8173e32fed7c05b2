//! The OpenAI wire shapes the stub answers in: completions and chat completions, whole or as
//! SSE chunks, errors, and the model list.

use serde_json::{json, Value};

/// Completions (`/v1/completions`) or chat completions (`/v1/chat/completions`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Completions,
    Chat,
}

impl Api {
    pub fn path(self) -> &'static str {
        match self {
            Api::Completions => "/v1/completions",
            Api::Chat => "/v1/chat/completions",
        }
    }

    fn object(self, stream: bool) -> &'static str {
        match (self, stream) {
            (Api::Completions, _) => "text_completion",
            (Api::Chat, false) => "chat.completion",
            (Api::Chat, true) => "chat.completion.chunk",
        }
    }
}

/// What a valid request asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub model: Option<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub max_tokens: Option<u32>,
    /// Whitespace-separated words of the prompt or messages: the stub's stand-in for tokens.
    pub prompt_words: u32,
}

impl Request {
    /// Checks the fields the stub relies on, the way an engine would refuse them.
    pub fn parse(api: Api, body: &Value) -> Result<Self, String> {
        let object = body
            .as_object()
            .ok_or("the request body must be a JSON object")?;
        let text = match api {
            Api::Completions => match object.get("prompt") {
                Some(Value::String(prompt)) => prompt.clone(),
                Some(Value::Array(prompts)) => prompts
                    .iter()
                    .map(|p| {
                        p.as_str()
                            .map(str::to_owned)
                            .unwrap_or_else(|| p.to_string())
                    })
                    .collect::<Vec<_>>()
                    .join(" "),
                Some(_) => return Err("\"prompt\" must be a string or an array".into()),
                None => return Err("\"prompt\" is required".into()),
            },
            Api::Chat => match object.get("messages") {
                Some(Value::Array(messages)) if !messages.is_empty() => messages
                    .iter()
                    .map(|m| match &m["content"] {
                        Value::String(content) => content.clone(),
                        other => other.to_string(),
                    })
                    .collect::<Vec<_>>()
                    .join(" "),
                Some(Value::Array(_)) => return Err("\"messages\" must not be empty".into()),
                Some(_) => return Err("\"messages\" must be an array".into()),
                None => return Err("\"messages\" is required".into()),
            },
        };
        let model = match object.get("model") {
            None | Some(Value::Null) => None,
            Some(Value::String(model)) => Some(model.clone()),
            Some(_) => return Err("\"model\" must be a string".into()),
        };
        let stream = match object.get("stream") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(stream)) => *stream,
            Some(_) => return Err("\"stream\" must be a boolean".into()),
        };
        let max_tokens = match object
            .get("max_tokens")
            .or(object.get("max_completion_tokens"))
        {
            None | Some(Value::Null) => None,
            Some(value) => Some(
                value
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or("\"max_tokens\" must be a non-negative integer")?,
            ),
        };
        let include_usage = object
            .get("stream_options")
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        Ok(Self {
            model,
            stream,
            include_usage,
            max_tokens,
            prompt_words: u32::try_from(text.split_whitespace().count()).unwrap_or(u32::MAX),
        })
    }
}

/// Who answers and under which names: the fields every answer carries.
#[derive(Debug, Clone)]
pub struct Answer<'a> {
    pub api: Api,
    /// `cmpl-<engine id>-<seq>` or `chatcmpl-<engine id>-<seq>`.
    pub id: String,
    pub engine_id: &'a str,
    pub model: &'a str,
    pub created: u64,
}

impl<'a> Answer<'a> {
    pub fn new(api: Api, engine_id: &'a str, seq: u64, model: &'a str, created: u64) -> Self {
        let prefix = match api {
            Api::Completions => "cmpl",
            Api::Chat => "chatcmpl",
        };
        Self {
            api,
            id: format!("{prefix}-{engine_id}-{seq}"),
            engine_id,
            model,
            created,
        }
    }

    /// The `i`-th generated token (0-based): names the engine, so the text shows where it ran.
    pub fn token(&self, i: u32) -> String {
        format!("{}#{} ", self.engine_id, i + 1)
    }

    fn envelope(&self, stream: bool, choice: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.api.object(stream),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.engine_id,
            "stub_engine_id": self.engine_id,
            "choices": [choice],
        })
    }

    /// The whole answer of a non-streaming request.
    pub fn complete(&self, tokens: u32, prompt_words: u32) -> Value {
        let text: String = (0..tokens).map(|i| self.token(i)).collect();
        let choice = match self.api {
            Api::Completions => json!({
                "index": 0, "text": text, "logprobs": null, "finish_reason": "length",
            }),
            Api::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": null,
                "finish_reason": "length",
            }),
        };
        let mut answer = self.envelope(false, choice);
        answer["usage"] = usage(prompt_words, tokens);
        answer
    }

    /// SSE chunk `i` of `tokens` (the last one carries `finish_reason`).
    pub fn chunk(&self, i: u32, tokens: u32) -> Value {
        let finish_reason = if i + 1 == tokens {
            json!("length")
        } else {
            Value::Null
        };
        let choice = match self.api {
            Api::Completions => json!({
                "index": 0, "text": self.token(i), "logprobs": null,
                "finish_reason": finish_reason,
            }),
            Api::Chat => {
                let delta = if i == 0 {
                    json!({"role": "assistant", "content": self.token(i)})
                } else {
                    json!({"content": self.token(i)})
                };
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason})
            }
        };
        self.envelope(true, choice)
    }

    /// The chunk with no choices and the usage, sent last when `stream_options.include_usage`.
    pub fn usage_chunk(&self, tokens: u32, prompt_words: u32) -> Value {
        let mut chunk = self.envelope(true, Value::Null);
        chunk["choices"] = json!([]);
        chunk["usage"] = usage(prompt_words, tokens);
        chunk
    }
}

fn usage(prompt_words: u32, tokens: u32) -> Value {
    json!({
        "prompt_tokens": prompt_words,
        "completion_tokens": tokens,
        "total_tokens": prompt_words.saturating_add(tokens),
    })
}

/// An OpenAI-style error body.
pub fn error(message: &str, kind: &str, code: u16) -> Value {
    json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
}

/// The `GET /v1/models` answer: the one model the stub serves.
pub fn models(model: &str, engine_id: &str) -> Value {
    json!({
        "object": "list",
        "data": [{"id": model, "object": "model", "created": 0, "owned_by": "burst-prefix-stub-engine"}],
        "stub_engine_id": engine_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_it_needs() {
        let request = Request::parse(
            Api::Chat,
            &json!({"model": "m", "stream": true, "max_tokens": 3,
                    "stream_options": {"include_usage": true},
                    "messages": [{"role": "user", "content": "a b c"}]}),
        )
        .unwrap();
        assert_eq!(
            request,
            Request {
                model: Some("m".into()),
                stream: true,
                include_usage: true,
                max_tokens: Some(3),
                prompt_words: 3,
            }
        );
        let request = Request::parse(Api::Completions, &json!({"prompt": ["a b", "c"]})).unwrap();
        assert_eq!(
            (request.model, request.stream, request.prompt_words),
            (None, false, 3)
        );
    }

    #[test]
    fn refuses_bad_requests_with_the_field() {
        for (api, body, needle) in [
            (Api::Completions, json!([1]), "JSON object"),
            (Api::Completions, json!({}), "\"prompt\" is required"),
            (Api::Completions, json!({"prompt": 1}), "\"prompt\""),
            (
                Api::Chat,
                json!({"prompt": "x"}),
                "\"messages\" is required",
            ),
            (Api::Chat, json!({"messages": []}), "must not be empty"),
            (
                Api::Completions,
                json!({"prompt": "x", "stream": "yes"}),
                "\"stream\"",
            ),
            (
                Api::Completions,
                json!({"prompt": "x", "max_tokens": -1}),
                "\"max_tokens\"",
            ),
            (
                Api::Completions,
                json!({"prompt": "x", "model": 7}),
                "\"model\"",
            ),
        ] {
            let err = Request::parse(api, &body).unwrap_err();
            assert!(err.contains(needle), "{err} should mention {needle}");
        }
    }

    #[test]
    fn answers_in_openai_shape_naming_the_engine() {
        let answer = Answer::new(Api::Chat, "pod-a", 7, "m", 1);
        let whole = answer.complete(2, 5);
        assert_eq!(whole["id"], "chatcmpl-pod-a-7");
        assert_eq!(whole["object"], "chat.completion");
        assert_eq!(whole["stub_engine_id"], "pod-a");
        assert_eq!(
            whole["choices"][0]["message"]["content"],
            "pod-a#1 pod-a#2 "
        );
        assert_eq!(whole["usage"]["total_tokens"], 7);

        let first = answer.chunk(0, 2);
        assert_eq!(first["object"], "chat.completion.chunk");
        assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(first["choices"][0]["finish_reason"], Value::Null);
        assert_eq!(answer.chunk(1, 2)["choices"][0]["finish_reason"], "length");
        assert_eq!(answer.usage_chunk(2, 5)["choices"], json!([]));

        let completion = Answer::new(Api::Completions, "pod-b", 1, "m", 1).chunk(0, 1);
        assert_eq!(completion["object"], "text_completion");
        assert_eq!(completion["choices"][0]["text"], "pod-b#1 ");
    }
}
