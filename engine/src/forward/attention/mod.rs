//! Causal grouped-query attention of a segment's query rows against its KV cache, in f32: per
//! (row, head), the scores `ops::dot(q, k_j) * scale`, a softmax (max, `exp`, sum in position order,
//! divide) and the sum of `p_j * v_j` in position order. The AVX2 build (detected at run time) does
//! the same operations in the same order on 8 lanes, four keys at a time, so it gives the same bits.
//! The `attn_splitk_bf16` and `sliding_window` patches act here.

#[cfg(target_arch = "x86_64")]
mod avx2;

use std::ops::Range;

use rayon::prelude::*;

use super::fast::Kernel;
use super::ops::dot;
use crate::kv::KvCache;
use crate::model::ModelConfig;
use ctxscope_numerics::splitk_bf16;

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
        if let Some(chunk) = splitk {
            scores.clear();
            scores.extend((first..visible).map(|j| dot(qh, &keys[j * kv_dim + kvh * hd..j * kv_dim + (kvh + 1) * hd]) * scale));
            let vrow = |j: usize| &values[(first + j) * kv_dim + kvh * hd..(first + j) * kv_dim + (kvh + 1) * hd];
            splitk_bf16(scores, vrow, chunk, o);
            return;
        }
        let kv = HeadKv { keys, values, stride: kv_dim, offset: kvh * hd };
        head(qh, &kv, first..visible, scale, scores, o);
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

#[inline]
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

/// One KV head of a layer's cache: position j's key at `keys[j * stride + offset..][..head_dim]`.
pub struct HeadKv<'a> {
    pub keys: &'a [f32],
    pub values: &'a [f32],
    pub stride: usize,
    pub offset: usize,
}

impl HeadKv<'_> {
    fn key(&self, j: usize, hd: usize) -> &[f32] {
        &self.keys[j * self.stride + self.offset..][..hd]
    }

    fn value(&self, j: usize, hd: usize) -> &[f32] {
        &self.values[j * self.stride + self.offset..][..hd]
    }
}

/// One query head's output over the positions `span` (unpatched attention).
fn head(q: &[f32], kv: &HeadKv<'_>, span: Range<usize>, scale: f32, scores: &mut Vec<f32>, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if Kernel::detect() != Kernel::Scalar {
        // SAFETY: AVX2 and FMA were detected (`Kernel::detect`), and each instance reads `C * 8`
        // values per row, the head width it is picked for.
        unsafe {
            match q.len() {
                64 => return avx2::head::<8>(q, kv, span, scale, scores, out),
                128 => return avx2::head::<16>(q, kv, span, scale, scores, out),
                32 => return avx2::head::<4>(q, kv, span, scale, scores, out),
                _ => {}
            }
        }
    }
    let hd = q.len();
    scores.clear();
    scores.extend(span.clone().map(|j| dot(q, kv.key(j, hd)) * scale));
    softmax(scores);
    out.fill(0.0);
    for (j, p) in span.zip(scores.iter()) {
        for (o, v) in out.iter_mut().zip(kv.value(j, hd)) {
            *o += p * v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_sums_to_one() {
        let mut x = vec![1.0, 2.0, 3.0];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[2] > x[1]);
    }

    #[test]
    fn every_head_width_gives_the_scalar_bits() {
        let mut rng = crate::forward::testutil::Rng(3);
        for hd in [32, 64, 128, 24] {
            let stride = 3 * hd;
            let positions = 37;
            let keys = rng.vec(positions * stride, 2.0);
            let values = rng.vec(positions * stride, 1.0);
            let q = rng.vec(hd, 2.0);
            let kv = HeadKv { keys: &keys, values: &values, stride, offset: hd };
            for span in [0..1, 0..5, 3..37, 0..37] {
                let mut got = vec![0f32; hd];
                head(&q, &kv, span.clone(), 0.125, &mut Vec::new(), &mut got);
                let mut scores: Vec<f32> = span.clone().map(|j| dot(&q, kv.key(j, hd)) * 0.125).collect();
                softmax(&mut scores);
                let mut want = vec![0f32; hd];
                for (j, p) in span.clone().zip(&scores) {
                    for (o, v) in want.iter_mut().zip(kv.value(j, hd)) {
                        *o += p * v;
                    }
                }
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&want), bits(&got), "head width {hd}, positions {span:?}");
            }
        }
    }
}
