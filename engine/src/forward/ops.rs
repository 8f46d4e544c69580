//! The element-wise and attention operations of the forward pass, in f32 with f32 accumulation,
//! plus the bf16 variants the numerical patches select (see `crate::patch` for where they round).

use rayon::prelude::*;

use crate::kv::KvCache;
use crate::model::ModelConfig;
use crate::patch::round::bf16;

/// Fixed-order dot product with 8 partial sums (vectorizable, and the same result every run).
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

/// y = x / sqrt(mean(x^2) + eps) * weight, row by row.
pub fn rmsnorm_rows(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let dim = weight.len();
    for (row, o) in x.chunks(dim).zip(out.chunks_mut(dim)) {
        let mean = dot(row, row) / dim as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, x), w) in o.iter_mut().zip(row).zip(weight) {
            *o = x * scale * w;
        }
    }
}

/// `rmsnorm_bf16`: the mean square reduced in bf16 (32 strided lanes rounded after every add, then a
/// pairwise bf16 tree), the rest as [`rmsnorm_rows`].
pub fn rmsnorm_rows_bf16(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let dim = weight.len();
    for (row, o) in x.chunks(dim).zip(out.chunks_mut(dim)) {
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
        let mean = lanes[0] / dim as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, x), w) in o.iter_mut().zip(row).zip(weight) {
            *o = x * scale * w;
        }
    }
}

/// Rotates adjacent pairs (x[2i], x[2i+1]) of every head by pos * base^(-2i/head_dim), the rotation
/// llama.cpp applies to GGUF llama models (whose Q/K rows the converter permuted for it).
/// With `bf16_tables` (`rope_bf16`), position, inverse frequency, angle, cos and sin are each rounded
/// to bf16.
pub fn rope_rows(x: &mut [f32], heads: usize, head_dim: usize, positions: &[usize], base: f32, bf16_tables: bool) {
    let width = heads * head_dim;
    let half = head_dim / 2;
    let inv: Vec<f64> = (0..half).map(|i| (base as f64).powf(-2.0 * i as f64 / head_dim as f64)).collect();
    for (row, pos) in x.chunks_mut(width).zip(positions) {
        let trig: Vec<(f32, f32)> = if bf16_tables {
            inv.iter()
                .map(|f| {
                    let theta = bf16(bf16(*pos as f32) * bf16(*f as f32));
                    (bf16(theta.cos()), bf16(theta.sin()))
                })
                .collect()
        } else {
            inv.iter()
                .map(|f| {
                    let theta = *pos as f64 * f;
                    (theta.cos() as f32, theta.sin() as f32)
                })
                .collect()
        };
        for head in row.chunks_mut(head_dim) {
            for (i, (cos, sin)) in trig.iter().enumerate() {
                let (a, b) = (head[2 * i], head[2 * i + 1]);
                head[2 * i] = a * cos - b * sin;
                head[2 * i + 1] = a * sin + b * cos;
            }
        }
    }
}

/// What the patches change in attention (both `None`: plain causal attention).
#[derive(Debug, Clone, Copy, Default)]
pub struct AttnShape {
    /// `sliding_window=N`: attend to the last N positions only.
    pub window: Option<usize>,
    /// `attn_splitk_bf16=C`: split into chunks of C positions with bf16 partials.
    pub splitk: Option<usize>,
}

/// Causal grouped-query attention of `q` rows (at `positions`) against layer `layer` of `kv`.
/// `shape.window` (`sliding_window`) limits each query to the last N positions; `shape.splitk`
/// (`attn_splitk_bf16`) computes it in chunks whose partial results are kept in bf16.
/// Every (token, head) pair is independent and computed the same way on any thread, so spreading
/// them over the cores does not change a bit of the result.
pub fn attention(q: &[f32], kv: &KvCache, layer: usize, positions: &[usize], c: &ModelConfig, shape: AttnShape, out: &mut [f32]) {
    let AttnShape { window, splitk } = shape;
    let hd = c.head_dim;
    let group = c.n_heads / c.n_kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let keys = kv.keys(layer);
    let values = kv.values(layer);
    let kv_dim = c.kv_dim();
    let work = |(i, o): (usize, &mut [f32]), scores: &mut Vec<f32>| {
        let (t, h) = (i / c.n_heads, i % c.n_heads);
        let visible = positions[t] + 1;
        let first = window.map_or(0, |w| visible.saturating_sub(w));
        let kvh = h / group;
        let qh = &q[i * hd..(i + 1) * hd];
        scores.clear();
        scores.extend((first..visible).map(|j| dot(qh, &keys[j * kv_dim + kvh * hd..j * kv_dim + (kvh + 1) * hd]) * scale));
        if let Some(chunk) = splitk {
            let vrow = |j: usize| &values[(first + j) * kv_dim + kvh * hd..(first + j) * kv_dim + (kvh + 1) * hd];
            splitk_bf16(scores, vrow, chunk, o);
            return;
        }
        softmax(scores);
        o.fill(0.0);
        for (j, p) in scores.iter().enumerate() {
            let j = first + j;
            let vj = &values[j * kv_dim + kvh * hd..j * kv_dim + (kvh + 1) * hd];
            for (o, v) in o.iter_mut().zip(vj) {
                *o += p * v;
            }
        }
    };
    // Small jobs (a few short decode rows) are cheaper on this thread than through the pool.
    let cost: usize = positions.iter().map(|p| p + 1).sum::<usize>() * c.n_heads;
    if cost < 4096 {
        let mut scores = Vec::new();
        out.chunks_mut(hd).enumerate().for_each(|pair| work(pair, &mut scores));
    } else {
        out.par_chunks_mut(hd).enumerate().for_each_init(Vec::new, |scores, pair| work(pair, scores));
    }
}

/// Split-K attention of one query: per chunk of `chunk` scores, the max m, the exp-sum s and the
/// normalised output are rounded to bf16; the merge rescales by exp(m - M) in f32.
fn splitk_bf16<'v>(scores: &[f32], value: impl Fn(usize) -> &'v [f32], chunk: usize, out: &mut [f32]) {
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

pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

pub fn add_assign(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// gate = silu(gate) * up.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
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
        rope_rows(&mut x, 1, 8, &[0], 10000.0, false);
        assert_eq!(x, orig);
        rope_rows(&mut x, 1, 8, &[5], 10000.0, false);
        let n0: f32 = orig.iter().map(|v| v * v).sum();
        let n1: f32 = x.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-3);
    }

    #[test]
    fn softmax_sums_to_one() {
        let mut x = vec![1.0, 2.0, 3.0];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[2] > x[1]);
    }
}
