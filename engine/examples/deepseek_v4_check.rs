//! The golden DeepSeek-V4 pass on a checkpoint against the transformers reference beside it
//! (`reference.json`, written by scripts/deepseek_v4/make_tiny.py and make_small.py): the prompt fed
//! in chunks (no output head before its last token), then the teacher-forced decode steps one by
//! one; prints each step's rel L2 against transformers' fp32 logits, the worst, the median and the
//! time, and fails when the worst is above 1e-4 (golden) or, with `--fast` (bf16 products), the median
//! above 1e-1 (bf16 moves an expert or indexer pick now and then, and such a step jumps: transformers'
//! own bf16 on `small` is at a median of 1.5e-1 from its fp32, `scripts/deepseek_v4/check_reference.py
//! --bf16`; a broken path is near 1). With `--cuda` (a build with `--features cuda`) the products run
//! on GPU 0 (every matrix uploaded before the clock starts): f32 on the golden path, bf16 with
//! `--fast`, then also compared with the same bf16 products on the host. `--decode N` then times N
//! greedy steps after the reference's and states the weights each token reads and how much of a
//! token's time the products take.
//! `cargo run --release -p ctxscope-engine --example deepseek_v4_check -- DIR [--cuda [--fast]] [--decode N]`

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use ctxscope_engine::forward::deepseek_v4::DeepseekV4Model;
use ctxscope_engine::forward::dsv4_products::{Host, HostBf16, Products};
use ctxscope_engine::PatchSet;
use serde_json::Value;

fn ids(reference: &Value, key: &str) -> Vec<u32> {
    reference[key].as_array().map(|a| a.iter().filter_map(Value::as_u64).map(|v| v as u32).collect()).unwrap_or_default()
}

fn rel_l2(ours: &[f32], theirs: &[f64]) -> f64 {
    let (mut diff, mut norm) = (0f64, 0f64);
    for (a, b) in ours.iter().zip(theirs) {
        diff += (f64::from(*a) - b).powi(2);
        norm += b * b;
    }
    (diff / norm).sqrt()
}

/// Where the products run: the host, or GPU 0 in f32 (golden) or bf16 (`fast`).
fn products(cuda: bool, fast: bool) -> Result<Arc<dyn Products>, String> {
    match (cuda, fast) {
        (false, false) => Ok(Arc::new(Host)),
        (false, true) => Ok(Arc::new(HostBf16)),
        #[cfg(feature = "cuda")]
        (true, fast) => {
            ctxscope_engine::device::Dsv4Products::open(0, fast).map(|p| Arc::new(p) as Arc<dyn Products>).map_err(|e| e.to_string())
        }
        #[cfg(not(feature = "cuda"))]
        (true, _) => Err("built without CUDA: cargo build --release -p ctxscope-engine --features cuda --example deepseek_v4_check".into()),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(dir) = args.iter().find(|a| !a.starts_with("--") && a.parse::<usize>().is_err()).map(PathBuf::from) else {
        eprintln!("usage: deepseek_v4_check DIR [--cuda [--fast]] [--decode N] (a checkpoint with reference.json)");
        return ExitCode::from(2);
    };
    let (cuda, fast) = (args.iter().any(|a| a == "--cuda"), args.iter().any(|a| a == "--fast"));
    let decode: usize = args.iter().position(|a| a == "--decode").and_then(|i| args.get(i + 1)).and_then(|n| n.parse().ok()).unwrap_or(0);
    let executor = match products(cuda, fast) {
        Ok(inner) => Arc::new(Timed { inner, trips: AtomicU64::new(0), nanos: AtomicU64::new(0) }),
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let text = match std::fs::read_to_string(dir.join("reference.json")) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("{}: {e}", dir.join("reference.json").display());
            return ExitCode::from(2);
        }
    };
    let reference: Value = serde_json::from_str(&text).expect("reference.json is JSON");
    let started = Instant::now();
    let model = match DeepseekV4Model::load(&dir) {
        Ok(model) => model,
        Err(e) => {
            eprintln!("{}: {e}", dir.display());
            return ExitCode::from(2);
        }
    };
    if let Err(e) = executor.prepare(&model.product_matrices()) {
        eprintln!("{e}");
        return ExitCode::FAILURE;
    }
    let loaded = started.elapsed().as_secs_f64();
    let (prompt, forced) = (ids(&reference, "prompt_ids"), ids(&reference, "decode_ids"));
    let rows: Vec<Vec<f64>> = reference["logits"]
        .as_array()
        .map(|rows| rows.iter().map(|r| r.as_array().unwrap().iter().filter_map(Value::as_f64).collect()).collect())
        .unwrap_or_default();
    let Some((&last, before)) = prompt.split_last() else {
        eprintln!("reference.json has no prompt");
        return ExitCode::from(2);
    };
    let started = Instant::now();
    let mut state = model.state_on(&PatchSet::default(), executor.clone());
    model.advance(&mut state, before);
    let mut ours = vec![model.step(&mut state, last)];
    let prefilled = started.elapsed().as_secs_f64();
    ours.extend(forced.iter().map(|&id| model.step(&mut state, id)));
    let decoded = started.elapsed().as_secs_f64() - prefilled;
    if cuda && fast {
        // What the GPU's bf16 products should compute: the same products on the host.
        let mut host = model.state_on(&PatchSet::default(), Arc::new(HostBf16));
        model.advance(&mut host, before);
        let sim: Vec<f64> = std::iter::once(last)
            .chain(forced.iter().copied())
            .zip(&ours)
            .map(|(id, row)| rel_l2(row, &model.step(&mut host, id).iter().map(|&v| f64::from(v)).collect::<Vec<_>>()))
            .collect();
        let worst = sim.iter().copied().fold(0f64, f64::max);
        println!(
            "GPU bf16 against the host's bf16 products: median rel L2 {:.2e}, worst {worst:.2e} over {} steps",
            median(&sim),
            sim.len()
        );
    }
    let mut worst = 0f64;
    for (step, (a, b)) in ours.iter().zip(&rows).enumerate() {
        let err = rel_l2(a, b);
        worst = worst.max(err);
        println!("step {step:>2}: rel L2 {err:.2e}");
    }
    // FNV-1a over every logit's bits: equal digests, equal numbers (threads must not change them).
    let digest = ours.iter().flatten().fold(0xcbf2_9ce4_8422_2325u64, |h, v| (h ^ u64::from(v.to_bits())).wrapping_mul(0x100_0000_01b3));
    println!(
        "{}: {} prompt + {} forced tokens, {} steps compared; worst rel L2 {worst:.2e} (transformers {}); logits digest {digest:016x}; load {loaded:.1} s, prompt {prefilled:.1} s, decode {decoded:.1} s",
        dir.display(),
        prompt.len(),
        forced.len(),
        rows.len().min(ours.len()),
        reference["transformers"].as_str().unwrap_or("?")
    );
    if decode > 0 {
        let mut token = argmax(ours.last().map_or(&[][..], Vec::as_slice));
        let (trips, nanos) = (executor.trips.load(Relaxed), executor.nanos.load(Relaxed));
        let started = Instant::now();
        for _ in 0..decode {
            token = argmax(&model.step(&mut state, token));
        }
        let seconds = started.elapsed().as_secs_f64();
        let in_products = (executor.nanos.load(Relaxed) - nanos) as f64 / 1e6 / decode as f64;
        println!(
            "decode: {:.2} ms a token, {in_products:.2} ms of it in the products ({:.0} calls), the rest on the host",
            seconds * 1e3 / decode as f64,
            (executor.trips.load(Relaxed) - trips) as f64 / decode as f64
        );
        let per_token = model.weights_per_token();
        let bytes = per_token * if fast { 2 } else { 4 };
        println!(
            "decode: {decode} greedy steps after position {} in {seconds:.2} s, {:.1} tokens/s; {per_token} weights a token ({:.3} GB as {}): {:.1} GB/s",
            state.len() - decode,
            decode as f64 / seconds,
            bytes as f64 / 1e9,
            if fast { "bf16" } else { "f32" },
            bytes as f64 * decode as f64 / seconds / 1e9
        );
    }
    let median = median(&ours.iter().zip(&rows).map(|(a, b)| rel_l2(a, b)).collect::<Vec<_>>());
    println!("median rel L2 {median:.2e}");
    let failed = if fast { median > 1e-1 } else { worst > 1e-4 };
    if rows.len() != ours.len() || failed {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// An executor counting its calls and the time spent in them (calls come one at a time in decode).
struct Timed {
    inner: Arc<dyn Products>,
    trips: AtomicU64,
    nanos: AtomicU64,
}

impl Products for Timed {
    fn products(&self, w: &[f32], xs: &[f32], k: usize) -> Vec<f32> {
        self.products_each(&[(w, xs)], k).pop().unwrap_or_default()
    }

    fn products_each(&self, jobs: &[(&[f32], &[f32])], k: usize) -> Vec<Vec<f32>> {
        let started = Instant::now();
        let out = self.inner.products_each(jobs, k);
        self.nanos.fetch_add(started.elapsed().as_nanos() as u64, Relaxed);
        self.trips.fetch_add(1, Relaxed);
        out
    }

    fn prepare(&self, matrices: &[(&[f32], usize)]) -> Result<(), String> {
        self.inner.prepare(matrices)
    }
}

/// The middle value (the upper one of an even count); infinite when there is none.
fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::INFINITY)
}

fn argmax(logits: &[f32]) -> u32 {
    logits.iter().enumerate().fold((0, f32::NEG_INFINITY), |best, (i, &v)| if v > best.1 { (i, v) } else { best }).0 as u32
}
