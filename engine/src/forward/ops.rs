//! The element-wise operations of the forward pass, in f32 with f32 accumulation,
//! plus the bf16 variants the numerical patches select (see `crate::patch` for where they round).

use rayon::prelude::*;

use crate::patch::round::bf16;

/// The golden path's fixed-order dot product (`ctxscope_numerics`, shared with the kernel checks).
pub use ctxscope_numerics::dot;

/// Rows from which the row-wise operations below are spread over the thread pool (each row is
/// computed the same way on any thread).
const PARALLEL_ROWS: usize = 32;

/// `f(row of x, row of out)` for every row, on the pool when there are many.
fn rows_of<F: Fn(&[f32], &mut [f32]) + Sync>(x: &[f32], width: usize, out: &mut [f32], out_width: usize, f: F) {
    if x.len() >= PARALLEL_ROWS * width {
        x.par_chunks(width).zip(out.par_chunks_mut(out_width)).for_each(|(x, o)| f(x, o));
    } else {
        x.chunks(width).zip(out.chunks_mut(out_width)).for_each(|(x, o)| f(x, o));
    }
}

/// y = x / sqrt(mean(x^2) + eps) * weight, row by row.
pub fn rmsnorm_rows(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let dim = weight.len();
    rows_of(x, dim, out, dim, |row, o| {
        let mean = dot(row, row) / dim as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, x), w) in o.iter_mut().zip(row).zip(weight) {
            *o = x * scale * w;
        }
    });
}

/// `rmsnorm_bf16`: the mean square reduced in bf16 (32 strided lanes rounded after every add, then a
/// pairwise bf16 tree), the rest as [`rmsnorm_rows`].
pub fn rmsnorm_rows_bf16(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let dim = weight.len();
    rows_of(x, dim, out, dim, |row, o| {
        let mean = ctxscope_numerics::mean_square_bf16(row);
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, x), w) in o.iter_mut().zip(row).zip(weight) {
            *o = x * scale * w;
        }
    });
}

/// The cos and sin of every (row, pair) RoPE angle of a pass: pair i of the row at position p
/// turns by p * base^(-2i/head_dim), computed in f64 and rounded to f32 (llama.cpp's rotation of
/// GGUF llama models, whose Q/K rows the converter permuted for it). With `bf16_tables`
/// (`rope_bf16`), position, inverse frequency, angle, cos and sin are each rounded to bf16. Made once
/// per pass, shared by Q, K and every layer.
pub struct RopeTable {
    half: usize,
    trig: Vec<(f32, f32)>,
}

impl RopeTable {
    pub fn new(positions: &[usize], head_dim: usize, base: f32, bf16_tables: bool) -> RopeTable {
        let half = head_dim / 2;
        let inv: Vec<f64> = (0..half).map(|i| (base as f64).powf(-2.0 * i as f64 / head_dim as f64)).collect();
        let angle = |pos: usize, f: f64| {
            if bf16_tables {
                let theta = bf16(bf16(pos as f32) * bf16(f as f32));
                (bf16(theta.cos()), bf16(theta.sin()))
            } else {
                let theta = pos as f64 * f;
                (theta.cos() as f32, theta.sin() as f32)
            }
        };
        let trig = positions.iter().flat_map(|pos| inv.iter().map(move |f| angle(*pos, *f))).collect();
        RopeTable { half, trig }
    }
}

/// Rotates adjacent pairs (x[2i], x[2i+1]) of every head of every row by the table's angles.
pub fn rope_rows(x: &mut [f32], heads: usize, head_dim: usize, table: &RopeTable) {
    debug_assert_eq!(table.half * 2, head_dim);
    let width = heads * head_dim;
    let rotate = |row: &mut [f32], trig: &[(f32, f32)]| {
        for head in row.chunks_mut(head_dim) {
            for (i, (cos, sin)) in trig.iter().enumerate() {
                let (a, b) = (head[2 * i], head[2 * i + 1]);
                head[2 * i] = a * cos - b * sin;
                head[2 * i + 1] = a * sin + b * cos;
            }
        }
    };
    if x.len() >= PARALLEL_ROWS * width {
        x.par_chunks_mut(width).zip(table.trig.par_chunks(table.half)).for_each(|(row, trig)| rotate(row, trig));
    } else {
        x.chunks_mut(width).zip(table.trig.chunks(table.half)).for_each(|(row, trig)| rotate(row, trig));
    }
}

pub fn add_assign(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// silu(g) * u, SwiGLU's element.
#[inline(always)]
pub fn silu_mul(g: f32, u: f32) -> f32 {
    g / (1.0 + (-g).exp()) * u
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_a_plain_sum() {
        let a: Vec<f32> = (0..37).map(|i| i as f32 * 0.5).collect();
        let b: Vec<f32> = (0..37).map(|i| 1.0 - i as f32 * 0.01).collect();
        let plain: f64 = a.iter().zip(&b).map(|(x, y)| (*x as f64) * (*y as f64)).sum();
        assert!((dot(&a, &b) as f64 - plain).abs() < 1e-3);
    }

    #[test]
    fn rope_at_position_zero_is_identity_and_preserves_norm() {
        let mut x: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let orig = x.clone();
        rope_rows(&mut x, 1, 8, &RopeTable::new(&[0], 8, 10000.0, false));
        assert_eq!(x, orig);
        rope_rows(&mut x, 1, 8, &RopeTable::new(&[5], 8, 10000.0, false));
        let n0: f32 = orig.iter().map(|v| v * v).sum();
        let n1: f32 = x.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-3);
    }
}
