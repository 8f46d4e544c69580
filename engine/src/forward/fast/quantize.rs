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

/// [`quantize_row`] on AVX2: the same operations, 8 lanes at a time. The block maximum ignores NaN
/// as `f32::max` does (`maxps` returns its second operand, the running maximum, when the first is
/// NaN); `vroundps` rounds half to even like `round_ties_even`; a NaN product becomes 0 as Rust's
/// `as i32` makes it; d and s round to f16 with F16C (the same bits as [`f32_to_f16`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_row_avx2(x: &[f32], qs: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    use std::arch::x86_64::*;
    let f16 = |v: f32| _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph::<0>(_mm_set_ss(v))));
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (b, (xb, qb)) in x.chunks_exact(BLOCK).zip(qs.chunks_exact_mut(BLOCK)).enumerate() {
        let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(xb.as_ptr().add(8 * i)));
        let mut m = _mm256_setzero_ps();
        for v in v {
            m = _mm256_max_ps(_mm256_and_ps(v, abs_mask), m);
        }
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
        let scale = amax / 127.0;
        let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
        let q: [__m256i; 4] = std::array::from_fn(|i| {
            let p = _mm256_mul_ps(v[i], id);
            let r = _mm256_cvtps_epi32(_mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(p));
            _mm256_and_si256(r, _mm256_castps_si256(_mm256_cmp_ps::<_CMP_ORD_Q>(p, p)))
        });
        let sum4 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        let sum2 = _mm_add_epi32(_mm256_castsi256_si128(sum4), _mm256_extracti128_si256::<1>(sum4));
        let sum1 = _mm_add_epi32(sum2, _mm_shuffle_epi32::<0b01_00_11_10>(sum2));
        let sum = _mm_cvtsi128_si32(_mm_add_epi32(sum1, _mm_shuffle_epi32::<0b10_11_00_01>(sum1)));
        let packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256(qb.as_mut_ptr() as *mut __m256i, _mm256_permutevar8x32_epi32(packed, order));
        d[b] = f16(scale);
        s[b] = f16(scale * sum as f32);
    }
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
