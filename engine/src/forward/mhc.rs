//! DeepSeek-V4's manifold-constrained hyper-connections (mHC), golden f32, one token at a time: the
//! residual is `hc` streams of the model width; before a block, a one-layer perceptron over the
//! RMS-normalised streams gives `pre` (collapse the streams into the block's input), `post` (spread
//! the block's output back over them) and `comb` (mix the streams, made doubly stochastic by
//! Sinkhorn-Knopp). The final hyper-head collapses the streams once more before the model's norm.
//! As transformers' `DeepseekV4HyperConnection` and `DeepseekV4HyperHead` compute them; with
//! [`HcSettings::bf16`] (the `mhc_bf16` patch) the projection and the Sinkhorn steps round to bf16.

use ctxscope_numerics::round::bf16_slice;

/// A hyper-connection's weights: `mix` rows of `hc * width` (`hc_attn_fn` / `hc_ffn_fn`, rows
/// pre, post, then comb row-major), their biases and the three scales (pre, post, comb).
pub struct HcWeights<'a> {
    pub fn_rows: &'a [f32],
    pub base: &'a [f32],
    pub scale: [f32; 3],
}

/// What a hyper-connection gives a block: its input and how to fold its output back in.
#[derive(Debug, Clone, PartialEq)]
pub struct HcMix {
    /// `hc` weights spreading the block's output over the streams.
    pub post: Vec<f32>,
    /// `hc x hc`, row-major, doubly stochastic: stream j feeds stream k with `comb[j * hc + k]`.
    pub comb: Vec<f32>,
    /// The block's input: the streams collapsed by `pre`.
    pub collapsed: Vec<f32>,
}

/// The mHC settings of a model.
#[derive(Debug, Clone, Copy)]
pub struct HcSettings {
    pub hc: usize,
    pub sinkhorn_iters: usize,
    /// Added to `pre`, `comb` and each Sinkhorn denominator (`hc_eps`).
    pub eps: f32,
    /// The RMS norm's epsilon over the flattened streams (`rms_norm_eps`).
    pub norm_eps: f32,
    /// `mhc_bf16`: the projection's inputs, weights and outputs, and every Sinkhorn step, in bf16.
    pub bf16: bool,
}

/// `x / sqrt(mean(x^2) + eps)`, without a weight (`DeepseekV4UnweightedRMSNorm`).
fn unweighted_rms_norm(x: &[f32], eps: f32) -> Vec<f32> {
    super::dsv4_attention::rms_norm(x, None, eps)
}

/// `rows` (each `x.len()` long) times `x`, the mixing GEMM of one token; `in_bf16`: a bf16 GEMM
/// (inputs, weights and outputs rounded to bf16, f32 accumulator).
fn project(rows: &[f32], x: &[f32], in_bf16: bool) -> Vec<f32> {
    if in_bf16 {
        return ctxscope_numerics::matvec_bf16(rows, x);
    }
    rows.chunks(x.len()).map(|row| ctxscope_numerics::dot(row, x)).collect()
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `streams` (`hc` rows of the width) collapsed by weights `pre`.
fn collapse(streams: &[f32], pre: &[f32]) -> Vec<f32> {
    let width = streams.len() / pre.len();
    let mut out = vec![0f32; width];
    for (stream, &p) in streams.chunks(width).zip(pre) {
        for (o, s) in out.iter_mut().zip(stream) {
            *o += p * s;
        }
    }
    out
}

/// The hyper-connection before a block, for one token's `streams` (`hc * width`).
pub fn hyper_connection(streams: &[f32], w: &HcWeights<'_>, s: HcSettings) -> HcMix {
    let hc = s.hc;
    let mixes = project(w.fn_rows, &unweighted_rms_norm(streams, s.norm_eps), s.bf16);
    let affine = |i: usize, scale: f32| mixes[i] * scale + w.base[i];
    let pre: Vec<f32> = (0..hc).map(|i| sigmoid(affine(i, w.scale[0])) + s.eps).collect();
    let post: Vec<f32> = (hc..2 * hc).map(|i| 2.0 * sigmoid(affine(i, w.scale[1]))).collect();
    // comb: a softmax along each row, plus eps, then Sinkhorn: columns, then (rows, columns) again;
    // under bf16 the matrix is rounded after the softmax and after every row or column normalisation.
    let round = |comb: &mut [f32]| {
        if s.bf16 {
            bf16_slice(comb)
        }
    };
    let mut comb = vec![0f32; hc * hc];
    for (r, row) in comb.chunks_mut(hc).enumerate() {
        let logits: Vec<f32> = (0..hc).map(|c| affine(2 * hc + r * hc + c, w.scale[2])).collect();
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let exps: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
        let sum: f32 = exps.iter().sum();
        for (v, e) in row.iter_mut().zip(&exps) {
            *v = e / sum + s.eps;
        }
    }
    round(&mut comb);
    let normalise_columns = |comb: &mut [f32]| {
        for c in 0..hc {
            let sum: f32 = (0..hc).map(|r| comb[r * hc + c]).sum::<f32>() + s.eps;
            for r in 0..hc {
                comb[r * hc + c] /= sum;
            }
        }
        round(comb);
    };
    normalise_columns(&mut comb);
    for _ in 1..s.sinkhorn_iters {
        for row in comb.chunks_mut(hc) {
            let sum: f32 = row.iter().sum::<f32>() + s.eps;
            row.iter_mut().for_each(|v| *v /= sum);
        }
        round(&mut comb);
        normalise_columns(&mut comb);
    }
    HcMix { post, comb, collapsed: collapse(streams, &pre) }
}

/// Folds a block's output back into the streams: stream k becomes
/// `post[k] * out + sum_j comb[j][k] * stream j`.
pub fn fold(streams: &mut [f32], mix: &HcMix, block_out: &[f32]) {
    let (hc, width) = (mix.post.len(), block_out.len());
    let before = streams.to_vec();
    for (k, stream) in streams.chunks_mut(width).enumerate() {
        for (d, v) in stream.iter_mut().enumerate() {
            let mixed: f32 = (0..hc).map(|j| mix.comb[j * hc + k] * before[j * width + d]).sum();
            *v = mix.post[k] * block_out[d] + mixed;
        }
    }
}

/// The final hyper-head: the streams collapsed by `sigmoid(fn . norm(streams) * scale + base) + eps`
/// (its projection in bf16 too under [`HcSettings::bf16`]).
pub fn head(streams: &[f32], fn_rows: &[f32], base: &[f32], scale: f32, s: HcSettings) -> Vec<f32> {
    let mixes = project(fn_rows, &unweighted_rms_norm(streams, s.norm_eps), s.bf16);
    let pre: Vec<f32> = mixes.iter().zip(base).map(|(m, b)| sigmoid(m * scale + b) + s.eps).collect();
    collapse(streams, &pre)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forward::testutil::tiny;

    #[test]
    fn matches_transformers_on_the_tiny_checkpoint() {
        let (fixture, config, st) = (tiny::json("mhc.json"), tiny::config(), tiny::tensors());
        let t = |name: &str| st.f32(name).unwrap();
        let (fn_rows, base, scale) = (t("model.layers.0.hc_attn_fn"), t("model.layers.0.hc_attn_base"), t("model.layers.0.hc_attn_scale"));
        let weights = HcWeights { fn_rows: &fn_rows, base: &base, scale: [scale[0], scale[1], scale[2]] };
        let s = HcSettings {
            hc: config.hc_mult,
            sinkhorn_iters: config.hc_sinkhorn_iters,
            eps: config.hc_eps,
            norm_eps: config.rms_norm_eps,
            bf16: false,
        };
        let (hc, d) = (config.hc_mult, config.hidden_size);
        let (streams, block_out) = (tiny::floats(&fixture["streams"]), tiny::floats(&fixture["block_out"]));
        let (mut post, mut comb, mut collapsed, mut updated, mut heads) = (vec![], vec![], vec![], vec![], vec![]);
        let (head_fn, head_base, head_scale) = (t("model.hc_head.hc_fn"), t("model.hc_head.hc_base"), t("model.hc_head.hc_scale"));
        for (token, out) in streams.chunks(hc * d).zip(block_out.chunks(d)) {
            let mix = hyper_connection(token, &weights, s);
            // Doubly stochastic, up to the eps in each denominator.
            for i in 0..hc {
                let row: f32 = mix.comb[i * hc..(i + 1) * hc].iter().sum();
                let col: f32 = (0..hc).map(|r| mix.comb[r * hc + i]).sum();
                assert!((row - 1.0).abs() < 1e-4 && (col - 1.0).abs() < 1e-4, "row {row}, column {col}");
            }
            let mut folded = token.to_vec();
            fold(&mut folded, &mix, out);
            heads.extend(head(token, &head_fn, &head_base, head_scale[0], s));
            post.extend(mix.post);
            comb.extend(mix.comb);
            collapsed.extend(mix.collapsed);
            updated.extend(folded);
        }
        for (name, ours) in [("post", &post), ("comb", &comb), ("collapsed", &collapsed), ("updated", &updated), ("head", &heads)] {
            let err = tiny::rel_l2(ours, &tiny::floats(&fixture[name]));
            eprintln!("mhc {name}: rel L2 {err:.1e} against transformers");
            assert!(err < 1e-5, "{name}: rel L2 {err:e} against transformers");
        }
    }
}
