//! The golden dot product on AVX2, for a tile of `R` weight rows by `T` input rows. Each (row, input)
//! pair keeps one 8-lane accumulator updated as `acc = acc + w * x` (a multiply, then an add: never
//! fused) eight elements at a time in element order, and ends with `ops::dot`'s reduction, so every
//! result has the bits of `ops::dot(W[r], x[t])`. The weights come either from f32 rows or from the
//! file's quantized blocks, each element dequantized with the loader's arithmetic (Q4_1 `q*d + m`,
//! Q4_0 `(q-8)*d`, Q8_0 `q*d`, d and m converted exactly from f16), which gives the f32 value the
//! loader stored: decode then reads an eighth of the bytes for the same result.

use std::arch::x86_64::*;

use super::{Source, F32, Q4_0, Q4_1, Q8_0};

/// `ahead`: how many bytes past each block to prefetch (quantized sources; 0 for none).
/// Pointers to `R` weight rows of `nb` blocks of 32 elements in the layout of `S`, and `T` input
/// rows of `nb * 32` f32 starting at `x` with stride `cols`.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; each row must hold `nb` blocks of its source's layout
/// (f32: 128 bytes a block; Q4_1: 20; Q4_0: 18; Q8_0: 34) and the `T` input rows must be in bounds.
/// Every input row is read for every weight row: `T` > 1 only for rows that stay in cache.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile<const S: Source, const R: usize, const T: usize>(
    rows: [*const u8; R],
    nb: usize,
    x: *const f32,
    cols: usize,
    ahead: usize,
) -> [[f32; T]; R] {
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    for b in 0..nb {
        for (row, acc) in rows.iter().zip(acc.iter_mut()) {
            if S != F32 && ahead > 0 {
                // A hint only: it never faults, so the address may run past the matrix.
                _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(b * block_bytes::<S>() + ahead) as *const i8);
            }
            let w = weights::<S>(*row, b);
            for (t, acc) in acc.iter_mut().enumerate() {
                let xt = x.add(t * cols + b * 32);
                for (c, wc) in w.iter().enumerate() {
                    *acc = _mm256_add_ps(*acc, _mm256_mul_ps(*wc, _mm256_loadu_ps(xt.add(c * 8))));
                }
            }
        }
    }
    acc.map(|row| {
        row.map(|v| {
            let mut a = [0f32; 8];
            _mm256_storeu_ps(a.as_mut_ptr(), v);
            // `ops::dot`'s reduction, its empty tail included (it turns -0 into +0).
            ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7])) + 0.0
        })
    })
}

/// Bytes per block of 32 weights.
#[inline(always)]
pub const fn block_bytes<const S: Source>() -> usize {
    match S {
        Q4_1 => 20,
        Q4_0 => 18,
        Q8_0 => 34,
        _ => 128,
    }
}

/// The 32 weights of block `b` of a row, as four vectors of 8 in element order.
#[inline(always)]
unsafe fn weights<const S: Source>(row: *const u8, b: usize) -> [__m256; 4] {
    match S {
        F32 => {
            let p = (row as *const f32).add(b * 32);
            [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)), _mm256_loadu_ps(p.add(16)), _mm256_loadu_ps(p.add(24))]
        }
        Q4_1 => {
            let blk = row.add(b * block_bytes::<S>());
            let d = _mm256_set1_ps(half(blk));
            let m = _mm256_set1_ps(half(blk.add(2)));
            let [q0, q1, q2, q3] = nibbles(blk.add(4));
            // The loader's `q as f32 * d + m`: rounded after the product and after the sum.
            let f = |q: __m256i| _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q), d), m);
            [f(q0), f(q1), f(q2), f(q3)]
        }
        Q4_0 => {
            let blk = row.add(b * block_bytes::<S>());
            let d = _mm256_set1_ps(half(blk));
            let eight = _mm256_set1_epi32(8);
            let [q0, q1, q2, q3] = nibbles(blk.add(2));
            let f = |q: __m256i| _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q, eight)), d);
            [f(q0), f(q1), f(q2), f(q3)]
        }
        _ => {
            let blk = row.add(b * block_bytes::<S>());
            let d = _mm256_set1_ps(half(blk));
            let q = |at: usize| _mm256_cvtepi8_epi32(_mm_loadl_epi64(blk.add(2 + at) as *const __m128i));
            let f = |q: __m256i| _mm256_mul_ps(_mm256_cvtepi32_ps(q), d);
            [f(q(0)), f(q(8)), f(q(16)), f(q(24))]
        }
    }
}

/// The f16 at `p` as f32 (exact).
#[inline(always)]
unsafe fn half(p: *const u8) -> f32 {
    let bits = std::ptr::read_unaligned(p as *const u16);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// 16 bytes of nibbles as 32 integers in the blocks' element order: the low nibbles of bytes 0..16,
/// then the high nibbles.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> [__m256i; 4] {
    let qs = _mm_loadu_si128(p as *const __m128i);
    let mask = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(qs, mask);
    let hi = _mm_and_si128(_mm_srli_epi16(qs, 4), mask);
    [
        _mm256_cvtepu8_epi32(lo),
        _mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)),
        _mm256_cvtepu8_epi32(hi),
        _mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)),
    ]
}
