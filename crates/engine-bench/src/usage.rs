//! What the engine says it computed: llama-server's usage fields, read from a completion (JSON)
//! or from the last events of a stream (SSE).
//!
//! `usage.prompt_tokens_details.cached_tokens` is OpenAI's field; llama-server also sends a
//! `timings` object whose `cache_n` and `prompt_n` split the same prompt into reused and
//! computed tokens. When both are there they must agree, or the parser is misreading them.

use serde::Deserialize;

/// One request's prompt accounting, as the engine reported it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineUsage {
    pub prompt_tokens: u64,
    /// Tokens generated (0 when the answer does not say).
    pub completion_tokens: u64,
    /// Prompt tokens taken from the prefix cache (a slot's KV or the host prompt cache).
    pub cached_tokens: u64,
    /// llama-server's `timings`, when sent.
    pub timings: Option<Timings>,
}

#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
pub struct Timings {
    pub cache_n: u64,
    pub prompt_n: u64,
    pub prompt_ms: f64,
}

impl EngineUsage {
    /// Prompt tokens the engine computed (prefilled).
    pub fn computed_tokens(&self) -> u64 {
        self.prompt_tokens - self.cached_tokens
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum UsageError {
    #[error("not a completion: {0}")]
    NotJson(String),
    #[error("the answer has no usage (an error, or stream_options.include_usage was not set)")]
    NoUsage,
    #[error("cached_tokens {cached} exceeds prompt_tokens {prompt}")]
    CachedBeyondPrompt { cached: u64, prompt: u64 },
    #[error(
        "timings disagree with usage: cache_n {cache_n} + prompt_n {prompt_n} against \
         cached_tokens {cached} of prompt_tokens {prompt}"
    )]
    Disagree {
        cache_n: u64,
        prompt_n: u64,
        cached: u64,
        prompt: u64,
    },
}

#[derive(Deserialize)]
struct Answer {
    usage: Option<Usage>,
    timings: Option<Timings>,
}

#[derive(Deserialize)]
struct Usage {
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<PromptTokensDetails>,
}

#[derive(Deserialize)]
struct PromptTokensDetails {
    #[serde(default)]
    cached_tokens: u64,
}

/// The usage of a non-streaming completion's body.
pub fn from_completion(body: &[u8]) -> Result<EngineUsage, UsageError> {
    let answer: Answer =
        serde_json::from_slice(body).map_err(|e| UsageError::NotJson(e.to_string()))?;
    checked(answer.usage.ok_or(UsageError::NoUsage)?, answer.timings)
}

/// The usage of a streamed completion (the whole SSE body): the last event that carries
/// `usage`, with the last `timings` seen (llama-server sends both on its final events).
pub fn from_sse(body: &[u8]) -> Result<EngineUsage, UsageError> {
    let text = std::str::from_utf8(body).map_err(|e| UsageError::NotJson(e.to_string()))?;
    let mut usage = None;
    let mut timings = None;
    for data in text
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(str::trim)
        .filter(|data| *data != "[DONE]" && !data.is_empty())
    {
        let event: Answer =
            serde_json::from_str(data).map_err(|e| UsageError::NotJson(e.to_string()))?;
        usage = event.usage.or(usage);
        timings = event.timings.or(timings);
    }
    checked(usage.ok_or(UsageError::NoUsage)?, timings)
}

fn checked(usage: Usage, timings: Option<Timings>) -> Result<EngineUsage, UsageError> {
    let prompt = usage.prompt_tokens;
    let cached = usage.prompt_tokens_details.map_or(0, |d| d.cached_tokens);
    if cached > prompt {
        return Err(UsageError::CachedBeyondPrompt { cached, prompt });
    }
    if let Some(t) = timings {
        if t.cache_n != cached || t.cache_n + t.prompt_n != prompt {
            return Err(UsageError::Disagree {
                cache_n: t.cache_n,
                prompt_n: t.prompt_n,
                cached,
                prompt,
            });
        }
    }
    Ok(EngineUsage {
        prompt_tokens: prompt,
        completion_tokens: usage.completion_tokens,
        cached_tokens: cached,
        timings,
    })
}
