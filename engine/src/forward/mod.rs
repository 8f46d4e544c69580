//! The Llama-family forward pass over a batch of segments (a prefill chunk of one sequence, or one
//! decode token of each of many): RMSNorm, RoPE on adjacent pairs (GGUF's permuted Q/K), grouped-query
//! attention against each segment's KV cache, SwiGLU. All activations are f32; the `Path` decides
//! only how the weight matmuls are computed, and a [`PatchSet`] may round at the points `crate::patch`
//! documents (the empty set takes exactly the unpatched code).

mod attention;
pub mod deepseek_v4;
pub mod dsv4_attention;
#[cfg(test)]
mod dsv4_patches;
pub mod dsv4_products;
mod fast;
mod golden;
mod matmul;
pub mod mhc;
pub mod moe;
mod ops;
#[cfg(test)]
pub(crate) mod testutil;

use std::borrow::Cow;

use crate::kv::KvCache;
use crate::model::{Matrix, Model};
use crate::patch::{round, PatchSet, KV_FP8_SCALE};

pub(crate) use fast::f32_to_f16;
pub use matmul::matmul;
use matmul::{products, Epilogue, Product};

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

/// The input rows of a weight matmul under the patches that act on every matmul input (`act_q8`
/// rounds them as llama.cpp's 8-bit activation blocks); borrowed unchanged otherwise.
fn matmul_input<'x>(patches: &PatchSet, x: &'x [f32], cols: usize) -> Cow<'x, [f32]> {
    if !patches.act_q8 {
        return Cow::Borrowed(x);
    }
    let mut xq = x.to_vec();
    for row in xq.chunks_mut(cols) {
        round::q8_blocks(row, |v| ctxscope_formats::gguf::f16_to_f32(f32_to_f16(v)));
    }
    Cow::Owned(xq)
}

/// x += W a, a layer's residual add (`residual_gemm_bf16` rounds the matmul's input and output to
/// bf16 here; `proj` holds the rounded product then).
fn residual(path: Path, patches: &PatchSet, w: &Matrix, a: &[f32], n: usize, x: &mut [f32], proj: &mut [f32]) {
    if patches.residual_gemm_bf16 {
        let mut ab = a.to_vec();
        round::bf16_slice(&mut ab);
        matmul(path, w, &matmul_input(patches, &ab, w.cols), n, proj);
        round::bf16_slice(proj);
        ops::add_assign(x, proj);
    } else {
        products(path, &matmul_input(patches, a, w.cols), n, vec![Product { w, epilogue: Epilogue::Add, out: x }]);
    }
}

fn norm(patches: &PatchSet, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    if patches.rmsnorm_bf16 {
        ops::rmsnorm_rows_bf16(x, weight, eps, out);
    } else {
        ops::rmsnorm_rows(x, weight, eps, out);
    }
}

/// [`forward`] under a patch set. The pass runs on the thread pool's own threads, so the caller
/// waits once per pass rather than once per parallel operation.
pub fn forward_patched(model: &Model, path: Path, patches: &PatchSet, segments: &mut [Segment<'_>]) -> Vec<Vec<f32>> {
    rayon::scope(|_| pass(model, path, patches, segments))
}

fn pass(model: &Model, path: Path, patches: &PatchSet, segments: &mut [Segment<'_>]) -> Vec<Vec<f32>> {
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
    let rope = ops::RopeTable::new(&positions, c.head_dim, c.rope_base, patches.rope_bf16);
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
    let mut proj = if patches.residual_gemm_bf16 { vec![0f32; n * dim] } else { Vec::new() };
    let mut hidden = vec![0f32; n * c.ffn_dim];
    for (l, layer) in w.layers.iter().enumerate() {
        norm(patches, &x, &layer.attn_norm, c.rms_eps, &mut xb);
        let qkv = vec![
            Product { w: &layer.wq, epilogue: Epilogue::Store, out: &mut q },
            Product { w: &layer.wk, epilogue: Epilogue::Store, out: &mut k },
            Product { w: &layer.wv, epilogue: Epilogue::Store, out: &mut v },
        ];
        products(path, &matmul_input(patches, &xb, dim), n, qkv);
        ops::rope_rows(&mut q, c.n_heads, c.head_dim, &rope);
        ops::rope_rows(&mut k, c.n_kv_heads, c.head_dim, &rope);
        if patches.kv_fp8 {
            round::fp8_scaled_slice(&mut k, KV_FP8_SCALE);
            round::fp8_scaled_slice(&mut v, KV_FP8_SCALE);
        }
        for (s, seg) in segments.iter_mut().enumerate() {
            let rows = starts[s]..starts[s] + seg.tokens.len();
            seg.kv.append(l, &k[rows.start * kv_dim..rows.end * kv_dim], &v[rows.start * kv_dim..rows.end * kv_dim]);
            // Split-K is a decode kernel: it applies to single-token segments only.
            let splitk = if seg.tokens.len() == 1 { patches.attn_splitk_bf16 } else { None };
            attention::attention(
                &q[rows.start * dim..rows.end * dim],
                seg.kv,
                l,
                &positions[rows.clone()],
                c,
                attention::AttnShape { window: patches.sliding_window, splitk },
                &mut att[rows.start * dim..rows.end * dim],
            );
        }
        residual(path, patches, &layer.wo, &att, n, &mut x, &mut proj);
        norm(patches, &x, &layer.ffn_norm, c.rms_eps, &mut xb);
        let ffn = vec![Product { w: &layer.w_gate, epilogue: Epilogue::SwiGlu { up: &layer.w_up }, out: &mut hidden }];
        products(path, &matmul_input(patches, &xb, dim), n, ffn);
        residual(path, patches, &layer.w_down, &hidden, n, &mut x, &mut proj);
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
    matmul(path, w.output(), &matmul_input(patches, &normed, dim), last.len(), &mut logits);
    logits.chunks(c.vocab).map(<[f32]>::to_vec).collect()
}
