//! The persistent decode step (cuda/decode.cu `decode_step_*`): one launch per batch-1 decode step,
//! from the embedded token to the logits, one block per SM for the whole step; its plan (ring slots
//! per thread, shared memory, whether every block can be resident at once) and its launch.

use cudarc::driver::{CudaFunction, CudaSlice, CudaView, CudaViewMut, LaunchConfig};

use super::{check, opt_in_smem, Device, DeviceError, In, Matrix, MatrixData, MAX_GROUP, MAX_HEAD_DIM};
use crate::launch::KernelArg;

/// Threads per block (`DS_THREADS`).
const THREADS: usize = 512;
/// Device addresses per layer in the layer table (`DS_LAYER_PTRS`): wqkv, wo, w_gu, w_down, attn_norm, ffn_norm.
const LAYER_PTRS: usize = 6;
/// Most attention spans per KV head (`DS_MAX_SPANS`).
pub const MAX_SPANS: usize = 32;
/// K (and as many V) rows of the attention tile (`CL_ROWS`).
const TILE_ROWS: usize = 64;

/// The model's shape as the step kernel needs it.
#[derive(Debug, Clone, Copy)]
pub struct StepShape {
    pub n_layers: usize,
    pub dim: usize,
    pub ffn: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub rope_base: f32,
    pub eps: f32,
    /// Keep only the last `window` positions (0: all).
    pub window: usize,
    /// Attention spans per KV head: the blocks of one KV head's attention (as `attn_decode_cluster`'s
    /// cluster size, whose arithmetic the step repeats).
    pub spans: usize,
}

impl StepShape {
    fn q_stride(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.head_dim
    }
}

/// How a step launch is cut: ring groups per thread and dynamic shared memory (one block per SM).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepPlan {
    pub slots: usize,
    pub smem: usize,
}

/// The buffers one step reads and writes (row 0 of each; `sync` zero before the first launch, the
/// kernel leaves it zero).
pub struct StepIo<'a> {
    /// The residual stream: the embedded token in, the last layer's output out.
    pub x: CudaViewMut<'a, f32>,
    pub qkv: CudaViewMut<'a, f32>,
    pub att: CudaViewMut<'a, f32>,
    pub act: CudaViewMut<'a, f32>,
    pub logits: CudaViewMut<'a, f32>,
    pub part_o: CudaViewMut<'a, f32>,
    pub part_ml: CudaViewMut<'a, f32>,
    pub sync: CudaViewMut<'a, u32>,
    pub positions: CudaView<'a, i32>,
    pub kv_base: CudaView<'a, u64>,
}

/// One layer's weights as the layer table lists them.
pub struct StepLayer<'a> {
    pub wqkv: &'a Matrix,
    pub wo: &'a Matrix,
    pub w_gu: &'a Matrix,
    pub w_down: &'a Matrix,
    pub attn_norm: &'a CudaSlice<f32>,
    pub ffn_norm: &'a CudaSlice<f32>,
}

/// Counters the step kernel needs in `StepIo::sync` for `kv_heads`.
pub fn sync_len(kv_heads: usize) -> usize {
    2 + kv_heads
}

/// Lets the step kernels take all the dynamic shared memory a block may opt in to.
pub(super) fn step_attributes(kernels: [&CudaFunction; 2], optin: usize) -> Result<usize, DeviceError> {
    let mut limit = optin;
    for f in kernels {
        limit = limit.min(opt_in_smem(f, optin)?);
    }
    Ok(limit)
}

impl Device {
    /// The layer table of one set of weights: per layer the addresses of wqkv, wo, w_gu, w_down and
    /// the two norm weights (`LAYER_PTRS`), uploaded once.
    pub fn layer_table<'a>(&self, layers: impl Iterator<Item = StepLayer<'a>>) -> Result<CudaSlice<u64>, DeviceError> {
        let mut table = Vec::new();
        for l in layers {
            let matrices = [l.wqkv, l.wo, l.w_gu, l.w_down].map(|m| m.address(&self.stream));
            table.extend(matrices);
            table.extend([l.attn_norm.bits(&self.stream), l.ffn_norm.bits(&self.stream)]);
        }
        Ok(self.stream.clone_htod(&table)?)
    }

    /// The plan for a step of `shape` on `bf16` or f32 weights, or `None` when the kernel cannot take
    /// it: a head or group too large, widths not whole 16-byte chunks, too many spans, or a block
    /// (ring, staged input row, attention tile) that does not fit an SM.
    pub fn step_plan(&self, shape: &StepShape, bf16: bool) -> Option<StepPlan> {
        let s = shape;
        let per_chunk = if bf16 { 8 } else { 4 };
        let ok = s.kv_heads > 0
            && s.heads.is_multiple_of(s.kv_heads)
            && s.heads / s.kv_heads <= MAX_GROUP.min(16)
            && s.head_dim <= MAX_HEAD_DIM
            && s.head_dim.is_multiple_of(4)
            && s.dim.is_multiple_of(per_chunk)
            && s.ffn.is_multiple_of(per_chunk)
            && s.q_stride().is_multiple_of(2)
            && (1..=MAX_SPANS).contains(&s.spans)
            && self.step_smem_limit > 0;
        if !ok {
            return None;
        }
        // The ring, the staged input row, the attention tile (K and V rows padded by 4 floats).
        let staged = s.dim.max(s.ffn) * 4 + 2 * TILE_ROWS * (s.head_dim + 4) * 4;
        let function = self.function(if bf16 { "decode_step_bf16" } else { "decode_step_f32" });
        // Ring depth: 4 groups per thread (measured faster than 8 on the H200: the deeper prefetch queues
        // ahead of the latency-bound loads); `CTXSCOPE_CUDA_STEP_SLOTS=8` for the deeper one.
        let asked = std::env::var("CTXSCOPE_CUDA_STEP_SLOTS").ok().and_then(|v| v.parse().ok()).unwrap_or(4);
        let slots = if asked >= 8 { 8 } else { 4 };
        let plan = StepPlan { slots, smem: slots * 2 * THREADS * 16 + staged };
        let fits = plan.smem <= self.step_smem_limit
            && function.occupancy_max_active_blocks_per_multiprocessor(THREADS as u32, plan.smem, None).is_ok_and(|b| b >= 1);
        fits.then_some(plan)
    }

    /// One batch-1 decode step: `io.x` (the embedded token) through every layer of `table` (see
    /// `layer_table`) into `io.logits` through the final norm `head_norm` and the output projection
    /// `head`, K/V stored at `io.positions[0]` of the cache at `io.kv_base[0]`; `round_x` rounds each
    /// product's input to bf16 (the fast path).
    pub fn decode_step(
        &self,
        table: &CudaSlice<u64>,
        head: &Matrix,
        head_norm: &In,
        io: StepIo,
        shape: &StepShape,
        round_x: bool,
    ) -> Result<(), DeviceError> {
        let s = shape;
        let bf16 = matches!(head.data, MatrixData::Bf16(_));
        let Some(plan) = self.step_plan(s, bf16) else {
            return Err(DeviceError::Shape {
                kernel: "decode_step",
                detail: format!("{s:?}: not a shape the step kernel takes, or its block does not fit an SM"),
            });
        };
        let StepIo { mut x, mut qkv, mut att, mut act, mut logits, mut part_o, mut part_ml, mut sync, positions, kv_base } = io;
        let group = s.heads / s.kv_heads;
        let parts = s.kv_heads * s.spans * group;
        let ok = table.len() >= s.n_layers * LAYER_PTRS
            && head.rows == s.vocab
            && head.cols == s.dim
            && head_norm.len() == s.dim
            && x.len() >= s.dim
            && qkv.len() >= s.q_stride()
            && att.len() >= s.dim
            && act.len() >= s.ffn
            && logits.len() >= s.vocab
            && part_o.len() >= parts * s.head_dim
            && part_ml.len() >= parts * 2
            && sync.len() >= sync_len(s.kv_heads)
            && !positions.is_empty()
            && !kv_base.is_empty();
        check("decode_step", ok, || format!("buffers too small for {s:?}"))?;
        let ints = [s.n_layers as i32, s.dim as i32, s.ffn as i32, s.heads as i32, s.kv_heads as i32, s.head_dim as i32, s.vocab as i32];
        let scale = 1.0 / (s.head_dim as f32).sqrt();
        let more = [s.window as i32, s.spans as i32, i32::from(round_x), plan.slots as i32];
        let cfg = LaunchConfig {
            grid_dim: (self.multiprocessors as u32, 1, 1),
            block_dim: (THREADS as u32, 1, 1),
            shared_mem_bytes: plan.smem as u32,
        };
        macro_rules! step {
            ($kernel:literal, $w:expr) => {
                launch!(
                    self,
                    $kernel,
                    cfg,
                    $w,
                    table,
                    head_norm,
                    &mut x,
                    &mut qkv,
                    &mut att,
                    &mut act,
                    &mut logits,
                    &mut part_o,
                    &mut part_ml,
                    &mut sync,
                    &positions,
                    &kv_base,
                    &ints[0],
                    &ints[1],
                    &ints[2],
                    &ints[3],
                    &ints[4],
                    &ints[5],
                    &ints[6],
                    &s.rope_base,
                    &s.eps,
                    &scale,
                    &more[0],
                    &more[1],
                    &more[2],
                    &more[3]
                )
            };
        }
        match &head.data {
            MatrixData::Bf16(w) => step!("decode_step_bf16", w),
            MatrixData::F32(w) => step!("decode_step_f32", w),
        }
    }
}
