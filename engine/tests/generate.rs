//! The engine on the real default model: chat prompts rendered with the model's own template,
//! greedy generation on both paths, determinism, prefix reuse equal to a cold run.

mod common;

use ctxscope_engine::scheduler::{EngineHandle, Event, Finish, GenerateRequest};
use ctxscope_engine::Path;
use serde_json::{json, Value};

fn engine() -> &'static EngineHandle {
    common::shared_engine()
}

fn prompt(messages: &[Value]) -> Vec<u32> {
    common::chat_prompt(&engine().model, messages)
}

struct Outcome {
    tokens: Vec<u32>,
    text: String,
    cached: usize,
    finish: Finish,
}

fn generate(tokens: Vec<u32>, max_tokens: usize, path: Path) -> Outcome {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let request =
        GenerateRequest { prompt: tokens, max_tokens, sampling: Default::default(), path, patches: Default::default(), events: tx };
    engine().submit(request).expect("engine running");
    let (mut out, mut cached) = (Vec::new(), 0);
    loop {
        match rx.blocking_recv().expect("engine answers") {
            Event::Started { cached_tokens, .. } => cached = cached_tokens,
            Event::Token(s) => out.push(s.token),
            Event::Done { finish, .. } => {
                let text = engine().model.tokenizer.decode(&out);
                return Outcome { tokens: out, text, cached, finish };
            }
            Event::Error(e) => panic!("engine error: {e}"),
        }
    }
}

#[test]
fn greedy_answers_are_deterministic_and_sensible() {
    let p = prompt(&[json!({"role": "user", "content": "What is the capital of France?"})]);
    let a = generate(p.clone(), 24, Path::Golden);
    assert!(a.text.contains("Paris"), "{:?}", a.text);
    let b = generate(p, 24, Path::Golden);
    assert_eq!(a.tokens, b.tokens, "golden path not deterministic");
}

#[test]
fn prefix_reuse_gives_the_tokens_of_a_cold_run() {
    let first = [json!({"role": "user", "content": "Name three colors of the rainbow."})];
    let cold = generate(prompt(&first), 16, Path::Golden);
    let mut second = first.to_vec();
    second.push(json!({"role": "assistant", "content": cold.text}));
    second.push(json!({"role": "user", "content": "And one more?"}));
    let warm = generate(prompt(&second), 16, Path::Golden);
    assert!(warm.cached > 10, "prefix not reused: {} cached", warm.cached);
    // The same prompt from scratch, in a namespace with no cache entries: the fast path is separate,
    // so compare golden-with-reuse against golden computed cold by a fresh sequence instead.
    let fresh = {
        let model = engine().model.clone();
        let mut kv = ctxscope_engine::kv::KvCache::new(model.config.n_layers, model.config.kv_dim());
        let tokens = prompt(&second);
        let mut out = Vec::new();
        let mut input = tokens.clone();
        for _ in 0..16 {
            let mut seg = [ctxscope_engine::forward::Segment { tokens: &input, kv: &mut kv }];
            let logits = ctxscope_engine::forward::forward(&model, Path::Golden, &mut seg);
            let next = ctxscope_engine::sample::argmax(&logits[0]);
            if model.stop_tokens.contains(&next) {
                break;
            }
            out.push(next);
            input = vec![next];
        }
        out
    };
    assert_eq!(warm.tokens, fresh, "reused KV changed the greedy continuation");
}

#[test]
fn fast_path_stays_close_to_golden() {
    let p = prompt(&[json!({"role": "user", "content": "Write one sentence about the sea."})]);
    let golden = generate(p.clone(), 12, Path::Golden);
    let fast = generate(p, 12, Path::Fast);
    // The first few tokens agree; later ones may flip on near-ties.
    assert_eq!(golden.tokens[..3], fast.tokens[..3], "golden {:?} fast {:?}", golden.text, fast.text);
}

#[test]
fn max_tokens_and_overlong_prompts() {
    let p = prompt(&[json!({"role": "user", "content": "Count from one to fifty."})]);
    let out = generate(p, 3, Path::Golden);
    assert_eq!((out.tokens.len(), out.finish), (3, Finish::Length));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let huge = vec![100u32; engine().options.ctx + 5];
    engine()
        .submit(GenerateRequest {
            prompt: huge,
            max_tokens: 4,
            sampling: Default::default(),
            path: Path::Golden,
            patches: Default::default(),
            events: tx,
        })
        .unwrap();
    match rx.blocking_recv().unwrap() {
        Event::Error(message) => assert!(message.contains("context"), "{message}"),
        other => panic!("expected an error, got {other:?}"),
    }
}
