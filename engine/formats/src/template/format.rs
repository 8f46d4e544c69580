//! Chat formats: a model's Jinja chat template or a built-in encoder (DeepSeek V3.2 and V4 ship
//! Python code instead of a template) behind one type, [`ChatFormat`], that the token counter
//! renders with; the `--chat-format` names and the detection rule.
//!
//! Detection ([`ChatFormatChoice::Auto`]): the model's Jinja template when it has one (GGUF
//! `tokenizer.chat_template`, `chat_template.jinja` beside tokenizer.json, or
//! `tokenizer_config.json` `chat_template`); otherwise, when the vocabulary holds DeepSeek's chat
//! tokens `<｜begin▁of▁sentence｜>`, `<｜User｜>` and `<｜Assistant｜>`, the DeepSeek encoder: V4
//! when it also holds `<｜latest_reminder｜>` (a token V4 added), else V3.2, in chat mode
//! (thinking off); otherwise the ChatML fallback.

use std::str::FromStr;

use minijinja::Value;
use serde_json::Value as Json;

use super::deepseek::{self, DeepSeekFormat, DeepSeekVersion};
use super::{prepare_messages, ChatTemplate, RenderOptions, TemplateError};
use crate::tokenizer::Tokenizer;

/// Every `--chat-format` name.
pub const CHAT_FORMAT_NAMES: [&str; 7] =
    ["auto", "jinja", "chatml", "deepseek-v3.2", "deepseek-v3.2-thinking", "deepseek-v4", "deepseek-v4-thinking"];

/// How a model's conversations become prompt text.
// One per loaded model: the size of the Jinja variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum ChatFormat {
    /// A Jinja chat template (the model's own, or the ChatML fallback).
    Jinja(ChatTemplate),
    /// DeepSeek's encoding, rewritten from its reference script.
    DeepSeek(DeepSeekFormat),
}

impl From<ChatTemplate> for ChatFormat {
    fn from(t: ChatTemplate) -> Self {
        ChatFormat::Jinja(t)
    }
}

/// The `--chat-format` choice: detect, or a named format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ChatFormatChoice {
    /// The detection rule of this module.
    #[default]
    Auto,
    /// The model's own Jinja template (an error when it has none).
    Jinja,
    /// ChatML, whatever the model ships.
    ChatMl,
    /// A built-in DeepSeek encoder.
    DeepSeek(DeepSeekFormat),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown chat format {name:?}; known formats: {}", CHAT_FORMAT_NAMES.join(", "))]
pub struct UnknownChatFormat {
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChatFormatError {
    #[error("chat format \"jinja\" needs the model's Jinja chat template, and this model ships none (no GGUF tokenizer.chat_template, chat_template.jinja or tokenizer_config.json chat_template)")]
    NoJinjaTemplate,
}

impl FromStr for ChatFormatChoice {
    type Err = UnknownChatFormat;

    fn from_str(name: &str) -> Result<Self, UnknownChatFormat> {
        let deepseek = |version, thinking| Ok(ChatFormatChoice::DeepSeek(DeepSeekFormat { version, thinking }));
        match name {
            "auto" => Ok(ChatFormatChoice::Auto),
            "jinja" => Ok(ChatFormatChoice::Jinja),
            "chatml" => Ok(ChatFormatChoice::ChatMl),
            "deepseek-v3.2" => deepseek(DeepSeekVersion::V32, false),
            "deepseek-v3.2-thinking" => deepseek(DeepSeekVersion::V32, true),
            "deepseek-v4" => deepseek(DeepSeekVersion::V4, false),
            "deepseek-v4-thinking" => deepseek(DeepSeekVersion::V4, true),
            other => Err(UnknownChatFormat { name: other.into() }),
        }
    }
}

impl ChatFormatChoice {
    /// The format to use, given the model's Jinja template (if it has one) and its tokenizer.
    pub fn resolve(self, jinja: Option<ChatTemplate>, tokenizer: &Tokenizer) -> Result<ChatFormat, ChatFormatError> {
        Ok(match (self, jinja) {
            (ChatFormatChoice::Auto, Some(t)) | (ChatFormatChoice::Jinja, Some(t)) => ChatFormat::Jinja(t),
            (ChatFormatChoice::Jinja, None) => return Err(ChatFormatError::NoJinjaTemplate),
            (ChatFormatChoice::Auto, None) => match detect_builtin(tokenizer) {
                Some(f) => ChatFormat::DeepSeek(f),
                None => ChatFormat::Jinja(ChatTemplate::chatml_fallback()),
            },
            (ChatFormatChoice::ChatMl, _) => ChatFormat::Jinja(ChatTemplate::chatml_fallback()),
            (ChatFormatChoice::DeepSeek(f), _) => ChatFormat::DeepSeek(f),
        })
    }
}

/// The built-in format a template-less tokenizer's vocabulary identifies (see the module docs).
pub fn detect_builtin(tokenizer: &Tokenizer) -> Option<DeepSeekFormat> {
    let has = |t: &str| tokenizer.token_id(t).is_some();
    let deepseek = ["<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"].iter().all(|t| has(t));
    deepseek.then(|| DeepSeekFormat {
        version: if has("<｜latest_reminder｜>") { DeepSeekVersion::V4 } else { DeepSeekVersion::V32 },
        thinking: false,
    })
}

/// Messages converted once for repeated renders of their prefixes.
pub(crate) enum Prepared {
    Jinja(Vec<Value>),
    Json(Vec<Json>),
}

impl Prepared {
    pub(crate) fn len(&self) -> usize {
        match self {
            Prepared::Jinja(v) => v.len(),
            Prepared::Json(v) => v.len(),
        }
    }
}

impl ChatFormat {
    /// The `--chat-format` name of this format (`jinja` for a model's own template).
    pub fn name(&self) -> &'static str {
        match self {
            ChatFormat::Jinja(t) if t.is_fallback() => "chatml",
            ChatFormat::Jinja(_) => "jinja",
            ChatFormat::DeepSeek(f) => f.name(),
        }
    }

    /// The Jinja template, when this format is one.
    pub fn template(&self) -> Option<&ChatTemplate> {
        match self {
            ChatFormat::Jinja(t) => Some(t),
            ChatFormat::DeepSeek(_) => None,
        }
    }

    /// True for the ChatML fallback (a guess, not the model's own format).
    pub fn is_fallback(&self) -> bool {
        self.template().is_some_and(ChatTemplate::is_fallback)
    }

    /// Renders OpenAI-shaped messages.
    pub fn render(&self, messages: &[Json], opts: &RenderOptions<'_>) -> Result<String, TemplateError> {
        let prepared = self.prepare(messages)?;
        self.render_prefix(&prepared, prepared.len(), opts)
    }

    /// The generation prompt of this very conversation, where the format knows it exactly (the
    /// built-in encoders: it depends on the last message, e.g. after DeepSeek V3.2 tool results);
    /// `None` for Jinja templates, whose generation prompt is taken as constant.
    pub fn generation_prompt(&self, messages: &[Json], opts: &RenderOptions<'_>) -> Result<Option<String>, TemplateError> {
        match self {
            ChatFormat::Jinja(_) => Ok(None),
            ChatFormat::DeepSeek(f) => Ok(Some(f.render_split(messages, opts.tools)?.generation_prompt)),
        }
    }

    pub(crate) fn prepare(&self, messages: &[Json]) -> Result<Prepared, TemplateError> {
        Ok(match self {
            ChatFormat::Jinja(_) => Prepared::Jinja(prepare_messages(messages)?),
            ChatFormat::DeepSeek(_) => Prepared::Json(deepseek::prepare(messages)?),
        })
    }

    /// Renders the first `n` prepared messages.
    pub(crate) fn render_prefix(&self, prepared: &Prepared, n: usize, opts: &RenderOptions<'_>) -> Result<String, TemplateError> {
        match (self, prepared) {
            (ChatFormat::Jinja(t), Prepared::Jinja(m)) => t.render_prepared(&m[..n], opts),
            (ChatFormat::DeepSeek(f), Prepared::Json(m)) => {
                let split = f.render_prepared(&m[..n], opts.tools)?;
                Ok(if opts.add_generation_prompt { split.body + &split.generation_prompt } else { split.body })
            }
            // Prepared by another format: prepare again (not reached from this crate).
            (_, Prepared::Jinja(_)) | (_, Prepared::Json(_)) => {
                Err(TemplateError::BadConfig("messages prepared for another chat format".into()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_unknown_names_list_the_known_ones() {
        for name in CHAT_FORMAT_NAMES {
            let choice: ChatFormatChoice = name.parse().unwrap();
            if let ChatFormatChoice::DeepSeek(f) = choice {
                assert_eq!(f.name(), name);
            }
        }
        let err = "deepseek-v5".parse::<ChatFormatChoice>().unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("\"deepseek-v5\""), "{msg}");
        assert!(msg.contains("deepseek-v3.2, deepseek-v3.2-thinking, deepseek-v4"), "{msg}");
    }
}
