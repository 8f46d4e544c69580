//! DeepSeek-V4's attention, golden f32, over a whole sequence (no cache yet): the sliding-window
//! branch every layer has, and the heavily compressed blocks (HCA) some add. Queries through a low-rank path (`wq_a`, weighted RMS norm, `wq_b`, then
//! an unweighted RMS norm per head), one shared key-and-value head (`wkv`, RMS norm), interleaved RoPE
//! on the trailing `rope_dim` channels of each head, a learned sink logit per head, the window of the
//! last `window` positions, RoPE undone on the output at the query's position, and the grouped
//! low-rank output projection (`wo_a` per group of heads, then `wo_b`). An HCA layer's compressor
//! turns each closed block of `rate` tokens into one more key-and-value entry (a per-channel softmax
//! of the gates, plus a per-slot bias, over the block; RMS norm; RoPE at the block's first position),
//! which a query sees once the block has closed by its position. As transformers'
//! `DeepseekV4Attention` and `DeepseekV4HCACompressor` compute them.

use ctxscope_numerics::dot;

/// One attention layer's weights (row-major, rows as the checkpoint stores them).
pub struct AttentionWeights<'a> {
    pub wq_a: &'a [f32],
    pub q_norm: &'a [f32],
    pub wq_b: &'a [f32],
    pub wkv: &'a [f32],
    pub kv_norm: &'a [f32],
    pub wo_a: &'a [f32],
    pub wo_b: &'a [f32],
    pub sinks: &'a [f32],
}

/// A heavily compressed attention layer's compressor.
pub struct Compressor<'a> {
    pub wkv: &'a [f32],
    pub wgate: &'a [f32],
    /// `rate` rows of per-slot gate biases (`ape`).
    pub ape: &'a [f32],
    pub norm: &'a [f32],
    pub rate: usize,
}

/// The attention's shape and constants.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub heads: usize,
    pub head_dim: usize,
    pub rope_dim: usize,
    pub o_groups: usize,
    pub window: usize,
    pub rope_theta: f32,
    pub eps: f32,
}

fn matvec(rows: &[f32], x: &[f32]) -> Vec<f32> {
    rows.chunks(x.len()).map(|row| dot(row, x)).collect()
}

/// RMS norm of `x`, times `weight` when given.
fn rms_norm(x: &[f32], weight: Option<&[f32]>, eps: f32) -> Vec<f32> {
    let scale = 1.0 / (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32 + eps).sqrt();
    match weight {
        Some(w) => x.iter().zip(w).map(|(v, w)| w * (v * scale)).collect(),
        None => x.iter().map(|v| v * scale).collect(),
    }
}

/// Turns the trailing `rope_dim` channels of `head` by position `pos` (interleaved pairs), or back
/// when `inverse`.
fn rope(head: &mut [f32], pos: usize, s: &AttentionShape, inverse: bool) {
    let start = head.len() - s.rope_dim;
    for (i, pair) in head[start..].chunks_mut(2).enumerate() {
        let inv_freq = 1.0 / s.rope_theta.powf((2 * i) as f32 / s.rope_dim as f32);
        let angle = pos as f32 * inv_freq;
        let (cos, sin) = (angle.cos(), if inverse { -angle.sin() } else { angle.sin() });
        let (a, b) = (pair[0], pair[1]);
        pair[0] = a * cos - b * sin;
        pair[1] = b * cos + a * sin;
    }
}

/// One entry per closed block of `c.rate` rows of `x`, RoPE'd at the block's first position.
fn compress(x: &[f32], width: usize, c: &Compressor<'_>, s: &AttentionShape) -> Vec<Vec<f32>> {
    let hd = s.head_dim;
    let rows: Vec<&[f32]> = x.chunks(width).collect();
    rows.chunks_exact(c.rate)
        .enumerate()
        .map(|(block, rows)| {
            let kv: Vec<Vec<f32>> = rows.iter().map(|r| matvec(c.wkv, r)).collect();
            let gate: Vec<Vec<f32>> = rows
                .iter()
                .enumerate()
                .map(|(slot, r)| matvec(c.wgate, r).iter().zip(&c.ape[slot * hd..(slot + 1) * hd]).map(|(g, b)| g + b).collect())
                .collect();
            let mut entry = vec![0f32; hd];
            for (ch, e) in entry.iter_mut().enumerate() {
                let max = gate.iter().map(|g| g[ch]).fold(f32::NEG_INFINITY, f32::max);
                let exps: Vec<f32> = gate.iter().map(|g| (g[ch] - max).exp()).collect();
                let sum: f32 = exps.iter().sum();
                *e = exps.iter().zip(&kv).map(|(p, k)| p / sum * k[ch]).sum();
            }
            let mut entry = rms_norm(&entry, Some(c.norm), s.eps);
            rope(&mut entry, block * c.rate, s, false);
            entry
        })
        .collect()
}

/// The sliding-window attention of `x` (`seq` rows of the model width, at positions `0..seq`).
pub fn sliding_attention(x: &[f32], width: usize, w: &AttentionWeights<'_>, s: &AttentionShape) -> Vec<f32> {
    attention(x, width, w, s, None)
}

/// The attention of an HCA layer: the window plus every block closed by the query's position.
pub fn heavily_compressed_attention(x: &[f32], width: usize, w: &AttentionWeights<'_>, c: &Compressor<'_>, s: &AttentionShape) -> Vec<f32> {
    attention(x, width, w, s, Some(c))
}

fn attention(x: &[f32], width: usize, w: &AttentionWeights<'_>, s: &AttentionShape, compressor: Option<&Compressor<'_>>) -> Vec<f32> {
    let hd = s.head_dim;
    let seq = x.len() / width;
    let blocks = compressor.map(|c| compress(x, width, c, s)).unwrap_or_default();
    let mut queries = Vec::with_capacity(seq);
    let mut kvs = Vec::with_capacity(seq);
    for (pos, row) in x.chunks(width).enumerate() {
        let q_res = rms_norm(&matvec(w.wq_a, row), Some(w.q_norm), s.eps);
        let mut q = matvec(w.wq_b, &q_res);
        for head in q.chunks_mut(hd) {
            let normed = rms_norm(head, None, s.eps);
            head.copy_from_slice(&normed);
            rope(head, pos, s, false);
        }
        let mut kv = rms_norm(&matvec(w.wkv, row), Some(w.kv_norm), s.eps);
        rope(&mut kv, pos, s, false);
        queries.push(q);
        kvs.push(kv);
    }
    let scale = (hd as f32).powf(-0.5);
    let group_in = s.heads * hd / s.o_groups;
    let mut out = Vec::with_capacity(x.len());
    for (t, q) in queries.iter().enumerate() {
        let first = (t + 1).saturating_sub(s.window);
        // The window's raw entries, then the compressed blocks closed by position t.
        let closed = compressor.map_or(0, |c| ((t + 1) / c.rate).min(blocks.len()));
        let keys: Vec<&[f32]> = kvs[first..=t].iter().chain(&blocks[..closed]).map(Vec::as_slice).collect();
        let mut heads = vec![0f32; s.heads * hd];
        for (h, (qh, oh)) in q.chunks(hd).zip(heads.chunks_mut(hd)).enumerate() {
            let logits: Vec<f32> = keys.iter().map(|k| dot(qh, k) * scale).collect();
            // The sink joins the softmax and takes its share, then is dropped.
            let max = logits.iter().copied().fold(w.sinks[h], f32::max);
            let exps: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
            let total: f32 = exps.iter().sum::<f32>() + (w.sinks[h] - max).exp();
            for (e, k) in exps.iter().zip(&keys) {
                let p = e / total;
                for (o, v) in oh.iter_mut().zip(k.iter()) {
                    *o += p * v;
                }
            }
            rope(oh, t, s, true);
        }
        let low: Vec<f32> =
            heads.chunks(group_in).zip(w.wo_a.chunks(w.wo_a.len() / s.o_groups)).flat_map(|(group, rows)| matvec(rows, group)).collect();
        out.extend(matvec(w.wo_b, &low));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::deepseek_v4::AttentionKind;
    use serde_json::Value;
    use std::path::PathBuf;

    fn tiny() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/deepseek_v4/tiny")
    }

    fn floats(v: &Value) -> Vec<f32> {
        v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
    }

    fn check(fixture_name: &str) {
        let fixture: Value = serde_json::from_str(&std::fs::read_to_string(tiny().join(fixture_name)).unwrap()).unwrap();
        let config_json = serde_json::from_str(&std::fs::read_to_string(tiny().join("config.json")).unwrap()).unwrap();
        let c = crate::model::deepseek_v4::DeepseekV4Config::from_json(&config_json).unwrap();
        let layer = fixture["layer"].as_u64().unwrap() as usize;
        let st = ctxscope_formats::SafeTensors::open_dir(&tiny()).unwrap();
        let t = |name: &str| st.f32(&format!("model.layers.{layer}.attn.{name}")).unwrap();
        let (wq_a, q_norm, wq_b, wkv, kv_norm, wo_a, wo_b, sinks) = (
            t("wq_a.weight"),
            t("q_norm.weight"),
            t("wq_b.weight"),
            t("wkv.weight"),
            t("norm.weight"),
            t("wo_a.weight"),
            t("wo_b.weight"),
            t("attn_sink"),
        );
        let w = AttentionWeights {
            wq_a: &wq_a,
            q_norm: &q_norm,
            wq_b: &wq_b,
            wkv: &wkv,
            kv_norm: &kv_norm,
            wo_a: &wo_a,
            wo_b: &wo_b,
            sinks: &sinks,
        };
        let kind = c.layers[layer].0;
        // Sliding layers turn by the main RoPE base, compressed ones (and their blocks) by the compress one.
        let theta = if kind == AttentionKind::Sliding { c.rope_theta } else { c.compress_rope_theta };
        let s = AttentionShape {
            heads: c.num_heads,
            head_dim: c.head_dim,
            rope_dim: c.rope_dim,
            o_groups: c.o_groups,
            window: c.sliding_window,
            rope_theta: theta as f32,
            eps: c.rms_norm_eps,
        };
        let x = floats(&fixture["x_normed"]);
        let ours = match kind {
            AttentionKind::Sliding => sliding_attention(&x, c.hidden_size, &w, &s),
            AttentionKind::HeavilyCompressed => {
                let (ckv, cgate, ape, cnorm) =
                    (t("compressor.wkv.weight"), t("compressor.wgate.weight"), t("compressor.ape"), t("compressor.norm.weight"));
                let comp = Compressor { wkv: &ckv, wgate: &cgate, ape: &ape, norm: &cnorm, rate: c.hca_rate };
                heavily_compressed_attention(&x, c.hidden_size, &w, &comp, &s)
            }
            AttentionKind::CompressedSparse => unimplemented!("compressed sparse attention is not implemented yet"),
        };
        let reference = floats(&fixture["out"]);
        let rows = reference.len() / c.hidden_size;
        for (i, (a, b)) in ours.chunks(c.hidden_size).zip(reference.chunks(c.hidden_size)).enumerate() {
            let diff: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
            let err = (diff / b.iter().map(|y| y * y).sum::<f32>()).sqrt();
            assert!(err < 1e-5, "{fixture_name}: position {i} of {rows}: rel L2 {err:e}");
        }
        let diff: f32 = ours.iter().zip(&reference).map(|(x, y)| (x - y) * (x - y)).sum();
        eprintln!("{fixture_name}: rel L2 {:.1e} against transformers", (diff / reference.iter().map(|y| y * y).sum::<f32>()).sqrt());
    }

    #[test]
    fn sliding_layer_matches_transformers_on_the_tiny_checkpoint() {
        check("attention_sliding.json");
    }

    #[test]
    fn heavily_compressed_layer_matches_transformers_on_the_tiny_checkpoint() {
        check("attention_hca.json");
    }
}
