//! Activation rows quantized to 8 bits per block of 32, once per product group: ggml's Q8_1 (scale d
//! and s = d * sum of the quants, both rounded to f16) which also serves as Q8_0 (s unused). The rounding
//! is that of ggml's AVX2 `quantize_row_q8_1`/`quantize_row_q8_0`: id = 127 / amax, q = round half to
//! even (x * id), d = amax / 127 stored as f16; the scalar and AVX2 builds of `quantize_row` below
//! are the same source, so they agree bit for bit.

use ctxscope_formats::gguf::f16_to_f32;
use rayon::prelude::*;

/// Activation rows from which quantization is spread over the thread pool.
const PARALLEL_ROWS: usize = 32;

/// Elements per quantization block (all the block formats this path reads).
pub const BLOCK: usize = 32;

/// `n` activation rows of `nb` blocks each: quants row-major, scales as the f32 values of their f16.
pub struct QuantRows {
    pub nb: usize,
    /// `n * nb * 32` quants, row after row.
    pub qs: Vec<i8>,
    /// d of block `b` of row `t` at `t * nb + b`.
    pub d: Vec<f32>,
    /// s (= d * sum of the block's quants) at `t * nb + b`.
    pub s: Vec<f32>,
}

impl QuantRows {
    /// Quantizes `n` rows of `cols` values (`cols` a multiple of 32).
    pub fn new(x: &[f32], n: usize, cols: usize, simd: bool) -> QuantRows {
        debug_assert_eq!(cols % BLOCK, 0);
        let nb = cols / BLOCK;
        let mut rows = QuantRows { nb, qs: vec![0; n * cols], d: vec![0.0; n * nb], s: vec![0.0; n * nb] };
        let quantize = |t: usize, qs: &mut [i8], d: &mut [f32], s: &mut [f32]| {
            let xr = &x[t * cols..(t + 1) * cols];
            #[cfg(target_arch = "x86_64")]
            if simd {
                // SAFETY: `simd` is true only when the caller detected AVX2, FMA and F16C.
                return unsafe { quantize_row_avx2(xr, qs, d, s) };
            }
            let _ = simd;
            quantize_row(xr, qs, d, s)
        };
        if n >= PARALLEL_ROWS {
            let parts = rows.qs.par_chunks_mut(cols).zip(rows.d.par_chunks_mut(nb)).zip(rows.s.par_chunks_mut(nb));
            parts.enumerate().for_each(|(t, ((qs, d), s))| quantize(t, qs, d, s));
        } else {
            for (t, ((qs, d), s)) in rows.qs.chunks_mut(cols).zip(rows.d.chunks_mut(nb)).zip(rows.s.chunks_mut(nb)).enumerate() {
                quantize(t, qs, d, s);
            }
        }
        rows
    }

    /// The 32 quants of block `b` of row `t`.
    #[inline(always)]
    pub fn block(&self, t: usize, b: usize) -> &[i8] {
        let at = (t * self.nb + b) * BLOCK;
        &self.qs[at..at + BLOCK]
    }
}

/// The same code compiled with AVX2 enabled, so `round_ties_even` becomes `vroundps` and the loops
/// vectorize; IEEE f32 multiply and round give the same bits either way.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_row_avx2(x: &[f32], qs: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    quantize_row(x, qs, d, s)
}

#[inline(always)]
fn quantize_row(x: &[f32], qs: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    for (b, (xb, qb)) in x.chunks_exact(BLOCK).zip(qs.chunks_exact_mut(BLOCK)).enumerate() {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let scale = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (q, v) in qb.iter_mut().zip(xb) {
            let r = (v * id).round_ties_even() as i32;
            *q = r as i8;
            sum += r;
        }
        d[b] = f16_to_f32(f32_to_f16(scale));
        s[b] = f16_to_f32(f32_to_f16(scale * sum as f32));
    }
}

/// f32 to IEEE half bits, rounding to nearest even (what F16C's `vcvtps2ph` with mode 0 and ggml's
/// `GGML_FP32_TO_FP16` give).
pub fn f32_to_f16(value: f32) -> u16 {
    let x = value.to_bits();
    let sign = (x & 0x8000_0000) >> 16;
    let exp = x & 0x7f80_0000;
    let man = x & 0x007f_ffff;
    if exp == 0x7f80_0000 {
        let nan = if man == 0 { 0 } else { 0x0200 };
        return (sign | 0x7c00 | nan | (man >> 13)) as u16;
    }
    let half_exp = ((exp >> 23) as i32) - 127 + 15;
    if half_exp >= 0x1f {
        return (sign | 0x7c00) as u16;
    }
    if half_exp <= 0 {
        if 14 - half_exp > 24 {
            return sign as u16;
        }
        let man = man | 0x0080_0000;
        let mut half_man = man >> (14 - half_exp);
        let round_bit = 1u32 << (13 - half_exp);
        if (man & round_bit) != 0 && (man & (3 * round_bit - 1)) != 0 {
            half_man += 1;
        }
        return (sign | half_man) as u16;
    }
    let bits = sign | ((half_exp as u32) << 10) | (man >> 13);
    let round_bit = 0x0000_1000u32;
    if (man & round_bit) != 0 && (man & (3 * round_bit - 1)) != 0 {
        (bits + 1) as u16
    } else {
        bits as u16
    }
}
