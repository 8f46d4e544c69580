//! Correctness and speed of the CUDA backend on one reference checkpoint written by
//! scripts/device/reference.py (a transformers-built random Llama in bf16 with its fp32, bf16 and
//! "fastsim" (fp32, bf16-rounded GEMM inputs) logits of a 64-token prompt and 16 teacher-forced steps):
//! each path (golden, fast) against each reference, the CPU golden path against the device's, then
//! prefill, batch-1 and batched decode speed with the bytes each decoded token must read. Build with
//! `--features cuda`; run where a GPU is: `device_bench REF_DIR > bench.json` (one JSON object on stdout,
//! progress on stderr; `BENCH_JSON=FILE` also keeps FILE up to date after every section).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path as FsPath;
use std::sync::Arc;
use std::time::Instant;

use ctxscope_engine::backend::{Backend, Output, Step, Want};
use ctxscope_engine::device::DeviceBackend;
use ctxscope_engine::forward::{forward, Segment};
use ctxscope_engine::kv::KvCache;
use ctxscope_engine::{EngineOptions, Model, ModelConfig, PatchSet, Path};
use ctxscope_kernels::device::StreamTuning;
use serde_json::{json, Value};

type Kv = <DeviceBackend as Backend>::Kv;
type Res<T> = Result<T, String>;

/// The worst relative L2 distance from the fp32 reference logits that still passes, per path
/// (scripts/device/table.py's LIMIT_GOLDEN and LIMIT_FAST defaults: f32 throughout, and what bf16
/// weights and activations allow).
const GOLDEN_LIMIT: f64 = 1e-4;
const FAST_LIMIT: f64 = 3e-2;
const PERF_PROMPT: usize = 512;
const DECODE_STEPS: usize = 128;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn argmax(v: &[f32]) -> usize {
    v.iter().enumerate().fold(0, |b, (i, x)| if *x > v[b] { i } else { b })
}

fn top5(v: &[f32]) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.select_nth_unstable_by(4, |&a, &b| v[b].total_cmp(&v[a]));
    idx.truncate(5);
    idx
}

/// Per step: rel L2 = ‖ours − ref‖ / ‖ref‖ and max|Δ| / max|ref| (f64 sums); greedy agreement in vLLM's
/// `check_logprobs_close` sense: argmax equal ("exact"), or each side's argmax in the other's top-5
/// ("close"); `first_fail` is the first step where neither holds. NaN or Inf in ours is counted and makes
/// the step's numbers null.
fn compare(reference: &[Vec<f32>], ours: &[Vec<f32>]) -> Value {
    let (mut rel, mut mx) = (Vec::new(), Vec::new());
    let (mut exact, mut close, mut first_fail, mut nonfinite) = (0, 0, None, 0usize);
    for (i, (a, b)) in reference.iter().zip(ours).enumerate() {
        nonfinite += b.iter().filter(|x| !x.is_finite()).count();
        let (mut d2, mut a2, mut dmax, mut amax) = (0f64, 0f64, 0f64, 0f64);
        for (&x, &y) in a.iter().zip(b) {
            let d = (y as f64 - x as f64).abs();
            d2 += d * d;
            a2 += (x as f64) * (x as f64);
            dmax = dmax.max(d);
            amax = amax.max((x as f64).abs());
        }
        rel.push((d2 / a2).sqrt());
        mx.push(dmax / amax);
        let (ta, tb) = (argmax(a), argmax(b));
        if ta == tb {
            exact += 1;
            close += 1;
        } else if top5(b).contains(&ta) && top5(a).contains(&tb) {
            close += 1;
        } else if first_fail.is_none() {
            first_fail = Some(i);
        }
    }
    let finite = |v: &[f64]| v.iter().all(|x| x.is_finite());
    let worst = |v: &[f64]| if finite(v) { v.iter().cloned().fold(0f64, f64::max) } else { f64::NAN };
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    json!({
        "steps": rel.len(), "rel_l2": rel, "max_abs_rel": mx, "worst_rel_l2": worst(&rel), "mean_rel_l2": mean(&rel),
        "worst_max_abs_rel": worst(&mx), "greedy_exact": exact, "greedy_close": close, "first_fail": first_fail,
        "nonfinite": nonfinite,
    })
}

fn read_json<T: serde::de::DeserializeOwned>(path: &FsPath) -> Res<T> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// `[rows][vocab]` little-endian f32.
fn read_logits(path: &FsPath, rows: usize, vocab: usize) -> Res<Vec<Vec<f32>>> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.len() != rows * vocab * 4 {
        return Err(format!("{}: {} bytes, expected {rows} x {vocab} f32", path.display(), bytes.len()));
    }
    let all: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    Ok(all.chunks(vocab).map(<[f32]>::to_vec).collect())
}

/// Deterministic token ids below `vocab` (xorshift).
fn random_prompt(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % vocab as u64) as u32
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The JSON report and the errors met so far; with `BENCH_JSON` set, rewritten to that file after every
/// section, so a run stopped by a timeout still leaves what it measured.
struct Report {
    value: Value,
    errors: Vec<Value>,
    file: Option<std::path::PathBuf>,
}

impl Report {
    fn json(&self) -> Value {
        let mut v = self.value.clone();
        v["errors"] = json!(self.errors);
        v
    }

    fn save(&self) {
        if let Some(file) = &self.file {
            let tmp = file.with_extension("partial");
            let text = serde_json::to_string(&self.json()).unwrap_or_default();
            if std::fs::write(&tmp, text).and_then(|_| std::fs::rename(&tmp, file)).is_err() {
                eprintln!("cannot write {}", file.display());
            }
        }
    }

    /// Runs `f`, turning an error or a panic into an entry of `errors` under `name`.
    fn section<T>(&mut self, name: &str, f: impl FnOnce() -> Res<T>) -> Option<T> {
        let started = Instant::now();
        eprintln!("[{name}] ...");
        let result = match catch_unwind(AssertUnwindSafe(f)) {
            Ok(r) => r,
            Err(p) => Err(format!(
                "panic: {}",
                p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
            )),
        };
        let secs = started.elapsed().as_secs_f64();
        eprintln!("[{name}] {secs:.2} s{}", result.as_ref().err().map(|e| format!(": ERROR {e}")).unwrap_or_default());
        self.value["section_s"][name] = json!(secs);
        let out = match result {
            Ok(v) => Some(v),
            Err(e) => {
                self.errors.push(json!({"section": name, "error": e}));
                None
            }
        };
        self.save();
        out
    }
}

struct Bench {
    backend: DeviceBackend,
    patches: PatchSet,
    /// Seconds per graph replay measured at the end of the last `decode` (None: no graph).
    replay_s: Option<f64>,
    /// Trace one graph replay after each decode run (`trace_lines`): the decode variants do.
    trace: bool,
    trace_lines: Option<Vec<String>>,
}

impl Bench {
    fn new_kv(&mut self) -> Res<Kv> {
        self.backend.new_kv().map_err(|e| e.to_string())
    }

    /// One forward over several sequences; one output each.
    fn step(&mut self, path: Path, steps: &mut [Step<'_, Kv>]) -> Res<Vec<Output>> {
        let n = steps.len();
        let out = self.backend.forward(path, &self.patches, steps).map_err(|e| e.to_string())?;
        if out.len() != n {
            return Err(format!("{n} steps gave {} outputs", out.len()));
        }
        Ok(out)
    }

    fn logits(&mut self, path: Path, tokens: &[u32], kv: &mut Kv) -> Res<Vec<f32>> {
        match self.step(path, &mut [Step { tokens, kv, want: Want::Logits }])?.pop() {
            Some(Output::Logits(v)) => Ok(v),
            Some(Output::Token { .. }) => Err("asked for logits, got a token".into()),
            None => Err("no output".into()),
        }
    }

    fn greedy(&mut self, path: Path, tokens: &[u32], kv: &mut Kv) -> Res<u32> {
        greedy_of(self.step(path, &mut [Step { tokens, kv, want: Want::Greedy }])?.pop())
    }

    /// The prompt's last-position logits, then one row per fed token.
    fn teacher_forced(&mut self, path: Path, prompt: &[u32], fed: &[u32]) -> Res<Vec<Vec<f32>>> {
        let mut kv = self.new_kv()?;
        let mut rows = vec![self.logits(path, prompt, &mut kv)?];
        for &t in fed {
            rows.push(self.logits(path, &[t], &mut kv)?);
        }
        Ok(rows)
    }

    /// Seconds of each timed prefill of `prompt` (fresh cache each), after one untimed.
    fn prefill_times(&mut self, path: Path, prompt: &[u32], reps: usize) -> Res<Vec<f64>> {
        let mut times = Vec::new();
        for rep in 0..=reps {
            let mut kv = self.new_kv()?;
            let started = Instant::now();
            self.greedy(path, prompt, &mut kv)?;
            if rep > 0 {
                times.push(started.elapsed().as_secs_f64());
            }
        }
        Ok(times)
    }

    /// `prompts.len()` sequences prefilled one by one, then `steps` greedy decode steps of all of them
    /// together; returns the seconds of the decode steps.
    fn decode(&mut self, path: Path, prompts: &[Vec<u32>], steps: usize) -> Res<f64> {
        let mut kvs = Vec::with_capacity(prompts.len());
        let mut next = Vec::with_capacity(prompts.len());
        for p in prompts {
            let mut kv = self.new_kv()?;
            next.push(self.greedy(path, p, &mut kv)?);
            kvs.push(kv);
        }
        let started = Instant::now();
        for _ in 0..steps {
            let tokens: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
            let mut batch: Vec<Step<'_, Kv>> =
                tokens.iter().zip(kvs.iter_mut()).map(|(t, kv)| Step { tokens: t, kv, want: Want::Greedy }).collect();
            next = self.step(path, &mut batch)?.into_iter().map(|o| greedy_of(Some(o))).collect::<Res<_>>()?;
        }
        let secs = started.elapsed().as_secs_f64();
        // While the caches are alive: the GPU's own time per step (the captured graph replayed).
        self.replay_s = self.backend.time_graph_replay(path, prompts.len(), 50).map_err(|e| e.to_string())?;
        if self.trace {
            self.trace_lines = self.backend.trace_graph_replay(path, prompts.len()).map_err(|e| e.to_string())?;
        }
        Ok(secs)
    }
}

fn greedy_of(out: Option<Output>) -> Res<u32> {
    match out {
        Some(Output::Token { token, .. }) => Ok(token),
        Some(Output::Logits(v)) => Ok(argmax(&v) as u32),
        None => Err("no output".into()),
    }
}

/// Bytes one decode step reads: every weight matrix once (the output projection, or the tied embedding as
/// the LM head; the embedding row gather is negligible) at `weight_bytes` per element, norms as f32, plus
/// `batch` f32 KV caches of `ctx` positions.
fn bytes_per_step(c: &ModelConfig, weight_bytes: usize, batch: usize, ctx: usize) -> f64 {
    let (dim, kv, ffn) = (c.dim, c.kv_dim(), c.ffn_dim);
    let matrices = c.n_layers * (2 * dim * dim + 2 * kv * dim + 3 * ffn * dim) + c.vocab * dim;
    let norms = (2 * c.n_layers + 1) * dim * 4;
    let kv_per_position = 2 * c.n_layers * kv * 4;
    (matrices * weight_bytes + norms + batch * ctx * kv_per_position) as f64
}

fn main() {
    let Some(dir) = std::env::args().nth(1) else {
        eprintln!("usage: device_bench REF_DIR (a folder written by scripts/device/reference.py)");
        std::process::exit(2);
    };
    let dir = std::path::PathBuf::from(dir);
    let file = std::env::var_os("BENCH_JSON").map(std::path::PathBuf::from);
    let mut report = Report { value: json!({"dir": dir.display().to_string(), "section_s": {}}), errors: Vec::new(), file };
    let started = Instant::now();
    run(&dir, &mut report);
    report.value["wall_s"] = json!(started.elapsed().as_secs_f64());
    report.save();
    println!("{}", serde_json::to_string(&report.json()).unwrap_or_else(|e| format!("{{\"errors\": [\"json: {e}\"]}}")));
    std::process::exit(i32::from(!report.errors.is_empty()));
}

fn run(dir: &FsPath, rep: &mut Report) {
    let started = Instant::now();
    let Some(model) = rep.section("load", || Model::load(dir).map(Arc::new).map_err(|e| e.to_string())) else {
        return;
    };
    let c = model.config.clone();
    rep.value["load_s"] = json!(started.elapsed().as_secs_f64());
    rep.value["model"] = json!({"id": model.id, "n_layers": c.n_layers, "dim": c.dim, "n_heads": c.n_heads, "n_kv_heads": c.n_kv_heads,
        "ffn_dim": c.ffn_dim, "vocab": c.vocab, "rope_base": c.rope_base, "rms_eps": c.rms_eps,
        "params": c.n_layers * (2 * c.dim * c.dim + 2 * c.kv_dim() * c.dim + 3 * c.ffn_dim * c.dim) + c.vocab * c.dim});

    // BENCH_VARIANTS_ONLY=1: only the fast path's decode variants (with CTXSCOPE_CUDA_TRACE=1, traced).
    let variants_only = env_usize("BENCH_VARIANTS_ONLY", 0) == 1;

    // References. The variants alone check their logits against the fp32 rows when the folder has them
    // (a fast variant that computes garbage must not pass for a fast one).
    let forced = if variants_only { load_forced(dir, c.vocab).ok() } else { None };
    let refs = if variants_only {
        None
    } else {
        rep.section("references", || {
            let (prompt, fed, fp32) = load_forced(dir, c.vocab)?;
            let rows = fed.len() + 1;
            let bf16 = read_logits(&dir.join("logits_bf16.bin"), rows, c.vocab)?;
            // fp32 with bf16-rounded GEMM inputs: what the fast path should compute (older folders lack it).
            let fastsim = read_logits(&dir.join("logits_fastsim.bin"), rows, c.vocab).ok();
            Ok((prompt, fed, fp32, bf16, fastsim))
        })
    };

    // Our CPU golden path on the same file, first (it needs no GPU): prefill + a few decode steps (fewer on
    // a large model); compared with the device's golden rows once they exist.
    let mut cpu_golden: Option<Vec<Vec<f32>>> = None;
    if let Some((prompt, fed, fp32, _, _)) = &refs {
        let params = rep.value["model"]["params"].as_u64().unwrap_or(0);
        let cpu_steps = env_usize("BENCH_CPU_STEPS", if params > 500_000_000 { 2 } else { 4 }).min(fed.len());
        if let Some((rows, secs)) = rep.section("cpu golden", || {
            let t = Instant::now();
            let mut kv = KvCache::new(c.n_layers, c.kv_dim());
            let mut rows = Vec::new();
            rows.push(forward(&model, Path::Golden, &mut [Segment { tokens: prompt, kv: &mut kv }]).remove(0));
            for &t in &fed[..cpu_steps] {
                rows.push(forward(&model, Path::Golden, &mut [Segment { tokens: &[t], kv: &mut kv }]).remove(0));
            }
            Ok((rows, t.elapsed().as_secs_f64()))
        }) {
            rep.value["cuda_vs_cpu_golden"] = json!({"decode_steps": cpu_steps, "cpu_s": secs, "threads": rayon::current_num_threads(),
                "cpu_vs_fp32": compare(&fp32[..rows.len()], &rows)});
            cpu_golden = Some(rows);
        }
    }

    let mut options = EngineOptions::for_model(&model);
    options.device = ctxscope_engine::tuning::DeviceTuning::from_env();
    options.ctx = options.ctx.min(env_usize("BENCH_CTX", 1024));
    options.max_batch = 8;
    options.step_tokens = options.step_tokens.max(PERF_PROMPT);
    rep.value["options"] = json!({"ctx": options.ctx, "max_batch": options.max_batch, "step_tokens": options.step_tokens});
    let t = Instant::now();
    let Some(backend) = rep.section("backend", || DeviceBackend::new(model.clone(), 0, &options).map_err(|e| e.to_string())) else {
        return;
    };
    rep.value["backend_new_s"] = json!(t.elapsed().as_secs_f64());
    let mut bench = Bench { backend, patches: PatchSet::default(), replay_s: None, trace: false, trace_lines: None };
    rep.value["device"] = json!(bench.backend.name());

    // Correctness: each path against both references.
    let mut device_golden: Option<Vec<Vec<f32>>> = None;
    if let Some((prompt, fed, fp32, bf16, fastsim)) = &refs {
        rep.value["correctness"] = json!({});
        for path in [Path::Golden, Path::Fast] {
            let name = format!("correctness {}", path.as_str());
            if let Some(rows) = rep.section(&name, || bench.teacher_forced(path, prompt, fed)) {
                let mut v = json!({"fp32": compare(fp32, &rows), "bf16": compare(bf16, &rows)});
                if let Some(sim) = fastsim {
                    v["fastsim"] = compare(sim, &rows);
                }
                eprintln!(
                    "  {}: worst rel L2 vs fp32 {}, vs bf16 {}, vs fastsim {}",
                    path.as_str(),
                    v["fp32"]["worst_rel_l2"],
                    v["bf16"]["worst_rel_l2"],
                    v["fastsim"]["worst_rel_l2"]
                );
                rep.value["correctness"][path.as_str()] = v;
                rep.save();
                if path == Path::Golden {
                    device_golden = Some(rows);
                }
            }
        }
    }

    if let (Some(cpu), Some(dev)) = (&cpu_golden, &device_golden) {
        rep.value["cuda_vs_cpu_golden"]["cuda_vs_cpu"] = compare(cpu, &dev[..cpu.len()]);
        rep.save();
    }

    // Performance (BENCH_PERF=0 leaves it out; BENCH_BATCHES="1,4,8" picks the decode batch sizes).
    if env_usize("BENCH_PERF", 1) == 0 {
        return;
    }
    let batches: Vec<usize> = std::env::var("BENCH_BATCHES")
        .unwrap_or_else(|_| "1,4,8".into())
        .split(',')
        .filter_map(|b| b.trim().parse().ok())
        .filter(|&b| b > 0)
        .collect();
    let reps = env_usize("BENCH_REPS", 5);
    let decode_reps = env_usize("BENCH_DECODE_REPS", 2);
    let steps = env_usize("BENCH_DECODE_STEPS", DECODE_STEPS);
    let mean_ctx = PERF_PROMPT + steps / 2;
    rep.value["perf"] = json!({"prompt_tokens": PERF_PROMPT, "decode_steps": steps, "mean_ctx": mean_ctx});
    for path in [Path::Fast, Path::Golden] {
        if variants_only {
            if path == Path::Fast {
                let probe = forced.as_ref().map(|(prompt, fed, fp32)| Probe { prompt, fed, fp32 });
                decode_variants(&mut bench, rep, path, &c, steps, decode_reps, probe);
            }
            continue;
        }
        let weight_bytes = if path == Path::Fast { 2 } else { 4 };
        // The backend's own count of the weight bytes one decode step reads, beside ours.
        let backend_weight_bytes = bench.backend.weight_bytes(path);
        rep.value["perf"][path.as_str()] = json!({"weight_bytes": weight_bytes, "backend_weight_bytes_per_step": backend_weight_bytes});
        let prompt = random_prompt(PERF_PROMPT, c.vocab, 7);
        if let Some(times) = rep.section(&format!("prefill {}", path.as_str()), || bench.prefill_times(path, &prompt, reps)) {
            let m = median(times.clone());
            let flops = 2.0 * rep.value["model"]["params"].as_f64().unwrap_or(0.0) * PERF_PROMPT as f64;
            let p = &mut rep.value["perf"][path.as_str()];
            p["prefill_s"] = json!(m);
            p["prefill_runs_s"] = json!(times);
            p["prefill_tok_s"] = json!(PERF_PROMPT as f64 / m);
            p["prefill_tflops"] = json!(flops / m / 1e12);
            rep.save();
        }
        for &batch in &batches {
            let key = if batch == 1 { "decode".to_string() } else { format!("batch{batch}") };
            let prompts: Vec<Vec<u32>> = (0..batch).map(|i| random_prompt(PERF_PROMPT, c.vocab, 100 + i as u64)).collect();
            let r = rep.section(&format!("{key} {}", path.as_str()), || {
                bench.decode(path, &prompts, steps.min(16))?; // warm-up (graph capture, if any)
                (0..decode_reps.max(1)).map(|_| bench.decode(path, &prompts, steps)).collect::<Res<Vec<f64>>>()
            });
            if let Some(times) = r {
                let m = median(times.clone());
                let bytes = bytes_per_step(&c, weight_bytes, batch, mean_ctx);
                let p = &mut rep.value["perf"][path.as_str()];
                p[format!("{key}_s")] = json!(m);
                p[format!("{key}_runs_s")] = json!(times);
                p[format!("{key}_tok_s")] = json!((batch * steps) as f64 / m);
                p[format!("{key}_bytes_per_step")] = json!(bytes);
                p[format!("{key}_bytes_per_token")] = json!(bytes / batch as f64);
                p[format!("{key}_GBps")] = json!(bytes * steps as f64 / m / 1e9);
                rep.save();
            }
            // The GPU's own time per decode step (graph replays back to back, no host work).
            if let Some(gpu) = bench.replay_s.take() {
                let p = &mut rep.value["perf"][path.as_str()];
                p[format!("{key}_graph_replay_s")] = json!(gpu);
                eprintln!("  {key} {}: graph replay {:.1} us per step", path.as_str(), gpu * 1e6);
            }
        }
        if path == Path::Fast && batches.contains(&1) {
            // The same batch-1 decode with every kernel launched one by one (no graph).
            bench.backend.set_graphs(false);
            let prompts = vec![random_prompt(PERF_PROMPT, c.vocab, 100)];
            if let Some(times) = rep.section("decode fast eager", || {
                (0..decode_reps.max(1)).map(|_| bench.decode(path, &prompts, steps)).collect::<Res<Vec<f64>>>()
            }) {
                let m = median(times);
                rep.value["perf"]["fast"]["decode_eager_tok_s"] = json!(steps as f64 / m);
                eprintln!("  decode fast without graphs: {:.0} tok/s", steps as f64 / m);
                rep.save();
            }
            bench.backend.set_graphs(true);
        }
        if batches.contains(&1) {
            let probe = refs.as_ref().map(|(prompt, fed, fp32, _, _)| Probe { prompt, fed, fp32 });
            decode_variants(&mut bench, rep, path, &c, steps, decode_reps, probe);
        }
        let p = &rep.value["perf"][path.as_str()];
        eprintln!(
            "  {}: prefill {} tok/s, decode {} tok/s ({} GB/s), batch 8 {} tok/s",
            path.as_str(),
            p["prefill_tok_s"],
            p["decode_tok_s"],
            p["decode_GBps"],
            p["batch8_tok_s"]
        );
    }
}

/// A reference folder's prompt, the tokens it feeds after it, and the fp32 logits rows (the prompt's
/// last position, then one per fed token).
type Forced = (Vec<u32>, Vec<u32>, Vec<Vec<f32>>);

fn load_forced(dir: &FsPath, vocab: usize) -> Res<Forced> {
    let prompt: Vec<u32> = read_json(&dir.join("prompt.json"))?;
    let fed: Vec<u32> = read_json(&dir.join("tokens.json"))?;
    let fp32 = read_logits(&dir.join("logits_fp32.bin"), fed.len() + 1, vocab)?;
    Ok((prompt, fed, fp32))
}

/// What a decode variant's logits are checked against (`load_forced`'s, borrowed).
#[derive(Clone, Copy)]
struct Probe<'a> {
    prompt: &'a [u32],
    fed: &'a [u32],
    fp32: &'a [Vec<f32>],
}

/// A variant's teacher-forced logits against the fp32 reference: ", logits vs fp32 worst rel L2 X (ok)"
/// within the path's limit, "(WRONG)" past it or when not finite, "(error: ...)" when the pass failed.
fn probe_logits(bench: &mut Bench, path: Path, probe: Probe<'_>) -> String {
    let limit = if path == Path::Fast { FAST_LIMIT } else { GOLDEN_LIMIT };
    match bench.teacher_forced(path, probe.prompt, probe.fed) {
        Ok(rows) => {
            let worst = compare(probe.fp32, &rows)["worst_rel_l2"].as_f64().unwrap_or(f64::NAN);
            let verdict = if worst <= limit { "ok" } else { "WRONG" };
            format!(", logits vs fp32 worst rel L2 {worst:.1e} ({verdict})")
        }
        Err(e) => format!(", logits vs fp32 (error: {e})"),
    }
}

/// Same-run A/B of the batch-1 decode kernels: the one-warp-per-row GEMVs against the streamed ones
/// (`DeviceBackend::set_stream_gemv`) at several blocks per SM and bytes in flight per lane, and decode
/// attention in clusters of 8 or 16 blocks (`set_attn_cluster`) or split-K with global partials
/// (`set_attn_splits`), and the persistent decode step (`set_persistent`) with 16, 8 or 32 attention
/// spans per KV head; tokens/s, the graph's GPU time per step and (kernels compiled with their marks)
/// the traced timeline into `perf.<path>.variants`, each variant's logits checked against `probe`'s
/// when given (`probe_logits`). Ends on the settings it started with.
fn decode_variants(bench: &mut Bench, rep: &mut Report, path: Path, c: &ModelConfig, steps: usize, reps: usize, probe: Option<Probe<'_>>) {
    let prompts = vec![random_prompt(PERF_PROMPT, c.vocab, 100)];
    let (start, start_splits, start_cluster, start_step) =
        (bench.backend.stream_tuning(), bench.backend.attn_splits(), bench.backend.attn_cluster(), bench.backend.persistent());
    bench.trace = true;
    // BENCH_VARIANTS=name,name: only those.
    let only: Vec<String> = std::env::var("BENCH_VARIANTS").map(|v| v.split(',').map(str::to_string).collect()).unwrap_or_default();
    // (persistent step, streamed, blocks per SM, lane bytes, QKV lane bytes, spread, attention: cluster
    // size, or 0 and split-K partials with 0 for the default rule; the step's spans per KV head).
    let variants = [
        (false, false, 4, 128, 128, true, 16, 0),
        (false, true, 4, 128, 128, true, 16, 0),
        (false, true, 4, 128, 128, false, 16, 0),
        (false, true, 4, 128, 128, true, 8, 0),
        (false, true, 4, 128, 256, true, 16, 0),
        (false, true, 4, 128, 128, true, 0, 0),
        (false, true, 3, 128, 128, true, 16, 0),
        (true, true, 4, 128, 128, true, 16, 0),
        (true, true, 4, 128, 128, true, 8, 0),
        (true, true, 4, 128, 128, true, 0, 32),
    ];
    for (step, stream, per_sm, lane_bytes, qkv_lane_bytes, spread, cluster, splits) in variants {
        let gemv = if step {
            "step".to_string()
        } else if stream {
            format!("stream_lane{lane_bytes}_qkv{qkv_lane_bytes}_blocks{per_sm}{}", if spread { "" } else { "_packed" })
        } else {
            "warp_per_row".to_string()
        };
        let attention = if cluster > 0 {
            format!("cluster{cluster}")
        } else if splits > 0 {
            format!("splitk{splits}")
        } else {
            "splitk".to_string()
        };
        let name = format!("{gemv}_{attention}");
        if !only.is_empty() && !only.contains(&name) {
            continue;
        }
        bench.backend.set_stream_gemv(stream, StreamTuning { blocks_per_sm: per_sm, lane_bytes, qkv_lane_bytes, spread, ..start });
        bench.backend.set_attn_splits(if splits > 0 { splits } else { start_splits });
        bench.backend.set_attn_cluster(cluster);
        bench.backend.set_persistent(step);
        if step && !bench.backend.takes_step(path) {
            eprintln!("  decode {} {name}: the persistent step does not take this model here", path.as_str());
            continue;
        }
        let r = rep.section(&format!("decode {} {name}", path.as_str()), || {
            bench.decode(path, &prompts, steps.min(16))?;
            (0..reps.max(1)).map(|_| bench.decode(path, &prompts, steps)).collect::<Res<Vec<f64>>>()
        });
        if let Some(times) = r {
            let tok_s = steps as f64 / median(times);
            let replay = bench.replay_s.take();
            let trace = bench.trace_lines.take();
            let check = probe.map(|p| probe_logits(bench, path, p)).unwrap_or_default();
            eprintln!("  decode {} {name}: {tok_s:.0} tok/s, graph replay {:.1} us{check}", path.as_str(), replay.unwrap_or(0.0) * 1e6);
            for line in trace.iter().flatten() {
                eprintln!("    {line}");
            }
            rep.value["perf"][path.as_str()]["variants"][&name] =
                json!({"tok_s": tok_s, "graph_replay_s": replay, "trace": trace, "logits_check": check.trim_start_matches(", ")});
            rep.save();
        }
    }
    bench.trace = false;
    bench.backend.set_attn_splits(start_splits);
    bench.backend.set_attn_cluster(start_cluster);
    bench.backend.set_stream_gemv(true, start);
    bench.backend.set_persistent(start_step);
}
