//! CPU references shared by several sections: the number formats the kernels round to (bf16, FP8
//! e4m3, Q8_0) and the CPU engine's fixed-order f32 dot and bf16 split-K merge, from
//! `ctxscope_numerics` (the code the engine runs), f16 rounding as PTX does it, and f64 dot products
//! over all cores.

pub(crate) use ctxscope_numerics::round::bf16;
use ctxscope_numerics::round::fp8_e4m3;
pub(crate) use ctxscope_numerics::{dot, splitk_bf16};

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

/// llama.cpp's Q8_0 activation rounding (the engine's `q8_blocks`), d in f16.
pub(crate) fn q8_blocks(x: &mut [f32]) {
    ctxscope_numerics::round::q8_blocks(x, f16_round);
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
