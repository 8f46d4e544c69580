//! The streamed decode GEMV (cuda/gemv.cu `gemv_stream_*`): its launch plan (output units, shared
//! memory, grid) and wrappers for the plain products and for the QKV projection with RoPE and the K/V
//! store, each optionally taking the RMSNorm of its input rows.

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig};

use super::{check, opt_in_smem, qkv_rope_args, Device, DeviceError, GemvMode, In, Matrix, MatrixData, Out, RopeShape, GEMV_MAX_ROWS};
use crate::launch::KernelArg;

/// Threads per block (`STREAM_THREADS`): eight warps.
const THREADS: usize = 256;

/// How one streamed GEMV launch is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamPlan {
    /// Output units: rows, gate/up pairs (SwiGLU) or RoPE pairs (QKV).
    pub units: usize,
    /// Weight bytes each lane keeps in flight.
    pub lane_bytes: usize,
    /// Dynamic shared memory: every thread's in-flight slots and the staged input rows.
    pub smem: usize,
    pub blocks: usize,
    /// The kernel launched (`stream_kernel`), except that a QKV launch without RoPE's
    /// inverse-frequency table runs `gemv_stream_bf16` instead (`stream_launch`).
    pub kernel: &'static str,
}

/// The bf16 streamed GEMV's builds for one mode (0 to 3) at 128 bytes per lane: any number of token
/// rows, then one (cuda/gemv.cu `gemv_stream_special`; mode 3's need RoPE's inverse-frequency table).
/// Shorter code than the kernel that reads both at run time, which every launch runs with a cold
/// instruction cache; the same operations.
const STREAM_BF16_BUILDS: [[&str; 2]; 4] = [
    ["gemv_stream_bf16_m0", "gemv_stream_bf16_m0_n1"],
    ["gemv_stream_bf16_m1", "gemv_stream_bf16_m1_n1"],
    ["gemv_stream_bf16_m2", "gemv_stream_bf16_m2_n1"],
    ["gemv_stream_bf16_m3", "gemv_stream_bf16_m3_n1"],
];

/// Mode 3's builds that issue one ring iteration before waiting for the kernel before them (any
/// number of token rows, then one): `work_out_plan` picks them when `issues_one_early`.
const STREAM_QKV_EARLY_BUILDS: [&str; 2] = ["gemv_stream_bf16_m3_p1", "gemv_stream_bf16_m3_n1_p1"];

/// Every streamed GEMV kernel (each takes the dynamic shared memory its plan asks for): the two that
/// read their mode and rows at run time, then every build.
pub(super) fn stream_kernels() -> impl Iterator<Item = &'static str> {
    ["gemv_stream_bf16", "gemv_stream_f32"].into_iter().chain(STREAM_BF16_BUILDS.into_iter().flatten()).chain(STREAM_QKV_EARLY_BUILDS)
}

/// Ring iterations in flight per lane in mode 3's builds (cuda/gemv.cu `GEMV_RING_M3`).
const QKV_RING: usize = 4;

/// Whether a QKV launch of `blocks` blocks over `units` RoPE pairs of `cols` columns should issue one
/// ring iteration before its wait rather than the whole ring: when a warp's share of the weights takes
/// more iterations than its ring holds, it must fetch after the input row is staged anyway, and the
/// input row's loads should not queue behind its own ring at the release (measured on the H200: the 1B
/// shape's QKV, 8 iterations a warp, 770 → 761 µs a step; the 135M shape's, 3 iterations, loses 3.5 µs
/// with it, so a share that fits keeps the whole ring early). The other modes lose with fewer early
/// (BENCHMARKS.md's change table).
fn issues_one_early(units: usize, cols: usize, blocks: usize) -> bool {
    let units_per_warp = units.div_ceil(blocks * (THREADS / 32));
    units_per_warp * (cols / 8).div_ceil(32) > QKV_RING
}

/// The streamed GEMV kernel for these weights, in-flight bytes per lane, mode and token rows: a build
/// of its own where there is one, else the one that reads them at run time.
fn stream_kernel(bf16: bool, lane_bytes: usize, mode: i32, n: usize) -> &'static str {
    match (bf16, lane_bytes, usize::try_from(mode)) {
        (true, 128, Ok(m)) if m < STREAM_BF16_BUILDS.len() => STREAM_BF16_BUILDS[m][usize::from(n == 1)],
        (true, ..) => "gemv_stream_bf16",
        (false, ..) => "gemv_stream_f32",
    }
}

/// The norm applied to the input rows on the way in: (weight, epsilon).
pub type Norm<'a, 'b> = Option<(&'a In<'b>, f32)>;

/// Tuning of the streamed GEMV, set when the device opens: `CTXSCOPE_CUDA_STREAM_BLOCKS` blocks per
/// SM (default 4, fewer where that many do not fit), `CTXSCOPE_CUDA_LANE_BYTES` weight bytes each
/// lane keeps in flight (128 or 256, default 128) and `CTXSCOPE_CUDA_QKV_LANE_BYTES` those of the QKV
/// projection (default 128: at 256 its blocks take more shared memory and hold decode attention's
/// clusters back), `CTXSCOPE_CUDA_CARVEOUT` the kernels' preferred shared-memory
/// carveout in percent (default 100), `CTXSCOPE_CUDA_STREAM_SPREAD=0` lets a launch's blocks pack onto
/// fewer SMs (see `spread`). Defaults measured on the H200 (BENCHMARKS.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamTuning {
    pub blocks_per_sm: usize,
    pub lane_bytes: usize,
    /// In-flight bytes per lane of the QKV projection (`StreamOp::QkvRope`).
    pub qkv_lane_bytes: usize,
    /// Pad each launch's shared memory so that no SM can hold more of its blocks than an even spread
    /// over the SMs gives it. With programmatic launch a kernel's blocks land on whichever SMs free up
    /// first; without the padding a launch of a few blocks per SM can pile onto some SMs and leave
    /// others idle (measured: BENCHMARKS.md).
    pub spread: bool,
    /// Largest dynamic shared memory a block may ask for.
    pub smem_limit: usize,
    /// Shared memory of one SM.
    pub smem_per_sm: usize,
}

impl StreamTuning {
    /// Reads the environment and lets `kernels` (the streamed GEMVs) take all the dynamic shared
    /// memory a block may opt in to (`optin` less their static arrays), with the carveout asked for.
    pub(super) fn new(kernels: &[&CudaFunction], optin: usize, smem_per_sm: usize) -> Result<StreamTuning, DeviceError> {
        let var = |name: &str, default: usize| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
        let carveout = var("CTXSCOPE_CUDA_CARVEOUT", 100).min(100) as i32;
        let mut smem_limit = optin;
        for f in kernels {
            smem_limit = smem_limit.min(opt_in_smem(f, optin)?);
            f.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, carveout)?;
        }
        let spread = var("CTXSCOPE_CUDA_STREAM_SPREAD", 1) != 0;
        let tuning = StreamTuning { blocks_per_sm: 4, lane_bytes: 128, qkv_lane_bytes: 128, spread, smem_limit, smem_per_sm };
        Ok(tuning.with(
            var("CTXSCOPE_CUDA_STREAM_BLOCKS", 4),
            var("CTXSCOPE_CUDA_LANE_BYTES", 128),
            var("CTXSCOPE_CUDA_QKV_LANE_BYTES", 128),
        ))
    }

    /// This tuning with `blocks_per_sm` (1 to 4) blocks per SM and `lane_bytes` in flight per lane
    /// (`qkv_lane_bytes` in the QKV projection), each brought to what the kernel supports.
    pub fn with(self, blocks_per_sm: usize, lane_bytes: usize, qkv_lane_bytes: usize) -> StreamTuning {
        StreamTuning {
            blocks_per_sm: blocks_per_sm.clamp(1, 4),
            lane_bytes: supported_lane_bytes(lane_bytes),
            qkv_lane_bytes: supported_lane_bytes(qkv_lane_bytes),
            ..self
        }
    }
}

/// The in-flight bytes per lane the kernel has instantiations for: 256 for 256 and above, else 128.
fn supported_lane_bytes(asked: usize) -> usize {
    if asked >= 256 {
        256
    } else {
        128
    }
}

/// What a streamed GEMV computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamOp {
    Gemv(GemvMode),
    /// The fused QKV projection with RoPE and the K/V store (the kernel's mode 3).
    QkvRope,
}

impl StreamOp {
    fn mode(self) -> i32 {
        match self {
            StreamOp::Gemv(m) => m as i32,
            StreamOp::QkvRope => 3,
        }
    }
}

/// What a plan depends on: the matrix's shape and element type, the rows, the op, the norm, the tuning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct PlanKey {
    rows: usize,
    cols: usize,
    bf16: bool,
    n: usize,
    op: StreamOp,
    norm: bool,
    tuning: StreamTuning,
}

impl Device {
    /// The plan for `n` token rows through `w` (`norm`: with the RMSNorm folded in), or `None` when
    /// the shape is not streamable or the ring and the input rows do not fit in one block's shared
    /// memory (the caller falls back to `gemv`). Worked out once per shape and tuning (it asks the
    /// driver's occupancy calculator), then remembered: every layer of a model asks the same.
    pub fn stream_plan(&self, w: &Matrix, n: usize, op: StreamOp, norm: bool) -> Option<StreamPlan> {
        let key = PlanKey { rows: w.rows, cols: w.cols, bf16: matches!(w.data, MatrixData::Bf16(_)), n, op, norm, tuning: self.tuning };
        // A poisoned lock only means another thread panicked mid-insert: the map is still sound.
        let mut plans = self.stream_plans.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *plans.entry(key).or_insert_with(|| self.work_out_plan(w, n, op, norm))
    }

    fn work_out_plan(&self, w: &Matrix, n: usize, op: StreamOp, norm: bool) -> Option<StreamPlan> {
        let mode = op.mode();
        let k = if mode >= 2 { 2 } else { 1 };
        let units = w.rows / k;
        if !(1..=GEMV_MAX_ROWS).contains(&n) || units == 0 || !w.cols.is_multiple_of(8) || !w.rows.is_multiple_of(k) {
            return None;
        }
        // The lanes' slots, the input rows and the norm weight (only with a norm: the less a block
        // takes, the sooner the next kernel's blocks fit beside it).
        let lane_bytes = if op == StreamOp::QkvRope { self.tuning.qkv_lane_bytes } else { self.tuning.lane_bytes };
        let smem = lane_bytes * THREADS + (n + usize::from(norm)) * w.cols * 4;
        if smem > self.tuning.smem_limit {
            return None;
        }
        // Every block must be resident at once (each owns a share of the work): no more per SM than fit.
        let fit = |kernel: &'static str, smem: usize| {
            let function = self.function(kernel);
            function.occupancy_max_active_blocks_per_multiprocessor(THREADS as u32, smem, None).ok().map(|f| f as usize)
        };
        let blocks_for =
            |kernel| Some(units.div_ceil(THREADS / 32).min(self.tuning.blocks_per_sm.min(fit(kernel, smem)?) * self.multiprocessors));
        let mut kernel = stream_kernel(matches!(w.data, MatrixData::Bf16(_)), lane_bytes, mode, n);
        let mut blocks = blocks_for(kernel)?;
        if STREAM_BF16_BUILDS[3].contains(&kernel) && blocks > 0 && issues_one_early(units, w.cols, blocks) {
            // Fewer blocks (were the early build to fit fewer) only make each warp's share longer.
            kernel = STREAM_QKV_EARLY_BUILDS[usize::from(n == 1)];
            blocks = blocks_for(kernel)?;
        }
        let mut smem = smem;
        if self.tuning.spread && blocks > 0 {
            // The least shared memory (in 1 KB steps from an even share of the SM's) with which an SM
            // holds at most its even share of the blocks.
            let share = blocks.div_ceil(self.multiprocessors);
            let mut padded = smem.max((self.tuning.smem_per_sm / (share + 1)) & !1023);
            while padded <= self.tuning.smem_limit && fit(kernel, padded)? > share {
                padded += 1024;
            }
            if padded <= self.tuning.smem_limit {
                smem = padded;
            }
        }
        (blocks > 0).then_some(StreamPlan { units, lane_bytes, smem, blocks, kernel })
    }

    /// `y[t] (mode)= W x[t]` for `n` token rows, streaming W through shared memory; `norm` normalizes
    /// each x row first (as `rmsnorm`), `round_x` rounds the (normalized) input to bf16.
    #[allow(clippy::too_many_arguments)]
    pub fn gemv_stream(
        &self,
        w: &Matrix,
        x: &In,
        y: &mut Out,
        n: usize,
        mode: GemvMode,
        round_x: bool,
        norm: Norm,
    ) -> Result<(), DeviceError> {
        let ok = x.len() >= n * w.cols && y.len() >= n * mode.outputs(w.rows);
        check("gemv_stream", ok, || format!("{}x{} by {n} rows ({mode:?})", w.rows, w.cols))?;
        let rope = [0u64; 3];
        let ints = [0i32; 5];
        self.stream_launch(w, x, y, n, StreamOp::Gemv(mode), round_x, norm, rope, ints, 0.0)
    }

    /// Decode QKV as `gemv_qkv_rope` (RoPE applied, K/V stored into each row's sequence cache),
    /// streaming the weights and optionally normalizing the input rows. `inv_freq`: RoPE's inverse
    /// frequencies from `rope_table` for this shape (the same values; without it each launch computes
    /// them before its wait).
    #[allow(clippy::too_many_arguments)]
    pub fn gemv_stream_qkv_rope(
        &self,
        w: &Matrix,
        x: &In,
        qkv: &mut Out,
        n: usize,
        round_x: bool,
        norm: Norm,
        positions: &In<i32>,
        kv_base: &In<u64>,
        layer: usize,
        shape: &RopeShape,
        inv_freq: Option<&CudaSlice<f64>>,
    ) -> Result<(), DeviceError> {
        let ints = qkv_rope_args("gemv_stream_qkv_rope", w, x, qkv, n, positions, kv_base, layer, shape)?;
        check("gemv_stream_qkv_rope", inv_freq.is_none_or(|t| t.len() >= shape.head_dim / 2), || {
            format!("an inverse-frequency table shorter than {}", shape.head_dim / 2)
        })?;
        let rope = [positions.bits(&self.stream), kv_base.bits(&self.stream), inv_freq.map_or(0, |t| t.bits(&self.stream))];
        self.stream_launch(w, x, qkv, n, StreamOp::QkvRope, round_x, norm, rope, ints, shape.base)
    }

    /// One launch. `rope`: mode 3's positions, cache bases and inverse-frequency table (device
    /// addresses; 0 where unused), `ints` and `base` its layer, layers, q and KV widths, head size and
    /// RoPE base.
    #[allow(clippy::too_many_arguments)]
    fn stream_launch(
        &self,
        w: &Matrix,
        x: &In,
        y: &mut Out,
        n: usize,
        op: StreamOp,
        round_x: bool,
        norm: Norm,
        rope: [u64; 3],
        ints: [i32; 5],
        base: f32,
    ) -> Result<(), DeviceError> {
        let mode = op.mode();
        let Some(plan) = self.stream_plan(w, n, op, norm.is_some()) else {
            return Err(DeviceError::Shape {
                kernel: "gemv_stream",
                detail: format!(
                    "{}x{} by {n} rows (mode {mode}): not a streamable shape, or its ring and input rows exceed a block's shared memory",
                    w.rows, w.cols
                ),
            });
        };
        if let Some((g, _)) = norm {
            check("gemv_stream", g.len() == w.cols, || format!("norm weight of {} for {} columns", g.len(), w.cols))?;
        }
        let (norm_w, eps) = match norm {
            Some((g, eps)) => (g.bits(&self.stream), eps),
            None => (0u64, 0.0),
        };
        let args = [plan.units as i32, w.cols as i32, n as i32, mode, i32::from(round_x), plan.lane_bytes as i32];
        let cfg =
            LaunchConfig { grid_dim: (plan.blocks as u32, 1, 1), block_dim: (THREADS as u32, 1, 1), shared_mem_bytes: plan.smem as u32 };
        let (positions, kv_base, inv_freq) = (&rope[0], &rope[1], &rope[2]);
        // Mode 3's builds take the inverse-frequency table; without one, the kernel that can do without
        // (its blocks fit as the build's: both are held to 64 registers by their launch bounds).
        let kernel = if op == StreamOp::QkvRope && *inv_freq == 0 { "gemv_stream_bf16" } else { plan.kernel };
        match &w.data {
            MatrixData::Bf16(m) => launch!(
                self, kernel, cfg, m, x, y, &norm_w, &eps, &args[0], &args[1], &args[2], &args[3], &args[4], &args[5], positions, kv_base,
                &ints[0], &ints[1], &ints[2], &ints[3], &ints[4], &base, inv_freq
            ),
            MatrixData::F32(m) => launch!(
                self,
                "gemv_stream_f32",
                cfg,
                m,
                x,
                y,
                &norm_w,
                &eps,
                &args[0],
                &args[1],
                &args[2],
                &args[3],
                &args[4],
                &args[5],
                positions,
                kv_base,
                &ints[0],
                &ints[1],
                &ints[2],
                &ints[3],
                &ints[4],
                &base,
                inv_freq
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_launches_at_128_bytes_a_lane_get_their_mode_and_row_count_build() {
        assert_eq!(stream_kernel(true, 128, 3, 1), "gemv_stream_bf16_m3_n1");
        assert_eq!(stream_kernel(true, 128, 2, 3), "gemv_stream_bf16_m2");
        assert_eq!(stream_kernel(true, 128, 0, 1), "gemv_stream_bf16_m0_n1");
        assert_eq!(stream_kernel(true, 256, 1, 1), "gemv_stream_bf16");
        assert_eq!(stream_kernel(true, 128, 4, 1), "gemv_stream_bf16");
        assert_eq!(stream_kernel(false, 128, 1, 1), "gemv_stream_f32");
        for kernel in stream_kernels() {
            assert!(crate::KERNELS.contains(&kernel), "{kernel} is loaded");
        }
    }

    #[test]
    fn qkv_issues_one_iteration_early_only_where_a_warps_share_outgrows_its_ring() {
        // The 1B shape: 1,536 RoPE pairs of 2,048 columns in 192 blocks, one pair a warp, 8 iterations.
        assert!(issues_one_early(1536, 2048, 192));
        // The 135M shape: 480 pairs of 576 columns in 60 blocks, 3 iterations a warp: the ring holds them.
        assert!(!issues_one_early(480, 576, 60));
        // Exactly a ring (4 iterations: 1,024 columns) stays whole; two units of 3 iterations do not.
        assert!(!issues_one_early(8, 1024, 1));
        assert!(issues_one_early(16, 576, 1));
    }
}
