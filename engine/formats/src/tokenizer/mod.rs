//! The tokenizer: Hugging Face's `tokenizers` behind the API the engine, proxy and replay use. Built
//! from any `tokenizer.json` (BPE, Unigram, WordPiece, WordLevel with every normalizer,
//! pre-tokenizer and post-processor), or from GGUF metadata: `tokenizer.ggml.model = "gpt2"`
//! (byte-level BPE, pre-tokenizer regexes per `tokenizer.ggml.pre` as llama.cpp applies them) and
//! `"llama"` (SentencePiece as BPE with byte fallback, merges from the scores when absent). Both
//! GGUF kinds are converted to a `tokenizer.json` document first, so every source runs the same code.

mod bytelevel;
mod from_gguf;
pub(crate) mod from_hf;
mod pretokenize;

use std::path::PathBuf;

use serde_json::Value;

use crate::gguf::GgufError;

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not valid JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("unsupported GGUF tokenizer model '{0}': supported are 'gpt2' (byte-level BPE) and 'llama' (SentencePiece)")]
    UnsupportedModel(String),
    #[error("unsupported pre-tokenizer '{0}': supported are default, gpt-2, smollm (and starcoder family), llama3 (llama-bpe family), dbrx, smaug-bpe, qwen2")]
    UnsupportedPreTokenizer(String),
    #[error("the tokenizers library refuses this tokenizer: {0}")]
    Load(String),
    #[error("cannot tokenize the text: {0}")]
    Encode(String),
    #[error("invalid tokenizer data: {0}")]
    Invalid(String),
}

/// How a vocabulary entry behaves (GGUF `tokenizer.ggml.token_type` values 1..=6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    Normal,
    Unknown,
    /// Matched as a whole only when `parse_special` is true (`<|im_start|>`).
    Control,
    /// Always matched as a whole, even without `parse_special` (llama.cpp and HF agree here).
    UserDefined,
    Unused,
    Byte,
}

impl TokenKind {
    fn from_gguf(v: i64) -> Self {
        match v {
            2 => TokenKind::Unknown,
            3 => TokenKind::Control,
            4 => TokenKind::UserDefined,
            5 => TokenKind::Unused,
            6 => TokenKind::Byte,
            _ => TokenKind::Normal,
        }
    }

    /// Written as its literal text by `token_to_piece`, not decoded.
    fn is_literal(self) -> bool {
        matches!(self, TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown)
    }
}

/// How a normal token's stored text maps to the bytes it stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PieceStyle {
    /// GPT-2 byte-level: every byte is one printable character ("Ġ" is a space).
    ByteLevel,
    /// SentencePiece: "▁" is a space, `<0xNN>` is the byte NN. `strip_first_space`: decoding drops
    /// the space the tokenizer put before the text (llama.cpp's and HF's `Strip` decoder).
    SentencePiece { strip_first_space: bool },
    /// Anything else (WordPiece, WordLevel, Unigram without "▁"): the text itself; `decode` asks the
    /// tokenizer's own decoder.
    Text,
}

/// What a source adds to the `tokenizers` document: the id-ordered vocabulary with kinds, the piece
/// style and the special ids.
pub(crate) struct Meta {
    pub tokens: Vec<String>,
    pub kinds: Vec<TokenKind>,
    pub style: PieceStyle,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub add_bos: bool,
}

/// A tokenizer. Immutable after construction; `Send + Sync`.
pub struct Tokenizer {
    /// Matches special tokens written in the text (`parse_special = true`).
    special: tokenizers::Tokenizer,
    /// The same, with special tokens left as plain text (`encode_special_tokens`); added tokens
    /// that are not special still match.
    plain: tokenizers::Tokenizer,
    tokens: Vec<String>,
    kinds: Vec<TokenKind>,
    style: PieceStyle,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.tokens.len())
            .field("style", &self.style)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds from a `tokenizer.json` document and what the source says beyond it.
    pub(crate) fn from_document(doc: Value, meta: Meta) -> Result<Self, TokenizerError> {
        let special: tokenizers::Tokenizer = serde_json::from_value(doc).map_err(|e| TokenizerError::Load(e.to_string()))?;
        if meta.tokens.len() != meta.kinds.len() {
            return Err(TokenizerError::Invalid(format!("{} tokens but {} token types", meta.tokens.len(), meta.kinds.len())));
        }
        let n = u32::try_from(meta.tokens.len()).map_err(|_| TokenizerError::Invalid("vocabulary larger than u32".into()))?;
        for (name, id) in [("BOS", meta.bos), ("EOS", meta.eos)] {
            if let Some(id) = id.filter(|id| *id >= n) {
                return Err(TokenizerError::Invalid(format!("{name} id {id} is outside the vocabulary of {n}")));
            }
        }
        let mut plain = special.clone();
        plain.set_encode_special_tokens(true);
        Ok(Tokenizer {
            special,
            plain,
            tokens: meta.tokens,
            kinds: meta.kinds,
            style: meta.style,
            bos: meta.bos,
            eos: meta.eos,
            add_bos: meta.add_bos,
        })
    }

    /// Tokenizes `text` without adding BOS/EOS. With `parse_special`, control tokens written in
    /// the text (`<|im_start|>`) become their ids; user-defined tokens always do. A failure of the
    /// underlying tokenizer (not seen on any input so far) gives an empty list: `try_encode` says why.
    pub fn encode(&self, text: &str, parse_special: bool) -> Vec<u32> {
        self.try_encode(text, parse_special).unwrap_or_default()
    }

    /// `encode`, with the underlying tokenizer's error when it fails.
    pub fn try_encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        let tokenizer = if parse_special { &self.special } else { &self.plain };
        let encoding = tokenizer.encode_fast(text, false).map_err(|e| TokenizerError::Encode(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The bytes a token stands for: byte-level decoded (or "▁" as a space and `<0xNN>` as its byte
    /// for SentencePiece) for normal tokens, the literal text for special ones. A single token may
    /// hold part of a UTF-8 sequence. None for an unknown id.
    pub fn token_to_piece(&self, id: u32) -> Option<Vec<u8>> {
        let text = self.tokens.get(id as usize)?;
        let kind = self.kinds[id as usize];
        let mut out = Vec::with_capacity(text.len());
        if kind.is_literal() {
            out.extend_from_slice(text.as_bytes());
            return Some(out);
        }
        match self.style {
            PieceStyle::ByteLevel => bytelevel::decode_into(text, &mut out),
            PieceStyle::SentencePiece { .. } => match byte_token(text) {
                Some(b) => out.push(b),
                None => out.extend_from_slice(text.replace('\u{2581}', " ").as_bytes()),
            },
            PieceStyle::Text => out.extend_from_slice(text.as_bytes()),
        }
        Some(out)
    }

    /// Text of a token sequence, special tokens rendered as their text; invalid UTF-8 (a sequence
    /// cut between tokens) becomes U+FFFD. Unknown ids are skipped. SentencePiece vocabularies drop
    /// the space put before the text, as llama.cpp's detokenizer does.
    pub fn decode(&self, ids: &[u32]) -> String {
        if self.style == PieceStyle::Text {
            return self.special.decode(ids, false).unwrap_or_default();
        }
        let mut bytes = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            if let Some(piece) = self.token_to_piece(id) {
                let strip =
                    i == 0 && matches!(self.style, PieceStyle::SentencePiece { strip_first_space: true }) && piece.first() == Some(&b' ');
                bytes.extend_from_slice(&piece[usize::from(strip)..]);
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The stored text of a token (byte-level encoded for normal tokens: a space is "Ġ").
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The kind of a token.
    pub fn token_kind(&self, id: u32) -> Option<TokenKind> {
        self.kinds.get(id as usize).copied()
    }

    /// The id of a token text (stored form).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.special.token_to_id(text)
    }

    /// Number of entries in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// Beginning-of-sequence token id, when the model has one.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// End-of-sequence token id, when the model has one.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// Whether the model wants BOS prepended to a prompt (llama.cpp's `add_special` behaviour).
    pub fn add_bos(&self) -> bool {
        self.add_bos && self.bos.is_some()
    }
}

/// The byte of a SentencePiece byte token `<0xNN>`.
fn byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok()).flatten()
}

#[cfg(test)]
mod tests;
