//! The AVX2 + FMA (+ F16C for the f16 scales) kernels: ggml's `ggml_vec_dot_q4_1_q8_1` and
//! `ggml_vec_dot_q8_0_q8_0` / `_q4_0_q8_0` inner loops, extended to a tile of `R` weight rows by `T`
//! activation rows so each weight block is unpacked once and used `T` times. Every (row, token) pair
//! keeps its own accumulator, so the tile shape never changes a result. Two builds of one body: plain
//! AVX2 (`maddubs` then `madd` with ones, as ggml without VNNI) and AVX-512 VNNI on 256-bit vectors
//! (`vpdpbusd`, as ggml with `__AVX512VNNI__`); both give each lane the exact integer dot of 4 bytes.

use std::arch::x86_64::*;

use super::quantize::QuantRows;
use super::{Format, Q4_0, Q4_1};

macro_rules! tile_kernel {
    ($(#[$doc:meta])* $name:ident, $features:literal, $lanes:ident) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The CPU must support the enabled features, and every row must hold `acts.nb` blocks of
        /// format `F` (20, 18 or 34 bytes each); `t0 + T` must not exceed the activation rows.
        #[target_feature(enable = $features)]
        pub unsafe fn $name<const F: Format, const R: usize, const T: usize>(rows: [&[u8]; R], acts: &QuantRows, t0: usize, ahead: usize) -> [[f32; T]; R] {
            let nb = acts.nb;
            let block_bytes = match F {
                Q4_1 => 20,
                Q4_0 => 18,
                _ => 34,
            };
            for row in rows {
                assert!(row.len() >= nb * block_bytes, "weight row shorter than its blocks");
            }
            let mut acc = [[_mm256_setzero_ps(); T]; R];
            let mut summs = [[0f32; T]; R];
            for b in 0..nb {
                let mut qy = [_mm256_setzero_si256(); T];
                let mut dy = [0f32; T];
                let mut sy = [0f32; T];
                for t in 0..T {
                    // SAFETY: `block` returns exactly 32 bytes; the load is unaligned.
                    qy[t] = _mm256_loadu_si256(acts.block(t0 + t, b).as_ptr() as *const __m256i);
                    dy[t] = acts.d[(t0 + t) * nb + b];
                    sy[t] = acts.s[(t0 + t) * nb + b];
                }
                for r in 0..R {
                    // SAFETY: the assert above keeps block `b` (block_bytes from `blk`) in the row.
                    let blk = rows[r].as_ptr().add(b * block_bytes);
                    // Decode streams weights from DRAM; the hardware prefetcher alone leaves the
                    // loads waiting (measured: up to 2-3x slower on the output matrix). A hint
                    // only: it never faults, so the address may run past the matrix.
                    if ahead > 0 {
                        _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(ahead) as *const i8);
                    }
                    if F == Q4_1 {
                        // d and m are adjacent f16s: convert both at once.
                        let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(blk as *const i32)));
                        let (dw, mw) = (_mm_cvtss_f32(dm), _mm_cvtss_f32(_mm_movehdup_ps(dm)));
                        let qx = nibbles(blk.add(4));
                        for t in 0..T {
                            let xy = _mm256_cvtepi32_ps($lanes(qx, qy[t]));
                            acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * dy[t]), xy, acc[r][t]);
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
                        // ggml's mul_sum_i8_pairs: |x| (unsigned) times y with x's sign.
                        let ax = _mm256_sign_epi8(qx, qx);
                        for t in 0..T {
                            let xy = _mm256_cvtepi32_ps($lanes(ax, _mm256_sign_epi8(qy[t], qx)));
                            acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * dy[t]), xy, acc[r][t]);
                        }
                    }
                }
            }
            let mut out = [[0f32; T]; R];
            for r in 0..R {
                for t in 0..T {
                    out[r][t] = hsum8(acc[r][t]);
                    if F == Q4_1 {
                        out[r][t] += summs[r][t];
                    }
                }
            }
            out
        }
    };
}

tile_kernel!(
    /// `out[r][t] = W[r] . x[t0 + t]`, the same values as [`super::scalar::tile`].
    tile, "avx2,fma,f16c", lanes_avx2
);
tile_kernel!(
    /// [`tile`] with `vpdpbusd`: the same values, one instruction fewer per block pair.
    tile_vnni, "avx2,fma,f16c,avx512vnni,avx512vl", lanes_vnni
);

/// Lane k = the sum of the 4 products u8 x i8 at bytes 4k..4k+4. `maddubs` saturates its i16 pair
/// sums, but here a <= 128 (|x|, or a Q4_1 nibble) and |b| <= 127, so |pair| <= 32512: exact.
#[inline(always)]
unsafe fn lanes_avx2(a: __m256i, b: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1))
}

/// The same lanes in one instruction (inlined into `tile_vnni`, which enables the features).
#[inline]
#[target_feature(enable = "avx512vnni,avx512vl")]
unsafe fn lanes_vnni(a: __m256i, b: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b)
}

/// ggml's `bytes_from_nibbles_32`: 16 bytes of nibbles to 32 bytes, low nibbles first.
#[inline(always)]
pub(super) unsafe fn nibbles(p: *const u8) -> __m256i {
    let tmp = _mm_loadu_si128(p as *const __m128i);
    let both = _mm256_insertf128_si256(_mm256_castsi128_si256(tmp), _mm_srli_epi16(tmp, 4), 1);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0f))
}

/// ggml's `hsum_float_8`.
#[inline(always)]
pub(super) unsafe fn hsum8(x: __m256) -> f32 {
    let mut r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

/// Whether this CPU can run [`tile`].
pub fn available() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}

/// Whether this CPU can run [`tile_vnni`].
pub fn vnni_available() -> bool {
    available() && is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl")
}
