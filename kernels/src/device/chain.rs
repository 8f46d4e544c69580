//! Chained decode GEMVs (cuda/gemv.cu `gemv_chain_*`): a table of streamed products built once from
//! the weights and the workspace buffers (device addresses checked for size here, so a launch cannot
//! index past them), and the launch of consecutive table entries as one kernel with grid-wide barriers
//! between them.

use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig};

use super::stream::THREADS;
use super::{check, Device, DeviceError, GemvMode, In, Matrix, MatrixData, RopeShape, StreamOp, StreamPlan, GEMV_MAX_ROWS};
use crate::launch::KernelArg;

/// One product of a chain: `y (op)= W norm?(x)` over up to the table's rows.
pub struct ChainStep<'a> {
    pub w: &'a Matrix,
    pub op: StreamOp,
    pub x: &'a CudaSlice<f32>,
    pub y: &'a CudaSlice<f32>,
    pub norm: Option<&'a CudaSlice<f32>>,
    /// The layer whose K/V cache a QkvRope step writes.
    pub layer: usize,
}

/// Phase descriptors on the device (cuda/gemv.cu `ChainPhase`: four addresses, then units, cols,
/// mode, layer as 32-bit integers: six 8-byte words) for buffers that must outlive the table.
pub struct ChainTable {
    words: CudaSlice<u64>,
    len: usize,
    bf16: bool,
    /// Widest input and norm weight over the steps (shared-memory layout).
    xs_cols: usize,
    gs_cols: usize,
    /// Token rows every buffer was checked for.
    rows: usize,
}

const WORDS: usize = 6;

impl ChainTable {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Device {
    /// Checks and uploads `steps` for passes of up to `rows` token rows (all steps in one precision; the
    /// x, y and norm buffers must stay allocated, unmoved, while the table is used).
    pub fn chain_table(&self, steps: &[ChainStep], rows: usize) -> Result<ChainTable, DeviceError> {
        let bf16 = steps.first().is_some_and(|s| matches!(s.w.data, MatrixData::Bf16(_)));
        let mut words = Vec::with_capacity(steps.len() * WORDS);
        let (mut xs_cols, mut gs_cols) = (0, 0);
        for (i, s) in steps.iter().enumerate() {
            let (mode, k) = (s.op.mode(), if s.op.mode() >= 2 { 2 } else { 1 });
            let out = if s.op == StreamOp::Gemv(GemvMode::SwiGlu) { s.w.rows / 2 } else { s.w.rows };
            let ok = matches!(s.w.data, MatrixData::Bf16(_)) == bf16
                && s.w.cols.is_multiple_of(8)
                && s.w.rows.is_multiple_of(k)
                && s.x.len() >= rows * s.w.cols
                && s.y.len() >= rows * out
                && s.norm.is_none_or(|g| g.len() == s.w.cols);
            check("gemv_chain", ok, || format!("step {i}: {}x{} ({:?}) over {rows} rows", s.w.rows, s.w.cols, s.op))?;
            let w = match &s.w.data {
                MatrixData::Bf16(m) => m.device_ptr(&self.stream).0,
                MatrixData::F32(m) => m.device_ptr(&self.stream).0,
            };
            let norm = s.norm.map_or(0, |g| g.device_ptr(&self.stream).0);
            let pair = |a: usize, b: usize| u64::from(a as u32) | (u64::from(b as u32) << 32);
            words.extend([w, s.x.device_ptr(&self.stream).0, s.y.device_ptr(&self.stream).0, norm, pair(s.w.rows / k, s.w.cols), pair(mode as usize, s.layer)]);
            xs_cols = xs_cols.max(s.w.cols);
            if s.norm.is_some() {
                gs_cols = gs_cols.max(s.w.cols);
            }
        }
        Ok(ChainTable { words: self.stream.clone_htod(&words)?, len: steps.len(), bf16, xs_cols, gs_cols, rows })
    }

    /// The launch shape for `n` rows of `table`, or `None` when its shared memory does not fit a block.
    /// The grid is what fits on the device at once: the barriers need every block resident.
    pub fn chain_plan(&self, table: &ChainTable, n: usize) -> Option<StreamPlan> {
        if !(1..=GEMV_MAX_ROWS.min(table.rows)).contains(&n) || table.is_empty() {
            return None;
        }
        let smem = self.tuning.lane_bytes * THREADS + (table.gs_cols + n * table.xs_cols) * 4;
        if smem > self.tuning.smem_limit {
            return None;
        }
        let kernel = if table.bf16 { "gemv_chain_bf16" } else { "gemv_chain_f32" };
        let fit = self.function(kernel).occupancy_max_active_blocks_per_multiprocessor(THREADS as u32, smem, None).ok()? as usize;
        let blocks = self.tuning.blocks_per_sm.min(fit) * self.multiprocessors;
        (blocks > 0).then_some(StreamPlan { smem, blocks })
    }

    /// Runs steps `first .. first + count` of `table` over `n` token rows as one launch; `eps` for the
    /// steps' norms; positions, cache addresses and `shape` for their QkvRope steps.
    #[allow(clippy::too_many_arguments)]
    pub fn gemv_chain(&self, table: &ChainTable, first: usize, count: usize, n: usize, round_x: bool, eps: f32, positions: &In<i32>, kv_base: &In<u64>, shape: &RopeShape) -> Result<(), DeviceError> {
        let ok = count > 0 && first + count <= table.len && positions.len() >= n && kv_base.len() >= n && shape.head_dim.is_multiple_of(2);
        check("gemv_chain", ok, || format!("steps {first}..{} of {}, {n} rows", first + count, table.len))?;
        let Some(plan) = self.chain_plan(table, n) else {
            return Err(DeviceError::Shape { kernel: "gemv_chain", detail: format!("{n} rows: the chain's shared memory exceeds a block's") });
        };
        let phases = table.words.slice(first * WORDS..(first + count) * WORDS);
        let (q_dim, kv_dim) = (shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim);
        let ints = [count as i32, n as i32, i32::from(round_x)];
        let layout = [self.tuning.lane_bytes as i32, table.gs_cols as i32, table.xs_cols as i32];
        let rope = [shape.n_layers as i32, q_dim as i32, kv_dim as i32, shape.head_dim as i32];
        let cfg = LaunchConfig { grid_dim: (plan.blocks as u32, 1, 1), block_dim: (THREADS as u32, 1, 1), shared_mem_bytes: plan.smem as u32 };
        let bar = &self.chain_barrier;
        if table.bf16 {
            launch!(self, "gemv_chain_bf16", cfg, &phases, &ints[0], &ints[1], &ints[2], &eps, &layout[0], &layout[1], &layout[2], bar, positions, kv_base, &rope[0], &rope[1], &rope[2], &rope[3], &shape.base)
        } else {
            launch!(self, "gemv_chain_f32", cfg, &phases, &ints[0], &ints[1], &ints[2], &eps, &layout[0], &layout[1], &layout[2], bar, positions, kv_base, &rope[0], &rope[1], &rope[2], &rope[3], &shape.base)
        }
    }
}
