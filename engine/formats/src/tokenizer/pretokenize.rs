//! Pre-tokenization: the ordered regex list that splits text into words before BPE, as llama.cpp
//! applies it (each regex splits every fragment left by the previous one; matches and the gaps
//! between them both become fragments). Holds llama.cpp's named presets (`tokenizer.ggml.pre`).

use fancy_regex::Regex;

use super::TokenizerError;

/// GPT-2's split, as llama.cpp writes it (it has no trailing `|\s+`; a lone whitespace left
/// unmatched becomes a gap fragment, which gives the same words).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// GPT-2's split as Hugging Face's ByteLevel pre-tokenizer writes it.
pub(crate) const HF_BYTE_LEVEL: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
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
    let p = |regexes, ignore_merges, add_bos| {
        Some(Preset {
            regexes,
            ignore_merges,
            add_bos,
        })
    };
    match name {
        "default" => p(
            &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"],
            false,
            false,
        ),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" => p(&[LLAMA3], true, true),
        "dbrx" | "smaug-bpe" => p(&[LLAMA3], false, false),
        "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" | "trillion" | "granite-docling" => {
            p(&[GPT2], false, false)
        }
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b" => {
            p(&[r"\p{N}", GPT2], false, false)
        }
        "qwen2" | "stablelm2" | "deepseek-r1-qwen" | "hunyuan" => p(&[QWEN2], false, false),
        _ => None,
    }
}

/// The compiled regex list.
#[derive(Debug)]
pub(crate) struct PreTokenizer {
    regexes: Vec<Regex>,
}

impl PreTokenizer {
    pub(crate) fn new<S: AsRef<str>>(patterns: &[S]) -> Result<Self, TokenizerError> {
        let regexes = patterns
            .iter()
            .map(|p| {
                Regex::new(p.as_ref()).map_err(|e| TokenizerError::BadRegex {
                    pattern: p.as_ref().to_string(),
                    message: e.to_string(),
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(PreTokenizer { regexes })
    }

    /// Splits `text` into words (byte ranges of `text`, in order, covering it entirely).
    pub(crate) fn split(&self, text: &str) -> Vec<(usize, usize)> {
        let mut fragments = vec![(0, text.len())];
        if text.is_empty() {
            return Vec::new();
        }
        for re in &self.regexes {
            let mut next = Vec::with_capacity(fragments.len() * 2);
            for &(start, end) in &fragments {
                split_one(re, text, start, end, &mut next);
            }
            fragments = next;
        }
        fragments
    }
}

/// Splits `text[start..end]` by `re`: each match and each gap between matches is a fragment.
/// The regex sees only the fragment, as in llama.cpp (look-ahead stops at the fragment's end).
fn split_one(re: &Regex, text: &str, start: usize, end: usize, out: &mut Vec<(usize, usize)>) {
    let slice = &text[start..end];
    let mut last = 0;
    for m in re.find_iter(slice) {
        let Ok(m) = m else {
            // fancy-regex gave up (backtrack limit): keep the rest as one fragment rather than
            // dropping text. Not reached by the presets on any input seen so far.
            break;
        };
        if m.start() == m.end() {
            continue;
        }
        if m.start() > last {
            out.push((start + last, start + m.start()));
        }
        out.push((start + m.start(), start + m.end()));
        last = m.end();
    }
    if last < slice.len() {
        out.push((start + last, end));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(names: &str, text: &str) -> Vec<String> {
        let p = preset(names).unwrap();
        let pre = PreTokenizer::new(p.regexes).unwrap();
        pre.split(text)
            .into_iter()
            .map(|(s, e)| text[s..e].to_string())
            .collect()
    }

    #[test]
    fn smollm_splits_digits_then_gpt2() {
        assert_eq!(
            words("smollm", "abc 12345"),
            ["abc", " ", "1", "2", "3", "4", "5"]
        );
        assert_eq!(
            words("smollm", "I'm  here\n\nnow "),
            ["I", "'m", " ", " here", "\n", "\n", "now", " "]
        );
    }

    #[test]
    fn gpt2_keeps_space_before_word_and_groups_numbers() {
        assert_eq!(
            words("gpt-2", "hi  there 2024!"),
            ["hi", " ", " there", " 2024", "!"]
        );
    }

    #[test]
    fn llama3_groups_three_digits() {
        assert_eq!(words("llama3", "12345 ok"), ["123", "45", " ok"]);
    }

    #[test]
    fn every_preset_compiles() {
        for name in ["default", "llama3", "dbrx", "gpt-2", "smollm", "qwen2"] {
            let p = preset(name).unwrap();
            PreTokenizer::new(p.regexes).unwrap();
        }
        PreTokenizer::new(&[HF_BYTE_LEVEL]).unwrap();
        assert!(preset("no-such-pre").is_none());
    }
}
