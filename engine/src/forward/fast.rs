//! The fast path's matmul: weights stay in the file's quantized blocks. This first version
//! dequantizes one weight row at a time into a small buffer and uses the f32 dot; the SIMD
//! integer-dot kernels replace it (same signature).

use rayon::prelude::*;

use super::ops;
use crate::model::Matrix;

/// by_row[r][t] = W[r] . x[t], W read from its quantized blocks.
pub fn matmul_quant(w: &Matrix, x: &[f32], n: usize, by_row: &mut [f32]) {
    let q = &w.quant;
    by_row.par_chunks_mut(n).enumerate().for_each_init(
        || vec![0f32; w.cols],
        |buf, (r, row_out)| {
            let bytes = &q.bytes[r * q.row_bytes..(r + 1) * q.row_bytes];
            let row = ctxscope_formats::gguf::dequantize(&w.name, q.ggml_type, bytes, w.cols as u64).unwrap_or_default();
            buf.copy_from_slice(&row);
            for (t, o) in row_out.iter_mut().enumerate() {
                *o = ops::dot(buf, &x[t * w.cols..(t + 1) * w.cols]);
            }
        },
    );
}
