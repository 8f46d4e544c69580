//! Device check of every kernel wrapper (`./devcheck/kernels_check` on a lent GPU; built by
//! scripts/device/prepare.sh): deterministic random inputs, each launch on the GPU against a plain CPU
//! reference written here (f64 where that is natural; exact emulations of the patches' bf16, FP8 and Q8
//! roundings), every output poisoned with NaN before its launch and followed by a poisoned tail, so an
//! unwritten element or a write past the end shows. Timings first, the table LAST; exits non-zero
//! when a check misses its limit or a call fails.

use std::error::Error;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use ctxscope_kernels::blas::{Activations, Blas, Compute};
use ctxscope_kernels::cudarc::driver::{sys, CudaSlice, CudaStream, DevicePtr, DeviceRepr};
use ctxscope_kernels::device::{f32_to_bf16_bits, AttentionShape, Device, DeviceError, GemvMode, Matrix, MatrixData, RopeShape};

type Res<T = ()> = Result<T, Box<dyn Error>>;
type Section = fn(&Device, &mut Rng, &mut Report) -> Res;

/// Poisoned elements after every output: a kernel that writes past its output shows here.
const TAIL: usize = 64;
/// Limit of f32 arithmetic against an f64 reference (reduction order, expf, FMA contraction).
const F32_LIMIT: f64 = 1e-5;

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("kernels check: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Res<bool> {
    let started = Instant::now();
    let dev = Device::new(0)?;
    let ready = started.elapsed().as_secs_f64();
    let name = dev.ctx.name()?;
    println!("{name}, {} SMs: Device::new(0) (context + NVRTC compile of {} modules) took {ready:.2} s", dev.multiprocessors, ctxscope_kernels::SOURCES.len());
    let sections: [(&str, Section); 14] = [
        ("rmsnorm", check_rmsnorm),
        ("embed", check_embed),
        ("rope_kv", check_rope_kv),
        ("elementwise", check_elementwise),
        ("gemv", check_gemv),
        ("gemv timing", time_gemv),
        ("cuBLAS matmul", check_matmul),
        ("attn_prefill", check_prefill),
        ("attn_decode", check_decode),
        ("small kernels timed", time_small),
        ("argmax_logprob", check_argmax),
        ("top_p_sample", check_top_p),
        // Last: a wrapper that wrongly accepts a bad shape may launch out of bounds.
        ("wrapper shape checks", check_shapes),
        ("device errors", check_sticky),
    ];
    let mut rep = Report::default();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for (name, section) in sections {
        let t = Instant::now();
        if let Err(e) = section(&dev, &mut rng, &mut rep) {
            let mut row = Row::new(format!("{name}: ERROR"), 0.0);
            row.bad = 1;
            row.first_bad = e.to_string();
            rep.rows.push(row);
        }
        rep.info.push(format!("{name}: {:.2} s", t.elapsed().as_secs_f64()));
    }
    println!("total {:.1} s", started.elapsed().as_secs_f64());
    for line in &rep.info {
        println!("  {line}");
    }
    Ok(rep.print())
}

// ---------------------------------------------------------------------------------------------------
// Inputs, number formats, comparisons, the table.

/// xorshift64*: a small deterministic generator, so every run draws the same inputs.
struct Rng(u64);

impl Rng {
    fn bits(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.bits() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [-scale, scale).
    fn sym(&mut self, scale: f32) -> f32 {
        ((self.unit() * 2.0 - 1.0) * f64::from(scale)) as f32
    }

    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.sym(scale)).collect()
    }

    /// Uniform in [0, n).
    fn below(&mut self, n: usize) -> usize {
        ((self.unit() * n as f64) as usize).min(n - 1)
    }

    /// A magnitude spread over [lo, hi) on a log scale, with a random sign.
    fn wide(&mut self, lo: f64, hi: f64) -> f32 {
        let m = (lo.ln() + self.unit() * (hi.ln() - lo.ln())).exp();
        (if self.bits() & 1 == 1 { -m } else { m }) as f32
    }
}

/// bf16, round to nearest even (the kernels' `round_bf16`, the CPU's `patch::round::bf16`).
fn bf16(x: f32) -> f32 {
    f32::from_bits(u32::from(f32_to_bf16_bits(x)) << 16)
}

/// FP8 e4m3 (ties to even, saturating at ±448): a copy of engine/src/patch/round.rs `fp8_e4m3`.
fn fp8_e4m3(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs().min(448.0);
    let step = if a < 2f32.powi(-6) {
        2f32.powi(-9)
    } else {
        let exp = ((a.to_bits() >> 23) & 0xff) as i32 - 127;
        2f32.powi(exp - 3)
    };
    let r = ((a / step).round_ties_even() * step).min(448.0);
    r.copysign(x)
}

/// `x` stored as FP8 with a per-tensor scale, as the kernels do: fp8(x / scale) * scale.
fn fp8_scaled(x: f32, scale: f32) -> f32 {
    fp8_e4m3(x / scale) * scale
}

/// f32 -> f16 -> f32, round to nearest even (PTX `cvt.rn.f16.f32`): 10 mantissa bits, subnormals
/// below 2^-14 on a step of 2^-24, infinity from 65520 (the midpoint above 65504, which is odd).
fn f16_round(x: f32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    let a = x.abs();
    if a >= 65520.0 {
        return f32::INFINITY.copysign(x);
    }
    let step = if a < 2f32.powi(-14) {
        2f32.powi(-24)
    } else {
        2f32.powi(((a.to_bits() >> 23) & 0xff) as i32 - 127 - 10)
    };
    ((a / step).round_ties_even() * step).copysign(x)
}

/// llama.cpp's Q8_0 activation rounding: a copy of engine/src/patch/round.rs `q8_blocks`, d in f16.
fn q8_blocks(x: &mut [f32]) {
    for block in x.chunks_mut(32) {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = f16_round(amax / 127.0);
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        for v in block.iter_mut() {
            *v = (*v * id).round_ties_even() * d;
        }
    }
}

/// One launch (or a few merged) against its reference.
#[derive(Default)]
struct Cmp {
    elems: usize,
    /// ‖out − ref‖ / ‖ref‖ over the finite outputs.
    rel: f64,
    max_abs: f64,
    /// Elements that fail outright: not finite, differing where exactness is required, written past
    /// the end or where nothing should have been written.
    bad: usize,
    why: String,
}

impl Cmp {
    fn flag(mut self, count: usize, what: &str) -> Cmp {
        if count > 0 {
            self.bad += count;
            if !self.why.is_empty() {
                self.why.push_str(", ");
            }
            self.why.push_str(&format!("{count} {what}"));
        }
        self
    }

    /// The poisoned tail after the output must still be NaN.
    fn tail(self, tail: &[f32]) -> Cmp {
        let written = tail.iter().filter(|v| !v.is_nan()).count();
        self.flag(written, "written past the end")
    }

    fn merge(self, other: Cmp) -> Cmp {
        let why = [self.why, other.why].into_iter().filter(|w| !w.is_empty()).collect::<Vec<_>>().join(", ");
        Cmp { elems: self.elems + other.elems, rel: self.rel.max(other.rel), max_abs: self.max_abs.max(other.max_abs), bad: self.bad + other.bad, why }
    }
}

/// Relative (norm-wise) and max absolute error of `out` against `want`; outputs that are not finite
/// (where the reference is) are bad, as are outputs missing from either side.
fn compare(out: &[f32], want: &[f64]) -> Cmp {
    let (mut err2, mut ref2, mut max_abs, mut nonfinite) = (0f64, 0f64, 0f64, 0usize);
    for (&o, &w) in out.iter().zip(want) {
        if !w.is_finite() {
            if f64::from(o) != w {
                nonfinite += 1;
            }
            continue;
        }
        if !o.is_finite() {
            nonfinite += 1;
            continue;
        }
        let d = f64::from(o) - w;
        err2 += d * d;
        ref2 += w * w;
        max_abs = max_abs.max(d.abs());
    }
    let rel = if ref2 > 0.0 { (err2 / ref2).sqrt() } else { err2.sqrt() };
    let cmp = Cmp { elems: want.len(), rel, max_abs, ..Cmp::default() };
    cmp.flag(nonfinite, "not finite").flag(out.len().abs_diff(want.len()), "missing")
}

/// As `compare`, and every element must equal its reference exactly (±0 equal).
fn exact(out: &[f32], want: &[f32]) -> Cmp {
    let want64: Vec<f64> = want.iter().map(|&v| f64::from(v)).collect();
    let differ = out.iter().zip(want).filter(|(o, w)| o.is_finite() && *o != *w).count();
    compare(out, &want64).flag(differ, "differ")
}

fn to_f64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

/// One line of the table: the worst of a group of launches.
struct Row {
    name: String,
    elems: usize,
    rel: f64,
    max_abs: f64,
    limit: f64,
    bad: usize,
    worst: String,
    first_bad: String,
}

impl Row {
    fn new(name: impl Into<String>, limit: f64) -> Row {
        Row { name: name.into(), elems: 0, rel: 0.0, max_abs: 0.0, limit, bad: 0, worst: String::new(), first_bad: String::new() }
    }

    fn add(&mut self, label: &str, c: Cmp) {
        self.elems += c.elems;
        self.max_abs = self.max_abs.max(c.max_abs);
        if c.bad > 0 && self.first_bad.is_empty() {
            self.first_bad = format!("{label}: {}", c.why);
        }
        self.bad += c.bad;
        if !self.rel.is_nan() && (c.rel.is_nan() || c.rel > self.rel) {
            self.rel = c.rel;
            self.worst = label.to_string();
        }
        if self.worst.is_empty() {
            self.worst = label.to_string();
        }
    }

    fn passed(&self) -> bool {
        self.bad == 0 && self.rel <= self.limit
    }
}

#[derive(Default)]
struct Report {
    rows: Vec<Row>,
    info: Vec<String>,
}

impl Report {
    fn single(&mut self, name: impl Into<String>, limit: f64, c: Cmp) {
        let mut row = Row::new(name, limit);
        row.add("", c);
        self.rows.push(row);
    }

    /// Prints the table; true when every row passed.
    fn print(&self) -> bool {
        println!();
        println!("{:<44} {:>8} {:>8} {:>8} {:>6} {:>5} {:<4} note (first failure, else worst case)", "check", "elements", "rel err", "max abs", "limit", "bad", "");
        for r in &self.rows {
            let note = if r.first_bad.is_empty() { r.worst.clone() } else { r.first_bad.clone() };
            let note: String = note.chars().take(64).collect();
            let verdict = if r.passed() { "ok" } else { "FAIL" };
            println!("{:<44} {:>8} {:>8.1e} {:>8.1e} {:>6.0e} {:>5} {:<4} {note}", r.name, r.elems, r.rel, r.max_abs, r.limit, r.bad, verdict);
        }
        let failed = self.rows.iter().filter(|r| !r.passed()).count();
        if failed == 0 {
            println!("all {} checks passed", self.rows.len());
        } else {
            println!("FAILED: {failed} of {} checks", self.rows.len());
        }
        failed == 0
    }
}

fn nan_buf(s: &Arc<CudaStream>, n: usize) -> Res<CudaSlice<f32>> {
    Ok(s.clone_htod(&vec![f32::NAN; n])?)
}

/// Waits for the stream (so a kernel fault is reported here) and copies `buf` back.
fn read<T: DeviceRepr>(s: &Arc<CudaStream>, buf: &CudaSlice<T>) -> Res<Vec<T>> {
    s.synchronize()?;
    Ok(s.clone_dtoh(buf)?)
}

/// Runs `f(row, out_row)` for every row of `out` (rows of `width`) on all cores.
fn par_rows(out: &mut [f64], width: usize, f: impl Fn(usize, &mut [f64]) + Sync) {
    let rows = out.len() / width;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, rows.max(1));
    let per = rows.div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        for (i, chunk) in out.chunks_mut(per * width).enumerate() {
            let f = &f;
            scope.spawn(move || {
                for (j, row) in chunk.chunks_mut(width).enumerate() {
                    f(i * per + j, row);
                }
            });
        }
    });
}

/// `w[r] · x[t]` in f64 for every row r of `w` (rows of `cols`) and the `tokens` rows of `x`, from the
/// bf16-rounded values where asked: out[r * tokens + t].
fn dots(w: &[f32], w_bf16: bool, x: &[f32], x_bf16: bool, cols: usize, tokens: usize) -> Vec<f64> {
    let xs: Vec<f64> = x[..tokens * cols].iter().map(|&v| f64::from(if x_bf16 { bf16(v) } else { v })).collect();
    let mut out = vec![0f64; w.len() / cols * tokens];
    par_rows(&mut out, tokens, |r, o| {
        let wr: Vec<f64> = w[r * cols..(r + 1) * cols].iter().map(|&v| f64::from(if w_bf16 { bf16(v) } else { v })).collect();
        for (t, o) in o.iter_mut().enumerate() {
            *o = wr.iter().zip(&xs[t * cols..(t + 1) * cols]).map(|(a, b)| a * b).sum();
        }
    });
    out
}

// ---------------------------------------------------------------------------------------------------
// Row-wise and element-wise kernels.

/// rmsnorm in f64 of one row.
fn rmsnorm_f64(x: &[f32], w: &[f32], eps: f32) -> Vec<f64> {
    let ms = x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / x.len() as f64;
    let scale = 1.0 / (ms + f64::from(eps)).sqrt();
    x.iter().zip(w).map(|(&v, &w)| f64::from(v) * scale * f64::from(w)).collect()
}

/// The rmsnorm_bf16 patch on one row: engine/src/forward/ops.rs `rmsnorm_rows_bf16` (32 strided lanes,
/// each add rounded to bf16, then a pairwise bf16 tree of widths 16, 8, 4, 2, 1).
fn rmsnorm_bf16_row(row: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let mut lanes = [0f32; 32];
    for (i, v) in row.iter().enumerate() {
        lanes[i % 32] = bf16(lanes[i % 32] + bf16(v * v));
    }
    let mut width = 32;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            lanes[i] = bf16(lanes[i] + lanes[i + width]);
        }
    }
    let mean = lanes[0] / weight.len() as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    row.iter().zip(weight).map(|(x, w)| x * scale * w).collect()
}

fn check_rmsnorm(dev: &Device, rng: &mut Rng, rep: &mut Report) -> Res {
    let s = &dev.stream;
    let (n, src_rows, eps) = (37usize, 50usize, 1e-5f32);
    for dim in [576usize, 2048] {
        let mut x = Vec::with_capacity(src_rows * dim);
        for _ in 0..src_rows {
            let scale = 0.05 + 3.0 * rng.unit() as f32;
            x.extend(rng.vec(dim, scale));
        }
        let w: Vec<f32> = (0..dim).map(|_| 1.0 + rng.sym(0.5)).collect();
        let map: Vec<i32> = (0..n).map(|_| rng.below(src_rows) as i32).collect();
        let (dx, dw, dmap) = (s.clone_htod(&x)?, s.clone_htod(&w)?, s.clone_htod(&map)?);
        for bf16_stats in [false, true] {
            let mut row = if bf16_stats { Row::new(format!("rmsnorm bf16 stats (emulation) dim {dim}"), 1e-6) } else { Row::new(format!("rmsnorm f32 stats dim {dim}"), F32_LIMIT) };
            for with_map in [false, true] {
                let mut out = nan_buf(s, n * dim + TAIL)?;
                let map_view = dmap.as_view();
                dev.rmsnorm(&dx.as_view(), with_map.then_some(&map_view), &dw.as_view(), &mut out.as_view_mut(), n, dim, eps, bf16_stats)?;
                let got = read(s, &out)?;
                let src = |r: usize| if with_map { map[r] as usize } else { r };
                let mut want = Vec::with_capacity(n * dim);
                let mut differ = 0;
                for r in 0..n {
                    let xr = &x[src(r) * dim..(src(r) + 1) * dim];
                    if bf16_stats {
                        let e = rmsnorm_bf16_row(xr, &w, eps);
                        differ += e.iter().zip(&got[r * dim..]).filter(|(a, b)| a != b).count();
                        want.extend(to_f64(&e));
                    } else {
                        want.extend(rmsnorm_f64(xr, &w, eps));
                    }
                }
                let label = if with_map { "row map" } else { "plain" };
                let label = if bf16_stats { format!("{label}, {differ} not bit-equal") } else { label.to_string() };
                row.add(&label, compare(&got[..n * dim], &want).tail(&got[n * dim..]));
            }
            rep.rows.push(row);
        }
    }
    Ok(())
}

fn check_embed(dev: &Device, rng: &mut Rng, rep: &mut Report) -> Res {
    let s = &dev.stream;
    let (vocab, dim) = (1000usize, 576usize);
    let table = rng.vec(vocab * dim, 1.0);
    let ids: Vec<i32> = vec![0, 999, 3, 3, 517, 998, 1, 250, 0];
    let n = ids.len();
    let dids = s.clone_htod(&ids)?;
    for as_bf16 in [false, true] {
        let m = Matrix::upload(s, &table, vocab, dim, as_bf16)?;
        let mut out = nan_buf(s, n * dim + TAIL)?;
        dev.embed(&m, &dids.as_view(), &mut out.as_view_mut(), n)?;
        let got = read(s, &out)?;
        let want: Vec<f32> = ids.iter().flat_map(|&i| table[i as usize * dim..(i as usize + 1) * dim].iter().map(|&v| if as_bf16 { bf16(v) } else { v })).collect();
        let name = if as_bf16 { "embed_bf16 (exact)" } else { "embed_f32 (exact)" };
        rep.single(name, 0.0, exact(&got[..n * dim], &want).tail(&got[n * dim..]));
    }
    Ok(())
}

/// cos and sin of one RoPE angle as rope_kv computes them: angle in f64, or under rope_bf16 position,
/// inverse frequency and angle rounded to bf16 and cos/sin of it (in f64) rounded to bf16.
fn rope_trig(pos: i32, inv: f64, bf16_tables: bool) -> (f32, f32) {
    if bf16_tables {
        let theta = bf16(bf16(pos as f32) * bf16(inv as f32));
        (bf16(f64::from(theta).cos() as f32), bf16(f64::from(theta).sin() as f32))
    } else {
        let theta = f64::from(pos) * inv;
        (theta.cos() as f32, theta.sin() as f32)
    }
}

/// Whether `got` is the FP8 rounding of an f32 computation whose exact value is `exact` within
/// `tol` (either side of a rounding boundary: the kernel may contract the multiply-adds into FMAs).
fn fp8_accepts(got: f32, exact: f64, tol: f64, scale: f32) -> bool {
    got == fp8_scaled((exact - tol) as f32, scale) || got == fp8_scaled((exact + tol) as f32, scale) || got == fp8_scaled(exact as f32, scale)
}

struct RopeCase {
    heads: usize,
    kv_heads: usize,
    hd: usize,
    n_layers: usize,
    layer: usize,
    base: f32,
    buffers: usize,
}

fn check_rope_kv(dev: &Device, rng: &mut Rng, rep: &mut Report) -> Res {
    let s = &dev.stream;
    // Distinct positions (rows sharing a cache must not share a position), some past 4000.
    let positions: Vec<i32> = vec![0, 1, 7, 31, 100, 1023, 2047, 4000, 4001, 4097];
    let n = positions.len();
    let capacity = 4100usize;
    let cases = [
        RopeCase { heads: 9, kv_heads: 3, hd: 64, n_layers: 3, layer: 2, base: 100_000.0, buffers: 3 },
        RopeCase { heads: 32, kv_heads: 8, hd: 128, n_layers: 2, layer: 1, base: 500_000.0, buffers: 2 },
    ];
    let dpos = s.clone_htod(&positions)?;
    for c in cases {
        let (q_dim, kv_dim, hd, half) = (c.heads * c.hd, c.kv_heads * c.hd, c.hd, c.hd / 2);
        let row_len = q_dim + 2 * kv_dim;
        let buffer_of = |t: usize| t % c.buffers;
        let off = |pos: usize, kind: usize| ((pos * c.n_layers + c.layer) * 2 + kind) * kv_dim;
        let poison = vec![f32::NAN; capacity * c.n_layers * 2 * kv_dim];
        let inv: Vec<f64> = (0..half).map(|j| f64::from(c.base).powf(-2.0 * j as f64 / hd as f64)).collect();
        for (flags, kv_scale) in [(0, 1.0f32), (1, 1.0), (2, 1.0), (2, 0.5), (3, 0.5)] {
            let mut qkv = rng.vec(n * row_len, 2.0);
            // Row 0 sits at position 0 (no rotation): FP8 edge cases in its K and V — past ±448
            // (saturating), a tie, values under the subnormal step.
            qkv[q_dim..q_dim + 2].copy_from_slice(&[300.0, -0.001]);
            let v0 = q_dim + kv_dim;
            qkv[v0..v0 + 6].copy_from_slice(&[500.0, -1000.0, 1e-3, 2f32.powi(-10), 3.0 * 2f32.powi(-10), 1.0625]);
            let mut dqkv = s.clone_htod(&[qkv.as_slice(), &[f32::NAN; TAIL]].concat())?;
            let caches = (0..c.buffers).map(|_| s.clone_htod(&poison)).collect::<Result<Vec<_>, _>>()?;
            let bases: Vec<u64> = (0..n).map(|t| caches[buffer_of(t)].device_ptr(s).0).collect();
            let dbase = s.clone_htod(&bases)?;
            let shape = RopeShape { n_layers: c.n_layers, heads: c.heads, kv_heads: c.kv_heads, head_dim: hd, base: c.base, flags, kv_scale };
            dev.rope_kv(&mut dqkv.as_view_mut(), &dpos.as_view(), &dbase.as_view(), n, c.layer, &shape)?;
            let got_qkv = read(s, &dqkv)?;
            let got_caches = caches.iter().map(|b| read(s, b)).collect::<Res<Vec<_>>>()?;

            // Reference: q rotated in place (k and v of the row untouched), K rotated (exact value and
            // its f32 error bound), V as is.
            let mut want_qkv = to_f64(&qkv);
            let (mut k_exact, mut k_tol) = (vec![0f64; n * kv_dim], vec![0f64; n * kv_dim]);
            for t in 0..n {
                let row = &qkv[t * row_len..(t + 1) * row_len];
                for p in 0..(q_dim + kv_dim) / 2 {
                    let (cs, sn) = rope_trig(positions[t], inv[p % half], flags & 1 != 0);
                    let (cs, sn) = (f64::from(cs), f64::from(sn));
                    let (a, b) = (f64::from(row[2 * p]), f64::from(row[2 * p + 1]));
                    let (ra, rb) = (a * cs - b * sn, a * sn + b * cs);
                    if 2 * p < q_dim {
                        want_qkv[t * row_len + 2 * p] = ra;
                        want_qkv[t * row_len + 2 * p + 1] = rb;
                    } else {
                        let i = t * kv_dim + 2 * p - q_dim;
                        let eps = 2.0 * f64::from(f32::EPSILON);
                        k_exact[i] = ra;
                        k_exact[i + 1] = rb;
                        k_tol[i] = eps * ((a * cs).abs() + (b * sn).abs());
                        k_tol[i + 1] = eps * ((a * sn).abs() + (b * cs).abs());
                    }
                }
            }
            let q_cmp = compare(&got_qkv[..n * row_len], &want_qkv).tail(&got_qkv[n * row_len..]);

            // What the caches hold at each row's position and layer; everything else must be poison.
            let (mut got_k, mut got_v, mut want_v) = (Vec::new(), Vec::new(), Vec::new());
            for t in 0..n {
                let (cache, pos) = (&got_caches[buffer_of(t)], positions[t] as usize);
                got_k.extend_from_slice(&cache[off(pos, 0)..off(pos, 0) + kv_dim]);
                got_v.extend_from_slice(&cache[off(pos, 1)..off(pos, 1) + kv_dim]);
                let v = &qkv[t * row_len + q_dim + kv_dim..(t + 1) * row_len];
                want_v.extend(v.iter().map(|&x| if flags & 2 != 0 { fp8_scaled(x, kv_scale) } else { x }));
            }
            let mut stray = 0;
            for (b, cache) in got_caches.iter().enumerate() {
                let written: usize = (0..n)
                    .filter(|&t| buffer_of(t) == b)
                    .map(|t| cache[off(positions[t] as usize, 0)..off(positions[t] as usize, 0) + 2 * kv_dim].iter().filter(|v| !v.is_nan()).count())
                    .sum();
                stray += cache.iter().filter(|v| !v.is_nan()).count() - written;
            }
            let k_cmp = if flags & 2 != 0 {
                let mut rejected = 0;
                let want: Vec<f64> = (0..n * kv_dim)
                    .map(|i| {
                        if got_k[i].is_finite() && fp8_accepts(got_k[i], k_exact[i], k_tol[i], kv_scale) {
                            f64::from(got_k[i])
                        } else {
                            rejected += usize::from(got_k[i].is_finite());
                            f64::from(fp8_scaled(k_exact[i] as f32, kv_scale))
                        }
                    })
                    .collect();
                compare(&got_k, &want).flag(rejected, "K not the FP8 of the rotation")
            } else {
                compare(&got_k, &k_exact)
            };
            let v_cmp = exact(&got_v, &want_v);
            let name = format!("rope_kv h{}/{} hd{} L{}/{} flags={flags} s={kv_scale}", c.heads, c.kv_heads, hd, c.layer, c.n_layers);
            let label = format!("q {:.1e}, K {:.1e}, V {:.1e}", q_cmp.rel, k_cmp.rel, v_cmp.rel);
            rep.single(name, 1e-6, q_cmp.merge(k_cmp).merge(v_cmp).flag(stray, "cache values written where no row points"));
            if let Some(row) = rep.rows.last_mut() {
                row.worst = label;
            }
        }
    }
    Ok(())
}

fn check_elementwise(dev: &Device, rng: &mut Rng, rep: &mut Report) -> Res {
    let s = &dev.stream;

    // SwiGLU of fused gate|up rows.
    let (n, ffn) = (37usize, 1536usize);
    let gu = rng.vec(n * 2 * ffn, 4.0);
    let dgu = s.clone_htod(&gu)?;
    let mut out = nan_buf(s, n * ffn + TAIL)?;
    dev.swiglu(&dgu.as_view(), &mut out.as_view_mut(), n, ffn)?;
    let got = read(s, &out)?;
    let want: Vec<f64> = (0..n * ffn)
        .map(|i| {
            let (r, c) = (i / ffn, i % ffn);
            let (g, u) = (f64::from(gu[r * 2 * ffn + c]), f64::from(gu[r * 2 * ffn + ffn + c]));
            g / (1.0 + (-g).exp()) * u
        })
        .collect();
    rep.single("swiglu_f32 37x1536", 1e-6, compare(&got[..n * ffn], &want).tail(&got[n * ffn..]));

    // Residual add in place; the tail past n must keep its values.
    let n = 37 * 576 + 13;
    let (x, y) = (rng.vec(n + TAIL, 3.0), rng.vec(n, 3.0));
    let (mut dx, dy) = (s.clone_htod(&x)?, s.clone_htod(&y)?);
    dev.add(&mut dx.as_view_mut(), &dy.as_view(), n)?;
    let got = read(s, &dx)?;
    let want: Vec<f32> = (0..n + TAIL).map(|i| if i < n { x[i] + y[i] } else { x[i] }).collect();
    rep.single("add_f32 (exact, tail kept)", 0.0, exact(&got, &want));

    // f32 -> bf16 bits: ties, overflow, subnormals, infinities, then random bit patterns and values.
    let mut x = vec![
        0.0,
        -0.0,
        1.0,
        1.0 + 2f32.powi(-8),
        1.0 + 3.0 * 2f32.powi(-8),
        -(1.0 + 2f32.powi(-8)),
        f32::MAX,
        -f32::MAX,
        f32::MIN_POSITIVE,
        1e-40,
        -3e-39,
        f32::INFINITY,
        f32::NEG_INFINITY,
        65504.0,
        3.0e38,
    ];
    while x.len() < 4099 {
        let v = if x.len() % 2 == 0 { f32::from_bits(rng.bits() as u32) } else { rng.wide(1e-6, 1e6) };
        if !v.is_nan() {
            x.push(v);
        }
    }
    let n = x.len();
    let dx = s.clone_htod(&x)?;
    let mut out = s.clone_htod(&vec![0xffffu16; n + TAIL])?;
    dev.to_bf16(&dx.as_view(), &mut out.as_view_mut(), n)?;
    let got = read(s, &out)?;
    let differ = x.iter().zip(&got).filter(|(v, g)| f32_to_bf16_bits(**v) != **g).count();
    let finite: Vec<usize> = (0..n).filter(|&i| x[i].is_finite() && bf16(x[i]).is_finite()).collect();
    let got_f: Vec<f32> = finite.iter().map(|&i| f32::from_bits(u32::from(got[i]) << 16)).collect();
    let want_f: Vec<f64> = finite.iter().map(|&i| f64::from(bf16(x[i]))).collect();
    let tail = got[n..].iter().filter(|&&b| b != 0xffff).count();
    rep.single("to_bf16 (bits vs f32_to_bf16_bits)", 0.0, compare(&got_f, &want_f).flag(differ, "bit patterns differ").flag(tail, "written past the end"));

    // In-place rounding: bf16, and FP8 e4m3 with a per-tensor scale.
    let specials = [
        1.0625, 1.1, 1.1875, 0.0, -0.0, 2f32.powi(-9), 2f32.powi(-10), 3.0 * 2f32.powi(-10), 2f32.powi(-11), 232.0, 240.0, 448.0, 460.0, 464.0, 480.0, 1000.0, -1000.0, -0.3,
    ];
    let mut x: Vec<f32> = specials.to_vec();
    while x.len() < 4099 {
        x.push(rng.wide(1e-4, 2000.0));
    }
    let n = x.len();
    let sentinel = rng.vec(TAIL, 1.0);
    for (mode, scale) in [(None, 1.0f32), (Some(1.0f32), 1.0), (Some(0.5), 0.5), (Some(0.1), 0.1)] {
        let mut dx = s.clone_htod(&[x.as_slice(), &sentinel].concat())?;
        dev.round(&mut dx.as_view_mut(), n, mode)?;
        let got = read(s, &dx)?;
        let mut want: Vec<f32> = x.iter().map(|&v| if mode.is_some() { fp8_scaled(v, scale) } else { bf16(v) }).collect();
        want.extend_from_slice(&sentinel);
        let name = match mode {
            None => "round_f32 bf16 (exact)".to_string(),
            Some(scale) => format!("round_f32 fp8 scale {scale} (exact)"),
        };
        rep.single(name, 0.0, exact(&got, &want));
    }

    // Q8_0 blocks in place: rows of different scales, an all-zero block and a one-value block.
    let (rows, cols) = (37usize, 576usize);
    let mut x = Vec::with_capacity(rows * cols);
    for _ in 0..rows {
        let scale = rng.wide(1e-3, 50.0).abs();
        x.extend(rng.vec(cols, scale));
    }
    x[32..64].fill(0.0);
    x[64..96].fill(0.0);
    x[70] = -0.37;
    let n = x.len();
    let mut dx = s.clone_htod(&[x.as_slice(), &sentinel].concat())?;
    dev.q8_blocks(&mut dx.as_view_mut(), n)?;
    let got = read(s, &dx)?;
    let mut want = x.clone();
    q8_blocks(&mut want);
    want.extend_from_slice(&sentinel);
    rep.single("q8_blocks (exact, f16 d)", 0.0, exact(&got, &want));
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// GEMV and GEMM.

fn check_gemv(dev: &Device, rng: &mut Rng, rep: &mut Report) -> Res {
    let s = &dev.stream;
    let shapes = [(576usize, 576usize, true), (1536, 576, true), (49152, 576, false), (3072, 2048, true), (2048, 8192, true)];
    for (rows, cols, with_f32) in shapes {
        // Gate rows then up rows (the SwiGLU layout); Store and Accumulate use the gate half.
        let w_all = rng.vec(2 * rows * cols, 1.0 / (cols as f32).sqrt());
        let x = rng.vec(8 * cols, 1.0);
        let y0 = rng.vec(8 * rows, 1.0);
        let dx = s.clone_htod(&x)?;
        for as_bf16 in [true, false] {
            if !as_bf16 && !with_f32 {
                continue;
            }
            let single = Matrix::upload(s, &w_all[..rows * cols], rows, cols, as_bf16)?;
            let fused = Matrix::upload(s, &w_all, 2 * rows, cols, as_bf16)?;
            let refs = [dots(&w_all, as_bf16, &x, false, cols, 8), dots(&w_all, as_bf16, &x, true, cols, 8)];
            let mut row = Row::new(format!("gemv_{} {rows}x{cols} n 1,3,8 x 3 modes x round_x", if as_bf16 { "bf16" } else { "f32" }), F32_LIMIT);
            for n in [1usize, 3, 8] {
                for mode in [GemvMode::Store, GemvMode::Accumulate, GemvMode::SwiGlu] {
                    for round_x in [false, true] {
                        let w = if mode == GemvMode::SwiGlu { &fused } else { &single };
                        let mut y = nan_buf(s, n * rows + TAIL)?;
                        if mode == GemvMode::Accumulate {
                            s.memcpy_htod(&y0[..n * rows], &mut y.slice_mut(0..n * rows))?;
                        }
                        dev.gemv(w, &dx.slice(0..n * cols), &mut y.as_view_mut(), n, mode, round_x)?;
                        let got = read(s, &y)?;
                        let d = &refs[usize::from(round_x)];
                        let want: Vec<f64> = (0..n * rows)
                            .map(|i| {
                                let (t, r) = (i / rows, i % rows);
                                let g = d[r * 8 + t];
                                match mode {
                                    GemvMode::Store => g,
                                    GemvMode::Accumulate => f64::from(y0[i]) + g,
                                    GemvMode::SwiGlu => g / (1.0 + (-g).exp()) * d[(r + rows) * 8 + t],
                                }
                            })
                            .collect();
                        row.add(&format!("n={n} {mode:?} round_x={round_x}"), compare(&got[..n * rows], &want).tail(&got[n * rows..]));
                    }
                }
            }
            rep.rows.push(row);
        }
    }
    Ok(())
}

/// A bf16 matrix of random values (magnitudes 2^-8 .. 2^-1, random signs) built from bits directly,
/// and those bits.
fn random_bf16_matrix(s: &Arc<CudaStream>, rng: &mut Rng, rows: usize, cols: usize) -> Res<(Matrix, Vec<u16>)> {
    let n = rows * cols;
    let mut bits = Vec::with_capacity(n + 3);
    while bits.len() < n {
        let r = rng.bits();
        for k in 0..4 {
            let b = (r >> (16 * k)) as u16;
            bits.push((b & 0x807f) | ((119 + ((b >> 7) & 7)) << 7));
        }
    }
    bits.truncate(n);
    Ok((Matrix { data: MatrixData::Bf16(s.clone_htod(&bits)?), rows, cols }, bits))
}

/// Median and minimum milliseconds of `runs` event-timed calls of `f` after 5 warm-ups.
fn time_ms(dev: &Device, runs: usize, mut f: impl FnMut() -> Res) -> Res<(f64, f64)> {
    let s = &dev.stream;
    for _ in 0..5 {
        f()?;
    }
    let mut events = Vec::with_capacity(runs);
    for _ in 0..runs {
        let start = s.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
        f()?;
        let end = s.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
        events.push((start, end));
    }
    s.synchronize()?;
    let mut ms = events.iter().map(|(a, b)| a.elapsed_ms(b)).collect::<Result<Vec<f32>, _>>()?;
    ms.sort_by(f32::total_cmp);
    Ok((f64::from(ms[runs / 2]), f64::from(ms[0])))
}

/// Times the small per-layer kernels of one decode step (informative: where a decode step's time
/// goes besides the weight GEMVs) in the 1B shape (32/8 heads of 64, 16 layers) at 600 positions.
fn time_small(dev: &Device, rng: &mut Rng, rep: &mut Report) -> Res {
    let s = &dev.stream;
    let (heads, kv_heads, hd, layers, len, dim) = (32usize, 8usize, 64usize, 16usize, 600usize, 2048usize);
    let kv_dim = kv_heads * hd;
    let per_pos = layers * 2 * kv_dim;
    let cache = s.clone_htod(&rng.vec(len * per_pos, 1.0))?;
    let base = cache.device_ptr(s).0;
    let bases = s.clone_htod(&[base])?;
    let positions = s.clone_htod(&[(len - 1) as i32])?;
    let q_stride = (heads + 2 * kv_heads) * hd;
    let mut qkv = s.clone_htod(&rng.vec(q_stride, 1.0))?;
    let mut out = nan_buf(s, heads * hd)?;
    let shape = AttentionShape { n_layers: layers, heads, kv_heads, head_dim: hd, window: 0 };
    let mut lines = Vec::new();
    for splits in [1usize, 8, 32] {
        let mut po = nan_buf(s, heads * splits * hd)?;
        let mut pml = nan_buf(s, heads * splits * 2)?;
        let (med, min) = time_ms(dev, 50, || {
            dev.attn_decode(&qkv.as_view(), &positions.as_view(), &bases.as_view(), 3, (&mut po.as_view_mut(), &mut pml.as_view_mut()), &mut out.as_view_mut(), 1, splits, 0, &shape)?;
            Ok(())
        })?;
        lines.push(format!("attn_decode 1 row, {len} positions, {splits} splits: {:.1} us (min {:.1})", med * 1e3, min * 1e3));
    }
    let rope = RopeShape { n_layers: layers, heads, kv_heads, head_dim: hd, base: 500000.0, flags: 0, kv_scale: 1.0 };
    let (med, _) = time_ms(dev, 50, || Ok(dev.rope_kv(&mut qkv.as_view_mut(), &positions.as_view(), &bases.as_view(), 1, 3, &rope)?))?;
    lines.push(format!("rope_kv 1 row: {:.1} us", med * 1e3));
    let x = s.clone_htod(&rng.vec(dim, 1.0))?;
    let w = s.clone_htod(&rng.vec(dim, 1.0))?;
    let mut y = nan_buf(s, dim)?;
    let (med, _) = time_ms(dev, 50, || Ok(dev.rmsnorm(&x.as_view(), None, &w.as_view(), &mut y.as_view_mut(), 1, dim, 1e-5, false)?))?;
    lines.push(format!("rmsnorm 1 row of {dim}: {:.1} us", med * 1e3));
    let vocab = 128_256usize;
    let logits = s.clone_htod(&rng.vec(vocab, 4.0))?;
    let mut tok = s.clone_htod(&[0i32])?;
    let mut lp = nan_buf(s, 1)?;
    let (med, _) = time_ms(dev, 50, || Ok(dev.argmax(&logits.as_view(), 1, vocab, &mut tok.as_view_mut(), &mut lp.as_view_mut())?))?;
    lines.push(format!("argmax 1 row of {vocab}: {:.1} us", med * 1e3));
    let mut one = s.clone_htod(&[1.0f32])?;
    let other = s.clone_htod(&[1.0f32])?;
    let (med, _) = time_ms(dev, 50, || Ok(dev.add(&mut one.as_view_mut(), &other.as_view(), 1)?))?;
    lines.push(format!("add_f32 of 1 value (a launch): {:.1} us", med * 1e3));
    for line in lines {
        rep.info.push(line);
    }
    Ok(())
}

/// Times gemv_bf16 at the 1B model's decode shapes (informative), and checks the last timed launch's
/// output against f64 (these shapes are not covered above).
fn time_gemv(dev: &Device, rng: &mut Rng, rep: &mut Report) -> Res {
    let s = &dev.stream;
    let (warmup, runs) = (5usize, 50usize);
    let mut row = Row::new("gemv_bf16 timed shapes, last run (n=1, round_x)", F32_LIMIT);
    // The SwiGLU matrix (64 MiB) is near the L2 size: two copies, alternated, so the L2 cannot serve it.
    for (rows, cols, mode, copies) in [(2 * 8192usize, 2048usize, GemvMode::SwiGlu, 2usize), (128_256, 2048, GemvMode::Store, 1)] {
        let (mats, bits): (Vec<Matrix>, Vec<Vec<u16>>) = (0..copies).map(|_| random_bf16_matrix(s, rng, rows, cols)).collect::<Res<Vec<_>>>()?.into_iter().unzip();
        let out_rows = if mode == GemvMode::SwiGlu { rows / 2 } else { rows };
        let x = rng.vec(cols, 1.0);
        let dx = s.clone_htod(&x)?;
        let mut y = nan_buf(s, out_rows + TAIL)?;
        for i in 0..warmup {
            dev.gemv(&mats[i % copies], &dx.as_view(), &mut y.as_view_mut(), 1, mode, true)?;
        }
        let mut events = Vec::with_capacity(runs);
        for i in 0..runs {
            let start = s.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
            dev.gemv(&mats[i % copies], &dx.as_view(), &mut y.as_view_mut(), 1, mode, true)?;
            let end = s.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
            events.push((start, end));
        }
        s.synchronize()?;
        let mut ms = events.iter().map(|(a, b)| a.elapsed_ms(b)).collect::<Result<Vec<f32>, _>>()?;
        ms.sort_by(f32::total_cmp);
        let (median, min) = (f64::from(ms[runs / 2]), f64::from(ms[0]));
        let bytes = mats[0].bytes() as f64;
        rep.info.push(format!(
            "gemv_bf16 {mode:?} {rows}x{cols} n=1: median {:.1} us (min {:.1}) over {runs} launches: {:.0} GB/s of weights",
            median * 1e3,
            min * 1e3,
            bytes / (median * 1e-3) / 1e9
        ));

        let got = read(s, &y)?;
        let last = &bits[(runs - 1) % copies];
        let xs: Vec<f64> = x.iter().map(|&v| f64::from(bf16(v))).collect();
        let mut d = vec![0f64; rows];
        par_rows(&mut d, 1, |r, o| {
            o[0] = last[r * cols..(r + 1) * cols].iter().zip(&xs).map(|(&b, &x)| f64::from(f32::from_bits(u32::from(b) << 16)) * x).sum();
        });
        let want: Vec<f64> = (0..out_rows)
            .map(|r| {
                let g = d[r];
                if mode == GemvMode::SwiGlu {
                    g / (1.0 + (-g).exp()) * d[r + out_rows]
                } else {
                    g
                }
            })
            .collect();
        row.add(&format!("{mode:?} {rows}x{cols}"), compare(&got[..out_rows], &want).tail(&got[out_rows..]));
    }
    rep.rows.push(row);
    Ok(())
}

fn check_matmul(dev: &Device, rng: &mut Rng, rep: &mut Report) -> Res {
    let s = &dev.stream;
    let blas = Blas::new(s.clone())?;
    let (rows, cols, n) = (1536usize, 576usize, 37usize);
    let w = rng.vec(rows * cols, 1.0 / (cols as f32).sqrt());
    let x = rng.vec(n * cols, 1.0);
    let y0 = rng.vec(n * rows, 1.0);
    let x_bits: Vec<u16> = x.iter().map(|&v| f32_to_bf16_bits(v)).collect();
    let (exact_ref, rounded_ref) = (dots(&w, false, &x, false, cols, n), dots(&w, true, &x, true, cols, n));
    let (mf, mb) = (Matrix::upload(s, &w, rows, cols, false)?, Matrix::upload(s, &w, rows, cols, true)?);
    let (dx, dxb) = (s.clone_htod(&x)?, s.clone_htod(&x_bits)?);
    // (label, bf16 operands, compute, limit, gate against the bf16-rounded-input reference)
    let cases = [
        ("f32 32F", false, Compute::F32, F32_LIMIT, false),
        ("f32 32F_FAST_16BF", false, Compute::F32Fast16Bf, 1e-2, false),
        ("bf16 x bf16 (vs rounded inputs)", true, Compute::F32, F32_LIMIT, true),
    ];
    for (label, bf16_operands, compute, limit, gate_rounded) in cases {
        let mut row = Row::new(format!("matmul {label} {rows}x{cols} n {n}"), limit);
        for accumulate in [false, true] {
            let mut y = nan_buf(s, n * rows + TAIL)?;
            if accumulate {
                s.memcpy_htod(&y0, &mut y.slice_mut(0..n * rows))?;
            }
            let (xv, xbv) = (dx.as_view(), dxb.as_view());
            let act = if bf16_operands { Activations::Bf16(&xbv) } else { Activations::F32(&xv) };
            blas.matmul(if bf16_operands { &mb } else { &mf }, act, &mut y.as_view_mut(), n, compute, accumulate)?;
            let got = read(s, &y)?;
            let want = |d: &[f64]| -> Vec<f64> {
                (0..n * rows).map(|i| d[(i % rows) * n + i / rows] + if accumulate { f64::from(y0[i]) } else { 0.0 }).collect()
            };
            let (gate, other) = if gate_rounded { (want(&rounded_ref), want(&exact_ref)) } else { (want(&exact_ref), want(&rounded_ref)) };
            let c = compare(&got[..n * rows], &gate).tail(&got[n * rows..]);
            let o = compare(&got[..n * rows], &other).rel;
            let vs = if gate_rounded { "vs exact inputs" } else { "vs bf16-rounded inputs" };
            row.add(&format!("accumulate={accumulate}, {vs} {o:.1e}"), c);
        }
        rep.rows.push(row);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// Attention.

/// A sequence's KV cache on the host, position-major as on the device (prelude.cuh `kv_row`):
/// [capacity][n_layers][2 (K, V)][kv_dim].
struct Cache {
    data: Vec<f32>,
    n_layers: usize,
    kv_dim: usize,
}

impl Cache {
    /// NaN everywhere except random K and V of `layer` at positions 0..len: a read of another layer
    /// or of a position past the sequence poisons the result.
    fn random(rng: &mut Rng, capacity: usize, n_layers: usize, layer: usize, kv_dim: usize, len: usize) -> Cache {
        let mut data = vec![f32::NAN; capacity * n_layers * 2 * kv_dim];
        for pos in 0..len {
            let at = (pos * n_layers + layer) * 2 * kv_dim;
            data[at..at + 2 * kv_dim].copy_from_slice(&rng.vec(2 * kv_dim, 1.0));
        }
        Cache { data, n_layers, kv_dim }
    }

    /// Head `kvh` (of `hd`) of K (kind 0) or V (kind 1) at `pos` of `layer`.
    fn head(&self, pos: usize, layer: usize, kind: usize, kvh: usize, hd: usize) -> &[f32] {
        let at = ((pos * self.n_layers + layer) * 2 + kind) * self.kv_dim + kvh * hd;
        &self.data[at..at + hd]
    }
}

/// Softmax attention of one query head in f64 over positions lo..=pos.
fn attend_f64(q: &[f32], cache: &Cache, layer: usize, kvh: usize, lo: usize, pos: usize) -> Vec<f64> {
    let hd = q.len();
    let scale = 1.0 / (hd as f64).sqrt();
    let scores: Vec<f64> = (lo..=pos).map(|j| q.iter().zip(cache.head(j, layer, 0, kvh, hd)).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum::<f64>() * scale).collect();
    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
    let total: f64 = e.iter().sum();
    let mut out = vec![0f64; hd];
    for (j, p) in (lo..=pos).zip(&e) {
        for (o, &v) in out.iter_mut().zip(cache.head(j, layer, 1, kvh, hd)) {
            *o += p * f64::from(v);
        }
    }
    out.iter().map(|o| o / total).collect()
}

/// engine/src/forward/ops.rs `dot`: fixed-order f32 dot product with 8 partial sums.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8;
    for i in 0..chunks {
        let (x, y) = (&a[i * 8..i * 8 + 8], &b[i * 8..i * 8 + 8]);
        for j in 0..8 {
            acc[j] += x[j] * y[j];
        }
    }
    let mut tail = 0f32;
    for i in chunks * 8..a.len() {
        tail += a[i] * b[i];
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// engine/src/forward/ops.rs `splitk_bf16`, the attn_splitk_bf16 patch: per chunk of `chunk` scores the
/// max m, the exp-sum s and the normalised output are rounded to bf16; the merge is f32.
fn splitk_bf16<'v>(scores: &[f32], value: impl Fn(usize) -> &'v [f32], chunk: usize, out: &mut [f32]) {
    let mut parts: Vec<(f32, f32, Vec<f32>)> = Vec::with_capacity(scores.len().div_ceil(chunk));
    for (c, block) in scores.chunks(chunk).enumerate() {
        let m = block.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut s = 0f32;
        let mut o = vec![0f32; out.len()];
        for (j, score) in block.iter().enumerate() {
            let p = (score - m).exp();
            s += p;
            for (o, v) in o.iter_mut().zip(value(c * chunk + j)) {
                *o += p * v;
            }
        }
        for v in o.iter_mut() {
            *v = bf16(*v / s);
        }
        parts.push((bf16(m), bf16(s), o));
    }
    let max = parts.iter().map(|p| p.0).fold(f32::NEG_INFINITY, f32::max);
    let mut total = 0f32;
    out.fill(0.0);
    for (m, s, o) in &parts {
        let w = s * (m - max).exp();
        total += w;
        for (acc, v) in out.iter_mut().zip(o) {
            *acc += w * v;
        }
    }
    for v in out.iter_mut() {
        *v /= total;
    }
}

/// The CPU engine's split-K attention of one query head over positions first..=pos (f32 scores).
fn attend_splitk(q: &[f32], cache: &Cache, layer: usize, kvh: usize, first: usize, pos: usize, chunk: usize) -> Vec<f32> {
    let hd = q.len();
    let scale = 1.0 / (hd as f32).sqrt();
    let scores: Vec<f32> = (first..=pos).map(|j| dot(q, cache.head(j, layer, 0, kvh, hd)) * scale).collect();
    let mut out = vec![0f32; hd];
    splitk_bf16(&scores, |j| cache.head(first + j, layer, 1, kvh, hd), chunk, &mut out);
    out
}

/// First visible position of a query at `pos` (`window` 0: all).
fn window_start(pos: usize, window: usize) -> usize {
    if window > 0 {
        (pos + 1).saturating_sub(window)
    } else {
        0
    }
}

/// Query rows in the fused qkv layout: q random, the k and v parts NaN (attention must not read them).
fn query_rows(rng: &mut Rng, n: usize, s: &AttentionShape) -> Vec<f32> {
    let (q_dim, stride) = (s.heads * s.head_dim, (s.heads + 2 * s.kv_heads) * s.head_dim);
    let mut qkv = vec![f32::NAN; n * stride];
    for t in 0..n {
        qkv[t * stride..t * stride + q_dim].copy_from_slice(&rng.vec(q_dim, 1.0));
    }
    qkv
}

fn shape_name(s: &AttentionShape) -> String {
    format!("h{}/{} hd{}", s.heads, s.kv_heads, s.head_dim)
}

fn check_prefill(dev: &Device, rng: &mut Rng, rep: &mut Report) -> Res {
    let st = &dev.stream;
    let small = AttentionShape { n_layers: 3, heads: 9, kv_heads: 3, head_dim: 64, window: 0 };
    let large = AttentionShape { n_layers: 2, heads: 32, kv_heads: 8, head_dim: 128, window: 0 };
    let layer = 1;
    for (shape, start, n) in [(small, 300usize, 37usize), (small, 0, 100), (large, 300, 37)] {
        let (hd, kv_dim, stride) = (shape.head_dim, shape.kv_heads * shape.head_dim, (shape.heads + 2 * shape.kv_heads) * shape.head_dim);
        let len = start + n;
        let cache = Cache::random(rng, len + 3, shape.n_layers, layer, kv_dim, len);
        let qkv = query_rows(rng, n, &shape);
        let (dcache, dq) = (st.clone_htod(&cache.data)?, st.clone_htod(&qkv)?);
        let base = dcache.device_ptr(st).0;
        for window in [0usize, 64] {
            let s = AttentionShape { window, ..shape };
            let width = s.heads * hd;
            let mut out = nan_buf(st, n * width + TAIL)?;
            dev.attn_prefill(&dq.as_view(), base, layer, &mut out.as_view_mut(), n, start, &s)?;
            let got = read(st, &out)?;
            let mut want = Vec::with_capacity(n * width);
            for t in 0..n {
                let pos = start + t;
                for h in 0..s.heads {
                    let q = &qkv[t * stride + h * hd..t * stride + (h + 1) * hd];
                    want.extend(attend_f64(q, &cache, layer, h / (s.heads / s.kv_heads), window_start(pos, window), pos));
                }
            }
            let name = format!("attn_prefill {} L1/{} start {start} n {n} win {window}", shape_name(&s), s.n_layers);
            rep.single(name, F32_LIMIT, compare(&got[..n * width], &want).tail(&got[n * width..]));
        }
    }
    Ok(())
}

fn check_decode(dev: &Device, rng: &mut Rng, rep: &mut Report) -> Res {
    let st = &dev.stream;
    let shapes = [
        AttentionShape { n_layers: 3, heads: 9, kv_heads: 3, head_dim: 64, window: 0 },
        AttentionShape { n_layers: 2, heads: 32, kv_heads: 8, head_dim: 128, window: 0 },
        // Group 16 (the most): four heads per warp.
        AttentionShape { n_layers: 2, heads: 16, kv_heads: 1, head_dim: 64, window: 0 },
    ];
    let layer = 1;
    let positions: Vec<i32> = vec![0, 1, 31, 700, 2000];
    let n = positions.len();
    let dpos = st.clone_htod(&positions)?;
    for shape in shapes {
        let (hd, kv_dim, stride) = (shape.head_dim, shape.kv_heads * shape.head_dim, (shape.heads + 2 * shape.kv_heads) * shape.head_dim);
        let width = shape.heads * hd;
        let group = shape.heads / shape.kv_heads;
        // One cache per row (a spare poisoned position after each row's own).
        let caches: Vec<Cache> = positions.iter().map(|&p| Cache::random(rng, p as usize + 2, shape.n_layers, layer, kv_dim, p as usize + 1)).collect();
        let dcaches = caches.iter().map(|c| st.clone_htod(&c.data)).collect::<Result<Vec<_>, _>>()?;
        let bases: Vec<u64> = dcaches.iter().map(|c| c.device_ptr(st).0).collect();
        let dbase = st.clone_htod(&bases)?;
        let qkv = query_rows(rng, n, &shape);
        let dq = st.clone_htod(&qkv)?;
        let mut rows = [
            Row::new(format!("attn_decode {} (vs f64)", shape_name(&shape)), F32_LIMIT),
            Row::new(format!("attn_decode {} splitk16 (vs emulation)", shape_name(&shape)), SPLITK_LIMIT),
        ];
        for window in [0usize, 100] {
            let s = AttentionShape { window, ..shape };
            // The exact answer (f64) and the CPU engine's split-K emulation (chunks of 16).
            let (mut exact_ref, mut splitk_ref) = (Vec::with_capacity(n * width), Vec::with_capacity(n * width));
            for (t, cache) in caches.iter().enumerate() {
                let pos = positions[t] as usize;
                for h in 0..s.heads {
                    let q = &qkv[t * stride + h * hd..t * stride + (h + 1) * hd];
                    exact_ref.extend(attend_f64(q, cache, layer, h / group, window_start(pos, window), pos));
                    splitk_ref.extend(to_f64(&attend_splitk(q, cache, layer, h / group, window_start(pos, window), pos, 16)));
                }
            }
            for (row, chunk) in rows.iter_mut().zip([0usize, 16]) {
                for splits in [1usize, 7, 32] {
                    let slots = n * s.heads * splits;
                    let (mut part_o, mut part_ml) = (nan_buf(st, slots * hd)?, nan_buf(st, slots * 2)?);
                    let mut out = nan_buf(st, n * width + TAIL)?;
                    dev.attn_decode(&dq.as_view(), &dpos.as_view(), &dbase.as_view(), layer, (&mut part_o.as_view_mut(), &mut part_ml.as_view_mut()), &mut out.as_view_mut(), n, splits, chunk, &s)?;
                    let got = read(st, &out)?;
                    let unwritten = read(st, &part_o)?.iter().chain(&read(st, &part_ml)?).filter(|v| v.is_nan()).count();
                    let (gate, other) = if chunk == 0 { (&exact_ref, &splitk_ref) } else { (&splitk_ref, &exact_ref) };
                    let c = compare(&got[..n * width], gate).tail(&got[n * width..]).flag(unwritten, "partials unwritten");
                    let o = compare(&got[..n * width], other).rel;
                    let vs = if chunk == 0 { "vs emulation" } else { "vs f64" };
                    row.add(&format!("win {window} splits {splits}, {vs} {o:.1e}"), c);
                }
            }
        }
        rep.rows.extend(rows);
    }
    Ok(())
}

/// Limit of the split-K kernel against the CPU emulation. Both round each chunk's max, exp-sum and
/// output to bf16, but from f32 values computed in another order (dot products, expf, warp sums), so
/// a value next to a bf16 rounding boundary now and then rounds the other way: a CPU model of the
/// kernel's order against the emulation, on these shapes and positions, gave 5e-7 median, 5e-5 at the
/// 99th percentile and 1.5e-4 at worst over 1380 random draws; without the bf16 roundings the answer is
/// 1.3e-3 or more away from the emulation (the note shows that distance, "vs f64").
const SPLITK_LIMIT: f64 = 5e-4;

// ---------------------------------------------------------------------------------------------------
// Sampling.

/// log-softmax of `row` at index `i`, temperature 1, in f64.
fn log_softmax_at(row: &[f32], i: usize) -> f64 {
    let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
    let sum: f64 = row.iter().map(|&v| (f64::from(v) - m).exp()).sum();
    f64::from(row[i]) - m - sum.ln()
}

/// First index of the largest value.
fn first_argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

fn check_argmax(dev: &Device, rng: &mut Rng, rep: &mut Report) -> Res {
    let s = &dev.stream;
    for vocab in [49152usize, 128_256] {
        let rows = 5;
        let mut logits = rng.vec(rows * vocab, 4.0);
        let unique = rng.below(vocab);
        logits[unique] = 9.0; // row 0: a unique maximum
        for i in [300, 5000] {
            logits[vocab + i] = 9.0; // row 1: a tie across warps (300 wins)
        }
        for i in [7, 7 + 1024, vocab - 1] {
            logits[2 * vocab + i] = 9.0; // row 2: a tie within one thread's stride and at the end (7 wins)
        }
        logits[3 * vocab + vocab - 1] = 9.0; // row 3: the maximum at the last index; row 4: as drawn
        let dl = s.clone_htod(&logits)?;
        let mut tok = s.clone_htod(&vec![-1i32; rows + TAIL])?;
        let mut lp = nan_buf(s, rows + TAIL)?;
        dev.argmax(&dl.as_view(), rows, vocab, &mut tok.as_view_mut(), &mut lp.as_view_mut())?;
        let (got_tok, got_lp) = (read(s, &tok)?, read(s, &lp)?);
        let want_tok: Vec<usize> = (0..rows).map(|r| first_argmax(&logits[r * vocab..(r + 1) * vocab])).collect();
        let wrong = (0..rows).filter(|&r| got_tok[r] != want_tok[r] as i32).count();
        let want_lp: Vec<f64> = (0..rows).map(|r| log_softmax_at(&logits[r * vocab..(r + 1) * vocab], want_tok[r])).collect();
        let stray = got_tok[rows..].iter().filter(|&&t| t != -1).count();
        let c = compare(&got_lp[..rows], &want_lp).tail(&got_lp[rows..]).flag(wrong, "wrong tokens").flag(stray, "tokens written past the end");
        rep.single(format!("argmax_logprob vocab {vocab} (ties: first)"), F32_LIMIT, c);
    }
    Ok(())
}

/// The host sampler's kept set at temperature `t`: the most probable tokens whose mass first reaches
/// `top_p`, with their renormalised probabilities, and the cut's margin (distance of top_p from the
/// mass just before and at the cut; small margins make the test ambiguous, not the kernel wrong).
fn kept_set(row: &[f32], t: f64, top_p: f64) -> (Vec<(usize, f64)>, f64) {
    let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
    let p: Vec<f64> = row.iter().map(|&v| ((f64::from(v) - m) / t).exp()).collect();
    let total: f64 = p.iter().sum();
    let mut order: Vec<usize> = (0..row.len()).collect();
    order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
    let (mut cum, mut kept) = (0.0, Vec::new());
    for &i in &order {
        let before = cum;
        cum += p[i] / total;
        kept.push(i);
        if cum >= top_p {
            let margin = (top_p - before).min(cum - top_p);
            let mass: f64 = kept.iter().map(|&k| p[k]).sum();
            return (kept.iter().map(|&k| (k, p[k] / mass)).collect(), margin);
        }
    }
    let mass: f64 = kept.iter().map(|&k| p[k]).sum();
    (kept.iter().map(|&k| (k, p[k] / mass)).collect(), 0.0)
}

/// One top_p_sample launch over the rows of `logits` (one row per entry of `temps`): tokens, logprobs
/// and the count of outputs written past the end.
fn top_p_launch(dev: &Device, logits: &[f32], vocab: usize, temps: &[f32], top_ps: &[f32], uniforms: &[f32]) -> Res<(Vec<i32>, Vec<f32>, usize)> {
    let s = &dev.stream;
    let rows = temps.len();
    let (dl, dt, dp, du) = (s.clone_htod(logits)?, s.clone_htod(temps)?, s.clone_htod(top_ps)?, s.clone_htod(uniforms)?);
    let mut tok = s.clone_htod(&vec![-1i32; rows + TAIL])?;
    let mut lp = nan_buf(s, rows + TAIL)?;
    dev.top_p(&dl.as_view(), rows, vocab, (&dt.as_view(), &dp.as_view(), &du.as_view()), &mut tok.as_view_mut(), &mut lp.as_view_mut())?;
    let (got_tok, got_lp) = (read(s, &tok)?, read(s, &lp)?);
    let stray = got_tok[rows..].iter().filter(|&&t| t != -1).count() + got_lp[rows..].iter().filter(|v| !v.is_nan()).count();
    Ok((got_tok[..rows].to_vec(), got_lp[..rows].to_vec(), stray))
}

fn check_top_p(dev: &Device, rng: &mut Rng, rep: &mut Report) -> Res {
    let vocab = 49152usize;
    // Every drawn token's reported log-probability (temperature 1), over all the cases below.
    let (mut lp_got, mut lp_want, mut lp_bad) = (Vec::new(), Vec::new(), 0usize);
    let mut record_lp = |logits: &[f32], vocab: usize, tokens: &[i32], lps: &[f32]| {
        for (r, (&t, &lp)) in tokens.iter().zip(lps).enumerate() {
            if t >= 0 && (t as usize) < vocab {
                lp_got.push(lp);
                lp_want.push(log_softmax_at(&logits[r * vocab..(r + 1) * vocab], t as usize));
            } else {
                lp_bad += 1;
            }
        }
    };

    // (a) top_p 1e-6 keeps only the most probable token, whatever the uniform and temperature.
    let rows = 8;
    let mut logits = rng.vec(rows * vocab, 4.0);
    let mut argmax = Vec::with_capacity(rows);
    for r in 0..rows {
        let i = rng.below(vocab);
        logits[r * vocab + i] = 6.0;
        argmax.push(i as i32);
    }
    let temps = [0.5f32, 0.7, 1.0, 1.3, 1.0, 0.9, 1.1, 2.0];
    let uniforms = [0.0f32, 0.999, 0.5, 0.25, 0.75, 0.123, 0.9999, 0.6];
    let (tokens, lps, stray) = top_p_launch(dev, &logits, vocab, &temps, &[1e-6; 8], &uniforms)?;
    let wrong = tokens.iter().zip(&argmax).filter(|(a, b)| a != b).count();
    let mut c = Cmp { elems: rows, ..Cmp::default() }.flag(wrong, "not the argmax").flag(stray, "written past the end");
    c.why = if c.why.is_empty() { String::new() } else { format!("{} (got {tokens:?}, want {argmax:?})", c.why) };
    rep.single("top_p (a) top_p 1e-6 = argmax", 0.0, c);
    record_lp(&logits, vocab, &tokens, &lps);

    // (b) four dominant tokens over a faint background; every draw must land in the CPU's kept set,
    // with frequencies near the renormalised probabilities (stratified uniforms, 200 rows).
    let dominant = [(17usize, 2.0f32), (4099, 1.7), (30000, 1.5), (49151, 1.0)];
    let mut row_logits: Vec<f32> = (0..vocab).map(|_| -12.0 + rng.sym(2.0)).collect();
    for (i, v) in dominant {
        row_logits[i] = v;
    }
    let rows = 200;
    let logits: Vec<f32> = (0..rows).flat_map(|_| row_logits.iter().copied()).collect();
    for (t, top_p) in [(1.0f32, 0.5f32), (1.0, 0.75), (0.8, 0.9)] {
        let (kept, margin) = kept_set(&row_logits, f64::from(t), f64::from(top_p));
        let uniforms: Vec<f32> = (0..rows).map(|i| ((i as f64 + rng.unit()) / rows as f64) as f32).collect();
        let (tokens, lps, stray) = top_p_launch(dev, &logits, vocab, &vec![t; rows], &vec![top_p; rows], &uniforms)?;
        let outside = tokens.iter().filter(|&&tok| !kept.iter().any(|&(k, _)| k as i32 == tok)).count();
        let mut worst_freq = 0f64;
        for &(k, p) in &kept {
            let freq = tokens.iter().filter(|&&tok| tok == k as i32).count() as f64 / rows as f64;
            worst_freq = worst_freq.max((freq - p).abs());
        }
        let mut row = Row::new(format!("top_p (b) t {t} top_p {top_p}: kept set of {}", kept.len()), 0.03);
        // The table's "rel err" column holds the largest |frequency - probability| here.
        let c = Cmp { elems: rows, rel: worst_freq, ..Cmp::default() }.flag(outside, "draws outside the kept set").flag(stray, "written past the end");
        row.add(&format!("cut margin {margin:.3}, worst |freq - p| {worst_freq:.3}"), c);
        rep.rows.push(row);
        record_lp(&logits, vocab, &tokens, &lps);
    }

    // (d) top_p 1.0 over a 128256 vocabulary: any token, still with its log-probability.
    let (big, rows) = (128_256usize, 4usize);
    let logits = rng.vec(rows * big, 3.0);
    let (tokens, lps, stray) = top_p_launch(dev, &logits, big, &[1.0; 4], &[1.0; 4], &[0.1, 0.4, 0.7, 0.95])?;
    record_lp(&logits, big, &tokens, &lps);

    let c = compare(&lp_got, &lp_want).flag(lp_bad, "tokens out of range").flag(stray, "written past the end");
    rep.single("top_p (c) logprob at t=1 vs f64", F32_LIMIT, c);
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// Expected errors.

/// Every wrapper must refuse a shape its kernel cannot take (an error, not a launch).
fn check_shapes(dev: &Device, _rng: &mut Rng, rep: &mut Report) -> Res {
    let s = &dev.stream;
    let mut row = Row::new("wrapper shape checks (each must be an error)", 0.0);
    let mut expect_err = |what: &str, r: Result<(), DeviceError>| {
        let accepted = usize::from(r.is_ok());
        row.add(what, Cmp { elems: 1, ..Cmp::default() }.flag(accepted, "accepted"));
    };
    let big = nan_buf(s, 1 << 16)?;
    let mut out = nan_buf(s, 1 << 16)?;
    let m16 = Matrix::upload(s, &vec![0.5; 16 * 16], 16, 16, true)?;
    let m_cols12 = Matrix::upload(s, &vec![0.5; 16 * 12], 16, 12, true)?;
    let m_odd = Matrix::upload(s, &vec![0.5; 15 * 16], 15, 16, false)?;
    expect_err("gemv n=9", dev.gemv(&m16, &big.as_view(), &mut out.as_view_mut(), 9, GemvMode::Store, false));
    expect_err("gemv n=0", dev.gemv(&m16, &big.as_view(), &mut out.as_view_mut(), 0, GemvMode::Store, false));
    expect_err("gemv cols 12", dev.gemv(&m_cols12, &big.as_view(), &mut out.as_view_mut(), 1, GemvMode::Store, false));
    expect_err("gemv SwiGlu odd rows", dev.gemv(&m_odd, &big.as_view(), &mut out.as_view_mut(), 1, GemvMode::SwiGlu, false));
    expect_err("gemv y short", dev.gemv(&m16, &big.as_view(), &mut out.slice_mut(0..2 * 16 - 1), 2, GemvMode::Store, false));
    expect_err("gemv x short", dev.gemv(&m16, &big.slice(0..2 * 16 - 1), &mut out.as_view_mut(), 2, GemvMode::Store, false));
    expect_err("rmsnorm w != dim", dev.rmsnorm(&big.as_view(), None, &big.slice(0..63), &mut out.as_view_mut(), 2, 64, 1e-5, false));
    expect_err("rmsnorm out short", dev.rmsnorm(&big.as_view(), None, &big.slice(0..64), &mut out.slice_mut(0..127), 2, 64, 1e-5, false));
    let rows = s.clone_htod(&[0i32, 1])?;
    expect_err("rmsnorm row map short", dev.rmsnorm(&big.as_view(), Some(&rows.as_view()), &big.slice(0..64), &mut out.as_view_mut(), 3, 64, 1e-5, false));
    expect_err("q8_blocks n=33", dev.q8_blocks(&mut out.as_view_mut(), 33));
    expect_err("swiglu out short", dev.swiglu(&big.as_view(), &mut out.slice_mut(0..99), 1, 100));
    expect_err("embed out short", dev.embed(&m16, &rows.as_view(), &mut out.slice_mut(0..31), 2));
    let bases = s.clone_htod(&[big.device_ptr(s).0; 2])?;
    let rope = RopeShape { n_layers: 1, heads: 2, kv_heads: 1, head_dim: 7, base: 10000.0, flags: 0, kv_scale: 1.0 };
    expect_err("rope_kv odd head_dim", dev.rope_kv(&mut out.as_view_mut(), &rows.as_view(), &bases.as_view(), 2, 0, &rope));
    let rope = RopeShape { head_dim: 8, ..rope };
    expect_err("rope_kv qkv short", dev.rope_kv(&mut out.slice_mut(0..2 * 32 - 1), &rows.as_view(), &bases.as_view(), 2, 0, &rope));
    let attn = AttentionShape { n_layers: 1, heads: 34, kv_heads: 2, head_dim: 64, window: 0 };
    let (mut po, mut pml) = (nan_buf(s, 1 << 14)?, nan_buf(s, 1 << 10)?);
    expect_err("attn_decode group 17", dev.attn_decode(&big.as_view(), &rows.as_view(), &bases.as_view(), 0, (&mut po.as_view_mut(), &mut pml.as_view_mut()), &mut out.as_view_mut(), 1, 1, 0, &attn));
    let attn = AttentionShape { heads: 4, kv_heads: 2, ..attn };
    expect_err("attn_decode part_ml short", dev.attn_decode(&big.as_view(), &rows.as_view(), &bases.as_view(), 0, (&mut po.as_view_mut(), &mut pml.slice_mut(0..2 * 4 * 2 * 2 - 1)), &mut out.as_view_mut(), 2, 2, 0, &attn));
    expect_err("attn_decode splits 0", dev.attn_decode(&big.as_view(), &rows.as_view(), &bases.as_view(), 0, (&mut po.as_view_mut(), &mut pml.as_view_mut()), &mut out.as_view_mut(), 1, 0, 0, &attn));
    let attn = AttentionShape { head_dim: 256, ..attn };
    expect_err("attn_prefill head_dim 256", dev.attn_prefill(&big.as_view(), big.device_ptr(s).0, 0, &mut out.as_view_mut(), 1, 0, &attn));
    let attn = AttentionShape { heads: 3, head_dim: 64, ..attn };
    expect_err("attn_prefill heads % kv_heads", dev.attn_prefill(&big.as_view(), big.device_ptr(s).0, 0, &mut out.as_view_mut(), 1, 0, &attn));
    expect_err("argmax logits short", dev.argmax(&big.slice(0..2 * 100 - 1), 2, 100, &mut s.clone_htod(&[0i32; 2])?.as_view_mut(), &mut out.as_view_mut()));
    expect_err("Matrix::upload count", Matrix::upload(s, &[0.0; 10], 3, 3, false).map(|_| ()));
    let blas = Blas::new(s.clone())?;
    let bits = s.clone_htod(&[0u16; 64])?;
    let mf = Matrix::upload(s, &vec![0.5; 16 * 16], 16, 16, false)?;
    let bits_view = bits.as_view();
    expect_err("matmul f32 weights, bf16 x", blas.matmul(&mf, Activations::Bf16(&bits_view), &mut out.as_view_mut(), 1, Compute::F32, false));
    rep.rows.push(row);
    Ok(())
}

/// After every launch above, the stream must be clean: a fault would have surfaced at a read, but a
/// final synchronize makes sure nothing is pending.
fn check_sticky(dev: &Device, _rng: &mut Rng, rep: &mut Report) -> Res {
    dev.stream.synchronize()?;
    dev.ctx.synchronize()?;
    rep.single("stream and context synchronize clean", 0.0, Cmp::default());
    Ok(())
}
