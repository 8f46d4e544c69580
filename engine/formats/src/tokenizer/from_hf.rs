//! Builds a `Tokenizer` from a Hugging Face `tokenizer.json` (+ optional `tokenizer_config.json` for
//! BOS/EOS and `add_bos_token`). Supports byte-level BPE with no normalizer and pre-tokenizers made
//! of Split(Regex, Isolated), Digits and ByteLevel; anything else is refused by name, not guessed.

use std::path::Path;

use serde_json::Value;

use super::pretokenize::HF_BYTE_LEVEL;
use super::{Parts, TokenKind, Tokenizer, TokenizerError};

/// Reads and parses a JSON file.
pub(crate) fn read_json(path: &Path) -> Result<Value, TokenizerError> {
    let text = std::fs::read_to_string(path).map_err(|source| TokenizerError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| TokenizerError::Json {
        path: path.to_path_buf(),
        source,
    })
}

/// A special token named in tokenizer_config.json: a string or an object with "content".
pub(crate) fn config_token(config: &Value, key: &str) -> Option<String> {
    match config.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

fn unsupported(what: impl Into<String>) -> TokenizerError {
    TokenizerError::UnsupportedFeature(what.into())
}

impl Tokenizer {
    /// Loads `tokenizer.json`; `config` is the parsed `tokenizer_config.json` beside it, if any.
    pub fn from_tokenizer_json(
        path: &Path,
        config: Option<&Value>,
    ) -> Result<Self, TokenizerError> {
        Self::from_hf_value(&read_json(path)?, config)
    }

    /// Builds from an already parsed `tokenizer.json`.
    pub fn from_hf_value(json: &Value, config: Option<&Value>) -> Result<Self, TokenizerError> {
        let model = json
            .get("model")
            .ok_or_else(|| TokenizerError::Invalid("no \"model\" object".into()))?;
        let kind = model.get("type").and_then(Value::as_str).unwrap_or("BPE");
        if kind != "BPE" {
            return Err(TokenizerError::UnsupportedModel(kind.to_string()));
        }
        if model
            .get("byte_fallback")
            .and_then(Value::as_bool)
            .unwrap_or(false)
        {
            return Err(unsupported(
                "BPE byte_fallback (SentencePiece-style vocabulary)",
            ));
        }
        for key in ["continuing_subword_prefix", "end_of_word_suffix"] {
            if model
                .get(key)
                .and_then(Value::as_str)
                .is_some_and(|s| !s.is_empty())
            {
                return Err(unsupported(format!("BPE {key}")));
            }
        }
        if !json.get("normalizer").map_or(true, Value::is_null) {
            return Err(unsupported(format!(
                "normalizer {}",
                type_of(&json["normalizer"])
            )));
        }

        let mut pre_patterns = Vec::new();
        let mut byte_level = false;
        if let Some(pre) = json.get("pre_tokenizer").filter(|v| !v.is_null()) {
            collect_pre(pre, &mut pre_patterns, &mut byte_level)?;
        }
        if json
            .get("decoder")
            .is_some_and(|d| type_of(d) == "ByteLevel")
        {
            byte_level = true;
        }
        if !byte_level {
            return Err(unsupported("a vocabulary without ByteLevel encoding"));
        }

        let (tokens, kinds) = vocabulary(model, json.get("added_tokens"))?;
        let merges = merges(model.get("merges"))?;
        let id_of = |text: Option<String>| {
            text.and_then(|t| tokens.iter().position(|x| *x == t))
                .map(|i| i as u32)
        };
        let bos = id_of(config.and_then(|c| config_token(c, "bos_token")));
        let eos = id_of(config.and_then(|c| config_token(c, "eos_token")));
        let add_bos = match config
            .and_then(|c| c.get("add_bos_token"))
            .and_then(Value::as_bool)
        {
            Some(b) => b,
            None => bos.is_some_and(|b| {
                post_processor_adds(json.get("post_processor"), &tokens[b as usize])
            }),
        };

        Tokenizer::from_parts(Parts {
            tokens,
            kinds,
            merges,
            pre_patterns,
            ignore_merges: model
                .get("ignore_merges")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            bos,
            eos,
            add_bos,
        })
    }
}

fn type_of(v: &Value) -> &str {
    v.get("type").and_then(Value::as_str).unwrap_or("?")
}

/// Flattens a pre-tokenizer tree into llama.cpp-style sequential regexes.
fn collect_pre(
    pre: &Value,
    patterns: &mut Vec<String>,
    byte_level: &mut bool,
) -> Result<(), TokenizerError> {
    match type_of(pre) {
        "Sequence" => {
            for p in pre
                .get("pretokenizers")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                collect_pre(p, patterns, byte_level)?;
            }
        }
        "ByteLevel" => {
            if pre
                .get("add_prefix_space")
                .and_then(Value::as_bool)
                .unwrap_or(false)
            {
                return Err(unsupported("ByteLevel add_prefix_space"));
            }
            if pre
                .get("use_regex")
                .and_then(Value::as_bool)
                .unwrap_or(true)
            {
                patterns.push(HF_BYTE_LEVEL.to_string());
            }
            *byte_level = true;
        }
        "Digits" => {
            let single = pre
                .get("individual_digits")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            patterns.push(if single { r"\p{N}" } else { r"\p{N}+" }.to_string());
        }
        "Split" => {
            let behavior = pre.get("behavior").and_then(Value::as_str).unwrap_or("?");
            if behavior != "Isolated" || pre.get("invert").and_then(Value::as_bool).unwrap_or(false)
            {
                return Err(unsupported(format!(
                    "Split with behavior {behavior} or invert"
                )));
            }
            let pattern = pre.get("pattern");
            if let Some(re) = pattern.and_then(|p| p.get("Regex")).and_then(Value::as_str) {
                patterns.push(re.to_string());
            } else if let Some(s) = pattern
                .and_then(|p| p.get("String"))
                .and_then(Value::as_str)
            {
                patterns.push(fancy_regex::escape(s).into_owned());
            } else {
                return Err(unsupported("Split without a Regex or String pattern"));
            }
        }
        other => return Err(unsupported(format!("pre-tokenizer {other}"))),
    }
    Ok(())
}

/// Id-ordered tokens and kinds from model.vocab plus added_tokens; ids not named are unused.
fn vocabulary(
    model: &Value,
    added: Option<&Value>,
) -> Result<(Vec<String>, Vec<TokenKind>), TokenizerError> {
    let vocab = model
        .get("vocab")
        .and_then(Value::as_object)
        .ok_or_else(|| TokenizerError::Invalid("model.vocab is not an object".into()))?;
    let mut entries: Vec<(u64, String, TokenKind)> = Vec::with_capacity(vocab.len());
    for (text, id) in vocab {
        let id = id.as_u64().ok_or_else(|| {
            TokenizerError::Invalid(format!("vocab id of {text:?} is not an integer"))
        })?;
        entries.push((id, text.clone(), TokenKind::Normal));
    }
    for a in added.and_then(Value::as_array).into_iter().flatten() {
        let id = a.get("id").and_then(Value::as_u64);
        let text = a.get("content").and_then(Value::as_str);
        let (Some(id), Some(text)) = (id, text) else {
            return Err(TokenizerError::Invalid(format!(
                "added token without id or content: {a}"
            )));
        };
        let special = a.get("special").and_then(Value::as_bool).unwrap_or(false);
        let kind = if special {
            TokenKind::Control
        } else {
            TokenKind::UserDefined
        };
        entries.push((id, text.to_string(), kind));
    }
    let size = entries.iter().map(|e| e.0 + 1).max().unwrap_or(0);
    if size > u64::from(u32::MAX) || size > (entries.len() as u64) * 2 + 1024 {
        return Err(TokenizerError::Invalid(format!(
            "token ids reach {size}, far above the {} entries",
            entries.len()
        )));
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

/// Merges as "a b" strings (older files) or ["a", "b"] pairs (newer files).
fn merges(merges: Option<&Value>) -> Result<Vec<(String, String)>, TokenizerError> {
    let list = merges
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    list.iter()
        .map(|m| match m {
            Value::String(s) => s
                .split_once(' ')
                .map(|(l, r)| (l.to_string(), r.to_string())),
            Value::Array(p) if p.len() == 2 => {
                Some((p[0].as_str()?.to_string(), p[1].as_str()?.to_string()))
            }
            _ => None,
        })
        .map(|m| {
            m.ok_or_else(|| TokenizerError::Invalid("a merge is neither \"a b\" nor [a, b]".into()))
        })
        .collect()
}

/// Whether a TemplateProcessing post-processor (alone or in a Sequence) starts with `bos`.
fn post_processor_adds(post: Option<&Value>, bos: &str) -> bool {
    let Some(post) = post.filter(|p| !p.is_null()) else {
        return false;
    };
    match type_of(post) {
        "Sequence" => post
            .get("processors")
            .and_then(Value::as_array)
            .is_some_and(|ps| ps.iter().any(|p| post_processor_adds(Some(p), bos))),
        "TemplateProcessing" => {
            post.get("single")
                .and_then(Value::as_array)
                .and_then(|s| s.first())
                .and_then(|first| first.get("SpecialToken"))
                .and_then(|st| st.get("id"))
                .and_then(Value::as_str)
                == Some(bos)
        }
        _ => false,
    }
}
