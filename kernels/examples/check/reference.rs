//! CPU references shared by several sections: the number formats the kernels round to (bf16, FP8
//! e4m3, f16, Q8_0) as exact emulations of engine/src/patch/round.rs, f64 dot products over all cores,
//! and the CPU engine's fixed-order f32 dot and bf16 split-K merge (engine/src/forward/ops.rs).

use ctxscope_kernels::device::f32_to_bf16_bits;

/// bf16, round to nearest even (the kernels' `round_bf16`, the CPU's `patch::round::bf16`).
pub(crate) fn bf16(x: f32) -> f32 {
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
pub(crate) fn fp8_scaled(x: f32, scale: f32) -> f32 {
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
    let step = if a < 2f32.powi(-14) { 2f32.powi(-24) } else { 2f32.powi(((a.to_bits() >> 23) & 0xff) as i32 - 127 - 10) };
    ((a / step).round_ties_even() * step).copysign(x)
}

/// llama.cpp's Q8_0 activation rounding: a copy of engine/src/patch/round.rs `q8_blocks`, d in f16.
pub(crate) fn q8_blocks(x: &mut [f32]) {
    for block in x.chunks_mut(32) {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = f16_round(amax / 127.0);
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        for v in block.iter_mut() {
            *v = (*v * id).round_ties_even() * d;
        }
    }
}

/// Runs `f(row, out_row)` for every row of `out` (rows of `width`) on all cores.
pub(crate) fn par_rows(out: &mut [f64], width: usize, f: impl Fn(usize, &mut [f64]) + Sync) {
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
pub(crate) fn dots(w: &[f32], w_bf16: bool, x: &[f32], x_bf16: bool, cols: usize, tokens: usize) -> Vec<f64> {
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

/// engine/src/forward/ops.rs `dot`: fixed-order f32 dot product with 8 partial sums.
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
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
pub(crate) fn splitk_bf16<'v>(scores: &[f32], value: impl Fn(usize) -> &'v [f32], chunk: usize, out: &mut [f32]) {
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
