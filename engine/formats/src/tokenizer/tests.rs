//! Unit tests of the tokenizer on a tiny hand-made tokenizer.json: special-token partition with and
//! without `parse_special`, user-defined tokens, decode round trips, SentencePiece-style,
//! Unigram and WordPiece files, and typed errors for files that cannot be read. Agreement with llama.cpp on the real model is tested in `tests/tokenizer_fixtures.rs`.

use serde_json::json;

use super::*;

/// A byte-level BPE over the letters of "hello world" plus a few merges and specials.
fn tiny() -> Tokenizer {
    let mut vocab = serde_json::Map::new();
    let base = ["h", "e", "l", "o", "Ġ", "w", "r", "d", "<", ">", "|", "!", "1", "2", "Ċ", "s"];
    let merged = ["he", "ll", "llo", "hello", "Ġw", "or", "Ġwor", "Ġworld", "ld"];
    for (i, t) in base.iter().chain(merged.iter()).enumerate() {
        vocab.insert(t.to_string(), json!(i));
    }
    let n = vocab.len();
    let json = json!({
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true}
        ]},
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true},
        "added_tokens": [
            {"id": n, "content": "<|s|>", "special": true, "single_word": false,
             "lstrip": false, "rstrip": false, "normalized": false},
            {"id": n + 1, "content": "<tool>", "special": false, "single_word": false,
             "lstrip": false, "rstrip": false, "normalized": false}
        ],
        "model": {"type": "BPE", "vocab": vocab, "merges": [
            "h e", "l l", "ll o", "he llo", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld"
        ]}
    });
    let config = json!({"bos_token": "<|s|>", "eos_token": {"content": "<|s|>"}, "add_bos_token": true});
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
    assert_eq!(t.encode("<|s|>hello", true), [vec![s], ids(&t, &["hello"])].concat());
    let plain = t.encode("<|s|>hello", false);
    assert!(!plain.contains(&s));
    assert_eq!(t.decode(&plain), "<|s|>hello");
    assert_eq!(t.encode("he<tool>he", false), [ids(&t, &["he"]), vec![tool], ids(&t, &["he"])].concat());
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
fn reads_what_the_old_hand_written_bpe_refused() {
    // A SentencePiece-style BPE: "▁" spaces, byte fallback, a normalizer Sequence.
    let json = json!({
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
        ]},
        "pre_tokenizer": null,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}
        ]},
        "added_tokens": [{"id": 1, "content": "<s>", "special": true, "single_word": false,
                          "lstrip": false, "rstrip": false, "normalized": false}],
        "model": {"type": "BPE", "byte_fallback": true, "fuse_unk": true, "unk_token": "<unk>",
                  "vocab": {"<unk>": 0, "<s>": 1, "<0xC3>": 2, "<0xA9>": 3, "▁": 4, "h": 5,
                            "i": 6, "▁h": 7, "▁hi": 8},
                  "merges": ["▁ h", "▁h i"]}
    });
    let config = json!({"bos_token": "<s>", "add_bos_token": true});
    let t = Tokenizer::from_hf_value(&json, Some(&config)).unwrap();
    assert_eq!(t.encode("hi é", true), [8, 4, 2, 3]);
    assert_eq!(t.encode("<s>hi", true), [1, 8]);
    // Without parse_special, "<s>" is text: "▁", then unknown characters fused into one <unk>.
    assert_eq!(t.encode("<s>", false), [4, 0]);
    assert_eq!(t.token_to_piece(8).unwrap(), b" hi");
    assert_eq!(t.token_to_piece(2).unwrap(), [0xC3]);
    assert_eq!(t.token_kind(2), Some(TokenKind::Byte));
    assert_eq!(t.token_kind(0), Some(TokenKind::Unknown));
    assert_eq!(t.decode(&[8, 4, 2, 3]), "hi é");
    assert_eq!((t.bos(), t.add_bos()), (Some(1), true));

    // Unigram and WordPiece models load too.
    let unigram = json!({"model": {"type": "Unigram", "unk_id": 0,
        "vocab": [["<unk>", 0.0], ["▁a", -1.0], ["b", -2.0]]},
        "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true}});
    let t = Tokenizer::from_hf_value(&unigram, None).unwrap();
    assert_eq!(t.encode("ab", true), [1, 2]);
    let wordpiece = json!({"normalizer": {"type": "BertNormalizer", "clean_text": true,
            "handle_chinese_chars": true, "strip_accents": null, "lowercase": true},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": {"[UNK]": 0, "play": 1, "##ing": 2}}});
    let t = Tokenizer::from_hf_value(&wordpiece, None).unwrap();
    assert_eq!(t.encode("Playing", true), [1, 2]);
}

#[test]
fn refuses_what_it_cannot_read() {
    let err = |j: serde_json::Value| Tokenizer::from_hf_value(&j, None).unwrap_err();
    assert!(matches!(err(json!({"normalizer": null})), TokenizerError::Invalid(m) if m.contains("model")));
    assert!(matches!(err(json!({"model": {"type": "NoSuchModel", "vocab": {}}})), TokenizerError::Load(_)));
    assert!(matches!(
        err(json!({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                   "normalizer": {"type": "NoSuchNormalizer"}})),
        TokenizerError::Load(_)
    ));
}
