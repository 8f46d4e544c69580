//! The fast path's matmul, llama.cpp's scheme: weights stay in the GGUF's quantized blocks (Q4_1,
//! Q4_0, Q8_0), each activation row is quantized once per product group (`matmul::products`) to 8
//! bits per block of 32 (Q8_1 for Q4_1 weights, Q8_0 otherwise; see `quantize`), and each block's
//! integer dot product is combined with the two scales. Other weight types (K-quants, F16, ...) use their dequantized f32 rows and the
//! golden dot.
//!
//! Numerics. Against golden (the same dequantized weights, f32 activations, `ops::dot`) the result
//! differs by (1) activation rounding: each x is replaced by q * d with q = round(x * 127 / amax) and
//! d = amax / 127 rounded to f16, an error up to d/2 (plus d's f16 rounding) per element; for Q4_1 the
//! min term uses s = d * sum(q) rounded to f16; and (2) summation order. The order is that of ggml's
//! AVX2 `ggml_vec_dot_*`, for every kernel: per block, lane k (0..8) takes the exact integer dot of
//! elements 4k..4k+4, converted to f32, and is accumulated across blocks in block order as
//! `acc[k] = fma(d_w * d_x, lane, acc[k])`; the result is `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`,
//! plus, for Q4_1, `summs`, the block-order f32 sum of `m_w * s_x`. The scalar kernel writes that
//! arithmetic lane by lane (with `f32::mul_add`), so scalar and AVX2 give identical bits, and neither
//! depends on the tile shape or the thread count. Measured on SmolLM2-135M Q4_1 (4 chat prompts, the
//! prompt's last position and 8 teacher-forced decode steps each, `cargo bench --bench throughput`):
//! logits differ from golden by 0.23 on average and 1.38 at most (logits up to ~33 in magnitude);
//! the greedy token agreed at 31 of 36 positions.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod dispatch;
mod quantize;
pub(crate) use quantize::f32_to_f16;
mod scalar;
#[cfg(test)]
mod tests;

use std::ops::Range;

use crate::model::{Matrix, QuantMatrix};
pub use quantize::QuantRows;
use quantize::BLOCK;

/// A weight block format the integer kernels read (a const parameter of the kernels).
pub type Format = u8;
pub const Q4_1: Format = 0;
pub const Q4_0: Format = 1;
pub const Q8_0: Format = 2;

/// How many tiles of weight rows ahead the kernels prefetch.
pub const PREFETCH_TILES: usize = 2;

/// Which implementation of the block dot products runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    Scalar,
    /// AVX2 + FMA + F16C, x86-64 only.
    Avx2,
    /// The AVX2 kernel with AVX-512 VNNI's `vpdpbusd` (256-bit vectors): the same values.
    Vnni,
    /// [`Kernel::Vnni`], with tiles of an even number of activation rows on 512-bit vectors (two
    /// rows per vector, `avx512`): the same values.
    Avx512,
}

impl Kernel {
    /// The fastest kernel this CPU runs (CTXSCOPE_NO_VNNI=1 skips the VNNI builds), detected once.
    pub fn detect() -> Kernel {
        static KERNEL: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
        *KERNEL.get_or_init(Kernel::probe)
    }

    fn probe() -> Kernel {
        #[cfg(target_arch = "x86_64")]
        {
            if std::env::var_os("CTXSCOPE_NO_VNNI").is_none() {
                if avx512::available() {
                    return Kernel::Avx512;
                }
                if avx2::vnni_available() {
                    return Kernel::Vnni;
                }
            }
            if avx2::available() {
                return Kernel::Avx2;
            }
        }
        Kernel::Scalar
    }

    /// Every kernel this CPU can run (tests compare them).
    #[cfg(test)]
    pub fn available() -> Vec<Kernel> {
        let mut kernels = vec![Kernel::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            if avx2::available() {
                kernels.push(Kernel::Avx2);
            }
            if avx2::vnni_available() {
                kernels.push(Kernel::Vnni);
            }
            if avx512::available() {
                kernels.push(Kernel::Avx512);
            }
        }
        kernels
    }
}

/// `res[i][j] = W[rows.start + i] . x[tokens.start + j]` from `w`'s quantized blocks (of `format`,
/// from [`integer_format`]) and the quantized input rows `acts`; `res` row-major.
pub fn block(kernel: Kernel, format: Format, w: &Matrix, acts: &QuantRows, rows: Range<usize>, tokens: Range<usize>, res: &mut [f32]) {
    let q = &w.quant;
    let row = |r: usize| &q.bytes[r * q.row_bytes..(r + 1) * q.row_bytes];
    let tn = tokens.len();
    let put = |res: &mut [f32], r: usize, t: usize, vals: &[f32]| {
        let at = (r - rows.start) * tn + t - tokens.start;
        res[at..at + vals.len()].copy_from_slice(vals);
    };
    let mut r = rows.start;
    // Prefetch two tiles of rows ahead: far enough to cover DRAM's latency when decode streams the
    // weights (the output matrix: 4.1 -> 1.5 ms on one thread against 256 bytes along the row).
    let (ahead4, ahead2) = (PREFETCH_TILES * 4 * q.row_bytes, PREFETCH_TILES * 2 * q.row_bytes);
    // Decode: 4 rows share each activation block. Batches: 2 rows by 4 tokens, or 4 by 4 with the
    // 512-bit kernel (two tokens a vector; 4 by 4 measured ~15% faster than 2 by 4 there).
    let wide = kernel == Kernel::Avx512;
    if tn == 1 || wide {
        while r + 4 <= rows.end {
            let rr = [row(r), row(r + 1), row(r + 2), row(r + 3)];
            let mut t = tokens.start;
            if wide {
                while t + 4 <= tokens.end {
                    let out = dispatch::run::<4, 4>(kernel, format, rr, acts, t, ahead4);
                    for (i, o) in out.iter().enumerate() {
                        put(res, r + i, t, o);
                    }
                    t += 4;
                }
                if t + 2 <= tokens.end {
                    let out = dispatch::run::<4, 2>(kernel, format, rr, acts, t, ahead4);
                    for (i, o) in out.iter().enumerate() {
                        put(res, r + i, t, o);
                    }
                    t += 2;
                }
            }
            while t < tokens.end {
                let out = dispatch::run::<4, 1>(kernel, format, rr, acts, t, ahead4);
                for (i, o) in out.iter().enumerate() {
                    put(res, r + i, t, o);
                }
                t += 1;
            }
            r += 4;
        }
    }
    while r + 2 <= rows.end {
        let mut t = tokens.start;
        while t + 4 <= tokens.end {
            let out = dispatch::run::<2, 4>(kernel, format, [row(r), row(r + 1)], acts, t, ahead2);
            put(res, r, t, &out[0]);
            put(res, r + 1, t, &out[1]);
            t += 4;
        }
        while t < tokens.end {
            let out = dispatch::run::<2, 1>(kernel, format, [row(r), row(r + 1)], acts, t, ahead2);
            put(res, r, t, &out[0]);
            put(res, r + 1, t, &out[1]);
            t += 1;
        }
        r += 2;
    }
    while r < rows.end {
        for t in tokens.clone() {
            put(res, r, t, &dispatch::run::<1, 1>(kernel, format, [row(r)], acts, t, q.row_bytes)[0]);
        }
        r += 1;
    }
}

/// The integer kernels' format for this matrix, when its blocks are laid out as they expect.
pub fn integer_format(w: &Matrix) -> Option<Format> {
    let q: &QuantMatrix = &w.quant;
    let (format, block_bytes) = match q.ggml_type.0 {
        3 => (Q4_1, 20),
        2 => (Q4_0, 18),
        8 => (Q8_0, 34),
        _ => return None,
    };
    let fits = w.cols.is_multiple_of(BLOCK) && q.row_bytes == w.cols / BLOCK * block_bytes && q.bytes.len() >= w.rows * q.row_bytes;
    fits.then_some(format)
}
