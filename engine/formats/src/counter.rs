//! Token counting for the capture proxy: the upstream model's tokenizer plus its chat format (its
//! Jinja template or a built-in encoder, see [`crate::template::ChatFormat`]), opened from a `.gguf` file, a `tokenizer.json`, or a directory holding one. It splits a rendered
//! prompt into one text segment per message, so the proxy can cache counts by message hash; it is
//! stateless (`Send + Sync`), and the caching belongs to the caller.

use std::path::{Path, PathBuf};

use serde_json::Value as Json;

use crate::gguf::{Gguf, GgufError};
use crate::template::{ChatFormat, ChatFormatChoice, ChatFormatError, ChatTemplate, RenderOptions, TemplateError};
use crate::tokenizer::{from_hf, Tokenizer, TokenizerError};

#[derive(Debug, thiserror::Error)]
pub enum CounterError {
    #[error("cannot open model {path}: {source}")]
    Gguf {
        path: PathBuf,
        #[source]
        source: GgufError,
    },
    #[error("cannot build the tokenizer of {path}: {source}")]
    Tokenizer {
        path: PathBuf,
        #[source]
        source: TokenizerError,
    },
    #[error("cannot load the chat template of {path}: {source}")]
    TemplateLoad {
        path: PathBuf,
        #[source]
        source: TemplateError,
    },
    #[error("chat format of {path}: {source}")]
    ChatFormat {
        path: PathBuf,
        #[source]
        source: ChatFormatError,
    },
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error("{0} is neither a .gguf file, a tokenizer.json, nor a directory containing tokenizer.json")]
    UnknownSource(PathBuf),
}

/// A rendered prompt split per message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segments {
    /// One text per message; concatenated, they are the render without generation prompt.
    pub texts: Vec<String>,
    /// False when the template's render of a prefix of the conversation is not a prefix of the
    /// render of the whole (or failed): from the first such message on, the remaining text is
    /// attributed to the last message and the messages in between get empty segments.
    pub prefix_consistent: bool,
}

/// Tokenizer + chat template of one model.
#[derive(Debug)]
pub struct TokenCounter {
    tokenizer: Tokenizer,
    format: ChatFormat,
    bos_text: String,
    eos_text: String,
    generation_prompt_tokens: usize,
}

impl TokenCounter {
    /// Opens a `.gguf` file, a `tokenizer.json` (with `tokenizer_config.json` beside it, if present,
    /// for the chat template and special tokens), or a directory containing `tokenizer.json`.
    /// The chat format is detected ([`ChatFormatChoice::Auto`]).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, CounterError> {
        Self::open_with(path, ChatFormatChoice::Auto)
    }

    /// [`TokenCounter::open`] with the chat format chosen (`--chat-format`).
    pub fn open_with(path: impl AsRef<Path>, choice: ChatFormatChoice) -> Result<Self, CounterError> {
        let path = path.as_ref();
        if path.is_dir() {
            return Self::open_tokenizer_json(&path.join("tokenizer.json"), choice);
        }
        match path.extension().and_then(|e| e.to_str()) {
            Some("gguf") => Self::open_gguf(path, choice),
            Some("json") => Self::open_tokenizer_json(path, choice),
            _ => Err(CounterError::UnknownSource(path.to_path_buf())),
        }
    }

    fn resolve(
        path: &Path,
        choice: ChatFormatChoice,
        jinja: Option<ChatTemplate>,
        tokenizer: &Tokenizer,
    ) -> Result<ChatFormat, CounterError> {
        choice.resolve(jinja, tokenizer).map_err(|source| CounterError::ChatFormat { path: path.into(), source })
    }

    fn open_gguf(path: &Path, choice: ChatFormatChoice) -> Result<Self, CounterError> {
        let gguf = Gguf::open(path).map_err(|source| CounterError::Gguf { path: path.into(), source })?;
        let tokenizer = Tokenizer::from_gguf(&gguf).map_err(|source| CounterError::Tokenizer { path: path.into(), source })?;
        let template = ChatTemplate::from_gguf(&gguf).map_err(|source| CounterError::TemplateLoad { path: path.into(), source })?;
        let format = Self::resolve(path, choice, template, &tokenizer)?;
        Self::new(tokenizer, format)
    }

    /// `chat_template.jinja` beside tokenizer.json wins over tokenizer_config.json's
    /// `chat_template`, as in Hugging Face transformers.
    fn open_tokenizer_json(path: &Path, choice: ChatFormatChoice) -> Result<Self, CounterError> {
        let tok_err = |source| CounterError::Tokenizer { path: path.into(), source };
        if !path.is_file() {
            return Err(CounterError::UnknownSource(path.to_path_buf()));
        }
        let config_path = path.with_file_name("tokenizer_config.json");
        let config = if config_path.is_file() { Some(from_hf::read_json(&config_path).map_err(tok_err)?) } else { None };
        let tokenizer = Tokenizer::from_tokenizer_json(path, config.as_ref()).map_err(tok_err)?;
        let jinja_path = path.with_file_name("chat_template.jinja");
        let template = if jinja_path.is_file() {
            let load = |source| CounterError::TemplateLoad { path: jinja_path.clone(), source };
            let text = std::fs::read_to_string(&jinja_path).map_err(|e| load(TemplateError::BadConfig(format!("cannot read: {e}"))))?;
            Some(ChatTemplate::new(text).map_err(load)?)
        } else {
            match &config {
                Some(c) => ChatTemplate::from_tokenizer_config(c)
                    .map_err(|source| CounterError::TemplateLoad { path: config_path.clone(), source })?,
                None => None,
            }
        };
        let format = Self::resolve(path, choice, template, &tokenizer)?;
        Self::new(tokenizer, format)
    }

    /// Combines a tokenizer and a chat format (or template); BOS/EOS texts come from the
    /// tokenizer's ids.
    pub fn new(tokenizer: Tokenizer, format: impl Into<ChatFormat>) -> Result<Self, CounterError> {
        let format = format.into();
        let text = |id: Option<u32>| id.and_then(|i| tokenizer.token_text(i)).unwrap_or_default().to_string();
        let mut counter = TokenCounter {
            bos_text: text(tokenizer.bos()),
            eos_text: text(tokenizer.eos()),
            tokenizer,
            format,
            generation_prompt_tokens: 0,
        };
        // The generation prompt of a one-message probe conversation; templates whose assistant
        // header depends on the conversation are still counted exactly by `count_prompt`.
        let probe = [serde_json::json!({"role": "user", "content": "x"})];
        let without = counter.render(&probe, false)?;
        let with = counter.render(&probe, true)?;
        let suffix = with.strip_prefix(without.as_str()).unwrap_or_default();
        counter.generation_prompt_tokens = counter.count_segment(suffix);
        Ok(counter)
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The chat format: a Jinja template (possibly the ChatML fallback) or a built-in encoder.
    pub fn format(&self) -> &ChatFormat {
        &self.format
    }

    /// The same as [`TokenCounter::format`] (the name from when every format was a template);
    /// [`ChatFormat::template`] gives the Jinja template, when there is one.
    pub fn template(&self) -> &ChatFormat {
        &self.format
    }

    /// The generation prompt of this conversation where the format knows it exactly (built-in
    /// encoders); `None` for Jinja templates, see [`TokenCounter::generation_prompt_tokens`].
    pub fn generation_prompt(&self, messages: &[Json]) -> Result<Option<String>, CounterError> {
        Ok(self.format.generation_prompt(messages, &self.options(true))?)
    }

    fn options(&self, add_generation_prompt: bool) -> RenderOptions<'_> {
        RenderOptions { add_generation_prompt, bos_token: &self.bos_text, eos_token: &self.eos_text, tools: None }
    }

    /// Renders the conversation with the model's template.
    pub fn render(&self, messages: &[Json], add_generation_prompt: bool) -> Result<String, CounterError> {
        Ok(self.format.render(messages, &self.options(add_generation_prompt))?)
    }

    /// Tokens that tool definitions `tools` (an OpenAI `tools` array) add to a prompt of `messages`:
    /// the render with them less the render without them (0 for a template that does not render
    /// tools). Counts never include them otherwise (`render` passes none).
    pub fn tools_tokens(&self, messages: &[Json], tools: &Json) -> Result<usize, CounterError> {
        let with = RenderOptions { tools: Some(tools), ..self.options(false) };
        let with = self.tokenizer.encode(&self.format.render(messages, &with)?, true).len();
        let without = self.tokenizer.encode(&self.render(messages, false)?, true).len();
        Ok(with.saturating_sub(without))
    }

    /// Splits the render (without generation prompt) into one segment per message: segment i is
    /// render(messages[..=i]) minus render(messages[..i]). A template-added preamble (a default
    /// system prompt) belongs to the first message. Costs one render per message.
    pub fn segments(&self, messages: &[Json]) -> Result<Segments, CounterError> {
        let prepared = self.format.prepare(messages)?;
        let opts = self.options(false);
        let full = self.format.render_prefix(&prepared, prepared.len(), &opts)?;
        let mut texts = Vec::with_capacity(prepared.len());
        let mut prev_len = 0;
        for i in 1..=prepared.len() {
            let render = if i == prepared.len() { Ok(full.clone()) } else { self.format.render_prefix(&prepared, i, &opts) };
            match render {
                Ok(r) if full.starts_with(r.as_str()) && r.len() >= prev_len => {
                    texts.push(r[prev_len..].to_string());
                    prev_len = r.len();
                }
                _ => {
                    // Not a prefix chain: the rest goes to the last message.
                    texts.resize(prepared.len() - 1, String::new());
                    texts.push(full[prev_len..].to_string());
                    return Ok(Segments { texts, prefix_consistent: false });
                }
            }
        }
        Ok(Segments { texts, prefix_consistent: true })
    }

    /// Segment `i` alone: render(messages[..=i]) minus render(messages[..i]), for callers that cache
    /// segments and only need the new ones. `None` when the template's renders are not prefixes of
    /// each other (then only [`TokenCounter::count_prompt`] is exact).
    pub fn segment(&self, messages: &[Json], i: usize) -> Result<Option<String>, CounterError> {
        let prepared = self.format.prepare(&messages[..=i.min(messages.len().saturating_sub(1))])?;
        let opts = self.options(false);
        let with = self.format.render_prefix(&prepared, prepared.len(), &opts)?;
        let without = if i == 0 { String::new() } else { self.format.render_prefix(&prepared, i, &opts)? };
        Ok(with.strip_prefix(without.as_str()).map(str::to_string))
    }

    /// Tokens of one segment of a rendered prompt (special tokens parsed, no BOS).
    pub fn count_segment(&self, segment: &str) -> usize {
        self.tokenizer.encode(segment, true).len()
    }

    /// Tokens the template appends to open the assistant's reply (`<|im_start|>assistant\n`).
    pub fn generation_prompt_tokens(&self) -> usize {
        self.generation_prompt_tokens
    }

    /// 1 when the model prepends BOS to a prompt, else 0.
    pub fn bos_tokens(&self) -> usize {
        usize::from(self.tokenizer.add_bos())
    }

    /// Prompt tokens of a chat request: the full render with generation prompt, plus BOS when the
    /// model adds one and the template did not already write it.
    /// (llama.cpp's server strips a template-written BOS in that case, so it is counted once.)
    pub fn count_prompt(&self, messages: &[Json]) -> Result<usize, CounterError> {
        let text = self.render(messages, true)?;
        let ids = self.tokenizer.encode(&text, true);
        let bos = self.tokenizer.bos();
        let already = bos.is_some() && ids.first().copied() == bos;
        Ok(ids.len() + usize::from(self.tokenizer.add_bos() && !already))
    }

    /// Prompt tokens of a `/v1/completions` prompt: its text (special tokens parsed) plus BOS when
    /// the model adds one.
    pub fn count_text(&self, text: &str) -> usize {
        self.tokenizer.encode(text, true).len() + self.bos_tokens()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<TokenCounter>();
        assert_send_sync::<Tokenizer>();
        assert_send_sync::<ChatTemplate>();
        assert_send_sync::<Gguf>();
    }

    #[test]
    fn open_rejects_unknown_sources() {
        assert!(matches!(TokenCounter::open("model.bin"), Err(CounterError::UnknownSource(_))));
        let missing = TokenCounter::open("/nonexistent/model.gguf").unwrap_err();
        assert!(matches!(missing, CounterError::Gguf { .. }));
        assert!(missing.to_string().contains("/nonexistent/model.gguf"));
    }
}
