//! One forward pass on the device, enqueued on the stream without synchronizing: the same computation
//! as the CPU's `forward_patched` (RMSNorm, RoPE on adjacent pairs, grouped-query attention over each
//! sequence's cache, SwiGLU), with the patches' roundings at the same points. Rows 0..decode are
//! single-token sequences (split-K decode attention, batched); prefill chunks follow, one attention
//! launch each. Everything that varies between decode steps is read from device buffers, so a decode
//! pass can be captured once as a CUDA graph and replayed.

use ctxscope_kernels::blas::{Activations, Blas, Compute};
use ctxscope_kernels::cudarc::driver::CudaSlice;
use ctxscope_kernels::device::{
    AttentionShape, Device, DeviceError, GemvMode, Matrix, MatrixData, RopeShape, StepIo, StepShape, StreamOp, MAX_STEP_SPANS,
};

use super::weights::DeviceWeights;
use super::workspace::{Scratch, Workspace};
use crate::model::ModelConfig;
use crate::patch::{PatchSet, KV_FP8_SCALE};

/// The numerical patches as the device applies them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Numerics {
    pub rmsnorm_bf16: bool,
    pub residual_gemm_bf16: bool,
    pub rope_bf16: bool,
    pub kv_fp8: bool,
    pub act_q8: bool,
    /// attn_splitk_bf16's chunk (0: off).
    pub splitk_chunk: usize,
    /// sliding_window (0: off).
    pub window: usize,
}

impl Numerics {
    pub fn new(p: &PatchSet) -> Numerics {
        Numerics {
            rmsnorm_bf16: p.rmsnorm_bf16,
            residual_gemm_bf16: p.residual_gemm_bf16,
            rope_bf16: p.rope_bf16,
            kv_fp8: p.kv_fp8,
            act_q8: p.act_q8,
            splitk_chunk: p.attn_splitk_bf16.unwrap_or(0),
            window: p.sliding_window.unwrap_or(0),
        }
    }

    /// No numerical patch: the pass a decode graph captures.
    pub fn is_plain(&self) -> bool {
        *self == Numerics::default()
    }
}

/// A prefill chunk of one sequence: rows `row..row + n`, positions `start..start + n`.
#[derive(Debug, Clone, Copy)]
pub struct PrefillChunk {
    pub row: usize,
    pub n: usize,
    pub start: usize,
    pub kv_base: u64,
}

/// What one pass computes (the per-row ids, positions and cache addresses are already uploaded).
#[derive(Debug, Clone)]
pub struct Plan {
    pub rows: usize,
    /// Rows 0..decode are single-token sequences.
    pub decode: usize,
    pub prefill: Vec<PrefillChunk>,
    /// Sequences whose logits this pass produces (their rows are in `last_rows`).
    pub outputs: usize,
    pub splits: usize,
    /// Decode attention in clusters of this many blocks (0: split-K in `splits` partials); the
    /// attn_splitk_bf16 patch always takes split-K.
    pub cluster: usize,
}

/// The device, its cuBLAS handle and the model's shape: what every pass needs.
pub struct Pass<'a> {
    pub device: &'a Device,
    pub blas: &'a Blas,
    pub config: &'a ModelConfig,
    pub numerics: Numerics,
    /// Passes of up to this many rows use the GEMV kernels (at most GEMV_MAX_ROWS); wider ones cuBLAS.
    pub gemv_rows: usize,
    /// Plain GEMV passes stream the weights through shared memory with the RMSNorms folded into the
    /// products that consume them (`Device::gemv_stream`), where every matrix's plan fits.
    pub stream: bool,
    /// A streamed pass of one decode row runs as one persistent launch (`Device::decode_step`) where
    /// the kernel takes the shape: the same arithmetic, no kernel boundaries between the layers' steps.
    pub persistent: bool,
}

impl Pass<'_> {
    /// Enqueues the whole pass: logits of the `outputs` sequences into `ws.logits`, their greedy
    /// tokens and log-probabilities into `ws.picked`.
    pub fn enqueue(&self, w: &DeviceWeights, ws: &mut Workspace, plan: &Plan) -> Result<(), DeviceError> {
        let (c, d, num) = (self.config, self.device, self.numerics);
        let (n, dim) = (plan.rows, c.dim);
        let q_stride = c.dim + 2 * c.kv_dim();
        d.embed(&w.embed, &ws.inputs.ids(n), &mut ws.x.slice_mut(..n * dim), n)?;
        if let Some(shape) = self.step_shape(w, plan) {
            let io = StepIo {
                x: ws.x.slice_mut(..dim),
                qkv: ws.qkv.slice_mut(..q_stride),
                att: ws.att.slice_mut(..dim),
                act: ws.act.slice_mut(..c.ffn_dim),
                logits: ws.logits.slice_mut(..c.vocab),
                part_o: ws.part_o.slice_mut(..),
                part_ml: ws.part_ml.slice_mut(..),
                sync: ws.sync.slice_mut(..),
                positions: ws.inputs.positions(1),
                kv_base: ws.kv_base.slice(1),
            };
            d.decode_step(&w.table, w.output(), &w.output_norm.slice(..), io, &shape, w.bf16())?;
            let logits = ws.logits.slice(..c.vocab);
            let (mut ids, mut positions) = ws.inputs.next_step();
            return ws
                .picked
                .write(1, |token, logprob| d.argmax_advancing(&logits, 1, c.vocab, token, logprob, Some((&mut ids, &mut positions))));
        }
        let rope = RopeShape {
            n_layers: c.n_layers,
            heads: c.n_heads,
            kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            base: c.rope_base,
            flags: i32::from(num.rope_bf16) | (i32::from(num.kv_fp8) << 1),
            kv_scale: KV_FP8_SCALE,
        };
        // Decode rows without RoPE/K-V/matmul-input patches: RoPE and the K/V store ride in the QKV GEMV.
        let fused_rope = n <= self.gemv_rows && rope.flags == 0 && !num.act_q8;
        let streamed = self.streamable(w, n);
        let bf16 = w.bf16();
        let attn =
            AttentionShape { n_layers: c.n_layers, heads: c.n_heads, kv_heads: c.n_kv_heads, head_dim: c.head_dim, window: num.window };
        for (i, layer) in w.layers.iter().enumerate() {
            let (positions, bases) = (ws.inputs.positions(n), ws.kv_base.slice(n));
            if streamed {
                let norm = Some((&layer.attn_norm.slice(..), c.rms_eps));
                d.gemv_stream_qkv_rope(
                    &layer.wqkv,
                    &ws.x.slice(..n * dim),
                    &mut ws.qkv.slice_mut(..n * q_stride),
                    n,
                    bf16,
                    norm,
                    &positions,
                    &bases,
                    i,
                    &rope,
                    Some(&ws.rope_table),
                )?;
            } else {
                d.rmsnorm(
                    &ws.x.slice(..n * dim),
                    None,
                    &layer.attn_norm.slice(..),
                    &mut ws.h.slice_mut(..n * dim),
                    n,
                    dim,
                    c.rms_eps,
                    num.rmsnorm_bf16,
                )?;
                if fused_rope {
                    d.gemv_qkv_rope(
                        &layer.wqkv,
                        &ws.h.slice(..n * dim),
                        &mut ws.qkv.slice_mut(..n * q_stride),
                        n,
                        bf16,
                        &positions,
                        &bases,
                        i,
                        &rope,
                    )?;
                } else {
                    self.matmul(&layer.wqkv, &ws.h, &mut ws.qkv, n, GemvMode::Store, &mut ws.scratch)?;
                    d.rope_kv(&mut ws.qkv.slice_mut(..n * q_stride), &positions, &bases, n, i, &rope)?;
                }
            }
            if plan.decode > 0 {
                let m = plan.decode;
                if plan.cluster > 0 && num.splitk_chunk == 0 {
                    d.attn_decode_cluster(
                        &ws.qkv.slice(..m * q_stride),
                        &ws.inputs.positions(m),
                        &ws.kv_base.slice(m),
                        i,
                        &mut ws.att.slice_mut(..m * dim),
                        m,
                        plan.cluster,
                        &attn,
                    )?;
                } else {
                    d.attn_decode(
                        &ws.qkv.slice(..m * q_stride),
                        &ws.inputs.positions(m),
                        &ws.kv_base.slice(m),
                        i,
                        (&mut ws.part_o.slice_mut(..), &mut ws.part_ml.slice_mut(..)),
                        &mut ws.att.slice_mut(..m * dim),
                        m,
                        plan.splits,
                        num.splitk_chunk,
                        &attn,
                    )?;
                }
            }
            for chunk in &plan.prefill {
                let (r, k) = (chunk.row, chunk.n);
                d.attn_prefill(
                    &ws.qkv.slice(r * q_stride..(r + k) * q_stride),
                    chunk.kv_base,
                    i,
                    &mut ws.att.slice_mut(r * dim..(r + k) * dim),
                    k,
                    chunk.start,
                    &attn,
                )?;
            }
            if streamed {
                let (ffn, norm) = (layer.w_down.cols, Some((&layer.ffn_norm.slice(..), c.rms_eps)));
                d.gemv_stream(&layer.wo, &ws.att.slice(..n * dim), &mut ws.x.slice_mut(..n * dim), n, GemvMode::Accumulate, bf16, None)?;
                d.gemv_stream(&layer.w_gu, &ws.x.slice(..n * dim), &mut ws.act.slice_mut(..n * ffn), n, GemvMode::SwiGlu, bf16, norm)?;
                d.gemv_stream(
                    &layer.w_down,
                    &ws.act.slice(..n * ffn),
                    &mut ws.x.slice_mut(..n * dim),
                    n,
                    GemvMode::Accumulate,
                    bf16,
                    None,
                )?;
                continue;
            }
            self.residual(&layer.wo, &ws.att, &mut ws.x, n, &mut ws.scratch)?;
            d.rmsnorm(
                &ws.x.slice(..n * dim),
                None,
                &layer.ffn_norm.slice(..),
                &mut ws.h.slice_mut(..n * dim),
                n,
                dim,
                c.rms_eps,
                num.rmsnorm_bf16,
            )?;
            self.matmul(&layer.w_gu, &ws.h, &mut ws.act, n, GemvMode::SwiGlu, &mut ws.scratch)?;
            self.residual(&layer.w_down, &ws.act, &mut ws.x, n, &mut ws.scratch)?;
        }
        let s = plan.outputs;
        if s == 0 {
            // A pass inside a long prompt: only its K/V is wanted (a launch of no blocks would be an error).
            return Ok(());
        }
        let last_rows = ws.inputs.last_rows(s);
        if streamed && plan.prefill.is_empty() && s == n {
            // Every row is an output, in order: the final norm folds into the output projection.
            let norm = Some((&w.output_norm.slice(..), c.rms_eps));
            d.gemv_stream(w.output(), &ws.x.slice(..n * dim), &mut ws.logits.slice_mut(..s * c.vocab), s, GemvMode::Store, bf16, norm)?;
        } else {
            d.rmsnorm(
                &ws.x.slice(..n * dim),
                Some(&last_rows),
                &w.output_norm.slice(..),
                &mut ws.normed.slice_mut(..s * dim),
                s,
                dim,
                c.rms_eps,
                num.rmsnorm_bf16,
            )?;
            if streamed {
                d.gemv_stream(
                    w.output(),
                    &ws.normed.slice(..s * dim),
                    &mut ws.logits.slice_mut(..s * c.vocab),
                    s,
                    GemvMode::Store,
                    bf16,
                    None,
                )?;
            } else {
                self.matmul(w.output(), &ws.normed, &mut ws.logits, s, GemvMode::Store, &mut ws.scratch)?;
            }
        }
        let logits = ws.logits.slice(..s * c.vocab);
        // A decode pass (row r is output r) leaves its next step's inputs on the device: the same pass
        // can then run again without the host (DeviceBackend's speculative step).
        let (mut ids, mut positions) = ws.inputs.next_step();
        let next = (plan.prefill.is_empty() && s == n).then_some((&mut ids, &mut positions));
        ws.picked.write(s, |token, logprob| d.argmax_advancing(&logits, s, c.vocab, token, logprob, next))
    }

    /// The persistent step's shape when this pass is one plain decode row that it takes: asked for,
    /// streamable (the step computes what the streamed pass does) and a plan that fits.
    pub fn step_shape(&self, w: &DeviceWeights, plan: &Plan) -> Option<StepShape> {
        let c = self.config;
        let one_row = plan.rows == 1 && plan.decode == 1 && plan.outputs == 1 && plan.prefill.is_empty();
        if !(self.persistent && one_row && self.streamable(w, 1)) {
            return None;
        }
        let spans = if plan.cluster > 0 { plan.cluster } else { plan.splits };
        let shape = StepShape {
            n_layers: c.n_layers,
            dim: c.dim,
            ffn: c.ffn_dim,
            heads: c.n_heads,
            kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            vocab: c.vocab,
            rope_base: c.rope_base,
            eps: c.rms_eps,
            window: self.numerics.window,
            spans: spans.min(MAX_STEP_SPANS),
        };
        self.device.step_plan(&shape, w.bf16()).map(|_| shape)
    }

    /// Whether this pass of `n` rows takes the streamed GEMVs: asked for, no numerical patch (they
    /// round between the steps the streamed kernels fuse), few enough rows, and every plan fits.
    fn streamable(&self, w: &DeviceWeights, n: usize) -> bool {
        let d = self.device;
        let fits = |m: &Matrix, op: StreamOp, norm: bool| d.stream_plan(m, n, op, norm).is_some();
        let (store, accumulate) = (StreamOp::Gemv(GemvMode::Store), StreamOp::Gemv(GemvMode::Accumulate));
        self.stream
            && n <= self.gemv_rows
            && self.numerics.is_plain()
            && fits(w.output(), store, true)
            && w.layers.iter().all(|l| {
                fits(&l.wqkv, StreamOp::QkvRope, true)
                    && fits(&l.wo, accumulate, false)
                    && fits(&l.w_gu, StreamOp::Gemv(GemvMode::SwiGlu), true)
                    && fits(&l.w_down, accumulate, false)
            })
    }

    /// A matmul whose product is added to the residual stream `x`: fused (accumulate) unless
    /// residual_gemm_bf16 rounds its input and product to bf16 (CPU: `residual_mm`; act_q8 after).
    fn residual(&self, w: &Matrix, input: &CudaSlice<f32>, x: &mut CudaSlice<f32>, n: usize, s: &mut Scratch) -> Result<(), DeviceError> {
        if !self.numerics.residual_gemm_bf16 {
            return self.matmul(w, input, x, n, GemvMode::Accumulate, s);
        }
        let d = self.device;
        let (len, out) = (n * w.cols, n * w.rows);
        let Scratch { tmp, xb, gu, proj } = s;
        d.stream.memcpy_dtod(&input.slice(..len), &mut tmp.slice_mut(..len))?;
        d.round(&mut tmp.slice_mut(..len), len, None)?;
        if self.numerics.act_q8 {
            self.q8(tmp, len)?;
        }
        self.product(w, tmp, proj, n, GemvMode::Store, xb, gu)?;
        d.round(&mut proj.slice_mut(..out), out, None)?;
        d.add(&mut x.slice_mut(..out), &proj.slice(..out), out)
    }

    /// `out (mode)= W input` over `n` rows; act_q8 rounds the input rows first (on a copy).
    fn matmul(
        &self,
        w: &Matrix,
        input: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        n: usize,
        mode: GemvMode,
        s: &mut Scratch,
    ) -> Result<(), DeviceError> {
        let Scratch { tmp, xb, gu, .. } = s;
        if !self.numerics.act_q8 {
            return self.product(w, input, out, n, mode, xb, gu);
        }
        let len = n * w.cols;
        self.device.stream.memcpy_dtod(&input.slice(..len), &mut tmp.slice_mut(..len))?;
        self.q8(tmp, len)?;
        self.product(w, tmp, out, n, mode, xb, gu)
    }

    fn q8(&self, x: &mut CudaSlice<f32>, len: usize) -> Result<(), DeviceError> {
        if !len.is_multiple_of(32) {
            return Err(DeviceError::Shape { kernel: "act_q8", detail: format!("{len} values are not whole blocks of 32") });
        }
        self.device.q8_blocks(&mut x.slice_mut(..len), len)
    }

    /// The product itself: GEMV for up to `gemv_rows` rows, cuBLAS beyond (bf16 weights take bf16
    /// inputs there; the GEMV rounds its input to bf16 on load to match).
    #[allow(clippy::too_many_arguments)]
    fn product(
        &self,
        w: &Matrix,
        src: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        n: usize,
        mode: GemvMode,
        xb: &mut CudaSlice<u16>,
        gu: &mut CudaSlice<f32>,
    ) -> Result<(), DeviceError> {
        let d = self.device;
        let len = n * w.cols;
        let out_rows = mode.outputs(w.rows);
        let bf16 = matches!(w.data, MatrixData::Bf16(_));
        if n <= self.gemv_rows {
            return d.gemv(w, &src.slice(..len), &mut out.slice_mut(..n * out_rows), n, mode, bf16);
        }
        let accumulate = mode == GemvMode::Accumulate;
        let swiglu = mode == GemvMode::SwiGlu;
        {
            let mut gemm_out = if swiglu { gu.slice_mut(..n * w.rows) } else { out.slice_mut(..n * w.rows) };
            if bf16 {
                d.to_bf16(&src.slice(..len), &mut xb.slice_mut(..len), len)?;
                self.blas.matmul(w, Activations::Bf16(&xb.slice(..len)), &mut gemm_out, n, Compute::F32, accumulate)?;
            } else {
                self.blas.matmul(w, Activations::F32(&src.slice(..len)), &mut gemm_out, n, Compute::F32, accumulate)?;
            }
        }
        if swiglu {
            d.swiglu(&gu.slice(..n * w.rows), &mut out.slice_mut(..n * out_rows), n, out_rows)?;
        }
        Ok(())
    }
}
