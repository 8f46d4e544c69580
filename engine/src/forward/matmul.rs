//! Weight matmuls: out[t][r] = sum_c W[r][c] * x[t][c] for `n` input rows, spread over the cores
//! by output rows (so the result does not depend on the number of threads).

use rayon::prelude::*;

use super::{fast, ops, Path};
use crate::model::Matrix;

/// Output rows per parallel task.
const ROWS_PER_TASK: usize = 32;

pub fn matmul(path: Path, w: &Matrix, x: &[f32], n: usize, out: &mut [f32]) {
    debug_assert_eq!(x.len(), n * w.cols);
    debug_assert_eq!(out.len(), n * w.rows);
    // Compute [rows][n] in parallel chunks of rows, then transpose to [n][rows].
    let mut by_row = vec![0f32; w.rows * n];
    match path {
        Path::Golden => by_row.par_chunks_mut(n * ROWS_PER_TASK).enumerate().for_each(|(chunk, block)| {
            for (i, row_out) in block.chunks_mut(n).enumerate() {
                let r = chunk * ROWS_PER_TASK + i;
                let wr = &w.f32[r * w.cols..(r + 1) * w.cols];
                for (t, o) in row_out.iter_mut().enumerate() {
                    *o = ops::dot(wr, &x[t * w.cols..(t + 1) * w.cols]);
                }
            }
        }),
        Path::Fast => fast::matmul_quant(w, x, n, &mut by_row),
    }
    if n == 1 {
        out.copy_from_slice(&by_row);
        return;
    }
    // Transpose in parallel, 16 output rows at a time so both sides stay in cache (a pure copy).
    out.par_chunks_mut(w.rows * 16).enumerate().for_each(|(chunk, block)| {
        let t0 = chunk * 16;
        let ts = block.len() / w.rows;
        for r in 0..w.rows {
            for (i, src) in by_row[r * n + t0..r * n + t0 + ts].iter().enumerate() {
                block[i * w.rows + r] = *src;
            }
        }
    });
}
