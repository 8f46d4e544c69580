//! The CPU reference numerics, in one place: what the engine's golden path and numerical patches
//! compute on the host, and what the CUDA kernels' checks (kernels/examples/check) compare the
//! device against. [`round`]: the low-precision formats the patches emulate; [`dot`]: the fixed-order
//! dot product of the golden path; [`splitk_bf16`] and [`mean_square_bf16`]: the bf16 reductions of
//! the `attn_splitk_bf16` and `rmsnorm_bf16` patches; [`matvec_bf16`]: a bf16 GEMV. No dependencies.

pub mod round;

use round::bf16;

/// Fixed-order dot product with 8 partial sums (vectorizable, and the same result every run).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8;
    for i in 0..chunks {
        let (x, y) = (&a[i * 8..i * 8 + 8], &b[i * 8..i * 8 + 8]);
        for j in 0..8 {
            acc[j] += x[j] * y[j];
        }
    }
    let mut tail = 0f32;
    for i in chunks * 8..a.len() {
        tail += a[i] * b[i];
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// A bf16 GEMV with an f32 accumulator (the `mhc_bf16` mixing GEMM, the `moe_router_bf16` gate): `x`
/// and each of `rows` (each `x.len()` long) rounded to bf16, multiplied in f32 in [`dot`]'s order, each
/// output rounded to bf16.
pub fn matvec_bf16(rows: &[f32], x: &[f32]) -> Vec<f32> {
    let x: Vec<f32> = x.iter().map(|v| bf16(*v)).collect();
    let mut row_bf16 = vec![0f32; x.len()];
    rows.chunks(x.len())
        .map(|row| {
            row_bf16.iter_mut().zip(row).for_each(|(r, w)| *r = bf16(*w));
            bf16(dot(&row_bf16, &x))
        })
        .collect()
}

/// Split-K attention of one query (`attn_splitk_bf16`): per chunk of `chunk` scores, the max m, the
/// exp-sum s and the normalised output are rounded to bf16; the merge rescales by exp(m - M) in f32.
/// `value(j)` is the value row of score j.
pub fn splitk_bf16<'v>(scores: &[f32], value: impl Fn(usize) -> &'v [f32], chunk: usize, out: &mut [f32]) {
    let mut parts: Vec<(f32, f32, Vec<f32>)> = Vec::with_capacity(scores.len().div_ceil(chunk));
    for (c, block) in scores.chunks(chunk).enumerate() {
        let m = block.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut s = 0f32;
        let mut o = vec![0f32; out.len()];
        for (j, score) in block.iter().enumerate() {
            let p = (score - m).exp();
            s += p;
            for (o, v) in o.iter_mut().zip(value(c * chunk + j)) {
                *o += p * v;
            }
        }
        for v in o.iter_mut() {
            *v = bf16(*v / s);
        }
        parts.push((bf16(m), bf16(s), o));
    }
    let max = parts.iter().map(|p| p.0).fold(f32::NEG_INFINITY, f32::max);
    let mut total = 0f32;
    out.fill(0.0);
    for (m, s, o) in &parts {
        let w = s * (m - max).exp();
        total += w;
        for (acc, v) in out.iter_mut().zip(o) {
            *acc += w * v;
        }
    }
    for v in out.iter_mut() {
        *v /= total;
    }
}

/// The mean square of `row` reduced in bf16 (`rmsnorm_bf16`): 32 strided lanes, each add rounded to
/// bf16, then a pairwise bf16 tree of widths 16, 8, 4, 2, 1; the sum divided by the row's length.
pub fn mean_square_bf16(row: &[f32]) -> f32 {
    let mut lanes = [0f32; 32];
    for (i, v) in row.iter().enumerate() {
        lanes[i % 32] = bf16(lanes[i % 32] + bf16(v * v));
    }
    let mut width = 32;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            lanes[i] = bf16(lanes[i] + lanes[i + width]);
        }
    }
    lanes[0] / row.len() as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_is_the_plain_sum_for_exact_values() {
        let a: Vec<f32> = (0..19).map(|i| i as f32).collect();
        assert_eq!(dot(&a, &a), (0..19).map(|i| (i * i) as f32).sum::<f32>());
    }

    #[test]
    fn splitk_over_one_chunk_is_softmax_rounded() {
        let values = [[1.0f32, 0.0], [0.0, 1.0]];
        let mut out = [0f32; 2];
        splitk_bf16(&[0.0, 0.0], |j| &values[j], 8, &mut out);
        assert_eq!(out, [0.5, 0.5]);
    }

    #[test]
    fn matvec_bf16_rounds_inputs_weights_and_outputs() {
        // A weight of 1 + 2^-10 is 1 in bf16, and so is an input of 1 + 2^-8 (a tie, to even).
        assert_eq!(matvec_bf16(&[1.0 + 2f32.powi(-10), 0.0, 3.0, 0.0], &[1.0, 5.0]), vec![1.0, 3.0]);
        assert_eq!(matvec_bf16(&[3.0], &[1.0 + 2f32.powi(-8)]), vec![3.0]);
        // Exact bf16 inputs whose f32 sum, 1 + 2^-8, is not a bf16: the output rounds to 1.
        assert_eq!(matvec_bf16(&[1.0, 1.0], &[1.0, 2f32.powi(-8)]), vec![1.0]);
    }

    #[test]
    fn mean_square_of_ones_is_one() {
        assert_eq!(mean_square_bf16(&[1.0; 64]), 1.0);
        assert_eq!(mean_square_bf16(&[2.0; 40]), 4.0);
    }
}
