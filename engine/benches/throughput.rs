//! Engine throughput on the real model, llama-bench style: prefill of a 512-token prompt (pp512) and
//! decode of 128 tokens from an empty context (tg128), each at batch 1 and batch 8 (8 sequences in
//! one `forward` call: 8 segments of 512 prompt tokens, or 8 segments of one token per decode step),
//! on the golden and fast paths. Also the fast path's logit difference from golden on a few chat
//! prompts. Prints markdown. Run: `cargo bench -p ctxscope-engine --bench throughput`.
//!
//! Environment: CTXSCOPE_MODEL (model path), BENCH_PATHS (default `fast,golden`), BENCH_REPS
//! (repetitions, default 3; golden batch-8 prefill always runs once), BENCH_SKIP (comma list of
//! `pp512-b8`, `matmuls`, `numerics`, ...), LLAMA_PP512 / LLAMA_TG128 (llama-bench t/s, adds a ratio column),
//! BENCH_DIGEST=1 (print only a digest of each path's logits over prefill, decode and a mixed batch:
//! a restructuring of the forward pass that keeps the numerics keeps the digests).

use std::time::Instant;

use ctxscope_engine::forward::{forward, matmul, Segment};
use ctxscope_engine::kv::KvCache;
use ctxscope_engine::sample::argmax;
use ctxscope_engine::{Model, Path};
use ctxscope_formats::RenderOptions;
use serde_json::json;

const PP: usize = 512;
const TG: usize = 128;

fn main() {
    let path = ctxscope_formats::test_model_path().unwrap_or_else(|e| panic!("{e}"));
    let model = Model::load(&path).unwrap_or_else(|e| panic!("{e} (run scripts/fetch-model.sh)"));
    let paths: Vec<Path> = std::env::var("BENCH_PATHS")
        .unwrap_or_else(|_| "fast,golden".into())
        .split(',')
        .map(|p| Path::parse(p.trim()).unwrap_or_else(|| panic!("BENCH_PATHS: unknown path {p:?} (golden, fast)")))
        .collect();
    let reps: usize = std::env::var("BENCH_REPS").ok().and_then(|v| v.parse().ok()).unwrap_or(3).max(1);
    let skip = std::env::var("BENCH_SKIP").unwrap_or_default();
    let skipped = |name: &str| skip.split(',').any(|s| s.trim() == name);
    let reference = |var: &str| std::env::var(var).ok().and_then(|v| v.parse::<f64>().ok());
    let (llama_pp, llama_tg) = (reference("LLAMA_PP512"), reference("LLAMA_TG128"));
    if std::env::var_os("BENCH_DIGEST").is_some() {
        for path in paths {
            println!("{} digest {:#018x}", path.as_str(), digest(&model, path));
        }
        return;
    }

    println!(
        "Model `{}` ({} layers, width {}, vocab {}); {} rayon threads; AVX2+FMA+F16C: {}.\n",
        model.id,
        model.config.n_layers,
        model.config.dim,
        model.config.vocab,
        rayon::current_num_threads(),
        avx2()
    );
    let ratio_header = if llama_pp.is_some() { " ours / llama.cpp |" } else { "" };
    println!("| path | test | batch | tokens/s (mean ± sd) | runs |{ratio_header}");
    println!("|---|---|---|---|---|{}", if llama_pp.is_some() { "---|" } else { "" });
    // Warm up: page in the weights and start the thread pool.
    forward(&model, Path::Fast, &mut [Segment { tokens: &tokens(&model, 16, 0), kv: &mut kv(&model) }]);
    for path in paths {
        for (test, batch) in [("pp512", 1), ("pp512", 8), ("tg128", 1), ("tg128", 8)] {
            let name = format!("{test}-b{batch}");
            if skipped(&name) {
                continue;
            }
            let runs = if path == Path::Golden && test == "pp512" && batch == 8 { 1 } else { reps };
            let rates: Vec<f64> = (0..runs)
                .map(|rep| if test == "pp512" { prefill(&model, path, batch, rep) } else { decode(&model, path, batch, rep) })
                .collect();
            let mean = rates.iter().sum::<f64>() / rates.len() as f64;
            let sd = (rates.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / rates.len() as f64).sqrt();
            let reference = if test == "pp512" { llama_pp } else { llama_tg };
            let ratio = reference.map(|r| format!(" {:.2} |", mean / r)).unwrap_or_default();
            println!("| {} | {test} | {batch} | {mean:.1} ± {sd:.1} | {runs} |{ratio}", path.as_str());
        }
    }
    if !skipped("matmuls") {
        matmuls(&model);
    }
    if !skipped("numerics") {
        numerics(&model);
    }
}

/// One weight matmul at a time (layer 0's, and the output projection), both paths: where the
/// forward pass's time goes, apart from attention and the element-wise operations.
fn matmuls(model: &Model) {
    let layer = &model.weights.layers[0];
    let output = model.weights.output();
    println!("\n| matrix | type | rows x cols | n | golden ms | fast ms | fast weight GB/s | fast GMAC/s |");
    println!("|---|---|---|---|---|---|---|---|");
    for (name, w) in [("attn_q", &layer.wq), ("ffn_gate", &layer.w_gate), ("ffn_down", &layer.w_down), ("output", output)] {
        for n in [1, 8, 512] {
            if name == "output" && n == 512 {
                continue;
            }
            let x: Vec<f32> = tokens(model, n * w.cols, 7).iter().map(|t| (*t % 2001) as f32 / 1000.0 - 1.0).collect();
            let mut out = vec![0f32; n * w.rows];
            let time = |path: Path, out: &mut [f32]| {
                let (mut calls, start) = (0u32, Instant::now());
                while calls < 3 || start.elapsed().as_secs_f64() < 0.3 {
                    matmul(path, w, &x, n, out);
                    calls += 1;
                }
                start.elapsed().as_secs_f64() / calls as f64
            };
            let golden = if std::env::var_os("BENCH_NO_GOLDEN_MATMUL").is_some() { f64::NAN } else { time(Path::Golden, &mut out) };
            let fast = time(Path::Fast, &mut out);
            let macs = (w.rows * w.cols * n) as f64;
            println!(
                "| {name} | {} | {} x {} | {n} | {:.3} | {:.3} | {:.1} | {:.1} |",
                w.quant.ggml_type,
                w.rows,
                w.cols,
                golden * 1e3,
                fast * 1e3,
                w.quant.bytes.len() as f64 / fast / 1e9,
                macs / fast / 1e9
            );
        }
    }
}

/// FNV-1a over the bits of the logits of: a 300-token prefill in chunks of 200 and 100, 6 decode
/// steps, then one pass of three segments (a 40-token prefill and two decode rows).
fn digest(model: &Model, path: Path) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |logits: Vec<Vec<f32>>| {
        for v in logits.iter().flatten() {
            for b in v.to_bits().to_le_bytes() {
                h ^= b as u64;
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        }
    };
    let prompt = tokens(model, 300, 42);
    let (mut a, mut b, mut c) = (kv(model), kv(model), kv(model));
    eat(forward(model, path, &mut [Segment { tokens: &prompt[..200], kv: &mut a }]));
    eat(forward(model, path, &mut [Segment { tokens: &prompt[200..], kv: &mut a }]));
    eat(forward(model, path, &mut [Segment { tokens: &prompt[..20], kv: &mut b }]));
    for step in 0..6 {
        eat(forward(model, path, &mut [Segment { tokens: &prompt[step..step + 1], kv: &mut a }]));
    }
    let more = tokens(model, 40, 43);
    eat(forward(
        model,
        path,
        &mut [
            Segment { tokens: &more, kv: &mut c },
            Segment { tokens: &prompt[7..8], kv: &mut a },
            Segment { tokens: &prompt[8..9], kv: &mut b },
        ],
    ));
    h
}

fn kv(model: &Model) -> KvCache {
    KvCache::new(model.config.n_layers, model.config.kv_dim())
}

/// Deterministic pseudo-random token ids (llama-bench also feeds arbitrary tokens).
fn tokens(model: &Model, len: usize, seed: u64) -> Vec<u32> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ seed.wrapping_mul(0x2545_f491_4f6c_dd1d);
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % model.config.vocab as u64) as u32
        })
        .collect()
}

/// Tokens/s prefilling `batch` prompts of PP tokens in one forward call.
fn prefill(model: &Model, path: Path, batch: usize, rep: usize) -> f64 {
    let prompts: Vec<Vec<u32>> = (0..batch).map(|b| tokens(model, PP, (rep * 8 + b) as u64)).collect();
    let mut caches: Vec<KvCache> = (0..batch).map(|_| kv(model)).collect();
    let mut segments: Vec<Segment<'_>> = prompts.iter().zip(caches.iter_mut()).map(|(t, kv)| Segment { tokens: t, kv }).collect();
    let start = Instant::now();
    forward(model, path, &mut segments);
    (batch * PP) as f64 / start.elapsed().as_secs_f64()
}

/// Tokens/s decoding TG tokens in each of `batch` sequences from an empty context, one token per
/// sequence per forward call (sampling excluded: the inputs are fixed).
fn decode(model: &Model, path: Path, batch: usize, rep: usize) -> f64 {
    let inputs: Vec<Vec<u32>> = (0..batch).map(|b| tokens(model, TG, (100 + rep * 8 + b) as u64)).collect();
    let mut caches: Vec<KvCache> = (0..batch).map(|_| kv(model)).collect();
    let start = Instant::now();
    for step in 0..TG {
        let mut segments: Vec<Segment<'_>> =
            inputs.iter().zip(caches.iter_mut()).map(|(t, kv)| Segment { tokens: &t[step..step + 1], kv }).collect();
        forward(model, path, &mut segments);
    }
    (batch * TG) as f64 / start.elapsed().as_secs_f64()
}

/// Fast vs golden logits on chat prompts: after the prompt (prefill shapes) and after each of 8
/// greedy golden tokens fed to both paths (decode shapes).
fn numerics(model: &Model) {
    let questions = [
        "What is the capital of France?",
        "Write one sentence about the sea.",
        "List three prime numbers and explain why they are prime.",
        "Translate 'good morning' into Spanish and German.",
    ];
    println!("\n| prompt | tokens | logit rows | max abs diff | mean abs diff | max abs logit | argmax agrees |");
    println!("|---|---|---|---|---|---|---|");
    let (mut all_max, mut all_sum, mut all_count) = (0f32, 0f64, 0usize);
    for q in questions {
        let opts = RenderOptions { add_generation_prompt: true, bos_token: "", eos_token: "", tools: None };
        let text = model.template.render(&[json!({"role": "user", "content": q})], &opts).expect("template renders");
        let prompt = model.tokenizer.encode(&text, true);
        let (mut kg, mut kf) = (kv(model), kv(model));
        let (mut input, mut rows, mut agree) = (prompt.clone(), 0, 0);
        let (mut max, mut sum, mut peak) = (0f32, 0f64, 0f32);
        for _ in 0..9 {
            let g = forward(model, Path::Golden, &mut [Segment { tokens: &input, kv: &mut kg }]).remove(0);
            let f = forward(model, Path::Fast, &mut [Segment { tokens: &input, kv: &mut kf }]).remove(0);
            for (a, b) in g.iter().zip(&f) {
                max = max.max((a - b).abs());
                sum += (a - b).abs() as f64;
                peak = peak.max(a.abs());
            }
            rows += 1;
            let next = argmax(&g);
            agree += usize::from(next == argmax(&f));
            input = vec![next];
        }
        let count = rows * model.config.vocab;
        println!("| {q:?} | {} | {rows} | {max:.4} | {:.5} | {peak:.2} | {agree}/{rows} |", prompt.len(), sum / count as f64);
        all_max = all_max.max(max);
        all_sum += sum;
        all_count += count;
    }
    println!("| all | | | {all_max:.4} | {:.5} | | |", all_sum / all_count as f64);
}

fn avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    return is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c");
    #[cfg(not(target_arch = "x86_64"))]
    false
}
