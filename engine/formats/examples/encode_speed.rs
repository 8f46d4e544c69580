//! Encode throughput of `Tokenizer::encode` on a 64 KiB text: the texts of
//! tests/fixtures/tokenizer/smollm2.json (prose, code, numbers, CJK, emoji, whitespace runs)
//! repeated to 64 KiB. Usage: `cargo run --release -p ctxscope-formats --example encode_speed
//! [GGUF | tokenizer.json]`; without an argument, the default model's GGUF.
//!
//! Measured on the shared 2-core dev machine, old and new binaries interleaved, warm ms per 64 KiB:
//! SmolLM2 GGUF 9.1-10.9 with the hand-written BPE, 16.5-18.4 on tokenizers 0.23.2; Llama 3.2
//! tokenizer.json 7.1-8.8 before, 12.0-15.8 after (DeepSeek-V4: 17.7, not loadable before).

use std::path::PathBuf;
use std::time::Instant;

use ctxscope_formats::{Gguf, Tokenizer};

fn main() {
    let path = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| ctxscope_formats::test_model_path().unwrap_or_else(|e| panic!("{e}")));
    let tok = if path.extension().is_some_and(|e| e == "json") {
        Tokenizer::from_tokenizer_json(&path, None).expect("tokenizer.json loads")
    } else {
        Tokenizer::from_gguf(&Gguf::open(&path).expect("GGUF opens")).expect("GGUF tokenizer")
    };
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizer/smollm2.json");
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&fixture).expect("fixture")).expect("JSON");
    let pieces: Vec<&str> =
        ["cases", "fuzz"].iter().flat_map(|k| json[*k].as_array().expect("list")).filter_map(|c| c["text"].as_str()).collect();
    let mut text = String::new();
    'fill: loop {
        for p in &pieces {
            if text.len() + p.len() + 1 > 64 * 1024 {
                break 'fill;
            }
            text.push_str(p);
            text.push('\n');
        }
    }
    // The first encode runs with any word cache empty; the timed rounds after it run warm.
    let cold = Instant::now();
    let tokens = tok.encode(&text, true).len();
    let cold = cold.elapsed().as_secs_f64();
    let rounds = 50;
    let start = Instant::now();
    for _ in 0..rounds {
        std::hint::black_box(tok.encode(std::hint::black_box(&text), true));
    }
    let secs = start.elapsed().as_secs_f64() / f64::from(rounds);
    println!(
        "{}: {} bytes -> {tokens} tokens; first encode {:.2} ms; then {:.2} ms per encode, {:.1} MiB/s",
        path.display(),
        text.len(),
        cold * 1e3,
        secs * 1e3,
        text.len() as f64 / secs / (1024.0 * 1024.0)
    );
}
