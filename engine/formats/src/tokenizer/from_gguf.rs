//! Builds a `Tokenizer` from GGUF metadata (`tokenizer.ggml.*`) by writing the `tokenizer.json`
//! document it describes, with llama.cpp's defaults where a key is absent:
//! - `gpt2`: byte-level BPE; `tokenizer.ggml.pre` picks llama.cpp's regex preset.
//! - `llama`: SentencePiece as transformers' GGUF loader and llama.cpp read it: BPE with byte
//!   fallback, merges from the file or rebuilt from the scores, spaces as "▁" and, with
//!   `tokenizer.ggml.add_space_prefix` (default true), a "▁" before every run of text (the start,
//!   and after each special token, as llama.cpp's SentencePiece tokenizer adds it).
//!
//! Control and unknown tokens become special added tokens, user-defined ones plain added tokens,
//! all matched on the raw text.

use std::collections::{HashMap, HashSet};

use serde_json::{json, Map, Value};

use super::pretokenize::{byte_level_pre_tokenizer, preset};
use super::{Meta, PieceStyle, TokenKind, Tokenizer, TokenizerError};
use crate::gguf::Gguf;

const SPACE: &str = "\u{2581}";

impl Tokenizer {
    /// Builds the tokenizer a GGUF file describes: `tokenizer.ggml.model` "gpt2" or "llama".
    pub fn from_gguf(gguf: &Gguf) -> Result<Self, TokenizerError> {
        let model = gguf.get_str("tokenizer.ggml.model")?;
        let tokens = gguf.get_str_array("tokenizer.ggml.tokens")?.to_vec();
        let kinds: Vec<TokenKind> = if gguf.contains("tokenizer.ggml.token_type") {
            gguf.get_i64_array("tokenizer.ggml.token_type")?.into_iter().map(TokenKind::from_gguf).collect()
        } else {
            vec![TokenKind::Normal; tokens.len()]
        };
        if tokens.len() != kinds.len() {
            return Err(TokenizerError::Invalid(format!("{} tokens but {} token types", tokens.len(), kinds.len())));
        }
        let merges = if gguf.contains("tokenizer.ggml.merges") {
            Some(
                gguf.get_str_array("tokenizer.ggml.merges")?
                    .iter()
                    .map(|m| {
                        m.split_once(' ')
                            .map(|(l, r)| (l.to_string(), r.to_string()))
                            .ok_or_else(|| TokenizerError::Invalid(format!("merge {m:?} has no space")))
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            )
        } else {
            None
        };
        let vocab = first_ids(&tokens);
        let added = added_tokens(&tokens, &kinds);
        let (doc, style, default_bos, default_eos, default_add_bos) = match model {
            "gpt2" => {
                let pre_name = gguf.get_str_opt("tokenizer.ggml.pre")?.unwrap_or("default");
                let pre = preset(pre_name).ok_or_else(|| TokenizerError::UnsupportedPreTokenizer(pre_name.to_string()))?;
                let merges = merges.ok_or_else(|| TokenizerError::Invalid("a gpt2 vocabulary without tokenizer.ggml.merges".into()))?;
                let doc = json!({
                    "version": "1.0",
                    "truncation": null,
                    "padding": null,
                    "added_tokens": added,
                    "normalizer": null,
                    "pre_tokenizer": byte_level_pre_tokenizer(pre.regexes),
                    "post_processor": null,
                    "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
                    "model": bpe_model(&tokens, &vocab, &merges, pre.ignore_merges, None),
                });
                (doc, PieceStyle::ByteLevel, None, None, pre.add_bos)
            }
            "llama" => {
                let add_space = gguf.get_bool_opt("tokenizer.ggml.add_space_prefix")?.unwrap_or(true);
                let merges = match merges {
                    Some(m) => m,
                    None => {
                        let scores = if gguf.contains("tokenizer.ggml.scores") {
                            gguf.get_f32_array("tokenizer.ggml.scores")?
                        } else {
                            vec![0.0; tokens.len()]
                        };
                        if scores.len() != tokens.len() {
                            return Err(TokenizerError::Invalid(format!("{} tokens but {} scores", tokens.len(), scores.len())));
                        }
                        merges_from_scores(&tokens, &scores, &vocab)
                    }
                };
                let unk = gguf.get_u32_opt("tokenizer.ggml.unknown_token_id")?.unwrap_or(0);
                let unk_text = tokens.get(unk as usize).cloned();
                let replace = json!({"type": "Replace", "pattern": {"String": " "}, "content": SPACE});
                let normalizer = if add_space {
                    json!({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": SPACE}, replace]})
                } else {
                    replace
                };
                let mut decoders = vec![
                    json!({"type": "Replace", "pattern": {"String": SPACE}, "content": " "}),
                    json!({"type": "ByteFallback"}),
                    json!({"type": "Fuse"}),
                ];
                if add_space {
                    decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
                }
                let doc = json!({
                    "version": "1.0",
                    "truncation": null,
                    "padding": null,
                    "added_tokens": added,
                    "normalizer": normalizer,
                    "pre_tokenizer": null,
                    "post_processor": null,
                    "decoder": {"type": "Sequence", "decoders": decoders},
                    "model": bpe_model(&tokens, &vocab, &merges, false, unk_text),
                });
                let style = PieceStyle::SentencePiece { strip_first_space: add_space };
                (doc, style, Some(1), Some(2), true)
            }
            other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        };
        let n = tokens.len() as u32;
        let id = |key: &str, default: Option<u32>| -> Result<Option<u32>, TokenizerError> {
            Ok(gguf.get_u32_opt(key)?.or(default.filter(|&i| i < n)))
        };
        let bos = id("tokenizer.ggml.bos_token_id", default_bos)?;
        let eos = id("tokenizer.ggml.eos_token_id", default_eos)?;
        let add_bos = gguf.get_bool_opt("tokenizer.ggml.add_bos_token")?.unwrap_or(default_add_bos);
        Tokenizer::from_document(doc, Meta { tokens, kinds, style, bos, eos, add_bos })
    }
}

/// Text -> id with the first id winning for duplicate texts, as in llama.cpp.
fn first_ids(tokens: &[String]) -> HashMap<&str, u32> {
    let mut map = HashMap::with_capacity(tokens.len());
    for (id, t) in tokens.iter().enumerate() {
        map.entry(t.as_str()).or_insert(id as u32);
    }
    map
}

/// Control and unknown tokens as special added tokens, user-defined ones as plain added tokens.
fn added_tokens(tokens: &[String], kinds: &[TokenKind]) -> Vec<Value> {
    let mut seen = HashSet::new();
    tokens
        .iter()
        .zip(kinds)
        .enumerate()
        .filter(|(_, (t, _))| !t.is_empty())
        .filter_map(|(id, (t, kind))| {
            let special = match kind {
                TokenKind::Control | TokenKind::Unknown => true,
                TokenKind::UserDefined => false,
                _ => return None,
            };
            seen.insert(t.as_str()).then(|| {
                json!({"id": id, "content": t, "single_word": false, "lstrip": false,
                       "rstrip": false, "normalized": false, "special": special})
            })
        })
        .collect()
}

/// A BPE model object. Merges whose parts or result are not tokens cannot produce a token and
/// are skipped; for a repeated pair the first (best) rank wins.
fn bpe_model(
    tokens: &[String],
    vocab: &HashMap<&str, u32>,
    merges: &[(String, String)],
    ignore_merges: bool,
    unk: Option<String>,
) -> Value {
    let mut vocab_obj = Map::with_capacity(vocab.len());
    for (id, t) in tokens.iter().enumerate() {
        if vocab.get(t.as_str()) == Some(&(id as u32)) {
            vocab_obj.insert(t.clone(), json!(id));
        }
    }
    let mut seen = HashSet::with_capacity(merges.len());
    let merges: Vec<Value> = merges
        .iter()
        .filter(|(l, r)| vocab.contains_key(l.as_str()) && vocab.contains_key(r.as_str()) && vocab.contains_key(format!("{l}{r}").as_str()))
        .filter(|(l, r)| seen.insert((l.as_str(), r.as_str())))
        .map(|(l, r)| json!([l, r]))
        .collect();
    let byte_fallback = unk.is_some();
    json!({
        "type": "BPE",
        "dropout": null,
        "unk_token": unk,
        "continuing_subword_prefix": null,
        "end_of_word_suffix": null,
        "fuse_unk": byte_fallback,
        "byte_fallback": byte_fallback,
        "ignore_merges": ignore_merges,
        "vocab": vocab_obj,
        "merges": merges,
    })
}

/// Merges a SentencePiece vocabulary implies, as transformers' `generate_merges` derives them:
/// every split of every token into two tokens, ranked by the whole token's score (best first),
/// then the lengths of the left and right parts (longest first), ties kept in vocabulary order.
fn merges_from_scores(tokens: &[String], scores: &[f32], vocab: &HashMap<&str, u32>) -> Vec<(String, String)> {
    let mut merges: Vec<(&str, &str, f32, usize, usize)> = Vec::new();
    let mut done = HashSet::with_capacity(tokens.len());
    for (token, &score) in tokens.iter().zip(scores) {
        if !done.insert(token.as_str()) {
            continue;
        }
        let mut local = Vec::new();
        for (i, _) in token.char_indices().skip(1) {
            let (l, r) = token.split_at(i);
            if let (Some(&li), Some(&ri)) = (vocab.get(l), vocab.get(r)) {
                local.push((l, r, li, ri));
            }
        }
        local.sort_by_key(|&(_, _, li, ri)| (li, ri));
        merges.extend(local.into_iter().map(|(l, r, _, _)| (l, r, score, l.chars().count(), r.chars().count())));
    }
    merges.sort_by(|a, b| b.2.total_cmp(&a.2).then(b.3.cmp(&a.3)).then(b.4.cmp(&a.4)));
    merges.into_iter().map(|(l, r, ..)| (l.to_string(), r.to_string())).collect()
}
