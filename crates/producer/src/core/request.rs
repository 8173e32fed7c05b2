//! An inference request body (OpenAI completions or chat completions, as a client or a gateway
//! sends it) read into prompts and prefix blocks (SPEC §1).
//!
//! The body is parsed straight into typed, borrowed values (strings point into the body wherever
//! JSON escapes allow), never into a `serde_json::Value` tree: parsing costs about the body's own
//! size, and fields the producer does not read are skipped without being kept. Once hashed, a
//! request holds only its block hashes. Every error names its field once, by its path in the body
//! (`prompt[1]: expected a string like prompt[0], got a number`).

use std::borrow::Cow;
use std::fmt;
use std::num::NonZeroU32;

use burst_prefix_planner::{hash_prompts, BlockHash, BlockSpec, Prompt};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

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

/// What a client may tell the producer about its request, in the body under `"burst_prefix"`
/// (a name no inference server reads) or in `x-burst-prefix-*` headers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hints {
    /// How many requests (this one included) share this exact prompt; a window whose hinted
    /// groups are all complete is sealed at once.
    pub group_size: Option<NonZeroU32>,
}

/// The key of [`Hints`] in a request body.
pub const HINTS_FIELD: &str = "burst_prefix";

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

impl<'de> Deserialize<'de> for InferenceRequest<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(BodyVisitor)
    }
}

struct BodyVisitor;

impl<'de> Visitor<'de> for BodyVisitor {
    type Value = InferenceRequest<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
        let mut model = None;
        let mut cache_salt = None;
        let mut prompt = None;
        let mut chat = None;
        let mut tools = String::new();
        let mut endpoints = None;
        let mut hints = Hints::default();
        while let Some(key) = map.next_key::<Text<'de>>()? {
            match &*key.0 {
                "model" => model = Some(map.next_value::<Text<'de>>()?.0),
                "cache_salt" => cache_salt = map.next_value::<Option<Text<'de>>>()?.map(|t| t.0),
                "prompt" => prompt = Some(map.next_value::<CompletionPrompts<'de>>()?.0),
                "messages" => chat = Some(map.next_value_seed(ChatText)?),
                "tools" => tools = map.next_value::<Tools>()?.0,
                "endpoints" => {
                    endpoints = map.next_value::<Option<EndpointIds<'de>>>()?.map(|e| e.0)
                }
                HINTS_FIELD => hints = map.next_value::<Option<Hints>>()?.unwrap_or_default(),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let model = match model {
            None => return Err(de::Error::custom("`model` is missing (required)")),
            Some(model) if model.is_empty() => {
                return Err(de::Error::custom("`model` must not be empty"))
            }
            Some(model) => model,
        };
        let prompts =
            match (prompt, chat) {
                (Some(_), Some(_)) => return Err(de::Error::custom(
                    "`prompt` and `messages` are both set: send a completions or a chat request",
                )),
                (Some(prompts), None) => prompts,
                (None, Some(mut text)) => {
                    // The tools come first in the flattened text, wherever they are in the body.
                    if !tools.is_empty() {
                        text = tools + &text;
                    }
                    vec![PromptInput::Text(Cow::Owned(text))]
                }
                (None, None) => {
                    return Err(de::Error::custom(
                        "`prompt` (completions) or `messages` (chat) is missing",
                    ))
                }
            };
        Ok(InferenceRequest {
            model,
            cache_salt: cache_salt.unwrap_or_default(),
            prompts,
            endpoints,
            hints,
        })
    }
}

/// A string, borrowed from the body unless it has escapes.
struct Text<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(TextVisitor("a string"))
    }
}

struct TextVisitor(&'static str);

impl<'de> Visitor<'de> for TextVisitor {
    type Value = Text<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.0)
    }

    fn visit_borrowed_str<E: de::Error>(self, text: &'de str) -> Result<Self::Value, E> {
        Ok(Text(Cow::Borrowed(text)))
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
        Ok(Text(Cow::Owned(text.to_string())))
    }

    fn visit_string<E: de::Error>(self, text: String) -> Result<Self::Value, E> {
        Ok(Text(Cow::Owned(text)))
    }
}

/// One token ID: an integer from 0 to `u32::MAX`.
struct TokenId(u32);

impl<'de> Deserialize<'de> for TokenId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_u32(TokenIdVisitor)
    }
}

struct TokenIdVisitor;

fn not_a_token_id<E: de::Error>(got: impl fmt::Display) -> E {
    E::custom(format!(
        "expected a token ID (an integer from 0 to {}), got {got}",
        u32::MAX
    ))
}

impl Visitor<'_> for TokenIdVisitor {
    type Value = TokenId;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a token ID (an integer from 0 to {})", u32::MAX)
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<TokenId, E> {
        u32::try_from(value)
            .map(TokenId)
            .map_err(|_| not_a_token_id(value))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<TokenId, E> {
        u32::try_from(value)
            .map(TokenId)
            .map_err(|_| not_a_token_id(value))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<TokenId, E> {
        Err(not_a_token_id(value))
    }
}

/// A list of token IDs; `what` says what was expected, for the error.
struct TokenList(&'static str);

impl<'de> DeserializeSeed<'de> for TokenList {
    type Value = Vec<u32>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Vec<u32>, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for TokenList {
    type Value = Vec<u32>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.0)
    }

    fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<Vec<u32>, S::Error> {
        let mut tokens = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(TokenId(token)) = seq.next_element()? {
            tokens.push(token);
        }
        Ok(tokens)
    }
}

/// `prompt`: a string, a list of strings, a list of token IDs, or a list of token-ID lists.
struct CompletionPrompts<'a>(Vec<PromptInput<'a>>);

impl<'de> Deserialize<'de> for CompletionPrompts<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(CompletionPromptsVisitor)
    }
}

struct CompletionPromptsVisitor;

impl<'de> Visitor<'de> for CompletionPromptsVisitor {
    type Value = CompletionPrompts<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string, a list of strings, a list of token IDs or a list of token-ID lists")
    }

    fn visit_borrowed_str<E: de::Error>(self, text: &'de str) -> Result<Self::Value, E> {
        Ok(CompletionPrompts(vec![PromptInput::Text(Cow::Borrowed(
            text,
        ))]))
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
        Ok(CompletionPrompts(vec![PromptInput::Text(Cow::Owned(
            text.to_string(),
        ))]))
    }

    fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<Self::Value, S::Error> {
        // The first item decides the shape; every later one must be like it.
        let Some(first) = seq.next_element::<FirstPromptItem<'de>>()? else {
            return Ok(CompletionPrompts(Vec::new()));
        };
        let prompts = match first {
            FirstPromptItem::Text(text) => {
                let mut prompts = vec![PromptInput::Text(text)];
                while let Some(text) = seq.next_element_seed(TextLike("a string like prompt[0]"))? {
                    prompts.push(PromptInput::Text(text.0));
                }
                prompts
            }
            FirstPromptItem::Token(token) => {
                let mut tokens = Vec::with_capacity(seq.size_hint().unwrap_or(0) + 1);
                tokens.push(token);
                while let Some(TokenId(token)) = seq.next_element()? {
                    tokens.push(token);
                }
                vec![PromptInput::Tokens(tokens)]
            }
            FirstPromptItem::Tokens(tokens) => {
                let mut prompts = vec![PromptInput::Tokens(tokens)];
                while let Some(tokens) =
                    seq.next_element_seed(TokenList("a list of token IDs like prompt[0]"))?
                {
                    prompts.push(PromptInput::Tokens(tokens));
                }
                prompts
            }
        };
        Ok(CompletionPrompts(prompts))
    }
}

/// A string where `what` was expected.
struct TextLike(&'static str);

impl<'de> DeserializeSeed<'de> for TextLike {
    type Value = Text<'de>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Text<'de>, D::Error> {
        deserializer.deserialize_str(TextVisitor(self.0))
    }
}

/// The first item of a `prompt` list.
enum FirstPromptItem<'a> {
    Text(Cow<'a, str>),
    Token(u32),
    Tokens(Vec<u32>),
}

impl<'de> Deserialize<'de> for FirstPromptItem<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(FirstPromptItemVisitor)
    }
}

struct FirstPromptItemVisitor;

impl<'de> Visitor<'de> for FirstPromptItemVisitor {
    type Value = FirstPromptItem<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string, a token ID or a list of token IDs")
    }

    fn visit_borrowed_str<E: de::Error>(self, text: &'de str) -> Result<Self::Value, E> {
        Ok(FirstPromptItem::Text(Cow::Borrowed(text)))
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
        Ok(FirstPromptItem::Text(Cow::Owned(text.to_string())))
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Self::Value, E> {
        TokenIdVisitor
            .visit_u64(value)
            .map(|t| FirstPromptItem::Token(t.0))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Self::Value, E> {
        TokenIdVisitor
            .visit_i64(value)
            .map(|t| FirstPromptItem::Token(t.0))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<Self::Value, E> {
        TokenIdVisitor
            .visit_f64(value)
            .map(|t| FirstPromptItem::Token(t.0))
    }

    fn visit_seq<S: SeqAccess<'de>>(self, seq: S) -> Result<Self::Value, S::Error> {
        TokenList("a list of token IDs")
            .visit_seq(seq)
            .map(FirstPromptItem::Tokens)
    }
}

/// `messages`, flattened for the estimate as each message's role immediately followed by its
/// content (a string, or the `text` parts concatenated); no separators.
struct ChatText;

impl<'de> DeserializeSeed<'de> for ChatText {
    type Value = String;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<String, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ChatText {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of messages")
    }

    fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<String, S::Error> {
        let mut text = String::new();
        while seq.next_element_seed(Message(&mut text))?.is_some() {}
        Ok(text)
    }
}

/// One chat message, appended to the flattened text.
struct Message<'t>(&'t mut String);

impl<'de> DeserializeSeed<'de> for Message<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Message<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a message object")
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<(), M::Error> {
        let mut role = None;
        let mut content = Vec::new();
        while let Some(key) = map.next_key::<Text<'de>>()? {
            match &*key.0 {
                "role" => role = Some(map.next_value::<Text<'de>>()?.0),
                "content" => {
                    content = map
                        .next_value::<Option<Content<'de>>>()?
                        .map_or_else(Vec::new, |c| c.0)
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let role = role.ok_or_else(|| de::Error::custom("`role` is missing (required)"))?;
        self.0.push_str(&role);
        for part in content {
            self.0.push_str(&part);
        }
        Ok(())
    }
}

/// A message's content: a string, or an array of content parts whose `text` parts count.
struct Content<'a>(Vec<Cow<'a, str>>);

impl<'de> Deserialize<'de> for Content<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ContentVisitor)
    }
}

struct ContentVisitor;

impl<'de> Visitor<'de> for ContentVisitor {
    type Value = Content<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string or an array of content parts")
    }

    fn visit_borrowed_str<E: de::Error>(self, text: &'de str) -> Result<Self::Value, E> {
        Ok(Content(vec![Cow::Borrowed(text)]))
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
        Ok(Content(vec![Cow::Owned(text.to_string())]))
    }

    fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<Self::Value, S::Error> {
        let mut texts = Vec::new();
        while let Some(part) = seq.next_element::<ContentPart<'de>>()? {
            texts.extend(part.0);
        }
        Ok(Content(texts))
    }
}

/// One content part; only `{"type": "text", "text": ...}` parts carry text for the estimate.
struct ContentPart<'a>(Option<Cow<'a, str>>);

impl<'de> Deserialize<'de> for ContentPart<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(ContentPartVisitor)
    }
}

struct ContentPartVisitor;

impl<'de> Visitor<'de> for ContentPartVisitor {
    type Value = ContentPart<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a content part object")
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
        let mut is_text = false;
        let mut text = None;
        while let Some(key) = map.next_key::<Text<'de>>()? {
            match &*key.0 {
                "type" => {
                    is_text = map
                        .next_value::<Option<Text<'de>>>()?
                        .is_some_and(|t| t.0 == "text")
                }
                "text" => text = map.next_value::<Option<Text<'de>>>()?.map(|t| t.0),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        if !is_text {
            return Ok(ContentPart(None));
        }
        text.map(|text| ContentPart(Some(text)))
            .ok_or_else(|| de::Error::custom("a text part needs `text`"))
    }
}

/// `tools`, as compact JSON with sorted keys (Go's `map` marshalling), or nothing when empty.
/// Tools are small: the one part of a body read as a `serde_json::Value`.
struct Tools(String);

impl<'de> Deserialize<'de> for Tools {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde_json::Value;
        match Option::<Value>::deserialize(deserializer)? {
            None => Ok(Tools(String::new())),
            Some(Value::Array(tools)) if tools.is_empty() => Ok(Tools(String::new())),
            Some(tools @ Value::Array(_)) => Ok(Tools(tools.to_string())),
            Some(other) => Err(de::Error::custom(format!(
                "expected an array, got {}",
                match other {
                    Value::Object(_) => "an object",
                    Value::String(_) => "a string",
                    Value::Number(_) => "a number",
                    _ => "a boolean",
                }
            ))),
        }
    }
}

/// `endpoints`: a list of endpoint ids.
struct EndpointIds<'a>(Vec<Cow<'a, str>>);

impl<'de> Deserialize<'de> for EndpointIds<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_seq(EndpointIdsVisitor)
    }
}

struct EndpointIdsVisitor;

impl<'de> Visitor<'de> for EndpointIdsVisitor {
    type Value = EndpointIds<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of endpoint ids")
    }

    fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<Self::Value, S::Error> {
        let mut ids = Vec::new();
        while let Some(id) = seq.next_element_seed(TextLike("an endpoint id string"))? {
            ids.push(id.0);
        }
        Ok(EndpointIds(ids))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn with<T>(
        body: Value,
        check: impl FnOnce(Result<InferenceRequest<'_>, RequestError>) -> T,
    ) -> T {
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
                "burst_prefix.size: unknown field `size`, expected `group_size`",
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
}
