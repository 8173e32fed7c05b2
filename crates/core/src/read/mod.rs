//! Stage 2 of the path, **read** (docs/architecture.md): the whole body read into the request
//! the core places, once: parsed ([`json`]), its hints (the headers' win over the body's), a new
//! weight version noted, its prompts as the engine's token ids when a tokenizer is in use, and
//! its prefix blocks hashed (docs/behaviour.md §1) under the config it is placed with, among the
//! endpoints its gateway allows.
//!
//! The body is parsed straight into typed, borrowed values (strings point into the body wherever
//! JSON escapes allow), never into a `serde_json::Value` tree: parsing costs about the body's own
//! size, and fields the producer does not read are skipped without being kept. Once hashed, a
//! request holds only its block hashes ([`HashedRequest`]). Every error names its field once, by
//! its path in the body (`prompt[1]: expected a string like prompt[0], got a number`).

mod json;

pub use crate::error::RequestError;

use std::borrow::Cow;
use std::sync::Arc;

use burst_prefix_planner::{hash_prompts, BlockHash, BlockSpec, Prompt};

use crate::admit::Hints;
use crate::config_store::Snapshot;
use crate::engines::Engines;
use crate::error::PlaceError;

/// The key of the hints in a request body.
pub const HINTS_FIELD: &str = "burst_prefix";

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
    /// The longest answer it asks for: `max_completion_tokens`, else `max_tokens`.
    pub max_answer_tokens: Option<u32>,
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
        if let Ok(request) = <Self as serde::Deserialize>::deserialize(&mut deserializer) {
            if deserializer.end().is_ok() {
                return Ok(request);
            }
        }
        // Only a bad body is read again, tracking where it failed for the error: tracking costs
        // as much as reading, and reading a prompt of token ids is most of a request's cost.
        let mut deserializer = serde_json::Deserializer::from_slice(body);
        let request =
            serde_path_to_error::deserialize(&mut deserializer).map_err(RequestError::from_json)?;
        deserializer
            .end()
            .map_err(|e| RequestError::Json(e.to_string()))?;
        Ok(request)
    }

    /// Block hashes per non-empty prompt (docs/behaviour.md §1).
    pub fn block_hashes(&self, spec: BlockSpec) -> Vec<Vec<BlockHash>> {
        let prompts: Vec<Prompt<'_>> = self.prompts.iter().map(PromptInput::as_prompt).collect();
        hash_prompts(&self.model, &self.cache_salt, &prompts, spec)
    }
}

/// A request ready for the planner: all it keeps of its body.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HashedRequest {
    /// Its prompts' chains, concatenated.
    pub blocks: Vec<BlockHash>,
    /// Candidate endpoint ids; `None` means all.
    pub endpoints: Option<Vec<String>>,
    /// The longest answer it asks for (the time cost prices its decode at no more).
    pub max_answer_tokens: Option<u32>,
}

impl HashedRequest {
    /// `request` hashed under `spec`, its own endpoint list kept.
    pub fn new(request: &InferenceRequest<'_>, spec: BlockSpec) -> Self {
        Self::from_chains(request.block_hashes(spec), request)
    }

    /// From `request`'s chains, already hashed.
    fn from_chains(chains: Vec<Vec<BlockHash>>, request: &InferenceRequest<'_>) -> Self {
        HashedRequest {
            blocks: chains.concat(),
            endpoints: request
                .endpoints
                .as_ref()
                .map(|ids| ids.iter().map(|id| id.to_string()).collect()),
            max_answer_tokens: request.max_answer_tokens,
        }
    }

    /// What the request holds while it waits in a window.
    pub fn held_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.blocks.len() * std::mem::size_of::<BlockHash>()
            + self
                .endpoints
                .as_ref()
                .map_or(0, |ids| ids.iter().map(|id| id.len() + 24).sum())
    }
}

/// A request read: parsed, its hints, and hashed under one config.
#[derive(Debug)]
pub struct Read<'a> {
    request: InferenceRequest<'a>,
    pub hints: Hints,
    /// The config it was hashed under.
    pub snapshot: Arc<Snapshot>,
    pub hashed: HashedRequest,
}

/// Reads `body` (a whole request body whose headers said `header_hints`) and hashes it under
/// `snapshot`, the config in force (`None`: none yet, `no_endpoints` once the body is read),
/// among the endpoints whose address `subset` lists (a gateway's subset hint).
pub(crate) fn read<'a>(
    body: &'a [u8],
    header_hints: Hints,
    snapshot: Option<Arc<Snapshot>>,
    subset: Option<&[String]>,
    engines: &Engines,
) -> Result<Read<'a>, PlaceError> {
    let mut request = InferenceRequest::parse(body)?;
    let body_hints = std::mem::take(&mut request.hints);
    let hints = Hints {
        group_size: header_hints.group_size.or(body_hints.group_size),
        weight_version: header_hints.weight_version.or(body_hints.weight_version),
    };
    if let Some(version) = &hints.weight_version {
        engines.weights(version);
    }
    let prompts: Vec<Prompt<'_>> = request.prompts.iter().map(PromptInput::as_prompt).collect();
    if let Some(tokens) = engines.token_prompts(body, request.chat, &prompts) {
        request.prompts = tokens.into_iter().map(PromptInput::Tokens).collect();
    }
    let snapshot = snapshot.ok_or(PlaceError::NoEndpoints)?;
    let hashed = hash(&request, &snapshot, subset, engines)?;
    Ok(Read {
        request,
        hints,
        snapshot,
        hashed,
    })
}

impl Read<'_> {
    /// Hashes the request again under `snapshot`: a window opened under another config than
    /// the one it was hashed under takes it only so (docs/behaviour.md §3).
    pub(crate) fn rehash(
        &mut self,
        snapshot: Arc<Snapshot>,
        subset: Option<&[String]>,
        engines: &Engines,
    ) -> Result<(), PlaceError> {
        self.hashed = hash(&self.request, &snapshot, subset, engines)?;
        self.snapshot = snapshot;
        Ok(())
    }
}

/// Hashes a request under `snapshot`'s config, among its gateway's `subset` when it has one, and
/// notes what the engines hold of its first prompt.
fn hash(
    request: &InferenceRequest<'_>,
    snapshot: &Snapshot,
    subset: Option<&[String]>,
    engines: &Engines,
) -> Result<HashedRequest, PlaceError> {
    let spec = snapshot.settings.block_spec;
    let chains = request.block_hashes(spec);
    if let (Some(PromptInput::Tokens(tokens)), Some(chain)) =
        (request.prompts.first(), chains.first())
    {
        if !tokens.is_empty() {
            engines.note_held(tokens, chain, spec.block_size_tokens);
        }
    }
    let mut hashed = HashedRequest::from_chains(chains, request);
    if let Some(subset) = subset {
        let named = hashed.endpoints.as_deref();
        let allowed: Vec<String> = snapshot
            .config
            .endpoints
            .iter()
            .filter(|endpoint| subset.contains(&endpoint.address))
            .filter(|endpoint| named.is_none_or(|ids| ids.contains(&endpoint.id)))
            .map(|endpoint| endpoint.id.clone())
            .collect();
        if allowed.is_empty() {
            return Err(PlaceError::NoEligibleEndpoint);
        }
        hashed.endpoints = Some(allowed);
    }
    Ok(hashed)
}

#[cfg(test)]
mod tests;
