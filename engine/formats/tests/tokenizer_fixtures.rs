//! The tokenizer against references on the real SmolLM2 GGUF: every fixture string must give the
//! ids llama.cpp gives (and those of the HF `tokenizers` reference built from the same vocabulary),
//! and decode back to the same text. Also reads the real file's GGUF metadata and tensor infos.

mod common;

use ctxscope_formats::{Gguf, TokenKind, Tokenizer};
use serde_json::Value;

fn check_all(tok: &Tokenizer, cases: &[Value], label: &str) -> usize {
    let mut failures = Vec::new();
    for case in cases {
        let text = case["text"].as_str().expect("text");
        let parse_special = case["parse_special"].as_bool().expect("parse_special");
        let got = tok.encode(text, parse_special);
        let hf = common::ids(&case["ids"]);
        let llama = case.get("llama_cpp_ids").map(common::ids);
        if Some(&got) != llama.as_ref().or(Some(&hf)) || got != hf {
            failures.push(format!("{text:?} (parse_special={parse_special}): got {got:?}, llama.cpp {llama:?}, hf {hf:?}"));
        }
        assert_eq!(tok.decode(&got), text, "decode(encode(x)) != x for {text:?}");
    }
    assert!(failures.is_empty(), "{label}: {} of {} differ:\n{}", failures.len(), cases.len(), failures.join("\n"));
    cases.len()
}

#[test]
fn every_fixture_matches_llama_cpp() {
    let gguf = Gguf::open(common::model_path()).unwrap();
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    let fixture = common::fixture();
    let n = check_all(&tok, fixture["cases"].as_array().unwrap(), "cases");
    let m = check_all(&tok, fixture["fuzz"].as_array().unwrap(), "fuzz");
    assert!(n >= 30 && m >= 200, "fixture too small: {n} cases, {m} fuzz");
    // The fixture carries llama.cpp ids for every entry; a regenerated fixture must keep them.
    let with_llama = fixture["cases"].as_array().unwrap().iter().filter(|c| c.get("llama_cpp_ids").is_some()).count();
    assert_eq!(with_llama, n);
}

#[test]
fn special_tokens_and_metadata_of_the_real_vocabulary() {
    let gguf = Gguf::open(common::model_path()).unwrap();
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!((tok.bos(), tok.eos()), (Some(1), Some(2)));
    assert!(!tok.add_bos());
    assert_eq!(tok.token_text(1), Some("<|im_start|>"));
    assert_eq!(tok.token_kind(2), Some(TokenKind::Control));
    assert_eq!(tok.token_kind(100), Some(TokenKind::Normal));
    assert_eq!(tok.token_to_piece(216).unwrap(), b" ");
    assert_eq!(tok.encode("<|im_start|>", true), [1]);
    assert!(tok.encode("<|im_start|>", false).len() > 1);
}

#[test]
fn real_gguf_header_and_tensor_infos() {
    let path = common::model_path();
    let file_len = std::fs::metadata(&path).unwrap().len();
    let g = Gguf::open(&path).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(g.get_u32("llama.context_length").unwrap(), 8192);
    assert_eq!(g.get_u32("llama.block_count").unwrap(), 30);
    assert!((g.get_f32("llama.rope.freq_base").unwrap() - 100000.0).abs() < 1e-3);
    assert_eq!(g.get_str("tokenizer.ggml.pre").unwrap(), "smollm");
    assert_eq!(g.get_str_array("tokenizer.ggml.merges").unwrap().len(), 48900);
    assert_eq!(g.alignment(), 32);
    assert_eq!(g.data_offset(), 1_785_664); // as gguf-py 0.19 reports it
    assert_eq!(g.tensors().len(), 272);
    let emb = g.tensor("token_embd.weight").unwrap();
    assert_eq!(emb.dims, [576, 49152]);
    assert_eq!(emb.ggml_type.name(), Some("Q8_0")); // gguf-py: tensor_type 8
                                                    // Every tensor's size is known and the last one ends within alignment of the file's end.
    let end = g.tensors().iter().map(|t| g.data_offset() + t.offset + t.byte_size().expect("known type")).max().unwrap();
    assert!(end <= file_len && file_len - end < 32, "tensor data ends at {end}, file is {file_len}");
}
