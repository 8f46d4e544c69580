//! Guards the golden path: the logits of a fixed chat prompt (its prefill and four greedy decode steps)
//! must keep the exact bits recorded before the patch registry existed, so the empty patch set stays
//! the reference. Rerun with `--nocapture` to see the digest if the model file changes.

mod common;

use std::sync::Arc;

use ctxscope_engine::forward::{forward, Segment};
use ctxscope_engine::kv::KvCache;
use ctxscope_engine::{Model, Path};
use ctxscope_formats::RenderOptions;
use serde_json::json;

/// FNV-1a over the bits of every logit, recorded on SmolLM2-135M-Instruct.Q4_1 before the patches.
const GOLDEN_DIGEST: u64 = 0x8d33_55e9_9498_fba6;

fn load() -> Arc<Model> {
    let path = common::model_path();
    Arc::new(Model::load(&path).expect("model loads"))
}

/// Golden logits of the prompt's last position and `steps` greedy decode steps.
pub fn golden_logits(model: &Model, steps: usize) -> Vec<Vec<f32>> {
    let opts = RenderOptions { add_generation_prompt: true, bos_token: "", eos_token: "", tools: None };
    let messages = [json!({"role": "user", "content": "The secret word is banana. What fruit is yellow and curved?"})];
    let text = model.template.render(&messages, &opts).expect("renders");
    let mut input = model.tokenizer.encode(&text, true);
    let mut kv = KvCache::new(model.config.n_layers, model.config.kv_dim());
    let mut all = Vec::new();
    for _ in 0..=steps {
        let logits = forward(model, Path::Golden, &mut [Segment { tokens: &input, kv: &mut kv }]).remove(0);
        let next = logits.iter().enumerate().fold(0, |b, (i, v)| if *v > logits[b] { i } else { b }) as u32;
        all.push(logits);
        input = vec![next];
    }
    all
}

#[test]
fn empty_patch_set_keeps_the_golden_bits() {
    let model = load();
    let logits = golden_logits(&model, 4);
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for v in logits.iter().flatten() {
        for b in v.to_bits().to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    println!("golden digest {h:#018x}");
    assert_eq!(h, GOLDEN_DIGEST, "golden logits changed (digest {h:#018x})");
}
