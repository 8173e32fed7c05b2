use super::*;
use serde_json::{json, Value};
use std::num::NonZeroU32;

fn with<T>(body: Value, check: impl FnOnce(Result<InferenceRequest<'_>, RequestError>) -> T) -> T {
    let bytes = body.to_string().into_bytes();
    check(InferenceRequest::parse(&bytes))
}

fn prompts(body: Value) -> Vec<PromptInput<'static>> {
    with(body, |parsed| {
        parsed
            .unwrap()
            .prompts
            .into_iter()
            .map(|prompt| match prompt {
                PromptInput::Text(text) => PromptInput::Text(Cow::Owned(text.into_owned())),
                PromptInput::Tokens(tokens) => PromptInput::Tokens(tokens),
            })
            .collect()
    })
}

fn error(body: Value) -> String {
    with(body, |parsed| parsed.unwrap_err().to_string())
}

fn hashes(body: Value, block: usize) -> Vec<Vec<u64>> {
    with(body, |parsed| {
        parsed.unwrap().block_hashes(BlockSpec::new(block, 0))
    })
}

fn text(text: &str) -> PromptInput<'static> {
    PromptInput::Text(Cow::Owned(text.to_string()))
}

#[test]
fn chat_matches_the_spec_vector() {
    let body = json!({
        "model": "llama",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": [{"type": "text", "text": "Hello!"}]},
        ],
    });
    assert_eq!(
        prompts(body.clone()),
        vec![text("systemYou are a helpful assistant.userHello!")]
    );
    assert_eq!(
        hashes(body.clone(), 4),
        vec![vec![
            0xe77a870ac50a0797,
            0x24079cc05ca07818,
            0x7a8b7d23187ae718
        ]]
    );
    assert_eq!(hashes(body, 64), vec![vec![0x0fafa73bef220adc]]);
}

#[test]
fn token_prompt_and_salt_match_the_spec_vectors() {
    let body =
        json!({"model": "m", "prompt": (1..=10).collect::<Vec<u32>>(), "cache_salt": "salt"});
    assert_eq!(
        hashes(body, 4),
        vec![vec![
            0x71966444900f601d,
            0x2df7485150fcee96,
            0xa760a4765b4d3be5
        ]]
    );
}

#[test]
fn every_completions_prompt_shape() {
    let shape = |prompt: Value| prompts(json!({"model": "m", "prompt": prompt}));
    assert_eq!(shape(json!("hi")), vec![text("hi")]);
    assert_eq!(shape(json!(["a", "b"])), vec![text("a"), text("b")]);
    assert_eq!(shape(json!([1, 2])), vec![PromptInput::Tokens(vec![1, 2])]);
    assert_eq!(
        shape(json!([[1], [2, 3]])),
        vec![
            PromptInput::Tokens(vec![1]),
            PromptInput::Tokens(vec![2, 3])
        ]
    );
    assert_eq!(shape(json!([])), vec![]);
}

#[test]
fn strings_without_escapes_borrow_from_the_body() {
    let body = br#"{"model": "m", "prompt": "plain text", "other": {"deep": [1, 2]}}"#;
    let request = InferenceRequest::parse(body).unwrap();
    assert!(matches!(request.model, Cow::Borrowed("m")));
    assert!(matches!(
        &request.prompts[0],
        PromptInput::Text(Cow::Borrowed("plain text"))
    ));
    let escaped = InferenceRequest::parse(br#"{"model": "m", "prompt": "a\nb"}"#).unwrap();
    assert_eq!(escaped.prompts, vec![text("a\nb")]);
}

#[test]
fn tools_are_flattened_first_as_compact_json() {
    let body = json!({
        "model": "m",
        "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": null}],
        "tools": [{"type": "function", "function": {"name": "f"}}],
    });
    assert_eq!(
        prompts(body),
        vec![text(
            r#"[{"function":{"name":"f"},"type":"function"}]userxassistant"#
        )]
    );
}

#[test]
fn non_text_parts_and_unknown_fields_are_skipped() {
    let body = json!({
        "model": "m",
        "temperature": 0.5,
        "messages": [{"content": [{"type": "image_url", "image_url": {"url": "u"}}, {"type": "text", "text": "t"}], "role": "user", "name": "n"}],
    });
    assert_eq!(prompts(body), vec![text("usert")]);
}

#[test]
fn endpoints_salt_and_hints_are_read() {
    let body = json!({"model": "m", "prompt": "x", "cache_salt": "s", "endpoints": ["ns/a-rank-0"], "burst_prefix": {"group_size": 8}});
    with(body, |parsed| {
        let request = parsed.unwrap();
        assert_eq!(request.cache_salt, "s");
        assert_eq!(request.endpoints, Some(vec![Cow::Borrowed("ns/a-rank-0")]));
        assert_eq!(request.hints.group_size, NonZeroU32::new(8));
    });
    with(
        json!({"model": "m", "prompt": "x", "cache_salt": null, "endpoints": null}),
        |parsed| {
            let request = parsed.unwrap();
            assert_eq!((request.cache_salt.as_ref(), request.endpoints), ("", None));
        },
    );
}

#[test]
fn bad_bodies_name_the_field_once() {
    assert_eq!(
        InferenceRequest::parse(b"{").unwrap_err().code(),
        "invalid_json"
    );
    assert_eq!(
        InferenceRequest::parse(br#"{"model": "m", "prompt": "x"} trailing"#)
            .unwrap_err()
            .code(),
        "invalid_json"
    );
    let cases = [
        (json!([1]), "body: expected a JSON object, got an array"),
        (json!({"prompt": "x"}), "body: `model` is missing (required)"),
        (json!({"model": "", "prompt": "x"}), "body: `model` must not be empty"),
        (json!({"model": 3, "prompt": "x"}), "model: expected a string, got a number"),
        (json!({"model": null, "prompt": "x"}), "model: expected a string, got null"),
        (json!({"model": "m"}), "body: `prompt` (completions) or `messages` (chat) is missing"),
        (
            json!({"model": "m", "prompt": "x", "messages": []}),
            "body: `prompt` and `messages` are both set: send a completions or a chat request",
        ),
        (
            json!({"model": "m", "prompt": {"a": 1}}),
            "prompt: expected a string, a list of strings, a list of token IDs or a list of token-ID lists, got an object",
        ),
        (
            json!({"model": "m", "prompt": [{"a": 1}]}),
            "prompt[0]: expected a string, a token ID or a list of token IDs, got an object",
        ),
        (
            json!({"model": "m", "prompt": ["a", 1]}),
            "prompt[1]: expected a string like prompt[0], got a number",
        ),
        (
            json!({"model": "m", "prompt": [1, -1]}),
            "prompt[1]: expected a token ID (an integer from 0 to 4294967295), got -1",
        ),
        (
            json!({"model": "m", "prompt": [1, 4294967296u64]}),
            "prompt[1]: expected a token ID (an integer from 0 to 4294967295), got 4294967296",
        ),
        (
            json!({"model": "m", "prompt": [1, "a"]}),
            "prompt[1]: expected a token ID (an integer from 0 to 4294967295), got a string",
        ),
        (
            json!({"model": "m", "prompt": [[1], [1.5]]}),
            "prompt[1][0]: expected a token ID (an integer from 0 to 4294967295), got 1.5",
        ),
        (
            json!({"model": "m", "prompt": [[1], 2]}),
            "prompt[1]: expected a list of token IDs like prompt[0], got a number",
        ),
        (
            json!({"model": "m", "messages": [{"content": "x"}]}),
            "messages[0]: `role` is missing (required)",
        ),
        (
            json!({"model": "m", "messages": ["hi"]}),
            "messages[0]: expected a message object, got a string",
        ),
        (
            json!({"model": "m", "messages": [{"role": "user", "content": 5}]}),
            "messages[0].content: expected a string or an array of content parts, got a number",
        ),
        (
            json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "text"}]}]}),
            "messages[0].content[0]: a text part needs `text`",
        ),
        (
            json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]}),
            "messages[0].content[0].text: expected a string, got a number",
        ),
        (
            json!({"model": "m", "messages": "hi"}),
            "messages: expected an array of messages, got a string",
        ),
        (
            json!({"model": "m", "messages": [], "tools": {}}),
            "tools: expected an array, got an object",
        ),
        (
            json!({"model": "m", "prompt": "x", "endpoints": [1]}),
            "endpoints[0]: expected an endpoint id string, got a number",
        ),
        (
            json!({"model": "m", "prompt": "x", "endpoints": "a"}),
            "endpoints: expected an array of endpoint ids, got a string",
        ),
        (
            json!({"model": "m", "prompt": "x", "cache_salt": 1}),
            "cache_salt: expected a string, got a number",
        ),
        (
            json!({"model": "m", "prompt": "x", "burst_prefix": {"group_size": 0}}),
            "burst_prefix.group_size: invalid value: integer `0`, expected a nonzero u32",
        ),
        (
            json!({"model": "m", "prompt": "x", "burst_prefix": {"size": 2}}),
            "burst_prefix.size: unknown field `size`, expected `group_size` or `weight_version`",
        ),
    ];
    for (body, expected) in cases {
        assert_eq!(error(body.clone()), expected, "{body}");
    }
}

#[test]
fn within_names_the_field_once() {
    let error = |body: Value| {
        with(body, |parsed| {
            parsed.unwrap_err().within("requests[0].body").to_string()
        })
    };
    assert_eq!(
        error(json!([1])),
        "requests[0].body: expected a JSON object, got an array"
    );
    assert_eq!(
        error(json!({"model": 1, "prompt": "x"})),
        "requests[0].body.model: expected a string, got a number"
    );
    assert!(InferenceRequest::parse(b"{")
        .unwrap_err()
        .within("requests[0].body")
        .to_string()
        .starts_with("requests[0].body: malformed JSON: EOF"));
}

#[test]
fn the_longest_answer_asked_for_is_read_and_never_refused() {
    let cap = |extra: Value| {
        let mut body = json!({"model": "m", "prompt": "x"});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        with(body, |parsed| parsed.unwrap().max_answer_tokens)
    };
    assert_eq!(cap(json!({})), None);
    assert_eq!(cap(json!({"max_tokens": 4})), Some(4));
    assert_eq!(cap(json!({"max_tokens": 4.0})), Some(4));
    assert_eq!(cap(json!({"max_tokens": 1u64 << 40})), Some(u32::MAX));
    // Chat's newer name wins over the deprecated one, wherever each is.
    assert_eq!(
        cap(json!({"max_completion_tokens": 16, "max_tokens": 4})),
        Some(16)
    );
    assert_eq!(
        cap(json!({"max_tokens": 4, "max_completion_tokens": null})),
        Some(4)
    );
    // What the engine judges: no cap for the time cost, not a refusal here.
    for odd in [
        json!(null),
        json!(-1),
        json!("4"),
        json!(true),
        json!([4]),
        json!({"n": 4}),
    ] {
        assert_eq!(cap(json!({ "max_tokens": odd })), None, "{odd}");
    }
}
