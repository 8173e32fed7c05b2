//! The model's tokenizer and chat template, tokenizing as vLLM does, so that text and chat
//! requests can be matched against engine blocks (which are keyed by token ids).
//!
//! From a model directory: `tokenizer.json` (the HF `tokenizers` format), `tokenizer_config.json`
//! (special tokens, `chat_template`), and `chat_template.jinja` when the template lives there.
//!
//! - A completion prompt is encoded with the tokenizer's special tokens (its post-processor adds
//!   BOS where the model wants it), as vLLM's `/v1/completions` does (`add_special_tokens=True`).
//! - A chat request is rendered with the chat template as transformers renders it (Jinja with
//!   `trim_blocks` and `lstrip_blocks`, `messages`, `tools`, `add_generation_prompt`, the special
//!   tokens as variables, `raise_exception`, Python's string methods, a Python-style `tojson`),
//!   then encoded *without* special tokens, as vLLM's `/v1/chat/completions` does (the template
//!   writes BOS itself when the model wants it). Message contents given as a list of text parts
//!   are joined with newlines first, as vLLM does for templates that expect a string.
//!
//! Not reproduced: transformers' `{% generation %}` tag, `strftime_now`, multimodal parts, and
//! the key order of objects passed through `tojson` (JSON objects are ordered by key here, as
//! `serde_json` keeps them; Python keeps the request's order).

use std::path::Path;

use minijinja::{Environment, Error as JinjaError, ErrorKind, Value as JinjaValue};
use serde_json::{json, Value};

/// Why a tokenizer could not be loaded or a request not tokenized.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A file of the model directory could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// `tokenizer.json` is not a tokenizer the `tokenizers` crate loads.
    #[error("loading tokenizer.json: {0}")]
    Load(String),
    /// `tokenizer_config.json` is not JSON.
    #[error("tokenizer_config.json: {0}")]
    Config(String),
    /// The model has no chat template.
    #[error("the model directory has no chat template")]
    NoChatTemplate,
    /// The chat template does not compile, or rendering failed (`raise_exception` included).
    #[error("chat template: {0}")]
    Template(String),
    /// Encoding failed.
    #[error("encoding: {0}")]
    Encode(String),
    /// The request's messages are not a list of objects.
    #[error("messages must be a list of objects")]
    Messages,
}

/// Options of a chat request that change its rendering.
#[derive(Debug, Clone, Default)]
pub struct ChatOptions<'a> {
    /// The request's `tools`, passed to the template as `tools` (absent: undefined).
    pub tools: Option<&'a Value>,
    /// `add_generation_prompt` (vLLM's default for chat completions is true).
    pub add_generation_prompt: bool,
    /// The request's `chat_template_kwargs`, passed to the template as extra variables.
    pub template_kwargs: Option<&'a serde_json::Map<String, Value>>,
}

impl ChatOptions<'_> {
    /// vLLM's defaults for `/v1/chat/completions`: a generation prompt, no tools.
    pub fn chat_completions() -> Self {
        ChatOptions {
            tools: None,
            add_generation_prompt: true,
            template_kwargs: None,
        }
    }
}

/// A model's tokenizer and chat template.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    env: Option<Environment<'static>>,
    /// The special tokens as template variables (`bos_token`, `eos_token`, …).
    special: serde_json::Map<String, Value>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.inner.get_vocab_size(true))
            .field("chat_template", &self.env.is_some())
            .field("special", &self.special)
            .finish()
    }
}

/// The name the chat template is registered under.
const TEMPLATE: &str = "chat";

/// The most instructions one rendering may run (a bound on a template's loops).
const TEMPLATE_FUEL: u64 = 50_000_000;

fn read(dir: &Path, name: &str) -> Result<Option<String>, TokenizerError> {
    let path = dir.join(name);
    match std::fs::read_to_string(&path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TokenizerError::Read {
            path: path.display().to_string(),
            source,
        }),
    }
}

/// A special token in `tokenizer_config.json`: a string or an AddedToken object.
fn token_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json`, `tokenizer_config.json` and the chat template from `dir`.
    /// A model without a chat template loads (completions work; chat then fails).
    pub fn from_dir(dir: &Path) -> Result<Self, TokenizerError> {
        let json = read(dir, "tokenizer.json")?.ok_or_else(|| TokenizerError::Read {
            path: dir.join("tokenizer.json").display().to_string(),
            source: std::io::ErrorKind::NotFound.into(),
        })?;
        let mut inner = tokenizers::Tokenizer::from_bytes(json.as_bytes())
            .map_err(|e| TokenizerError::Load(e.to_string()))?;
        let config: Value = match read(dir, "tokenizer_config.json")? {
            Some(s) => {
                serde_json::from_str(&s).map_err(|e| TokenizerError::Config(e.to_string()))?
            }
            None => Value::Object(Default::default()),
        };
        set_bos_eos(&mut inner, &config)?;
        let mut special = serde_json::Map::new();
        for name in [
            "bos_token",
            "eos_token",
            "unk_token",
            "pad_token",
            "sep_token",
            "cls_token",
            "mask_token",
        ] {
            if let Some(t) = config.get(name).and_then(token_text) {
                special.insert(name.to_owned(), Value::String(t));
            }
        }
        // transformers prefers chat_template.jinja over the config's own entry.
        let template = match read(dir, "chat_template.jinja")? {
            Some(t) => Some(t),
            None => match config.get("chat_template") {
                Some(Value::String(t)) => Some(t.clone()),
                // A list of named templates: the one named "default".
                Some(Value::Array(list)) => list
                    .iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                    .and_then(|t| t.get("template"))
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                _ => None,
            },
        };
        let env = template.map(environment).transpose()?;
        Ok(Tokenizer {
            inner,
            env,
            special,
        })
    }

    /// Whether the model has a chat template.
    pub fn has_chat_template(&self) -> bool {
        self.env.is_some()
    }

    /// Encodes a completion prompt as vLLM's `/v1/completions` does (with special tokens).
    pub fn encode_completion(&self, prompt: &str) -> Result<Vec<u32>, TokenizerError> {
        self.encode(prompt, true)
    }

    /// Encodes text, with or without the tokenizer's special tokens (BOS and the like).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        self.inner
            .encode_fast(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TokenizerError::Encode(e.to_string()))
    }

    /// Renders a chat request's messages with the chat template (the prompt vLLM would build).
    pub fn render_chat(
        &self,
        messages: &Value,
        options: &ChatOptions<'_>,
    ) -> Result<String, TokenizerError> {
        let env = self.env.as_ref().ok_or(TokenizerError::NoChatTemplate)?;
        let messages = normalize_messages(messages)?;
        let mut ctx = serde_json::Map::new();
        if let Some(kwargs) = options.template_kwargs {
            ctx.extend(kwargs.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        ctx.extend(self.special.iter().map(|(k, v)| (k.clone(), v.clone())));
        ctx.insert("messages".into(), messages);
        ctx.insert(
            "add_generation_prompt".into(),
            Value::Bool(options.add_generation_prompt),
        );
        if let Some(tools) = options.tools {
            ctx.insert("tools".into(), tools.clone());
        }
        env.get_template(TEMPLATE)
            .and_then(|t| t.render(JinjaValue::from(minijinja::value::Serde(&ctx))))
            .map_err(|e| TokenizerError::Template(describe(&e)))
    }

    /// Encodes a chat request as vLLM's `/v1/chat/completions` does: rendered, then encoded
    /// without special tokens.
    pub fn encode_chat(
        &self,
        messages: &Value,
        options: &ChatOptions<'_>,
    ) -> Result<Vec<u32>, TokenizerError> {
        let prompt = self.render_chat(messages, options)?;
        self.encode(&prompt, false)
    }
}

/// transformers (5) replaces the post-processor of `tokenizer.json` when `tokenizer_config.json`
/// says `add_bos_token` or `add_eos_token`, or when there is none: BOS before the text when
/// `add_bos_token`, EOS after it when `add_eos_token` (each false when absent, or when the token
/// itself is not defined). Done here the same way, so that completions get the same ids.
fn set_bos_eos(tok: &mut tokenizers::Tokenizer, config: &Value) -> Result<(), TokenizerError> {
    let explicit = config.get("add_bos_token").is_some() || config.get("add_eos_token").is_some();
    if !explicit && tok.get_post_processor().is_some() {
        return Ok(());
    }
    let special = |flag: &str, name: &str| -> Option<(String, u32)> {
        if !config.get(flag).and_then(Value::as_bool).unwrap_or(false) {
            return None;
        }
        let text = config.get(name).and_then(token_text)?;
        let id = tok.token_to_id(&text)?;
        Some((text, id))
    };
    let (bos, eos) = (
        special("add_bos_token", "bos_token"),
        special("add_eos_token", "eos_token"),
    );
    let token =
        |t: &(String, u32), type_id: u32| json!({"SpecialToken": {"id": t.0, "type_id": type_id}});
    let seq = |id: &str, type_id: u32| json!({"Sequence": {"id": id, "type_id": type_id}});
    let mut single = Vec::new();
    let mut pair = Vec::new();
    for (list, seqs) in [
        (&mut single, &[("A", 0)][..]),
        (&mut pair, &[("A", 0), ("B", 1)][..]),
    ] {
        for &(id, type_id) in seqs {
            list.extend(bos.iter().map(|t| token(t, type_id)));
            list.push(seq(id, type_id));
            list.extend(eos.iter().map(|t| token(t, type_id)));
        }
    }
    let specials: serde_json::Map<String, Value> = bos
        .iter()
        .chain(eos.iter())
        .map(|(text, id)| {
            (
                text.clone(),
                json!({"id": text, "ids": [id], "tokens": [text]}),
            )
        })
        .collect();
    let processor: tokenizers::processors::PostProcessorWrapper = serde_json::from_value(json!({
        "type": "TemplateProcessing",
        "single": single,
        "pair": pair,
        "special_tokens": specials,
    }))
    .map_err(|e| TokenizerError::Load(format!("BOS/EOS post-processor: {e}")))?;
    tok.with_post_processor(Some(processor));
    Ok(())
}

/// The error and its causes on one line.
fn describe(e: &JinjaError) -> String {
    let mut s = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s
}

/// Message contents given as a list of `{"type": "text", "text": …}` parts become one string,
/// the parts joined with newlines (vLLM's "string" content format).
fn normalize_messages(messages: &Value) -> Result<Value, TokenizerError> {
    let list = messages.as_array().ok_or(TokenizerError::Messages)?;
    let mut out = Vec::with_capacity(list.len());
    for m in list {
        let mut m = m.as_object().ok_or(TokenizerError::Messages)?.clone();
        if let Some(Value::Array(parts)) = m.get("content") {
            let texts: Vec<&str> = parts
                .iter()
                .filter_map(|p| match p {
                    Value::String(s) => Some(s.as_str()),
                    Value::Object(o) => o.get("text").and_then(Value::as_str),
                    _ => None,
                })
                .collect();
            let joined = texts.join("\n");
            m.insert("content".into(), Value::String(joined));
        }
        out.push(Value::Object(m));
    }
    Ok(Value::Array(out))
}

fn environment(template: String) -> Result<Environment<'static>, TokenizerError> {
    let mut env = Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .map_err(|e| TokenizerError::Template(describe(&e)))?;
    env.set_syntax(syntax);
    env.set_fuel(Some(TEMPLATE_FUEL));
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |msg: String| -> Result<String, JinjaError> {
            Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
        },
    );
    env.add_filter("tojson", tojson);
    env.add_template_owned(TEMPLATE, template)
        .map_err(|e| TokenizerError::Template(describe(&e)))?;
    Ok(env)
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=indent)`, no HTML escaping.
fn tojson(value: JinjaValue, kwargs: minijinja::value::Kwargs) -> Result<JinjaValue, JinjaError> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| JinjaError::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let mut out = String::new();
    python_json(&json, indent, 0, &mut out);
    Ok(JinjaValue::from_safe_string(out))
}

/// `json.dumps` layout: `", "` and `": "` without indent; newlines and `indent` spaces with it.
fn python_json(v: &Value, indent: Option<usize>, depth: usize, out: &mut String) {
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * depth));
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v {
        Value::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                python_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        Value::Object(map) if !map.is_empty() => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                out.push_str(&Value::String(k.clone()).to_string());
                out.push_str(": ");
                python_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn model_dir(template: Option<&str>, file_template: Option<&str>) -> tempfile::TempDir {
        // A word-level tokenizer over a few words, with a BOS post-processor.
        let dir = tempfile::tempdir().unwrap();
        let tokenizer = json!({
            "version": "1.0",
            "truncation": null, "padding": null,
            "added_tokens": [
                {"id": 0, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false,
                 "normalized": false, "special": true},
                {"id": 1, "content": "<|user|>", "single_word": false, "lstrip": false,
                 "rstrip": false, "normalized": false, "special": true}
            ],
            "normalizer": null,
            "pre_tokenizer": {"type": "Whitespace"},
            "post_processor": {
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}}
            },
            "decoder": null,
            "model": {"type": "WordLevel", "vocab": {"<s>": 0, "<|user|>": 1, "hello": 2, "world": 3,
                      "[UNK]": 4, "{": 5, "}": 6, "yes": 7}, "unk_token": "[UNK]"}
        });
        std::fs::write(dir.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
        let mut config = json!({"bos_token": {"content": "<s>"}, "eos_token": "</s>"});
        if let Some(t) = template {
            config["chat_template"] = json!(t);
        }
        std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
        if let Some(t) = file_template {
            std::fs::write(dir.path().join("chat_template.jinja"), t).unwrap();
        }
        dir
    }

    #[test]
    fn a_completion_gets_the_post_processors_bos_and_chat_does_not() {
        let dir = model_dir(
            Some("{{ bos_token }}{% for m in messages %}<|user|> {{ m.content }}{% endfor %}"),
            None,
        );
        let tok = Tokenizer::from_dir(dir.path()).unwrap();
        assert_eq!(tok.encode_completion("hello world").unwrap(), vec![0, 2, 3]);
        let msgs = json!([{"role": "user", "content": "hello"}, {"role": "user", "content": [{"type": "text", "text": "world"}, {"type": "text", "text": "hello"}]}]);
        assert_eq!(
            tok.render_chat(&msgs, &ChatOptions::default()).unwrap(),
            "<s><|user|> hello<|user|> world\nhello"
        );
        assert_eq!(
            tok.encode_chat(&msgs, &ChatOptions::default()).unwrap(),
            vec![0, 1, 2, 1, 3, 2],
            "the template's own BOS only"
        );
    }

    #[test]
    fn add_bos_token_in_the_config_rules_the_post_processor_as_transformers_does() {
        let dir = model_dir(None, None);
        let write = |config: Value| {
            std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap()
        };
        // The tokenizer.json adds <s>; the config says not to: no BOS.
        write(json!({"bos_token": "<s>", "add_bos_token": false}));
        let tok = Tokenizer::from_dir(dir.path()).unwrap();
        assert_eq!(tok.encode_completion("hello").unwrap(), vec![2]);
        // BOS and EOS asked for (EOS is `yes` here, a token the vocabulary has).
        write(
            json!({"bos_token": "<s>", "eos_token": "yes", "add_bos_token": true, "add_eos_token": true}),
        );
        let tok = Tokenizer::from_dir(dir.path()).unwrap();
        assert_eq!(tok.encode_completion("hello").unwrap(), vec![0, 2, 7]);
        assert_eq!(tok.encode("hello", false).unwrap(), vec![2]);
        // No post-processor and no flags: nothing added.
        let path = dir.path().join("tokenizer.json");
        let mut json: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        json["post_processor"] = Value::Null;
        std::fs::write(&path, json.to_string()).unwrap();
        write(json!({"bos_token": "<s>"}));
        let tok = Tokenizer::from_dir(dir.path()).unwrap();
        assert_eq!(tok.encode_completion("hello").unwrap(), vec![2]);
    }

    #[test]
    fn the_template_file_wins_and_blocks_are_trimmed_as_transformers_does() {
        let dir = model_dir(
            Some("ignored"),
            Some("{% for m in messages %}\n  {{ m.content.strip() }}|\n{% endfor %}\n{% if add_generation_prompt %}yes{% endif %}"),
        );
        let tok = Tokenizer::from_dir(dir.path()).unwrap();
        let msgs = json!([{"role": "user", "content": " hello "}]);
        let opts = ChatOptions::chat_completions();
        assert_eq!(tok.render_chat(&msgs, &opts).unwrap(), "  hello|\nyes");
    }

    #[test]
    fn raise_exception_and_a_missing_template_are_errors() {
        let dir = model_dir(Some("{{ raise_exception('roles must alternate') }}"), None);
        let tok = Tokenizer::from_dir(dir.path()).unwrap();
        let err = tok
            .render_chat(&json!([]), &ChatOptions::default())
            .unwrap_err();
        assert!(err.to_string().contains("roles must alternate"), "{err}");
        let dir = model_dir(None, None);
        let tok = Tokenizer::from_dir(dir.path()).unwrap();
        assert!(!tok.has_chat_template());
        assert!(matches!(
            tok.encode_chat(&json!([]), &ChatOptions::default()),
            Err(TokenizerError::NoChatTemplate)
        ));
        assert!(matches!(
            Tokenizer::from_dir(&dir.path().join("absent")),
            Err(TokenizerError::Read { .. })
        ));
    }

    #[test]
    fn tools_and_kwargs_reach_the_template_and_tojson_writes_python_json() {
        let dir = model_dir(
            Some("{{ tools | tojson }}|{{ tools | tojson(indent=2) }}|{{ flag }}"),
            None,
        );
        let tok = Tokenizer::from_dir(dir.path()).unwrap();
        let tools = json!([{"name": "f<g>", "args": [1, "é"]}]);
        let kwargs = json!({"flag": "on"});
        let opts = ChatOptions {
            tools: Some(&tools),
            add_generation_prompt: false,
            template_kwargs: kwargs.as_object(),
        };
        assert_eq!(
            tok.render_chat(&json!([]), &opts).unwrap(),
            "[{\"args\": [1, \"é\"], \"name\": \"f<g>\"}]|[\n  {\n    \"args\": [\n      1,\n      \"é\"\n    ],\n    \"name\": \"f<g>\"\n  }\n]|on"
        );
    }
}
