//! The device: one CUDA context and stream, every kernel module loaded as machine code (`loader`), and
//! a launch wrapper per kernel. Buffers are cudarc views; each wrapper checks the lengths its kernel will
//! touch before launching, so a shape mistake is an error and not a stray write.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, LaunchConfig};

pub use crate::error::DeviceError;
use crate::launch::KernelArg;
use crate::loader::{load_modules, ModuleReport};
use crate::settings::KernelSettings;

/// A weight matrix on the device, `rows` outputs by `cols` inputs, row-major, f32 or bf16 (raw bits).
pub struct Matrix {
    pub data: MatrixData,
    pub rows: usize,
    pub cols: usize,
}

pub enum MatrixData {
    F32(CudaSlice<f32>),
    Bf16(CudaSlice<u16>),
}

impl Matrix {
    /// Uploads `rows * cols` f32 values, kept as f32 or rounded to bf16 (nearest even).
    pub fn upload(stream: &Arc<CudaStream>, values: &[f32], rows: usize, cols: usize, bf16: bool) -> Result<Matrix, DeviceError> {
        if values.len() != rows * cols {
            return Err(DeviceError::Shape { kernel: "upload", detail: format!("{} values for {rows}x{cols}", values.len()) });
        }
        let data = if bf16 {
            let bits: Vec<u16> = values.iter().map(|v| f32_to_bf16_bits(*v)).collect();
            MatrixData::Bf16(stream.clone_htod(&bits)?)
        } else {
            MatrixData::F32(stream.clone_htod(values)?)
        };
        Ok(Matrix { data, rows, cols })
    }

    /// The device address of its first element.
    pub fn address(&self, stream: &CudaStream) -> u64 {
        match &self.data {
            MatrixData::F32(m) => m.bits(stream),
            MatrixData::Bf16(m) => m.bits(stream),
        }
    }

    /// Bytes the matrix occupies (what one pass over it reads).
    pub fn bytes(&self) -> usize {
        self.rows * self.cols * if matches!(self.data, MatrixData::Bf16(_)) { 2 } else { 4 }
    }
}

/// Round to nearest even, keep the top 16 bits (NaN stays NaN).
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    if x.is_nan() {
        return 0x7fc0;
    }
    let b = x.to_bits();
    (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// What a GEMV does with its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GemvMode {
    /// y = Wx
    Store = 0,
    /// y += Wx (the residual add)
    Accumulate = 1,
    /// W is gate rows then up rows: y = silu(W_gate x) * (W_up x)
    SwiGlu = 2,
}

impl GemvMode {
    /// Outputs per token row of a matrix of `rows` rows (SwiGLU pairs a gate row with an up row).
    pub fn outputs(self, rows: usize) -> usize {
        if self == GemvMode::SwiGlu {
            rows / 2
        } else {
            rows
        }
    }
}

/// Most token rows one GEMV launch takes (`GEMV_MAX_N` in cuda/gemv.cu).
pub const GEMV_MAX_ROWS: usize = 8;
/// Largest head size the attention kernels take (`MAX_HD`).
pub const MAX_HEAD_DIM: usize = 128;
/// Most query heads per KV head the decode kernel takes.
pub const MAX_GROUP: usize = 16;

/// Most splits of decode attention (a lane each when they are merged).
pub const MAX_SPLITS: usize = 32;
/// Blocks per row of the greedy pick, and the most rows one launch takes.
const ARGMAX_BLOCKS: usize = 64;
const ARGMAX_MAX_ROWS: usize = 1024;
/// Counters of "last block merges" kernels: attention (row, KV head) pairs, then argmax rows.
const ATTN_COUNTERS: usize = 1 << 16;

/// A GPU with the engine's kernels loaded.
pub struct Device {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub multiprocessors: usize,
    functions: HashMap<&'static str, CudaFunction>,
    /// The compiled modules (kept for their `ctx_trace` globals: `trace`).
    modules: Vec<Arc<CudaModule>>,
    /// How each module was had at start-up (built in, cached or compiled) and how long it took.
    pub module_reports: Vec<ModuleReport>,
    /// The kernels were compiled with their timeline marks (`CTXSCOPE_CUDA_TRACE=1`; see `trace`).
    pub tracing: bool,
    /// Launch with programmatic stream serialization (on unless `CTXSCOPE_CUDA_PDL=0`).
    pub programmatic: bool,
    /// Zero between launches: each kernel's last block resets what it counted.
    counters: CudaSlice<i32>,
    argmax_v: CudaSlice<f32>,
    argmax_i: CudaSlice<i32>,
    argmax_s: CudaSlice<f32>,
    /// The streamed GEMV's tuning (`stream::StreamTuning`; public so a benchmark can vary it).
    pub tuning: StreamTuning,
    /// Largest thread-block cluster `attn_decode_cluster` may be launched with (0: no clusters, before sm_90).
    pub max_cluster: usize,
    /// Largest dynamic shared memory of a `decode_step_*` block.
    step_smem_limit: usize,
    /// The streamed GEMV's plans worked out so far (`stream_plan`).
    stream_plans: Mutex<HashMap<stream::PlanKey, Option<StreamPlan>>>,
}

type In<'a, T = f32> = CudaView<'a, T>;
type Out<'a, T = f32> = CudaViewMut<'a, T>;

/// Launches `$kernel` with the arguments in the order its CUDA signature lists them (programmatic
/// dependent launch when the device has it on; see `crate::launch`).
macro_rules! launch {
    ($self:ident, $kernel:expr, $cfg:expr, $($arg:expr),* $(,)?) => {
        launch!($self, $kernel, $cfg, cluster 0, $($arg),*)
    };
    ($self:ident, $kernel:expr, $cfg:expr, cluster $cluster:expr, $($arg:expr),* $(,)?) => {{
        let mut args = [$( KernelArg::bits($arg, &$self.stream) ),*];
        // SAFETY: every call site passes the kernel's parameters in its declared order and types
        // (cuda/*.cu), and has checked the buffer lengths the kernel indexes.
        unsafe { crate::launch::launch(&$self.stream, $self.function($kernel), $cfg, &mut args, $self.programmatic, $cluster) }.map_err(DeviceError::from)
    }};
}

mod step;
mod stream;
pub mod trace;
pub use step::{sync_len, StepIo, StepLayer, StepPlan, StepShape, MAX_SPANS as MAX_STEP_SPANS};
pub use stream::{Norm, StreamOp, StreamPlan, StreamTuning};

fn blocks(n: usize, per_block: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: (n.div_ceil(per_block).max(1) as u32, 1, 1), block_dim: (per_block as u32, 1, 1), shared_mem_bytes: 0 }
}

fn grid(grid: (usize, usize, usize), threads: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: (grid.0 as u32, grid.1 as u32, grid.2 as u32), block_dim: (threads as u32, 1, 1), shared_mem_bytes: 0 }
}

fn check(kernel: &'static str, ok: bool, detail: impl FnOnce() -> String) -> Result<(), DeviceError> {
    if ok {
        Ok(())
    } else {
        Err(DeviceError::Shape { kernel, detail: detail() })
    }
}

/// Tiles in `attn_decode_cluster`'s ring (`CL_RING` in cuda/attention.cu), of `CL_TILE` positions.
const CLUSTER_RING: usize = 2;
const CLUSTER_TILE: usize = 32;
/// Most blocks of one `attn_decode_cluster` cluster (`CL_MAX`).
pub const MAX_CLUSTER: usize = 16;

/// Dynamic shared memory of `attn_decode_cluster` (`cluster_smem` in cuda/attention.cu) for heads of
/// `hd`, `group` query heads per KV head and clusters of `size`: the ring of K and V tiles (rows padded
/// by 4 floats), the query heads, every block's (max, sum) per head, this block's share of the outputs
/// from every block, and the merge's weights.
fn cluster_smem_bytes(hd: usize, group: usize, size: usize) -> usize {
    let per = (group * hd).div_ceil(size);
    let floats = CLUSTER_RING * 2 * CLUSTER_TILE * (hd + 4) + group * hd + size * group * 2 + size * per + group * size;
    floats * 4
}

/// `attn_decode_cluster` and its builds for a compile-time head dimension and cluster size
/// (cuda/attention.cu).
const ATTN_CLUSTER_KERNELS: [&str; 3] = ["attn_decode_cluster", "attn_decode_cluster_hd64_c16", "attn_decode_cluster_hd128_c16"];

/// The decode attention kernel for `head_dim` and clusters of `cluster`: their own build where there
/// is one (shorter code), else the one that reads both at run time. The same sums in the same order.
fn attn_cluster_kernel(head_dim: usize, cluster: usize) -> &'static str {
    match (head_dim, cluster) {
        (64, 16) => "attn_decode_cluster_hd64_c16",
        (128, 16) => "attn_decode_cluster_hd128_c16",
        _ => "attn_decode_cluster",
    }
}

/// Lets `attn_decode_cluster` take all the dynamic shared memory a block may opt in to (`optin` less
/// its static arrays) and clusters past the portable 8 blocks; returns the largest cluster it may
/// then be launched with.
fn cluster_attributes(f: &CudaFunction, optin: usize) -> Result<usize, DeviceError> {
    use cudarc::driver::sys::CUfunction_attribute as A;
    opt_in_smem(f, optin)?;
    Ok(if f.set_attribute(A::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1).is_ok() { MAX_CLUSTER } else { 8 })
}

/// Lets `f` take all the dynamic shared memory a block may opt in to (`optin` less its static
/// arrays); returns that limit.
fn opt_in_smem(f: &CudaFunction, optin: usize) -> Result<usize, DeviceError> {
    use cudarc::driver::sys::CUfunction_attribute as A;
    let limit = optin.saturating_sub(f.get_attribute(A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)? as usize);
    f.set_attribute(A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, limit as i32)?;
    Ok(limit)
}

impl Device {
    /// Opens GPU `ordinal` with the kernel settings of the environment (`KernelSettings::from_env`).
    pub fn new(ordinal: usize) -> Result<Device, DeviceError> {
        Device::open(ordinal, &KernelSettings::from_env()?)
    }

    /// Opens GPU `ordinal` on a stream of its own (graph capture needs one) and loads every kernel
    /// module for it: built in, cached, or compiled with NVRTC (`loader`).
    pub fn open(ordinal: usize, settings: &KernelSettings) -> Result<Device, DeviceError> {
        // cudarc panics on its first driver call when the library is missing: ask first.
        // SAFETY: only tries to open the library by its usual names.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(DeviceError::NoDriver);
        }
        let ctx = CudaContext::new(ordinal)?;
        // One stream does all the work, so cudarc's cross-stream events are not needed (and event
        // records would get in the way of graph capture).
        // SAFETY: no buffer of this context is used from another stream.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        let (major, minor) = ctx.compute_capability()?;
        let arch = format!("sm_{major}{minor}");
        let multiprocessors = ctx.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as usize;
        let mut functions = HashMap::new();
        let mut modules = Vec::new();
        let mut module_reports = Vec::new();
        let tracing = settings.trace;
        for (loaded, report) in load_modules(&ctx, &arch, settings)? {
            for kernel in crate::KERNELS {
                if let Ok(f) = loaded.load_function(kernel) {
                    functions.insert(kernel, f);
                }
            }
            modules.push(loaded);
            module_reports.push(report);
        }
        let counters = stream.alloc_zeros::<i32>(ATTN_COUNTERS + ARGMAX_MAX_ROWS)?;
        let argmax_v = stream.alloc_zeros::<f32>(ARGMAX_MAX_ROWS * ARGMAX_BLOCKS)?;
        let argmax_i = stream.alloc_zeros::<i32>(ARGMAX_MAX_ROWS * ARGMAX_BLOCKS)?;
        let argmax_s = stream.alloc_zeros::<f32>(ARGMAX_MAX_ROWS * ARGMAX_BLOCKS)?;
        let optin = ctx.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)? as usize;
        let per_sm =
            ctx.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)? as usize;
        let streamed: Vec<&CudaFunction> = stream::stream_kernels().map(|kernel| &functions[kernel]).collect();
        let tuning = StreamTuning::new(&streamed, optin, per_sm)?;
        let programmatic = major >= 9 && std::env::var("CTXSCOPE_CUDA_PDL").map_or(true, |v| v != "0");
        let mut max_cluster = 0;
        if major >= 9 {
            max_cluster = MAX_CLUSTER;
            for kernel in ATTN_CLUSTER_KERNELS {
                max_cluster = max_cluster.min(cluster_attributes(&functions[kernel], optin)?);
            }
        }
        let step_smem_limit = step::step_attributes([&functions["decode_step_bf16"], &functions["decode_step_f32"]], optin)?;
        let stream_plans = Mutex::new(HashMap::new());
        Ok(Device {
            ctx,
            stream,
            multiprocessors,
            functions,
            modules,
            module_reports,
            tracing,
            programmatic,
            counters,
            argmax_v,
            argmax_i,
            argmax_s,
            tuning,
            max_cluster,
            step_smem_limit,
            stream_plans,
        })
    }

    fn function(&self, kernel: &'static str) -> &CudaFunction {
        // Every name in KERNELS is defined (a unit test checks the sources), so compiling loaded it.
        &self.functions[kernel]
    }

    /// `out[r] = x[rows[r] or r] / rms * w` for `n` rows of `dim`; `bf16_stats`: the rmsnorm_bf16 patch.
    #[allow(clippy::too_many_arguments)]
    pub fn rmsnorm(
        &self,
        x: &In,
        rows: Option<&In<i32>>,
        w: &In,
        out: &mut Out,
        n: usize,
        dim: usize,
        eps: f32,
        bf16_stats: bool,
    ) -> Result<(), DeviceError> {
        let rows_ok = rows.is_none_or(|r| r.len() >= n);
        check("rmsnorm_f32", out.len() >= n * dim && w.len() == dim && rows_ok && (rows.is_some() || x.len() >= n * dim), || {
            format!("{n} rows of {dim}")
        })?;
        // A null row map reads rows 0..n (checked above).
        let row_map = match rows {
            Some(r) => r.device_ptr(&self.stream).0,
            None => 0u64,
        };
        let (dim, flags) = (dim as i32, i32::from(bf16_stats));
        launch!(self, "rmsnorm_f32", grid((n, 1, 1), 256), x, &row_map, w, out, &dim, &eps, &flags)
    }

    /// `out[t] = table[ids[t]]` for `n` ids (each < the table's rows).
    pub fn embed(&self, table: &Matrix, ids: &In<i32>, out: &mut Out, n: usize) -> Result<(), DeviceError> {
        let dim = table.cols;
        check("embed", ids.len() >= n && out.len() >= n * dim, || format!("{n} ids of {dim}"))?;
        let d = dim as i32;
        match &table.data {
            MatrixData::F32(t) => launch!(self, "embed_f32", grid((n, 1, 1), 256), t, ids, out, &d),
            MatrixData::Bf16(t) => launch!(self, "embed_bf16", grid((n, 1, 1), 256), t, ids, out, &d),
        }
    }

    /// RoPE's inverse frequencies for `head_dim` and `base` (`head_dim / 2` values, f64), computed by
    /// the kernels' own function, for `gemv_stream_qkv_rope`.
    pub fn rope_table(&self, base: f32, head_dim: usize) -> Result<CudaSlice<f64>, DeviceError> {
        check("rope_inv_freq_table", head_dim >= 2 && head_dim.is_multiple_of(2), || format!("head_dim {head_dim}"))?;
        let table = self.stream.alloc_zeros::<f64>(head_dim / 2)?;
        let hd = head_dim as i32;
        launch!(self, "rope_inv_freq_table", grid((1, 1, 1), 64), &base, &hd, &table)?;
        Ok(table)
    }

    /// RoPE on the fused qkv rows and the K/V store into each row's sequence cache (see cuda/elementwise.cu).
    pub fn rope_kv(
        &self,
        qkv: &mut Out,
        positions: &In<i32>,
        kv_base: &In<u64>,
        n: usize,
        layer: usize,
        shape: &RopeShape,
    ) -> Result<(), DeviceError> {
        let row = (shape.heads + 2 * shape.kv_heads) * shape.head_dim;
        check(
            "rope_kv",
            qkv.len() >= n * row
                && positions.len() >= n
                && kv_base.len() >= n
                && shape.head_dim.is_multiple_of(2)
                && shape.head_dim <= 256
                && layer < shape.n_layers,
            || format!("{n} rows, layer {layer}"),
        )?;
        let ints = [layer as i32, shape.n_layers as i32, shape.heads as i32, shape.kv_heads as i32, shape.head_dim as i32];
        launch!(
            self,
            "rope_kv",
            grid((n, 1, 1), 128),
            qkv,
            positions,
            kv_base,
            &ints[0],
            &ints[1],
            &ints[2],
            &ints[3],
            &ints[4],
            &shape.base,
            &shape.flags,
            &shape.kv_scale
        )
    }

    /// `out[r] = silu(gu[r][..ffn]) * gu[r][ffn..]`.
    pub fn swiglu(&self, gu: &In, out: &mut Out, n: usize, ffn: usize) -> Result<(), DeviceError> {
        check("swiglu_f32", gu.len() >= n * 2 * ffn && out.len() >= n * ffn, || format!("{n} rows of {ffn}"))?;
        let (rows, f) = (n as i32, ffn as i32);
        launch!(self, "swiglu_f32", blocks(n * ffn, 256), gu, out, &rows, &f)
    }

    /// `x += y` over `n` values.
    pub fn add(&self, x: &mut Out, y: &In, n: usize) -> Result<(), DeviceError> {
        check("add_f32", x.len() >= n && y.len() >= n, || format!("{n} values"))?;
        let count = n as i32;
        launch!(self, "add_f32", blocks(n, 256), x, y, &count)
    }

    /// f32 -> bf16 bits (nearest even) over `n` values.
    pub fn to_bf16(&self, x: &In, out: &mut Out<u16>, n: usize) -> Result<(), DeviceError> {
        check("to_bf16", x.len() >= n && out.len() >= n, || format!("{n} values"))?;
        let count = n as i32;
        launch!(self, "to_bf16", blocks(n, 256), x, out, &count)
    }

    /// Rounds `n` values in place to bf16 (`fp8_scale: None`) or to FP8 e4m3 with a per-tensor scale.
    pub fn round(&self, x: &mut Out, n: usize, fp8_scale: Option<f32>) -> Result<(), DeviceError> {
        check("round_f32", x.len() >= n, || format!("{n} values"))?;
        let (count, mode, scale) = (n as i32, i32::from(fp8_scale.is_some()), fp8_scale.unwrap_or(1.0));
        launch!(self, "round_f32", blocks(n, 256), x, &count, &mode, &scale)
    }

    /// llama.cpp's Q8_0 activation rounding of `n` values in place (`n % 32 == 0`: whole blocks of rows).
    pub fn q8_blocks(&self, x: &mut Out, n: usize) -> Result<(), DeviceError> {
        check("q8_blocks", x.len() >= n && n.is_multiple_of(32), || format!("{n} values"))?;
        let count = (n / 32) as i32;
        launch!(self, "q8_blocks", blocks(n, 256), x, &count)
    }

    /// `y[t] (op)= W x[t]` for `n <= GEMV_MAX_ROWS` token rows; `round_x` rounds x to bf16 on load.
    pub fn gemv(&self, w: &Matrix, x: &In, y: &mut Out, n: usize, mode: GemvMode, round_x: bool) -> Result<(), DeviceError> {
        let out_rows = mode.outputs(w.rows);
        let ok = (1..=GEMV_MAX_ROWS).contains(&n)
            && w.cols.is_multiple_of(8)
            && x.len() >= n * w.cols
            && y.len() >= n * out_rows
            && (mode != GemvMode::SwiGlu || w.rows.is_multiple_of(2));
        check("gemv", ok, || format!("{}x{} by {n} rows ({mode:?})", w.rows, w.cols))?;
        let args = [out_rows as i32, w.cols as i32, n as i32, mode as i32, i32::from(round_x)];
        let cfg = blocks(out_rows * 32, 256);
        match &w.data {
            MatrixData::Bf16(m) => launch!(self, "gemv_bf16", cfg, m, x, y, &args[0], &args[1], &args[2], &args[3], &args[4]),
            MatrixData::F32(m) => launch!(self, "gemv_f32", cfg, m, x, y, &args[0], &args[1], &args[2], &args[3], &args[4]),
        }
    }
}

impl Device {
    /// Decode QKV: `qkv[t] = Wqkv x[t]` for `n <= GEMV_MAX_ROWS` rows with RoPE applied and K/V stored
    /// into each row's sequence cache, in one launch (what `gemv` + `rope_kv` do without patches).
    #[allow(clippy::too_many_arguments)]
    pub fn gemv_qkv_rope(
        &self,
        w: &Matrix,
        x: &In,
        qkv: &mut Out,
        n: usize,
        round_x: bool,
        positions: &In<i32>,
        kv_base: &In<u64>,
        layer: usize,
        shape: &RopeShape,
    ) -> Result<(), DeviceError> {
        let more = qkv_rope_args("gemv_qkv_rope", w, x, qkv, n, positions, kv_base, layer, shape)?;
        let ints = [(w.rows / 2) as i32, w.cols as i32, n as i32, i32::from(round_x)];
        let cfg = blocks(w.rows / 2 * 32, 256);
        match &w.data {
            MatrixData::Bf16(m) => launch!(
                self,
                "gemv_qkv_rope_bf16",
                cfg,
                m,
                x,
                qkv,
                &ints[0],
                &ints[1],
                &ints[2],
                &ints[3],
                positions,
                kv_base,
                &more[0],
                &more[1],
                &more[2],
                &more[3],
                &more[4],
                &shape.base
            ),
            MatrixData::F32(m) => launch!(
                self,
                "gemv_qkv_rope_f32",
                cfg,
                m,
                x,
                qkv,
                &ints[0],
                &ints[1],
                &ints[2],
                &ints[3],
                positions,
                kv_base,
                &more[0],
                &more[1],
                &more[2],
                &more[3],
                &more[4],
                &shape.base
            ),
        }
    }
}

/// Checks the shapes of a fused QKV + RoPE launch (`gemv_qkv_rope`, `gemv_stream_qkv_rope`) and
/// returns the kernel's RoPE arguments: layer, n_layers, q_dim, kv_dim, head_dim.
#[allow(clippy::too_many_arguments)]
fn qkv_rope_args(
    kernel: &'static str,
    w: &Matrix,
    x: &In,
    qkv: &Out,
    n: usize,
    positions: &In<i32>,
    kv_base: &In<u64>,
    layer: usize,
    shape: &RopeShape,
) -> Result<[i32; 5], DeviceError> {
    let (q_dim, kv_dim) = (shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim);
    let ok = (1..=GEMV_MAX_ROWS).contains(&n)
        && w.rows == q_dim + 2 * kv_dim
        && w.cols.is_multiple_of(8)
        && shape.head_dim.is_multiple_of(2)
        && layer < shape.n_layers
        && x.len() >= n * w.cols
        && qkv.len() >= n * w.rows
        && positions.len() >= n
        && kv_base.len() >= n;
    check(kernel, ok, || format!("{}x{} by {n} rows, layer {layer}", w.rows, w.cols))?;
    Ok([layer as i32, shape.n_layers as i32, q_dim as i32, kv_dim as i32, shape.head_dim as i32])
}

/// Shapes and flags of one `rope_kv` launch.
#[derive(Debug, Clone, Copy)]
pub struct RopeShape {
    pub n_layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub base: f32,
    /// 1: rope_bf16; 2: kv_fp8.
    pub flags: i32,
    pub kv_scale: f32,
}

/// Shape of the attention launches.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub n_layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Keep only the last `window` positions (0: all).
    pub window: usize,
}

impl AttentionShape {
    fn valid(&self) -> bool {
        self.kv_heads > 0
            && self.heads.is_multiple_of(self.kv_heads)
            && self.heads / self.kv_heads <= MAX_GROUP
            && self.head_dim <= MAX_HEAD_DIM
            && self.head_dim.is_multiple_of(4)
    }

    fn q_stride(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.head_dim
    }
}

impl Device {
    /// Prefill attention of `n` query rows of one sequence at positions `start..start + n` (their K/V
    /// stored), reading q from the fused qkv rows; writes `n` rows of heads * head_dim.
    #[allow(clippy::too_many_arguments)]
    pub fn attn_prefill(
        &self,
        qkv: &In,
        kv_base: u64,
        layer: usize,
        out: &mut Out,
        n: usize,
        start: usize,
        s: &AttentionShape,
    ) -> Result<(), DeviceError> {
        let width = s.heads * s.head_dim;
        check("attn_prefill", s.valid() && layer < s.n_layers && qkv.len() >= n * s.q_stride() && out.len() >= n * width, || {
            format!("{n} rows")
        })?;
        let ints = [
            s.q_stride() as i32,
            layer as i32,
            s.n_layers as i32,
            n as i32,
            start as i32,
            s.heads as i32,
            s.kv_heads as i32,
            s.head_dim as i32,
        ];
        let (scale, window) = (1.0 / (s.head_dim as f32).sqrt(), s.window as i32);
        let cfg = grid((n.div_ceil(16), s.heads, 1), 128);
        launch!(
            self,
            "attn_prefill",
            cfg,
            qkv,
            &ints[0],
            &kv_base,
            &ints[1],
            &ints[2],
            out,
            &ints[3],
            &ints[4],
            &ints[5],
            &ints[6],
            &ints[7],
            &scale,
            &window
        )
    }

    /// Decode attention of `n` rows (one query per sequence) with `splits` (<= MAX_SPLITS) partials per
    /// (row, head), merged into `out` by the last block of each group; `chunk > 0` is the
    /// attn_splitk_bf16 patch. `part_o` holds n * heads * splits * head_dim values, `part_ml`
    /// n * heads * splits * 2.
    #[allow(clippy::too_many_arguments)]
    pub fn attn_decode(
        &self,
        qkv: &In,
        positions: &In<i32>,
        kv_base: &In<u64>,
        layer: usize,
        parts: (&mut Out, &mut Out),
        out: &mut Out,
        n: usize,
        splits: usize,
        chunk: usize,
        s: &AttentionShape,
    ) -> Result<(), DeviceError> {
        let (part_o, part_ml) = parts;
        let slots = n * s.heads * splits;
        let ok = s.valid()
            && layer < s.n_layers
            && (1..=MAX_SPLITS).contains(&splits)
            && n * s.kv_heads <= ATTN_COUNTERS
            && qkv.len() >= n * s.q_stride()
            && positions.len() >= n
            && kv_base.len() >= n
            && part_o.len() >= slots * s.head_dim
            && part_ml.len() >= slots * 2
            && out.len() >= n * s.heads * s.head_dim;
        check("attn_decode", ok, || format!("{n} rows, {splits} splits"))?;
        let ints = [
            s.q_stride() as i32,
            layer as i32,
            s.n_layers as i32,
            s.heads as i32,
            s.kv_heads as i32,
            s.head_dim as i32,
            s.window as i32,
            splits as i32,
            chunk as i32,
        ];
        let scale = 1.0 / (s.head_dim as f32).sqrt();
        let cfg = grid((n, s.kv_heads, splits), 128);
        let counters = self.counters.slice(..ATTN_COUNTERS);
        launch!(
            self,
            "attn_decode",
            cfg,
            qkv,
            &ints[0],
            positions,
            kv_base,
            &ints[1],
            &ints[2],
            part_o,
            part_ml,
            &ints[3],
            &ints[4],
            &ints[5],
            &scale,
            &ints[6],
            &ints[7],
            &ints[8],
            out,
            &counters
        )
    }

    /// Decode attention of `n` rows as `attn_decode` (chunk 0) without global partials: one
    /// thread-block cluster of `cluster` blocks (1 to `max_cluster`) per (row, KV head), each block a
    /// contiguous span of the positions, merged through distributed shared memory (sm_90).
    #[allow(clippy::too_many_arguments)]
    pub fn attn_decode_cluster(
        &self,
        qkv: &In,
        positions: &In<i32>,
        kv_base: &In<u64>,
        layer: usize,
        out: &mut Out,
        n: usize,
        cluster: usize,
        s: &AttentionShape,
    ) -> Result<(), DeviceError> {
        let ok = s.valid()
            && layer < s.n_layers
            && (1..=self.max_cluster).contains(&cluster)
            && qkv.len() >= n * s.q_stride()
            && positions.len() >= n
            && kv_base.len() >= n
            && out.len() >= n * s.heads * s.head_dim;
        check("attn_decode_cluster", ok, || format!("{n} rows, clusters of {cluster} (at most {} here)", self.max_cluster))?;
        let ints =
            [s.q_stride() as i32, layer as i32, s.n_layers as i32, s.heads as i32, s.kv_heads as i32, s.head_dim as i32, s.window as i32];
        let scale = 1.0 / (s.head_dim as f32).sqrt();
        let group = s.heads / s.kv_heads;
        let cfg = LaunchConfig {
            shared_mem_bytes: cluster_smem_bytes(s.head_dim, group, cluster) as u32,
            ..grid((cluster, s.kv_heads, n), 32 * group.max(2))
        };
        launch!(self, attn_cluster_kernel(s.head_dim, cluster), cfg, cluster cluster as u32, qkv, &ints[0], positions, kv_base, &ints[1], &ints[2], &ints[3], &ints[4], &ints[5], &scale, &ints[6], out)
    }

    /// Greedy pick per row of `vocab` logits: the token (first index of the maximum) and its log-probability.
    pub fn argmax(&self, logits: &In, n: usize, vocab: usize, token: &mut Out<i32>, logprob: &mut Out) -> Result<(), DeviceError> {
        self.argmax_advancing(logits, n, vocab, token, logprob, None)
    }

    /// `argmax`, and with `next` = (ids, positions) of a decode pass whose row r is output r, row r's
    /// next inputs: its token as the next id, its position plus one (so the same pass can run again
    /// for the next step without the host).
    pub fn argmax_advancing(
        &self,
        logits: &In,
        n: usize,
        vocab: usize,
        token: &mut Out<i32>,
        logprob: &mut Out,
        next: Option<(&mut Out<i32>, &mut Out<i32>)>,
    ) -> Result<(), DeviceError> {
        let fits_next = next.as_ref().is_none_or(|(ids, positions)| ids.len() >= n && positions.len() >= n);
        check(
            "argmax_logprob",
            logits.len() >= n * vocab && token.len() >= n && logprob.len() >= n && n <= ARGMAX_MAX_ROWS && fits_next,
            || format!("{n} rows"),
        )?;
        let v = vocab as i32;
        let blocks = ARGMAX_BLOCKS.min(vocab.div_ceil(256)).max(1);
        let counters = self.counters.slice(ATTN_COUNTERS..);
        let (ids, positions) = match next {
            Some((ids, positions)) => (ids.bits(&self.stream), positions.bits(&self.stream)),
            None => (0, 0),
        };
        launch!(
            self,
            "argmax_logprob",
            grid((n, blocks, 1), 256),
            logits,
            &v,
            token,
            logprob,
            &self.argmax_v,
            &self.argmax_i,
            &self.argmax_s,
            &counters,
            &ids,
            &positions
        )
    }

    /// Temperature + top-p draw per row: `params` = (temperature, top_p, uniform in [0, 1)) per row;
    /// the drawn token and its log-probability at temperature 1.
    #[allow(clippy::too_many_arguments)]
    pub fn top_p(
        &self,
        logits: &In,
        n: usize,
        vocab: usize,
        params: (&In, &In, &In),
        token: &mut Out<i32>,
        logprob: &mut Out,
    ) -> Result<(), DeviceError> {
        let (temperature, top_p, uniforms) = params;
        let ok = logits.len() >= n * vocab
            && temperature.len() >= n
            && top_p.len() >= n
            && uniforms.len() >= n
            && token.len() >= n
            && logprob.len() >= n;
        check("top_p_sample", ok, || format!("{n} rows"))?;
        let v = vocab as i32;
        launch!(self, "top_p_sample", grid((n, 1, 1), 1024), logits, &v, temperature, top_p, uniforms, token, logprob)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_attention_shared_memory_is_sized_to_the_shape() {
        // The 1B shape (hd 64, 4 query heads per KV head, clusters of 16): ring 34,816 B, queries
        // 1,024, (max, sum) 512, outputs 1,024, weights 256.
        assert_eq!(cluster_smem_bytes(64, 4, 16), 37_632);
        // The largest shape a launch accepts stays within what one Hopper block may opt in to (227 KB).
        assert!(cluster_smem_bytes(MAX_HEAD_DIM, MAX_GROUP, MAX_CLUSTER) <= 227 * 1024);
        // Clusters that do not divide the outputs (3 heads of 64 over 7 blocks): shares of 28 rounded up.
        assert_eq!(cluster_smem_bytes(64, 3, 7), 4 * (8_704 + 192 + 7 * 3 * 2 + 7 * 28 + 3 * 7));
    }

    #[test]
    fn compile_time_builds_are_picked_only_for_their_shapes() {
        assert_eq!(attn_cluster_kernel(64, 16), "attn_decode_cluster_hd64_c16");
        assert_eq!(attn_cluster_kernel(128, 16), "attn_decode_cluster_hd128_c16");
        for (hd, cluster) in [(64, 8), (128, 4), (96, 16), (80, 8)] {
            assert_eq!(attn_cluster_kernel(hd, cluster), "attn_decode_cluster", "hd {hd}, clusters of {cluster}");
        }
        for kernel in ATTN_CLUSTER_KERNELS {
            assert!(crate::KERNELS.contains(&kernel), "{kernel} is loaded");
        }
    }
}
