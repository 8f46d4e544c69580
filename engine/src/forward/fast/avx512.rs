//! The VNNI kernel on 512-bit vectors for tiles of an even number of activation rows: each vector
//! holds two activation rows' blocks (one per 256-bit half) against the same weight block, so one
//! `vpdpbusd`, one conversion and one fused multiply-add serve two (row, token) pairs. Each half's 8
//! lanes get exactly what [`super::avx2::tile_vnni`] computes for that pair (the exact integer dot of
//! 4 bytes, scaled by `d_w * d_x` in f32 and accumulated with one FMA per block in block order), and
//! end in the same reduction, so the values are the same bits. Q4_0 and Q8_0 take the sign of the
//! weights into the activations by a mask (AVX-512 has no 512-bit `vpsignb`): where a weight is 0 its
//! absolute value is 0 and the product is 0 either way.

use std::arch::x86_64::*;

use super::avx2::{hsum8, nibbles};
use super::quantize::QuantRows;
use super::{Format, Q4_0, Q4_1};

/// `out[r][t] = W[r] . x[t0 + t]` for `T` even, the same values as [`super::scalar::tile`];
/// weights are prefetched `ahead` bytes past each block (none when 0).
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C and AVX-512 F, BW, DQ, VL and VNNI; every row must hold `acts.nb`
/// blocks of format `F` (20, 18 or 34 bytes each); `t0 + T` must not exceed the activation rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")]
pub unsafe fn tile<const F: Format, const R: usize, const T: usize>(
    rows: [&[u8]; R],
    acts: &QuantRows,
    t0: usize,
    ahead: usize,
) -> [[f32; T]; R] {
    assert!(T.is_multiple_of(2), "tokens in pairs");
    let nb = acts.nb;
    let block_bytes = match F {
        Q4_1 => 20,
        Q4_0 => 18,
        _ => 34,
    };
    for row in rows {
        assert!(row.len() >= nb * block_bytes, "weight row shorter than its blocks");
    }
    // Pair p holds tokens 2p and 2p + 1; entries past T / 2 stay unused.
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    let mut summs = [[0f32; T]; R];
    for b in 0..nb {
        let mut qy = [_mm512_setzero_si512(); T];
        let mut dy = [_mm512_setzero_ps(); T];
        let mut dys = [0f32; T];
        let mut sy = [0f32; T];
        for t in 0..T {
            dys[t] = acts.d[(t0 + t) * nb + b];
            sy[t] = acts.s[(t0 + t) * nb + b];
        }
        for p in 0..T / 2 {
            // SAFETY: `block` returns exactly 32 bytes; the loads are unaligned.
            let lo = _mm256_loadu_si256(acts.block(t0 + 2 * p, b).as_ptr() as *const __m256i);
            let hi = _mm256_loadu_si256(acts.block(t0 + 2 * p + 1, b).as_ptr() as *const __m256i);
            qy[p] = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
            dy[p] = _mm512_insertf32x8::<1>(_mm512_castps256_ps512(_mm256_set1_ps(dys[2 * p])), _mm256_set1_ps(dys[2 * p + 1]));
        }
        for r in 0..R {
            // SAFETY: the assert above keeps block `b` (block_bytes from `blk`) in the row.
            let blk = rows[r].as_ptr().add(b * block_bytes);
            if ahead > 0 {
                // A hint only: it never faults, so the address may run past the matrix.
                _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(ahead) as *const i8);
            }
            if F == Q4_1 {
                let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(blk as *const i32)));
                let (dw, mw) = (_mm_cvtss_f32(dm), _mm_cvtss_f32(_mm_movehdup_ps(dm)));
                let qx = _mm512_broadcast_i64x4(nibbles(blk.add(4)));
                let dwv = _mm512_set1_ps(dw);
                for p in 0..T / 2 {
                    let xy = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), qx, qy[p]));
                    // Each half: d_w * d_x of its token, as the 256-bit kernel's scalar product.
                    acc[r][p] = _mm512_fmadd_ps(_mm512_mul_ps(dwv, dy[p]), xy, acc[r][p]);
                }
                for t in 0..T {
                    summs[r][t] += mw * sy[t];
                }
            } else {
                let d16 = std::ptr::read_unaligned(blk as *const u16);
                let dw = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(d16 as i32)));
                let qx = if F == Q4_0 {
                    _mm256_sub_epi8(nibbles(blk.add(2)), _mm256_set1_epi8(8))
                } else {
                    _mm256_loadu_si256(blk.add(2) as *const __m256i)
                };
                let qx = _mm512_broadcast_i64x4(qx);
                let ax = _mm512_abs_epi8(qx);
                let negative = _mm512_movepi8_mask(qx);
                let dwv = _mm512_set1_ps(dw);
                for p in 0..T / 2 {
                    // y with x's sign: -y where x < 0 (|y| <= 127, so no overflow).
                    let sy = _mm512_mask_sub_epi8(qy[p], negative, _mm512_setzero_si512(), qy[p]);
                    let xy = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ax, sy));
                    acc[r][p] = _mm512_fmadd_ps(_mm512_mul_ps(dwv, dy[p]), xy, acc[r][p]);
                }
            }
        }
    }
    let mut out = [[0f32; T]; R];
    for ((out, acc), summs) in out.iter_mut().zip(&acc).zip(&summs) {
        for (t, o) in out.iter_mut().enumerate() {
            let pair = acc[t / 2];
            let lanes = if t % 2 == 0 { _mm512_castps512_ps256(pair) } else { _mm512_extractf32x8_ps::<1>(pair) };
            *o = hsum8(lanes);
            if F == Q4_1 {
                *o += summs[t];
            }
        }
    }
    out
}

/// Whether this CPU can run [`tile`].
pub fn available() -> bool {
    super::avx2::vnni_available()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512dq")
}
