//! Byte-level BPE tokenizer that agrees token for token with llama.cpp: special-token partition,
//! regex pre-tokenization, byte-level encoding, rank-ordered merges. Built from GGUF metadata
//! (`tokenizer.ggml.*`) or from a Hugging Face `tokenizer.json`. SentencePiece-style vocabularies
//! (`tokenizer.ggml.model = "llama"`) are not supported yet and are refused with a typed error.

mod bpe;
mod bytelevel;
mod from_gguf;
pub(crate) mod from_hf;
mod pretokenize;

use std::collections::HashMap;
use std::path::PathBuf;

use crate::gguf::GgufError;
use bpe::Merges;
use pretokenize::PreTokenizer;

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
    #[error("unsupported tokenizer model '{0}': only byte-level BPE (GGUF 'gpt2', tokenizer.json BPE with ByteLevel) is supported")]
    UnsupportedModel(String),
    #[error("unsupported pre-tokenizer '{0}': supported are default, gpt-2, smollm (and starcoder family), llama3 (llama-bpe family), dbrx, smaug-bpe, qwen2")]
    UnsupportedPreTokenizer(String),
    #[error("unsupported tokenizer.json feature: {0}")]
    UnsupportedFeature(String),
    #[error("pre-tokenizer regex {pattern:?} does not compile: {message}")]
    BadRegex { pattern: String, message: String },
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

    fn is_special(self) -> bool {
        matches!(
            self,
            TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown
        )
    }
}

/// Everything a tokenizer is built from, whatever the source format.
pub(crate) struct Parts {
    pub tokens: Vec<String>,
    pub kinds: Vec<TokenKind>,
    /// Merge pairs in rank order, as token texts.
    pub merges: Vec<(String, String)>,
    pub pre_patterns: Vec<String>,
    pub ignore_merges: bool,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub add_bos: bool,
}

/// A byte-level BPE tokenizer. Immutable after construction; `Send + Sync`.
#[derive(Debug)]
pub struct Tokenizer {
    tokens: Vec<String>,
    kinds: Vec<TokenKind>,
    token_to_id: HashMap<String, u32>,
    merges: Merges,
    pre: PreTokenizer,
    /// Special-token ids, longest text first (llama.cpp's `cache_special_tokens` order).
    specials: Vec<u32>,
    ignore_merges: bool,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
}

enum Fragment {
    Text(usize, usize),
    Token(u32),
}

impl Tokenizer {
    pub(crate) fn from_parts(p: Parts) -> Result<Self, TokenizerError> {
        if p.tokens.len() != p.kinds.len() {
            return Err(TokenizerError::Invalid(format!(
                "{} tokens but {} token types",
                p.tokens.len(),
                p.kinds.len()
            )));
        }
        let n = u32::try_from(p.tokens.len())
            .map_err(|_| TokenizerError::Invalid("vocabulary larger than u32".into()))?;
        for (name, id) in [("BOS", p.bos), ("EOS", p.eos)] {
            if let Some(id) = id.filter(|id| *id >= n) {
                return Err(TokenizerError::Invalid(format!(
                    "{name} id {id} is outside the vocabulary of {n}"
                )));
            }
        }
        let mut token_to_id = HashMap::with_capacity(p.tokens.len());
        for (id, t) in p.tokens.iter().enumerate() {
            // The first id wins for duplicate texts, as in llama.cpp.
            token_to_id.entry(t.clone()).or_insert(id as u32);
        }
        // Merges whose parts or result are not tokens cannot produce a token; they are skipped.
        let mut merges = Merges::with_capacity(p.merges.len());
        for (rank, (l, r)) in p.merges.iter().enumerate() {
            let ids = (
                token_to_id.get(l),
                token_to_id.get(r),
                token_to_id.get(&format!("{l}{r}")),
            );
            if let (Some(&l), Some(&r), Some(&m)) = ids {
                merges.entry((l, r)).or_insert((rank as u32, m));
            }
        }
        let mut specials: Vec<u32> = (0..n)
            .filter(|&id| p.kinds[id as usize].is_special() && !p.tokens[id as usize].is_empty())
            .collect();
        specials.sort_by_key(|&id| std::cmp::Reverse(p.tokens[id as usize].len()));
        Ok(Tokenizer {
            pre: PreTokenizer::new(&p.pre_patterns)?,
            tokens: p.tokens,
            kinds: p.kinds,
            token_to_id,
            merges,
            specials,
            ignore_merges: p.ignore_merges,
            bos: p.bos,
            eos: p.eos,
            add_bos: p.add_bos,
        })
    }

    /// Tokenizes `text` without adding BOS/EOS. With `parse_special`, control tokens written in
    /// the text (`<|im_start|>`) become their ids; user-defined tokens always do.
    pub fn encode(&self, text: &str, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::new();
        let mut word = String::new();
        for fragment in self.partition(text, parse_special) {
            match fragment {
                Fragment::Token(id) => out.push(id),
                Fragment::Text(start, end) => {
                    let piece = &text[start..end];
                    for (ws, we) in self.pre.split(piece) {
                        bytelevel::encode_into(&piece[ws..we], &mut word);
                        bpe::merge_word(
                            &word,
                            &self.token_to_id,
                            &self.merges,
                            self.ignore_merges,
                            &mut out,
                        );
                    }
                }
            }
        }
        out
    }

    /// Splits text at special tokens, longest token first, as llama.cpp's `tokenizer_st_partition`.
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Fragment> {
        let mut fragments = vec![Fragment::Text(0, text.len())];
        if text.is_empty() {
            return Vec::new();
        }
        for &id in &self.specials {
            if !parse_special && self.kinds[id as usize] != TokenKind::UserDefined {
                continue;
            }
            let special = self.tokens[id as usize].as_str();
            if !text.contains(special) {
                continue;
            }
            let mut next = Vec::with_capacity(fragments.len() + 2);
            for f in fragments {
                let Fragment::Text(mut start, end) = f else {
                    next.push(f);
                    continue;
                };
                while let Some(pos) = text[start..end].find(special) {
                    if pos > 0 {
                        next.push(Fragment::Text(start, start + pos));
                    }
                    next.push(Fragment::Token(id));
                    start += pos + special.len();
                }
                if start < end {
                    next.push(Fragment::Text(start, end));
                }
            }
            fragments = next;
        }
        fragments
    }

    /// The bytes a token stands for: byte-level decoded for normal tokens, the literal text for
    /// special ones. A single token may hold part of a UTF-8 sequence. None for an unknown id.
    pub fn token_to_piece(&self, id: u32) -> Option<Vec<u8>> {
        let text = self.tokens.get(id as usize)?;
        let mut out = Vec::with_capacity(text.len());
        match self.kinds[id as usize] {
            TokenKind::Normal | TokenKind::Byte => bytelevel::decode_into(text, &mut out),
            _ => out.extend_from_slice(text.as_bytes()),
        }
        Some(out)
    }

    /// Text of a token sequence, special tokens rendered as their text; invalid UTF-8 (a sequence
    /// cut between tokens) becomes U+FFFD. Unknown ids are skipped.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            if let Some(piece) = self.token_to_piece(id) {
                bytes.extend_from_slice(&piece);
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
        self.token_to_id.get(text).copied()
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

#[cfg(test)]
mod tests;
