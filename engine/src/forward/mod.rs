//! The Llama-family forward pass over a batch of segments (a prefill chunk of one sequence, or one
//! decode token of each of many): RMSNorm, RoPE on adjacent pairs (GGUF's permuted Q/K), grouped-query
//! attention against each segment's KV cache, SwiGLU. All activations are f32; the `Path` decides
//! only how the weight matmuls are computed, and a [`PatchSet`] may round at the points `crate::patch`
//! documents (the empty set takes exactly the unpatched code).

mod fast;
mod matmul;
mod ops;

use crate::kv::KvCache;
use crate::model::{Matrix, Model};
use crate::patch::{round, PatchSet, KV_FP8_SCALE};

pub(crate) use fast::f32_to_f16;
pub use matmul::matmul;

pub use crate::path::Path;

/// Tokens of one sequence at positions `kv.len() ..`, appended to its cache as they are computed.
pub struct Segment<'a> {
    pub tokens: &'a [u32],
    pub kv: &'a mut KvCache,
}

/// Runs the segments through the model; returns the logits of each segment's last token.
pub fn forward(model: &Model, path: Path, segments: &mut [Segment<'_>]) -> Vec<Vec<f32>> {
    forward_patched(model, path, &PatchSet::default(), segments)
}

/// A weight matmul under the patches that act on every matmul (`act_q8`).
fn mm(path: Path, patches: &PatchSet, w: &Matrix, x: &[f32], n: usize, out: &mut [f32]) {
    if patches.act_q8 {
        let mut xq = x.to_vec();
        for row in xq.chunks_mut(w.cols) {
            round::q8_blocks(row, |v| ctxscope_formats::gguf::f16_to_f32(f32_to_f16(v)));
        }
        matmul(path, w, &xq, n, out);
    } else {
        matmul(path, w, x, n, out);
    }
}

/// A matmul whose output is added to the residual stream (`residual_gemm_bf16` rounds here).
fn residual_mm(path: Path, patches: &PatchSet, w: &Matrix, x: &[f32], n: usize, out: &mut [f32]) {
    if patches.residual_gemm_bf16 {
        let mut xb = x.to_vec();
        round::bf16_slice(&mut xb);
        mm(path, patches, w, &xb, n, out);
        round::bf16_slice(out);
    } else {
        mm(path, patches, w, x, n, out);
    }
}

fn norm(patches: &PatchSet, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    if patches.rmsnorm_bf16 {
        ops::rmsnorm_rows_bf16(x, weight, eps, out);
    } else {
        ops::rmsnorm_rows(x, weight, eps, out);
    }
}

/// [`forward`] under a patch set.
pub fn forward_patched(model: &Model, path: Path, patches: &PatchSet, segments: &mut [Segment<'_>]) -> Vec<Vec<f32>> {
    let c = &model.config;
    let w = &model.weights;
    let n: usize = segments.iter().map(|s| s.tokens.len()).sum();
    if n == 0 {
        return Vec::new();
    }
    let (dim, kv_dim) = (c.dim, c.kv_dim());
    // Positions of every row, and where each segment's rows start.
    let mut positions = Vec::with_capacity(n);
    let mut starts = Vec::with_capacity(segments.len());
    for seg in segments.iter() {
        starts.push(positions.len());
        let base = seg.kv.len();
        positions.extend((0..seg.tokens.len()).map(|i| base + i));
    }
    let mut x = vec![0f32; n * dim];
    for (row, token) in segments.iter().flat_map(|s| s.tokens.iter()).enumerate() {
        let t = (*token as usize).min(c.vocab - 1);
        x[row * dim..(row + 1) * dim].copy_from_slice(&w.token_embd.f32[t * dim..(t + 1) * dim]);
    }
    let mut xb = vec![0f32; n * dim];
    let mut q = vec![0f32; n * dim];
    let mut k = vec![0f32; n * kv_dim];
    let mut v = vec![0f32; n * kv_dim];
    let mut att = vec![0f32; n * dim];
    let mut proj = vec![0f32; n * dim];
    let mut gate = vec![0f32; n * c.ffn_dim];
    let mut up = vec![0f32; n * c.ffn_dim];
    for (l, layer) in w.layers.iter().enumerate() {
        norm(patches, &x, &layer.attn_norm, c.rms_eps, &mut xb);
        mm(path, patches, &layer.wq, &xb, n, &mut q);
        mm(path, patches, &layer.wk, &xb, n, &mut k);
        mm(path, patches, &layer.wv, &xb, n, &mut v);
        ops::rope_rows(&mut q, c.n_heads, c.head_dim, &positions, c.rope_base, patches.rope_bf16);
        ops::rope_rows(&mut k, c.n_kv_heads, c.head_dim, &positions, c.rope_base, patches.rope_bf16);
        if patches.kv_fp8 {
            round::fp8_scaled_slice(&mut k, KV_FP8_SCALE);
            round::fp8_scaled_slice(&mut v, KV_FP8_SCALE);
        }
        for (s, seg) in segments.iter_mut().enumerate() {
            let rows = starts[s]..starts[s] + seg.tokens.len();
            seg.kv.append(l, &k[rows.start * kv_dim..rows.end * kv_dim], &v[rows.start * kv_dim..rows.end * kv_dim]);
            // Split-K is a decode kernel: it applies to single-token segments only.
            let splitk = if seg.tokens.len() == 1 { patches.attn_splitk_bf16 } else { None };
            ops::attention(
                &q[rows.start * dim..rows.end * dim],
                seg.kv,
                l,
                &positions[rows.clone()],
                c,
                ops::AttnShape { window: patches.sliding_window, splitk },
                &mut att[rows.start * dim..rows.end * dim],
            );
        }
        residual_mm(path, patches, &layer.wo, &att, n, &mut proj);
        ops::add_assign(&mut x, &proj);
        norm(patches, &x, &layer.ffn_norm, c.rms_eps, &mut xb);
        mm(path, patches, &layer.w_gate, &xb, n, &mut gate);
        mm(path, patches, &layer.w_up, &xb, n, &mut up);
        ops::swiglu(&mut gate, &up);
        residual_mm(path, patches, &layer.w_down, &gate, n, &mut proj);
        ops::add_assign(&mut x, &proj);
    }
    for seg in segments.iter_mut() {
        seg.kv.commit(seg.tokens.len());
    }
    // Final norm and logits for each segment's last row only.
    let last: Vec<usize> = starts.iter().zip(segments.iter()).map(|(s, seg)| s + seg.tokens.len() - 1).collect();
    let mut rows = vec![0f32; last.len() * dim];
    for (i, row) in last.iter().enumerate() {
        rows[i * dim..(i + 1) * dim].copy_from_slice(&x[row * dim..(row + 1) * dim]);
    }
    let mut normed = vec![0f32; rows.len()];
    norm(patches, &rows, &w.output_norm, c.rms_eps, &mut normed);
    let mut logits = vec![0f32; last.len() * c.vocab];
    mm(path, patches, w.output(), &normed, last.len(), &mut logits);
    logits.chunks(c.vocab).map(<[f32]>::to_vec).collect()
}
