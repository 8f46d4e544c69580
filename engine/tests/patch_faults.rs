//! Context and cache faults on the real model, through the scheduler: a multi-turn conversation whose
//! last turn asks for a fact from the first ("The secret word is banana."). Golden recalls it; each
//! context fault makes the engine lose it while reporting the prompt_tokens the imitated engine would;
//! the weak-hash prefix cache reports cached tokens for a prompt that does not share the prefix.

mod common;

use ctxscope_engine::scheduler::{EngineHandle, Event, GenerateRequest};
use ctxscope_engine::{PatchSet, Path};
use serde_json::{json, Value};

fn engine() -> &'static EngineHandle {
    common::shared_engine()
}

fn prompt(messages: &[Value]) -> Vec<u32> {
    common::chat_prompt(&engine().model, messages)
}

/// The recall conversation (the `secret_word` probe of tests/fixtures/llama_cpp/recall.json, which
/// llama.cpp answers): the fact in the first turn, the question in the last.
fn recall_prompt() -> Vec<u32> {
    prompt(&[
        json!({"role": "user", "content": "The secret word is banana."}),
        json!({"role": "assistant", "content": "Okay, I will remember that."}),
        json!({"role": "user", "content": "What is the secret word?"}),
    ])
}

struct Outcome {
    text: String,
    prompt_tokens: usize,
    cached: usize,
}

fn generate(tokens: Vec<u32>, max_tokens: usize, patches: &str) -> Outcome {
    let patches = PatchSet::parse(patches).expect("valid patches");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let request = GenerateRequest { prompt: tokens, max_tokens, sampling: Default::default(), path: Path::Golden, patches, events: tx };
    engine().submit(request).expect("engine running");
    let (mut out, mut prompt_tokens, mut cached) = (Vec::new(), 0, 0);
    loop {
        match rx.blocking_recv().expect("engine answers") {
            Event::Started { prompt_tokens: p, cached_tokens } => (prompt_tokens, cached) = (p, cached_tokens),
            Event::Token(s) => out.push(s.token),
            Event::Done { .. } => {
                let text = engine().model.tokenizer.decode(&out);
                return Outcome { text, prompt_tokens, cached };
            }
            Event::Error(e) => panic!("engine error: {e}"),
        }
    }
}

fn recalls(o: &Outcome) -> bool {
    o.text.to_lowercase().contains("banana")
}

#[test]
fn golden_recalls_the_fact_from_the_first_turn() {
    let o = generate(recall_prompt(), 16, "");
    assert!(recalls(&o), "golden lost the fact: {:?}", o.text);
    assert_eq!(o.prompt_tokens, 60);
}

#[test]
fn ctx_shift_keeps_head_and_tail_and_loses_the_fact() {
    // Ollama with num_ctx 32: the first 4 tokens and the last 28; the fact sits in between.
    let o = generate(recall_prompt(), 16, "ctx_shift=32");
    assert_eq!(o.prompt_tokens, 32, "Ollama reports the evaluated count");
    assert!(!recalls(&o), "ctx_shift kept the fact: {:?}", o.text);
}

#[test]
fn auto_truncate_keeps_the_head_and_loses_the_fact() {
    // SGLang with context 30: the first 23 tokens (the system prompt), the conversation dropped.
    let o = generate(recall_prompt(), 16, "auto_truncate=30");
    assert_eq!(o.prompt_tokens, 23, "SGLang reports the truncated count");
    assert!(!recalls(&o), "auto_truncate kept the fact: {:?}", o.text);
}

#[test]
fn sliding_window_loses_the_fact_but_reports_the_whole_prompt() {
    let o = generate(recall_prompt(), 16, "sliding_window=32");
    assert_eq!(o.prompt_tokens, 60);
    assert!(!recalls(&o), "sliding_window kept the fact: {:?}", o.text);
}

#[test]
fn prefix_cache_off_never_reports_cached_tokens() {
    let p = prompt(&[json!({"role": "user", "content": "Name a primary color."})]);
    generate(p.clone(), 4, "prefix_cache_off");
    assert_eq!(generate(p.clone(), 4, "prefix_cache_off").cached, 0);
    generate(p.clone(), 4, "");
    assert!(generate(p, 4, "").cached > 0, "golden should reuse its own prefix");
}

#[test]
fn weak_hash_reuses_kv_of_a_prompt_that_does_not_share_the_prefix() {
    let a = recall_prompt();
    // Same length, same first token in every 16-token block, every other token different.
    let b: Vec<u32> = a.iter().enumerate().map(|(i, t)| if i % 16 == 0 { *t } else { 1000 + i as u32 }).collect();
    let shared = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    assert_eq!(shared, 1);
    generate(a.clone(), 4, "prefix_cache_weak_hash");
    let weak = generate(b.clone(), 4, "prefix_cache_weak_hash");
    assert_eq!(weak.cached, 48, "three colliding 16-token blocks reported as cached");
    generate(a, 4, "");
    let exact = generate(b, 4, "");
    assert!(exact.cached <= shared, "token-exact matching reused {} tokens", exact.cached);
}
