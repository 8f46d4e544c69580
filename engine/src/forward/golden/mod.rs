//! The golden path's weight products: every output is `ops::dot(W[r], x[t])` on the dequantized f32
//! weights, bit for bit, however the work is tiled or threaded. With AVX2 (detected at run time) the
//! kernels in `avx2` compute a tile of (row, input) dots at once, each with `ops::dot`'s own lanes and
//! order; for a few input rows (decode) they read the file's quantized blocks instead of the f32
//! copy, dequantizing each element with the loader's arithmetic on the fly (the same values, an eighth
//! of the bytes). Without AVX2, `ops::dot` itself.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(test)]
mod tests;

use std::ops::Range;

use super::fast::{self, Kernel};
use super::ops;
use crate::model::Matrix;

pub use super::fast::{Q4_0, Q4_1, Q8_0};

/// Where a kernel reads the weights: a quantized block format of `fast`, or [`F32`] rows.
pub type Source = u8;
/// The dequantized f32 rows (`Matrix::f32`).
pub const F32: Source = 3;

/// Input rows up to which the kernels read quantized blocks: weights streamed from memory for few
/// rows; for more, each weight row is reused from cache and the f32 copy needs no unpacking.
const QUANT_INPUT_ROWS: usize = 8;

/// `res[i][j] = ops::dot(W[rows.start + i], x[tokens.start + j])`, `res` row-major
/// (`rows.len()` by `tokens.len()`); `x` holds input rows of `w.cols`.
pub fn block(w: &Matrix, x: &[f32], rows: Range<usize>, tokens: Range<usize>, res: &mut [f32]) {
    debug_assert_eq!(res.len(), rows.len() * tokens.len());
    #[cfg(target_arch = "x86_64")]
    if tokens.len() <= QUANT_INPUT_ROWS && Kernel::detect() != Kernel::Scalar && w.cols.is_multiple_of(32) && w.f32.len() == w.rows * w.cols
    {
        if let Some(format) = fast::integer_format(w) {
            assert!(rows.end <= w.rows && tokens.end * w.cols <= x.len(), "tile out of range");
            let row = |r: usize| w.quant.bytes[r * w.quant.row_bytes..].as_ptr();
            // Two tiles of rows ahead, as the fast kernels.
            let ahead = fast::PREFETCH_TILES * w.quant.row_bytes;
            // SAFETY: AVX2, FMA and F16C were detected; `integer_format` checked that every row
            // holds `cols / 32` blocks of its format, and the tile is in range (asserted above).
            unsafe {
                match format {
                    Q4_1 => tiles::<Q4_1>(row, w.cols, ahead, x, rows, tokens, res),
                    Q4_0 => tiles::<Q4_0>(row, w.cols, ahead, x, rows, tokens, res),
                    _ => tiles::<Q8_0>(row, w.cols, ahead, x, rows, tokens, res),
                }
            }
            return;
        }
    }
    block_f32(&w.f32, w.cols, x, rows, tokens, res);
}

/// [`block`] on plain f32 rows of `cols` (`w`, row-major): a matrix's f32 copy, and DeepSeek-V4's
/// weights, which have no quantized one.
pub fn block_f32(w: &[f32], cols: usize, x: &[f32], rows: Range<usize>, tokens: Range<usize>, res: &mut [f32]) {
    debug_assert_eq!(res.len(), rows.len() * tokens.len());
    #[cfg(target_arch = "x86_64")]
    if Kernel::detect() != Kernel::Scalar && cols.is_multiple_of(32) {
        assert!(rows.end * cols <= w.len() && tokens.end * cols <= x.len(), "tile out of range");
        // SAFETY: AVX2, FMA and F16C were detected; every row in `rows` holds `cols` f32 values
        // and every input row in `tokens` is in `x` (asserted above).
        unsafe { tiles::<F32>(|r| w[r * cols..].as_ptr() as *const u8, cols, 0, x, rows, tokens, res) };
        return;
    }
    scalar(w, cols, x, rows, tokens, res);
}

/// `ops::dot` itself over the tile (no AVX2, or rows not in whole blocks of 32).
fn scalar(w: &[f32], cols: usize, x: &[f32], rows: Range<usize>, tokens: Range<usize>, res: &mut [f32]) {
    let tn = tokens.len();
    for (i, r) in rows.enumerate() {
        let wr = &w[r * cols..(r + 1) * cols];
        for (j, t) in tokens.clone().enumerate() {
            res[i * tn + j] = ops::dot(wr, &x[t * cols..(t + 1) * cols]);
        }
    }
}

/// The tile loop: 4 rows by 1 input for a single input row, else 2 rows by 4 inputs, then the edges.
/// `row(r)` points at weight row `r` in the layout of `S`; `ahead` is the prefetch distance per row
/// (quantized sources).
///
/// # Safety
/// As [`avx2::tile`], for every row in `rows` and input row in `tokens`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tiles<const S: Source>(
    row: impl Fn(usize) -> *const u8,
    cols: usize,
    ahead: usize,
    x: &[f32],
    rows: Range<usize>,
    tokens: Range<usize>,
    res: &mut [f32],
) {
    let nb = cols / 32;
    let tn = tokens.len();
    let (r0, t0) = (rows.start, tokens.start);
    let mut put = |r: usize, t: usize, vals: &[f32]| {
        for (k, v) in vals.iter().enumerate() {
            res[(r - r0) * tn + t - t0 + k] = *v;
        }
    };
    let xp = |t: usize| x[t * cols..].as_ptr();
    let mut r = rows.start;
    if tn == 1 {
        while r + 4 <= rows.end {
            let out = avx2::tile::<S, 4, 1>([row(r), row(r + 1), row(r + 2), row(r + 3)], nb, xp(t0), cols, 4 * ahead);
            for (i, o) in out.iter().enumerate() {
                put(r + i, t0, o);
            }
            r += 4;
        }
    }
    while r + 2 <= rows.end {
        let mut t = t0;
        while t + 4 <= tokens.end {
            let out = avx2::tile::<S, 2, 4>([row(r), row(r + 1)], nb, xp(t), cols, 2 * ahead);
            put(r, t, &out[0]);
            put(r + 1, t, &out[1]);
            t += 4;
        }
        while t < tokens.end {
            let out = avx2::tile::<S, 2, 1>([row(r), row(r + 1)], nb, xp(t), cols, 2 * ahead);
            put(r, t, &out[0]);
            put(r + 1, t, &out[1]);
            t += 1;
        }
        r += 2;
    }
    while r < rows.end {
        for t in tokens.clone() {
            put(r, t, &avx2::tile::<S, 1, 1>([row(r)], nb, xp(t), cols, ahead)[0]);
        }
        r += 1;
    }
}
