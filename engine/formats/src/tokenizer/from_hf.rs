//! Builds a `Tokenizer` from a Hugging Face `tokenizer.json` (+ optional `tokenizer_config.json` for
//! BOS/EOS and `add_bos_token`). The document goes to the `tokenizers` library as it is; this file
//! only reads what the library does not keep: token kinds, how pieces decode, the special ids.

use std::path::Path;

use serde_json::Value;

use super::{Meta, PieceStyle, TokenKind, Tokenizer, TokenizerError};

/// Reads and parses a JSON file.
pub(crate) fn read_json(path: &Path) -> Result<Value, TokenizerError> {
    let text = std::fs::read_to_string(path).map_err(|source| TokenizerError::Io { path: path.to_path_buf(), source })?;
    serde_json::from_str(&text).map_err(|source| TokenizerError::Json { path: path.to_path_buf(), source })
}

/// A special token named in tokenizer_config.json: a string or an object with "content".
pub(crate) fn config_token(config: &Value, key: &str) -> Option<String> {
    match config.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json`; `config` is the parsed `tokenizer_config.json` beside it, if any.
    pub fn from_tokenizer_json(path: &Path, config: Option<&Value>) -> Result<Self, TokenizerError> {
        Self::from_hf_value(&read_json(path)?, config)
    }

    /// Builds from an already parsed `tokenizer.json`.
    pub fn from_hf_value(json: &Value, config: Option<&Value>) -> Result<Self, TokenizerError> {
        let model = json.get("model").filter(|m| m.is_object()).ok_or_else(|| TokenizerError::Invalid("no \"model\" object".into()))?;
        let (tokens, kinds) = vocabulary(model, json.get("added_tokens"))?;
        let id_of = |text: Option<String>| text.and_then(|t| tokens.iter().position(|x| *x == t)).map(|i| i as u32);
        let bos = id_of(config.and_then(|c| config_token(c, "bos_token")));
        let eos = id_of(config.and_then(|c| config_token(c, "eos_token")));
        let add_bos = match config.and_then(|c| c.get("add_bos_token")).and_then(Value::as_bool) {
            Some(b) => b,
            None => bos.is_some_and(|b| post_processor_adds(json.get("post_processor"), &tokens[b as usize])),
        };
        let style = piece_style(json, model);
        let mut doc = json.clone();
        fill_added_token_defaults(&mut doc);
        Tokenizer::from_document(doc, Meta { tokens, kinds, style, bos, eos, add_bos })
    }
}

/// Added tokens written by hand often name only id, content and special; `tokenizers` wants every
/// field. The missing ones get Hugging Face's defaults (normalized unless special).
fn fill_added_token_defaults(doc: &mut Value) {
    let Some(list) = doc.get_mut("added_tokens").and_then(Value::as_array_mut) else {
        return;
    };
    for token in list.iter_mut().filter_map(Value::as_object_mut) {
        let special = token.get("special").and_then(Value::as_bool).unwrap_or(false);
        for (key, default) in [("special", special), ("single_word", false), ("lstrip", false), ("rstrip", false), ("normalized", !special)]
        {
            token.entry(key).or_insert(Value::Bool(default));
        }
    }
}

fn type_of(v: &Value) -> &str {
    v.get("type").and_then(Value::as_str).unwrap_or("?")
}

/// Every component of a (possibly nested `Sequence`) normalizer, pre-tokenizer or decoder.
fn components(v: Option<&Value>) -> Vec<&Value> {
    let mut out = Vec::new();
    let mut stack: Vec<&Value> = v.into_iter().filter(|v| !v.is_null()).collect();
    while let Some(v) = stack.pop() {
        let children = ["normalizers", "pretokenizers", "decoders", "processors"].iter().find_map(|k| v.get(*k).and_then(Value::as_array));
        match children {
            Some(list) => stack.extend(list.iter().rev()),
            None => out.push(v),
        }
    }
    out
}

/// How the vocabulary's texts map to bytes, from the decoder (or pre-tokenizer) the file names.
fn piece_style(json: &Value, model: &Value) -> PieceStyle {
    let decoder = components(json.get("decoder"));
    let pre = components(json.get("pre_tokenizer"));
    let has = |list: &[&Value], t: &str| list.iter().any(|c| type_of(c) == t);
    if has(&decoder, "ByteLevel") || has(&pre, "ByteLevel") {
        return PieceStyle::ByteLevel;
    }
    let metaspace = decoder.iter().chain(&pre).find(|c| type_of(c) == "Metaspace");
    let replaces_meta = decoder
        .iter()
        .any(|c| type_of(c) == "Replace" && c.get("pattern").and_then(|p| p.get("String")).and_then(Value::as_str) == Some("\u{2581}"));
    let byte_fallback = model.get("byte_fallback").and_then(Value::as_bool).unwrap_or(false);
    if metaspace.is_some() || replaces_meta || byte_fallback || has(&decoder, "ByteFallback") {
        let strip = decoder.iter().any(|c| type_of(c) == "Strip" && c.get("start").and_then(Value::as_u64).unwrap_or(0) > 0)
            || metaspace.is_some_and(|m| {
                m.get("prepend_scheme").and_then(Value::as_str) != Some("never")
                    && m.get("add_prefix_space").and_then(Value::as_bool) != Some(false)
            });
        return PieceStyle::SentencePiece { strip_first_space: strip };
    }
    PieceStyle::Text
}

/// Id-ordered tokens and kinds from model.vocab (an object for BPE/WordPiece/WordLevel, a list of
/// [text, score] for Unigram) plus added_tokens; ids not named are unused.
fn vocabulary(model: &Value, added: Option<&Value>) -> Result<(Vec<String>, Vec<TokenKind>), TokenizerError> {
    let byte_fallback = model.get("byte_fallback").and_then(Value::as_bool).unwrap_or(false);
    let unk = match model.get("unk_token") {
        Some(Value::String(s)) => Some(s.clone()),
        _ => None,
    };
    let unk_id = model.get("unk_id").and_then(Value::as_u64);
    let kind_of = |text: &str, id: u64| {
        if unk.as_deref() == Some(text) || unk_id == Some(id) {
            TokenKind::Unknown
        } else if byte_fallback && super::byte_token(text).is_some() {
            TokenKind::Byte
        } else {
            TokenKind::Normal
        }
    };
    let mut entries: Vec<(u64, String, TokenKind)> = Vec::new();
    match model.get("vocab") {
        Some(Value::Object(vocab)) => {
            for (text, id) in vocab {
                let id = id.as_u64().ok_or_else(|| TokenizerError::Invalid(format!("vocab id of {text:?} is not an integer")))?;
                entries.push((id, text.clone(), kind_of(text, id)));
            }
        }
        Some(Value::Array(vocab)) => {
            for (id, entry) in vocab.iter().enumerate() {
                let text = entry
                    .get(0)
                    .and_then(Value::as_str)
                    .ok_or_else(|| TokenizerError::Invalid(format!("Unigram vocab entry {id} is not [text, score]")))?;
                entries.push((id as u64, text.to_string(), kind_of(text, id as u64)));
            }
        }
        _ => return Err(TokenizerError::Invalid("model.vocab is neither an object nor a list".into())),
    }
    for a in added.and_then(Value::as_array).into_iter().flatten() {
        let id = a.get("id").and_then(Value::as_u64);
        let text = a.get("content").and_then(Value::as_str);
        let (Some(id), Some(text)) = (id, text) else {
            return Err(TokenizerError::Invalid(format!("added token without id or content: {a}")));
        };
        let special = a.get("special").and_then(Value::as_bool).unwrap_or(false);
        let kind = if special { TokenKind::Control } else { TokenKind::UserDefined };
        entries.push((id, text.to_string(), kind));
    }
    let size = entries.iter().map(|e| e.0 + 1).max().unwrap_or(0);
    if size > u64::from(u32::MAX) || size > (entries.len() as u64) * 2 + 1024 {
        return Err(TokenizerError::Invalid(format!("token ids reach {size}, far above the {} entries", entries.len())));
    }
    let mut tokens = vec![String::new(); size as usize];
    let mut kinds = vec![TokenKind::Unused; size as usize];
    // Added tokens come last so they override a model.vocab entry with the same id.
    for (id, text, kind) in entries {
        tokens[id as usize] = text;
        kinds[id as usize] = kind;
    }
    Ok((tokens, kinds))
}

/// Whether a TemplateProcessing post-processor (alone or in a Sequence) starts with `bos`.
fn post_processor_adds(post: Option<&Value>, bos: &str) -> bool {
    components(post).iter().any(|p| {
        type_of(p) == "TemplateProcessing"
            && p.get("single")
                .and_then(Value::as_array)
                .and_then(|s| s.first())
                .and_then(|first| first.get("SpecialToken"))
                .and_then(|st| st.get("id"))
                .and_then(Value::as_str)
                == Some(bos)
    })
}
