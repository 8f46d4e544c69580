//! Each numerical patch's distance from golden on fixed chat prompts with the real model: for every
//! prompt, the last prompt position and 8 decode steps each fed golden's greedy token. A test holds each
//! patch to its expected order of magnitude; the ignored `distance_table` prints the BENCHMARKS.md table:
//! `cargo test --release -p ctxscope-engine --test patch_distance -- --ignored --nocapture`.
//!
//! Relative distance = max|Δlogit| / max|golden logit| over all positions. Thresholds (see
//! [`expected`]): every patch must move the logits (not a no-op) and stay short of a different model.
//! bf16 rounding of one stage (8 significant bits) is expected around 1e-2; FP8 KV (4 bits) and 8-bit
//! activations a few 1e-2; bf16 RoPE more, since past position 256 neighbouring positions share an
//! angle (the long prompt has 445 tokens).

mod common;

use std::sync::{Arc, OnceLock};

use ctxscope_engine::forward::{forward_patched, Segment};
use ctxscope_engine::kv::KvCache;
use ctxscope_engine::{Model, PatchSet, Path};
use ctxscope_formats::RenderOptions;
use serde_json::json;

const NUMERICAL: [&str; 6] = ["rmsnorm_bf16", "residual_gemm_bf16", "rope_bf16", "attn_splitk_bf16", "kv_fp8", "act_q8"];
const DECODE_STEPS: usize = 8;

fn model() -> &'static Arc<Model> {
    static MODEL: OnceLock<Arc<Model>> = OnceLock::new();
    MODEL.get_or_init(common::load_model)
}

/// Fixed prompts: a short question, the recall probe, and a long multi-turn chat (past 256 positions).
fn prompts() -> Vec<Vec<u32>> {
    let m = model();
    let opts = RenderOptions { add_generation_prompt: true, bos_token: "", eos_token: "", tools: None };
    let render = |messages: serde_json::Value| {
        let text = m.template.render(messages.as_array().expect("array"), &opts).expect("renders");
        m.tokenizer.encode(&text, true)
    };
    let long_turns: Vec<serde_json::Value> = (0..6)
        .flat_map(|i| {
            [
                json!({"role": "user", "content": format!("Tell me one fact about the number {}, in a sentence about gardens, rivers and old stone bridges.", i + 3)}),
                json!({"role": "assistant", "content": format!("The number {} appears in many gardens: a river may pass under {} old stone bridges before it reaches the sea, and gardeners often plant in groups of {}.", i + 3, i + 3, i + 3)}),
            ]
        })
        .chain([json!({"role": "user", "content": "Which numbers did we talk about?"})])
        .collect();
    vec![
        render(json!([{"role": "user", "content": "What is the capital of France?"}])),
        render(json!([
            {"role": "user", "content": "The secret word is banana."},
            {"role": "assistant", "content": "Okay, I will remember that."},
            {"role": "user", "content": "What is the secret word?"}
        ])),
        render(serde_json::Value::Array(long_turns)),
    ]
}

/// Logits at the last prompt position and each decode step, feeding `forced` tokens (golden's greedy
/// choices) when given, else this run's own greedy choices.
fn run(prompt: &[u32], patches: &PatchSet, forced: Option<&[u32]>) -> Run {
    let m = model();
    let mut kv = KvCache::new(m.config.n_layers, m.config.kv_dim());
    let mut input = prompt.to_vec();
    let (mut all, mut greedy) = (Vec::new(), Vec::new());
    for step in 0..=DECODE_STEPS {
        let logits = forward_patched(m, Path::Golden, patches, &mut [Segment { tokens: &input, kv: &mut kv }]).remove(0);
        let next = argmax(&logits);
        greedy.push(next);
        all.push(logits);
        input = vec![forced.map_or(next, |f| f[step])];
    }
    (all, greedy)
}

/// Logits per position and greedy tokens of one run.
type Run = (Vec<Vec<f32>>, Vec<u32>);

/// Golden's logits and greedy tokens for every prompt, computed once.
fn golden_runs() -> &'static [Run] {
    static RUNS: OnceLock<Vec<Run>> = OnceLock::new();
    RUNS.get_or_init(|| prompts().iter().map(|p| run(p, &PatchSet::default(), None)).collect())
}

fn argmax(v: &[f32]) -> u32 {
    v.iter().enumerate().fold(0, |b, (i, x)| if *x > v[b] { i } else { b }) as u32
}

fn log_softmax(v: &[f32]) -> Vec<f64> {
    let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = v.iter().map(|x| (*x as f64 - max).exp()).sum::<f64>().ln() + max;
    v.iter().map(|x| *x as f64 - lse).collect()
}

#[derive(Debug)]
struct Distance {
    max_abs: f64,
    mean_abs: f64,
    max_logit: f64,
    mean_kl: f64,
    max_kl: f64,
    positions: usize,
    /// (prompt index, step) of the first greedy disagreement and golden's top-1/top-2 margin there.
    first_diff: Option<(usize, usize, f64)>,
    agree: usize,
}

impl Distance {
    fn relative(&self) -> f64 {
        self.max_abs / self.max_logit
    }
}

fn distance(patch: &str) -> Distance {
    let patches = PatchSet::parse(patch).expect("valid patch");
    let mut d =
        Distance { max_abs: 0.0, mean_abs: 0.0, max_logit: 0.0, mean_kl: 0.0, max_kl: 0.0, positions: 0, first_diff: None, agree: 0 };
    let mut count = 0usize;
    for (pi, (prompt, (golden, greedy))) in prompts().iter().zip(golden_runs()).enumerate() {
        let (patched, _) = run(prompt, &patches, Some(greedy));
        for (step, (g, p)) in golden.iter().zip(&patched).enumerate() {
            for (a, b) in g.iter().zip(p) {
                let diff = (*a as f64 - *b as f64).abs();
                d.max_abs = d.max_abs.max(diff);
                d.mean_abs += diff;
                d.max_logit = d.max_logit.max(a.abs() as f64);
            }
            count += g.len();
            let (lg, lp) = (log_softmax(g), log_softmax(p));
            let kl: f64 = lg.iter().zip(&lp).map(|(a, b)| a.exp() * (a - b)).sum();
            d.mean_kl += kl;
            d.max_kl = d.max_kl.max(kl);
            d.positions += 1;
            if argmax(g) == argmax(p) {
                d.agree += 1;
            } else if d.first_diff.is_none() {
                let mut sorted = g.clone();
                sorted.sort_by(|x, y| y.total_cmp(x));
                d.first_diff = Some((pi, step, (sorted[0] - sorted[1]) as f64));
            }
        }
    }
    d.mean_abs /= count as f64;
    d.mean_kl /= d.positions as f64;
    d
}

/// The accepted range of the relative distance of each patch.
fn expected(patch: &str) -> (f64, f64) {
    match patch {
        "rmsnorm_bf16" | "residual_gemm_bf16" | "attn_splitk_bf16" => (1e-4, 5e-2),
        "kv_fp8" | "act_q8" => (1e-3, 0.2),
        "rope_bf16" => (1e-2, 0.5),
        other => panic!("no expectation for {other}"),
    }
}

#[test]
fn each_numerical_patch_moves_logits_by_the_expected_order() {
    for patch in NUMERICAL {
        let d = distance(patch);
        let rel = d.relative();
        let (low, high) = expected(patch);
        println!("{patch}: relative {rel:.2e} (expected {low:.0e}..{high:.0e}), {d:?}");
        assert!(rel > low, "{patch} barely changes the logits (relative {rel:.2e} <= {low:.0e}): is it applied?");
        assert!(rel < high, "{patch} changes the logits too much (relative {rel:.2e} >= {high:.0e})");
    }
}

#[test]
fn empty_patch_set_is_exactly_golden() {
    let prompt = &prompts()[0];
    let (a, _) = run(prompt, &PatchSet::default(), None);
    let m = model();
    let mut kv = KvCache::new(m.config.n_layers, m.config.kv_dim());
    let plain = ctxscope_engine::forward::forward(m, Path::Golden, &mut [Segment { tokens: prompt, kv: &mut kv }]).remove(0);
    assert_eq!(a[0].iter().map(|v| v.to_bits()).collect::<Vec<_>>(), plain.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
}

#[test]
#[ignore = "prints the BENCHMARKS.md table; run with --ignored --nocapture"]
fn distance_table() {
    let lens: Vec<usize> = prompts().iter().map(Vec::len).collect();
    println!(
        "prompts of {lens:?} tokens; {} positions each (last prompt position + {DECODE_STEPS} decode steps fed golden's token)",
        DECODE_STEPS + 1
    );
    println!("| patch | max abs Δlogit | mean abs Δlogit | relative (max Δ / max logit) | mean KL | max KL | greedy agrees | first greedy difference (prompt, step) | top-1/top-2 margin there |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for patch in NUMERICAL {
        let d = distance(patch);
        let (first, margin) = match d.first_diff {
            Some((p, s, m)) => (format!("prompt {p}, step {s}"), format!("{m:.3}")),
            None => ("none".to_string(), "-".to_string()),
        };
        println!(
            "| `{patch}` | {:.3} | {:.4} | {:.2e} | {:.2e} | {:.2e} | {}/{} | {first} | {margin} |",
            d.max_abs,
            d.mean_abs,
            d.relative(),
            d.mean_kl,
            d.max_kl,
            d.agree,
            d.positions
        );
    }
}
