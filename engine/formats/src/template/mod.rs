//! Chat templates: renders a model's Jinja chat template (GGUF `tokenizer.chat_template` or
//! `tokenizer_config.json` `chat_template`) the way Hugging Face's `apply_chat_template` does:
//! trim_blocks + lstrip_blocks, Python string methods, `raise_exception`, Python-style `tojson`.
//! Models without a template get a ChatML fallback, flagged by [`ChatTemplate::is_fallback`].
//! [`ChatFormat`] puts these templates and the built-in encoders of models that ship code instead
//! (DeepSeek V3.2 and V4, [`deepseek`]) behind one type.

pub mod deepseek;
mod format;
mod pyfns;
pub mod reasoning;

pub use deepseek::{DeepSeekError, DeepSeekFormat, DeepSeekVersion};
pub use format::{detect_builtin, ChatFormat, ChatFormatChoice, ChatFormatError, UnknownChatFormat, CHAT_FORMAT_NAMES};
pub use reasoning::{reasoning_rule, Keep, ReasoningRule};

use minijinja::value::Serde;
use minijinja::{context, Environment, Value};
use serde_json::Value as Json;

use crate::gguf::{Gguf, GgufError};

/// ChatML, used when a model ships no template. A fallback: it is what most instruct models of
/// the Qwen/SmolLM/Hermes families use, not what this particular model was trained on.
pub const CHATML_FALLBACK: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

const NAME: &str = "chat_template";

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("chat template does not compile: {0:#}")]
    Syntax(#[source] minijinja::Error),
    #[error("chat template failed to render: {0:#}")]
    Render(#[source] minijinja::Error),
    #[error("message {index} is not valid: {reason}")]
    InvalidMessage { index: usize, reason: String },
    #[error("tokenizer_config.json chat_template has an unexpected shape: {0}")]
    BadConfig(String),
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    DeepSeek(#[from] DeepSeekError),
}

/// What a render needs besides the messages.
#[derive(Debug, Clone, Copy, Default)]
pub struct RenderOptions<'a> {
    /// Append the assistant header that opens the model's reply.
    pub add_generation_prompt: bool,
    pub bos_token: &'a str,
    pub eos_token: &'a str,
    /// OpenAI `tools` (a JSON array), for templates that render tool definitions.
    pub tools: Option<&'a Json>,
}

/// A compiled chat template. `Send + Sync`; render as often as needed.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    fallback: bool,
}

impl ChatTemplate {
    /// Compiles a Jinja chat template.
    pub fn new(source: impl Into<String>) -> Result<Self, TemplateError> {
        Self::build(source.into(), false)
    }

    /// The ChatML fallback ([`CHATML_FALLBACK`]).
    pub fn chatml_fallback() -> Self {
        match Self::build(CHATML_FALLBACK.to_string(), true) {
            Ok(t) => t,
            // The constant is a fixed, tested template; failing to compile it is a programming error.
            Err(e) => unreachable!("the ChatML fallback template does not compile: {e}"),
        }
    }

    /// The template stored in GGUF metadata (`tokenizer.chat_template`), if any.
    pub fn from_gguf(gguf: &Gguf) -> Result<Option<Self>, TemplateError> {
        gguf.get_str_opt("tokenizer.chat_template")?.map(Self::new).transpose()
    }

    /// The template of a parsed `tokenizer_config.json`, if any: `chat_template` as a string, or as
    /// a list of `{name, template}` (the one named "default" is used, else the first).
    pub fn from_tokenizer_config(config: &Json) -> Result<Option<Self>, TemplateError> {
        match config.get("chat_template") {
            None | Some(Json::Null) => Ok(None),
            Some(Json::String(s)) => Self::new(s.clone()).map(Some),
            Some(Json::Array(list)) => {
                let named = |n: &str| list.iter().find(|t| t.get("name").and_then(Json::as_str) == Some(n));
                let chosen = named("default").or_else(|| list.first());
                let source = chosen.and_then(|t| t.get("template")).and_then(Json::as_str);
                match source {
                    Some(s) => Self::new(s.to_string()).map(Some),
                    None => Err(TemplateError::BadConfig("a list without a {name, template} entry".into())),
                }
            }
            Some(other) => Err(TemplateError::BadConfig(format!("expected a string or a list, found {other}"))),
        }
    }

    fn build(source: String, fallback: bool) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        // Hugging Face renders with trim_blocks and lstrip_blocks; llama.cpp's minja does the same.
        let syntax =
            minijinja::syntax::SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build().map_err(TemplateError::Syntax)?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", pyfns::raise_exception);
        env.add_function("strftime_now", pyfns::strftime_now);
        env.add_filter("tojson", pyfns::tojson);
        env.add_template_owned(NAME, source.clone()).map_err(TemplateError::Syntax)?;
        Ok(ChatTemplate { env, source, fallback })
    }

    /// The Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// True when this is the ChatML fallback rather than the model's own template.
    pub fn is_fallback(&self) -> bool {
        self.fallback
    }

    /// Renders OpenAI-shaped messages (`role`, `content` as a string or a list of parts).
    pub fn render(&self, messages: &[Json], opts: &RenderOptions<'_>) -> Result<String, TemplateError> {
        let prepared = prepare_messages(messages)?;
        self.render_prepared(&prepared, opts)
    }

    /// Renders messages already converted by [`prepare_messages`] (cheap to slice and re-render).
    pub(crate) fn render_prepared(&self, messages: &[Value], opts: &RenderOptions<'_>) -> Result<String, TemplateError> {
        let template = self.env.get_template(NAME).map_err(TemplateError::Render)?;
        let tools = opts.tools.map(|t| Value::from(Serde(t))).unwrap_or(Value::from(()));
        let ctx = context! {
            messages => Value::from(messages.to_vec()),
            add_generation_prompt => opts.add_generation_prompt,
            bos_token => opts.bos_token,
            eos_token => opts.eos_token,
            tools => tools,
        };
        template.render(ctx).map_err(TemplateError::Render)
    }
}

/// Converts OpenAI messages into template values: `content` given as a list of parts becomes the
/// text parts joined by "\n" (non-text parts dropped), as llama.cpp's server does; a null or
/// missing `content` becomes "". Other fields (`tool_calls`, `name`, ...) pass through.
pub(crate) fn prepare_messages(messages: &[Json]) -> Result<Vec<Value>, TemplateError> {
    messages
        .iter()
        .enumerate()
        .map(|(index, m)| {
            let Json::Object(fields) = m else {
                return Err(TemplateError::InvalidMessage { index, reason: "not a JSON object".into() });
            };
            if !fields.get("role").is_some_and(Json::is_string) {
                return Err(TemplateError::InvalidMessage { index, reason: "no string \"role\"".into() });
            }
            let content = match fields.get("content") {
                None | Some(Json::Null) => Json::String(String::new()),
                Some(Json::String(s)) => Json::String(s.clone()),
                Some(Json::Array(parts)) => Json::String(join_text_parts(parts)),
                Some(other) => {
                    let reason = format!("content must be a string or a list of parts, found {other}");
                    return Err(TemplateError::InvalidMessage { index, reason });
                }
            };
            let mut out: serde_json::Map<String, Json> =
                fields.iter().filter(|(k, _)| *k != "content").map(|(k, v)| (k.clone(), v.clone())).collect();
            out.insert("content".into(), content);
            Ok(Value::from(Serde(Json::Object(out))))
        })
        .collect()
}

fn join_text_parts(parts: &[Json]) -> String {
    let texts = parts.iter().filter_map(|p| match p {
        Json::String(s) => Some(s.as_str()),
        Json::Object(o) if o.get("type").and_then(Json::as_str) == Some("text") => o.get("text").and_then(Json::as_str),
        _ => None,
    });
    texts.collect::<Vec<_>>().join("\n")
}

#[cfg(test)]
mod tests;
