//! Pre-tokenization of GGUF byte-level vocabularies: llama.cpp's named regex presets
//! (`tokenizer.ggml.pre`) and the `tokenizers` pre-tokenizer that applies them as llama.cpp does.

use serde_json::{json, Value};

/// GPT-2's split, as llama.cpp writes it (it has no trailing `|\s+`; a lone whitespace left
/// unmatched becomes a gap fragment, which gives the same words).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Llama 3's split, case-insensitive contractions spelled out (llama.cpp's adaptation).
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split: Llama 3's with single digits.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// What a named llama.cpp pre-tokenizer implies.
pub(crate) struct Preset {
    pub regexes: &'static [&'static str],
    /// A word that is itself a token is emitted whole, without running merges.
    pub ignore_merges: bool,
    /// Whether llama.cpp adds BOS by default (the GGUF key `tokenizer.ggml.add_bos_token` overrides).
    pub add_bos: bool,
}

/// The preset for a `tokenizer.ggml.pre` value, following llama.cpp's `llama_vocab::impl::load`.
pub(crate) fn preset(name: &str) -> Option<Preset> {
    let p = |regexes, ignore_merges, add_bos| Some(Preset { regexes, ignore_merges, add_bos });
    match name {
        "default" => p(&[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"], false, false),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2" => p(&[LLAMA3], true, true),
        "dbrx" | "smaug-bpe" => p(&[LLAMA3], false, false),
        "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" | "trillion" | "granite-docling" => p(&[GPT2], false, false),
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b" => p(&[r"\p{N}", GPT2], false, false),
        "qwen2" | "stablelm2" | "deepseek-r1-qwen" | "hunyuan" => p(&[QWEN2], false, false),
        _ => None,
    }
}

/// The `tokenizers` pre-tokenizer for llama.cpp's regex list: each regex splits every fragment
/// the previous one left (matches and the gaps between them both become fragments, and a regex
/// sees only its fragment: `Split` with `Isolated`), then byte-level encoding without its own regex.
pub(crate) fn byte_level_pre_tokenizer(regexes: &[&str]) -> Value {
    let mut steps: Vec<Value> =
        regexes.iter().map(|re| json!({"type": "Split", "pattern": {"Regex": re}, "behavior": "Isolated", "invert": false})).collect();
    steps.push(json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}));
    json!({"type": "Sequence", "pretokenizers": steps})
}

#[cfg(test)]
mod tests {
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    use super::*;

    fn words(names: &str, text: &str) -> Vec<String> {
        let p = preset(names).unwrap();
        let pre: tokenizers::PreTokenizerWrapper = serde_json::from_value(byte_level_pre_tokenizer(p.regexes)).unwrap();
        let mut s = PreTokenizedString::from(text);
        pre.pre_tokenize(&mut s).unwrap();
        s.get_splits(OffsetReferential::Original, OffsetType::Byte).into_iter().map(|(_, (a, b), _)| text[a..b].to_string()).collect()
    }

    #[test]
    fn smollm_splits_digits_then_gpt2() {
        assert_eq!(words("smollm", "abc 12345"), ["abc", " ", "1", "2", "3", "4", "5"]);
        assert_eq!(words("smollm", "I'm  here\n\nnow "), ["I", "'m", " ", " here", "\n", "\n", "now", " "]);
    }

    #[test]
    fn gpt2_keeps_space_before_word_and_groups_numbers() {
        assert_eq!(words("gpt-2", "hi  there 2024!"), ["hi", " ", " there", " 2024", "!"]);
    }

    #[test]
    fn llama3_groups_three_digits() {
        assert_eq!(words("llama3", "12345 ok"), ["123", "45", " ok"]);
    }

    #[test]
    fn every_preset_compiles() {
        for name in ["default", "llama3", "dbrx", "gpt-2", "smollm", "qwen2"] {
            let p = preset(name).unwrap();
            serde_json::from_value::<tokenizers::PreTokenizerWrapper>(byte_level_pre_tokenizer(p.regexes)).unwrap();
        }
        assert!(preset("no-such-pre").is_none());
    }
}
