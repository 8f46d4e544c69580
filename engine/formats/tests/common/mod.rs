//! Shared helpers of the real-model tests: where the SmolLM2 GGUF is (env `CTXSCOPE_MODEL`, else
//! `default_model_path()`), failing loudly when it is missing, and the tokenizer fixture file.

#![allow(dead_code)]

use std::path::PathBuf;

use serde_json::Value;

/// The real model; panics with the fix when it is not there (these tests never skip silently).
pub fn model_path() -> PathBuf {
    ctxscope_formats::test_model_path().unwrap_or_else(|e| panic!("{e}"))
}

/// tests/fixtures/tokenizer/smollm2.json, made by make_fixtures.py beside it.
pub fn fixture() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizer/smollm2.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).expect("fixture is valid JSON")
}

/// Token ids of a JSON array.
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("an id list").iter().map(|x| x.as_u64().expect("an id") as u32).collect()
}
