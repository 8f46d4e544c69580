//! Builds a `Tokenizer` from GGUF metadata: `tokenizer.ggml.{model,pre,tokens,token_type,merges}`,
//! the special ids and `add_bos_token`, with llama.cpp's defaults where a key is absent.

use super::pretokenize::preset;
use super::{Parts, TokenKind, Tokenizer, TokenizerError};
use crate::gguf::Gguf;

impl Tokenizer {
    /// Builds the tokenizer a GGUF file describes. Only `tokenizer.ggml.model = "gpt2"` (byte-level
    /// BPE) is supported; `tokenizer.ggml.pre` picks the pre-tokenizer as llama.cpp does.
    pub fn from_gguf(gguf: &Gguf) -> Result<Self, TokenizerError> {
        let model = gguf.get_str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel(model.to_string()));
        }
        let pre_name = gguf.get_str_opt("tokenizer.ggml.pre")?.unwrap_or("default");
        let pre = preset(pre_name)
            .ok_or_else(|| TokenizerError::UnsupportedPreTokenizer(pre_name.to_string()))?;

        let tokens = gguf.get_str_array("tokenizer.ggml.tokens")?.to_vec();
        let kinds = if gguf.contains("tokenizer.ggml.token_type") {
            gguf.get_i64_array("tokenizer.ggml.token_type")?
                .into_iter()
                .map(TokenKind::from_gguf)
                .collect()
        } else {
            vec![TokenKind::Normal; tokens.len()]
        };
        let merges = gguf
            .get_str_array("tokenizer.ggml.merges")?
            .iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(l, r)| (l.to_string(), r.to_string()))
                    .ok_or_else(|| TokenizerError::Invalid(format!("merge {m:?} has no space")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let add_bos = gguf
            .get_bool_opt("tokenizer.ggml.add_bos_token")?
            .unwrap_or(pre.add_bos);

        Tokenizer::from_parts(Parts {
            tokens,
            kinds,
            merges,
            pre_patterns: pre.regexes.iter().map(|s| s.to_string()).collect(),
            ignore_merges: pre.ignore_merges,
            bos: gguf.get_u32_opt("tokenizer.ggml.bos_token_id")?,
            eos: gguf.get_u32_opt("tokenizer.ggml.eos_token_id")?,
            add_bos,
        })
    }
}
