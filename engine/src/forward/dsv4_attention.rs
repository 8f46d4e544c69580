//! DeepSeek-V4's attention, golden f32, over a whole sequence (no cache yet): the sliding-window
//! branch every layer has. Queries through a low-rank path (`wq_a`, weighted RMS norm, `wq_b`, then
//! an unweighted RMS norm per head), one shared key-and-value head (`wkv`, RMS norm), interleaved RoPE
//! on the trailing `rope_dim` channels of each head, a learned sink logit per head, the window of the
//! last `window` positions, RoPE undone on the output at the query's position, and the grouped
//! low-rank output projection (`wo_a` per group of heads, then `wo_b`). As transformers'
//! `DeepseekV4Attention` computes it for `sliding_attention` layers.

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

/// The sliding-window attention of `x` (`seq` rows of the model width, at positions `0..seq`).
pub fn sliding_attention(x: &[f32], width: usize, w: &AttentionWeights<'_>, s: &AttentionShape) -> Vec<f32> {
    let hd = s.head_dim;
    let seq = x.len() / width;
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
        let mut heads = vec![0f32; s.heads * hd];
        for (h, (qh, oh)) in q.chunks(hd).zip(heads.chunks_mut(hd)).enumerate() {
            let logits: Vec<f32> = (first..=t).map(|j| dot(qh, &kvs[j]) * scale).collect();
            // The sink joins the softmax and takes its share, then is dropped.
            let max = logits.iter().copied().fold(w.sinks[h], f32::max);
            let exps: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
            let total: f32 = exps.iter().sum::<f32>() + (w.sinks[h] - max).exp();
            for (e, j) in exps.iter().zip(first..=t) {
                let p = e / total;
                for (o, v) in oh.iter_mut().zip(&kvs[j]) {
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
    use serde_json::Value;
    use std::path::PathBuf;

    fn tiny() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/deepseek_v4/tiny")
    }

    fn floats(v: &Value) -> Vec<f32> {
        v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
    }

    #[test]
    fn sliding_layer_matches_transformers_on_the_tiny_checkpoint() {
        let fixture: Value = serde_json::from_str(&std::fs::read_to_string(tiny().join("attention_sliding.json")).unwrap()).unwrap();
        let config_json = serde_json::from_str(&std::fs::read_to_string(tiny().join("config.json")).unwrap()).unwrap();
        let c = crate::model::deepseek_v4::DeepseekV4Config::from_json(&config_json).unwrap();
        let st = ctxscope_formats::SafeTensors::open_dir(&tiny()).unwrap();
        let t = |name: &str| st.f32(&format!("model.layers.0.attn.{name}")).unwrap();
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
        let s = AttentionShape {
            heads: c.num_heads,
            head_dim: c.head_dim,
            rope_dim: c.rope_dim,
            o_groups: c.o_groups,
            window: c.sliding_window,
            rope_theta: c.rope_theta as f32,
            eps: c.rms_norm_eps,
        };
        let ours = sliding_attention(&floats(&fixture["x_normed"]), c.hidden_size, &w, &s);
        let reference = floats(&fixture["out"]);
        let rows = reference.len() / c.hidden_size;
        for (i, (a, b)) in ours.chunks(c.hidden_size).zip(reference.chunks(c.hidden_size)).enumerate() {
            let diff: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
            let err = (diff / b.iter().map(|y| y * y).sum::<f32>()).sqrt();
            assert!(err < 1e-5, "position {i} of {rows}: rel L2 {err:e}");
        }
        let diff: f32 = ours.iter().zip(&reference).map(|(x, y)| (x - y) * (x - y)).sum();
        eprintln!("sliding attention: rel L2 {:.1e} against transformers", (diff / reference.iter().map(|y| y * y).sum::<f32>()).sqrt());
    }
}
