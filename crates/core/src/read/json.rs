//! The JSON of a completions or chat completions request body, read straight into an
//! [`InferenceRequest`]: strings borrowed where JSON escapes allow, fields the producer does not
//! read skipped without being kept, chat messages flattened for the estimate
//! (docs/behaviour.md, "Prefix blocks").

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::{InferenceRequest, PromptInput, HINTS_FIELD};
use crate::admit::Hints;

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
        let mut max_tokens = None;
        let mut max_completion_tokens = None;
        while let Some(key) = map.next_key::<Text<'de>>()? {
            match &*key.0 {
                "model" => model = Some(map.next_value::<Text<'de>>()?.0),
                "cache_salt" => cache_salt = map.next_value::<Option<Text<'de>>>()?.map(|t| t.0),
                "prompt" => prompt = Some(map.next_value::<CompletionPrompts<'de>>()?.0),
                "messages" => chat = Some(map.next_value_seed(ChatText)?),
                "tools" => tools = map.next_value::<Tools>()?.0,
                "max_tokens" => max_tokens = map.next_value::<AnswerTokens>()?.0,
                "max_completion_tokens" => {
                    max_completion_tokens = map.next_value::<AnswerTokens>()?.0
                }
                "endpoints" => {
                    endpoints = map.next_value::<Option<EndpointIds<'de>>>()?.map(|e| e.0)
                }
                HINTS_FIELD => {
                    hints = map
                        .next_value::<Option<BodyHints>>()?
                        .map_or_else(Hints::default, BodyHints::into_hints)
                }
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
        let is_chat = chat.is_some();
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
            chat: is_chat,
            max_answer_tokens: max_completion_tokens.or(max_tokens),
        })
    }
}

/// `max_tokens` or `max_completion_tokens`, read for the time cost only: the engine judges
/// whether it is valid, so a value the producer cannot read as a count (a string, a negative
/// number) is no cap rather than a refusal.
struct AnswerTokens(Option<u32>);

impl<'de> Deserialize<'de> for AnswerTokens {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(AnswerTokensVisitor)
    }
}

struct AnswerTokensVisitor;

impl<'de> Visitor<'de> for AnswerTokensVisitor {
    type Value = AnswerTokens;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a token count")
    }

    fn visit_u64<E: de::Error>(self, count: u64) -> Result<Self::Value, E> {
        Ok(AnswerTokens(Some(u32::try_from(count).unwrap_or(u32::MAX))))
    }

    fn visit_i64<E: de::Error>(self, count: i64) -> Result<Self::Value, E> {
        Ok(AnswerTokens(
            u64::try_from(count)
                .ok()
                .map(|count| u32::try_from(count).unwrap_or(u32::MAX)),
        ))
    }

    fn visit_f64<E: de::Error>(self, count: f64) -> Result<Self::Value, E> {
        // `as` saturates; NaN and negatives are no count.
        Ok(AnswerTokens((count >= 0.0).then_some(count as u32)))
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(AnswerTokens(None))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(AnswerTokens(None))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(AnswerTokens(None))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(AnswerTokens(None))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(AnswerTokens(None))
    }
}

/// `"burst_prefix"`: the hints a body may carry (the same as the headers').
#[derive(Deserialize)]
#[serde(rename = "Hints", deny_unknown_fields)]
struct BodyHints {
    group_size: Option<std::num::NonZeroU32>,
    weight_version: Option<String>,
}

impl BodyHints {
    fn into_hints(self) -> Hints {
        Hints {
            group_size: self.group_size,
            weight_version: self.weight_version,
        }
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
