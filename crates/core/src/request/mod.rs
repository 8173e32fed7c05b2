//! An inference request body (OpenAI completions or chat completions, as a client or a gateway
//! sends it) read into prompts and prefix blocks (docs/behaviour.md §1).
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
pub mod error;
mod hashed;

pub use error::RequestError;
pub use hashed::HashedRequest;

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
    /// A chat request (its one prompt is its messages, flattened for the estimate).
    pub chat: bool,
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

    /// The same request with its prompts as the engine's token ids (from the model's
    /// tokenizer), hashed as they are instead of as estimates.
    pub fn with_token_prompts(mut self, prompts: Vec<Vec<u32>>) -> Self {
        self.prompts = prompts.into_iter().map(PromptInput::Tokens).collect();
        self
    }

    /// Block hashes per non-empty prompt (docs/behaviour.md §1).
    pub fn block_hashes(&self, spec: BlockSpec) -> Vec<Vec<BlockHash>> {
        let prompts: Vec<Prompt<'_>> = self.prompts.iter().map(PromptInput::as_prompt).collect();
        hash_prompts(&self.model, &self.cache_salt, &prompts, spec)
    }
}

#[cfg(test)]
mod tests;
