//! The request body parser (docs/behaviour.md §1): bytes in, a request or an error that names its
//! field out, and a request hashes into prefix blocks deterministically.

use burst_prefix_core::read::{InferenceRequest, PromptInput, RequestError};
use burst_prefix_planner::{hash_prompts, BlockSpec, Prompt};

/// The block specs every parsed request is hashed under: the smallest block, a small one, the
/// default, and a small per-prompt cap.
const SPECS: [(usize, usize); 4] = [(1, 0), (4, 0), (64, 0), (4, 8)];

/// Parses `data` as a body and checks what came out; returns the parse for callers that go on.
pub fn check(data: &[u8]) -> Result<InferenceRequest<'_>, RequestError> {
    let parsed = InferenceRequest::parse(data);
    assert_eq!(
        parsed,
        InferenceRequest::parse(data),
        "parsing is deterministic"
    );
    // serde_json's own reading of the same bytes: what is well-formed JSON, and what is a
    // well-formed JSON value (strings valid UTF-8 too).
    let well_formed = serde_json::from_slice::<serde::de::IgnoredAny>(data).is_ok();
    let value = serde_json::from_slice::<serde_json::Value>(data).is_ok();
    match &parsed {
        Ok(request) => {
            assert!(well_formed, "a body that parses is well-formed JSON");
            check_request(request);
        }
        Err(error) => {
            check_error(error);
            if value {
                assert!(
                    matches!(error, RequestError::Field { .. }),
                    "a well-formed JSON body is refused for a field, not as malformed JSON: {error}"
                );
            }
        }
    }
    parsed
}

fn check_request(request: &InferenceRequest<'_>) {
    assert!(!request.model.is_empty(), "a request names its model");
    let prompts: Vec<Prompt<'_>> = request
        .prompts
        .iter()
        .map(|prompt| match prompt {
            PromptInput::Text(text) => Prompt::Text(text),
            PromptInput::Tokens(tokens) => Prompt::Tokens(tokens),
        })
        .collect();
    let non_empty: Vec<&Prompt<'_>> = prompts.iter().filter(|p| p.token_count() > 0).collect();
    for (block, max_prefix) in SPECS {
        let spec = BlockSpec::new(block, max_prefix);
        let hashes = request.block_hashes(spec);
        assert_eq!(
            hashes,
            request.block_hashes(spec),
            "hashing is deterministic"
        );
        assert_eq!(
            hashes.len(),
            non_empty.len(),
            "one chain per non-empty prompt"
        );
        for (chain, prompt) in hashes.iter().zip(&non_empty) {
            let blocks = prompt.token_count().div_ceil(block).min(spec.max_blocks);
            assert_eq!(chain.len(), blocks, "blocks of {prompt:?} at {spec:?}");
            // A prefix of whole blocks hashes to the prefix of the chain (what makes requests
            // that share a prompt prefix share blocks).
            if chain.len() > 1 {
                let cut = chain.len() / 2;
                let prefix = match prompt {
                    Prompt::Tokens(tokens) => Prompt::Tokens(&tokens[..cut * block]),
                    Prompt::Text(text) => {
                        let bytes = &text.as_bytes()[..cut * block * 4];
                        // A cut inside a UTF-8 sequence has no `str`: hash the same bytes as
                        // token IDs instead (estimate tokens are the bytes as LE u32s).
                        match std::str::from_utf8(bytes) {
                            Ok(text) => Prompt::Text(text),
                            Err(_) => continue,
                        }
                    }
                };
                let again = hash_prompts(&request.model, &request.cache_salt, &[prefix], spec);
                assert_eq!(again, vec![chain[..cut].to_vec()], "prefix of {prompt:?}");
            }
        }
    }
}

/// An error names its field, once, and keeps doing so under a prefix.
pub fn check_error(error: &RequestError) {
    let field = error.field();
    assert!(!field.is_empty(), "an error names a field: {error:?}");
    let text = error.to_string();
    match error {
        RequestError::Json(_) => {
            assert_eq!(error.code(), "invalid_json");
            assert_eq!(field, "body");
        }
        RequestError::Field { problem, .. } => {
            assert_eq!(error.code(), "invalid_request");
            assert_eq!(text, format!("{field}: {problem}"));
            assert!(!problem.is_empty(), "a field error says what is wrong");
            assert!(
                !ends_with_position(problem),
                "a field error names the field, not a position: {problem:?}"
            );
        }
    }
    let within = error.clone().within("requests[7].body");
    assert!(
        within.field().starts_with("requests[7].body"),
        "{within:?} under requests[7].body"
    );
    assert!(
        !within.field().starts_with("requests[7].body.body"),
        "the body is named once: {within:?}"
    );
}

/// serde_json's ` at line L column C` suffix.
fn ends_with_position(text: &str) -> bool {
    let Some((rest, column)) = text.rsplit_once(" column ") else {
        return false;
    };
    let Some((_, line)) = rest.rsplit_once(" at line ") else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    digits(line) && digits(column)
}
