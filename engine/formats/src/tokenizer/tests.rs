//! Unit tests of the tokenizer on a tiny hand-made tokenizer.json: special-token partition with and
//! without `parse_special`, user-defined tokens, decode round trips, and refusal of unsupported
//! formats. Agreement with llama.cpp on the real model is tested in `tests/tokenizer_fixtures.rs`.

use serde_json::json;

use super::*;

/// A byte-level BPE over the letters of "hello world" plus a few merges and specials.
fn tiny() -> Tokenizer {
    let mut vocab = serde_json::Map::new();
    let base = [
        "h", "e", "l", "o", "Ġ", "w", "r", "d", "<", ">", "|", "!", "1", "2", "Ċ", "s",
    ];
    let merged = [
        "he", "ll", "llo", "hello", "Ġw", "or", "Ġwor", "Ġworld", "ld",
    ];
    for (i, t) in base.iter().chain(merged.iter()).enumerate() {
        vocab.insert(t.to_string(), json!(i));
    }
    let n = vocab.len();
    let json = json!({
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}
        ]},
        "decoder": {"type": "ByteLevel"},
        "added_tokens": [
            {"id": n, "content": "<|s|>", "special": true},
            {"id": n + 1, "content": "<tool>", "special": false}
        ],
        "model": {"type": "BPE", "vocab": vocab, "merges": [
            "h e", "l l", "ll o", "he llo", "Ġ w", "o r", ["Ġw", "or"], "l d", "Ġwor ld"
        ]}
    });
    let config =
        json!({"bos_token": "<|s|>", "eos_token": {"content": "<|s|>"}, "add_bos_token": true});
    Tokenizer::from_hf_value(&json, Some(&config)).unwrap()
}

fn ids(t: &Tokenizer, texts: &[&str]) -> Vec<u32> {
    texts.iter().map(|x| t.token_id(x).unwrap()).collect()
}

#[test]
fn encodes_words_with_merges() {
    let t = tiny();
    assert_eq!(t.encode("hello world", true), ids(&t, &["hello", "Ġworld"]));
    assert_eq!(t.encode("12", true), ids(&t, &["1", "2"]));
    assert_eq!(t.encode("", true), Vec::<u32>::new());
    assert_eq!(t.decode(&t.encode("hello world\n", true)), "hello world\n");
}

#[test]
fn control_tokens_need_parse_special_user_defined_do_not() {
    let t = tiny();
    let s = t.token_id("<|s|>").unwrap();
    let tool = t.token_id("<tool>").unwrap();
    assert_eq!(
        t.encode("<|s|>hello", true),
        [vec![s], ids(&t, &["hello"])].concat()
    );
    let plain = t.encode("<|s|>hello", false);
    assert!(!plain.contains(&s));
    assert_eq!(t.decode(&plain), "<|s|>hello");
    assert_eq!(
        t.encode("he<tool>he", false),
        [ids(&t, &["he"]), vec![tool], ids(&t, &["he"])].concat()
    );
    assert_eq!(t.token_kind(s), Some(TokenKind::Control));
    assert_eq!(t.token_kind(tool), Some(TokenKind::UserDefined));
    assert_eq!(t.token_to_piece(s).unwrap(), b"<|s|>");
    assert_eq!(t.token_to_piece(t.token_id("Ġw").unwrap()).unwrap(), b" w");
    assert_eq!(t.token_to_piece(9999), None);
}

#[test]
fn special_ids_and_sizes_come_from_the_config() {
    let t = tiny();
    assert_eq!(t.bos(), t.token_id("<|s|>"));
    assert_eq!(t.eos(), t.token_id("<|s|>"));
    assert!(t.add_bos());
    assert_eq!(t.vocab_size(), 27);
}

#[test]
fn refuses_what_it_cannot_reproduce() {
    let base = json!({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "decoder": {"type": "ByteLevel"}});
    let with = |key: &str, v: serde_json::Value| {
        let mut j = base.clone();
        j[key] = v;
        Tokenizer::from_hf_value(&j, None).unwrap_err()
    };
    assert!(
        matches!(with("normalizer", json!({"type": "NFC"})), TokenizerError::UnsupportedFeature(m) if m.contains("NFC"))
    );
    assert!(matches!(
        with("pre_tokenizer", json!({"type": "Metaspace"})),
        TokenizerError::UnsupportedFeature(_)
    ));
    assert!(matches!(
        with("model", json!({"type": "Unigram", "vocab": []})),
        TokenizerError::UnsupportedModel(m) if m == "Unigram"
    ));
    assert!(matches!(
        with(
            "model",
            json!({"type": "BPE", "vocab": {}, "merges": [], "byte_fallback": true})
        ),
        TokenizerError::UnsupportedFeature(_)
    ));
    assert!(matches!(
        with("decoder", json!(null)),
        TokenizerError::UnsupportedFeature(_)
    ));
    assert!(Tokenizer::from_hf_value(&base, None).is_ok());
}
