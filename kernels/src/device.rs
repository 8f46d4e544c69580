//! The device: one CUDA context and stream, the kernel module compiled once with NVRTC, and a launch
//! wrapper per kernel. Buffers are cudarc `CudaSlice`s; wrappers check lengths before launching.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    #[error("NVRTC could not compile {module}: {detail}")]
    Compile { module: String, detail: String },
    #[error("{kernel}: {detail}")]
    Shape { kernel: &'static str, detail: String },
    #[error("cuBLAS: {0}")]
    Blas(String),
}

/// A GPU with the engine's kernels loaded.
pub struct Device {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    functions: std::collections::HashMap<&'static str, CudaFunction>,
}

impl Device {
    /// Opens GPU `ordinal` and compiles every kernel source for it (once; about 0.3 s per module).
    pub fn new(ordinal: usize) -> Result<Device, DeviceError> {
        let ctx = CudaContext::new(ordinal)?;
        let stream = ctx.default_stream();
        let (major, minor) = ctx.compute_capability()?;
        let arch: &'static str = Box::leak(format!("sm_{major}{minor}").into_boxed_str());
        let mut functions = std::collections::HashMap::new();
        for (module, source) in crate::SOURCES {
            let options = CompileOptions { arch: Some(arch), ..CompileOptions::default() };
            let ptx = compile_ptx_with_opts(source, options).map_err(|e| DeviceError::Compile { module: module.into(), detail: e.to_string() })?;
            let loaded = ctx.load_module(ptx)?;
            for kernel in crate::KERNELS {
                if let Ok(f) = loaded.load_function(kernel) {
                    functions.insert(kernel, f);
                }
            }
        }
        Ok(Device { ctx, stream, functions })
    }

    fn function(&self, kernel: &'static str) -> &CudaFunction {
        // Every name in KERNELS is defined (a unit test checks the sources), so compiling loaded it.
        &self.functions[kernel]
    }

    /// `out[r] = x[r] / rms(x[r]) * w` for each of `rows` rows of `dim`.
    pub fn rmsnorm(&self, x: &CudaSlice<f32>, w: &CudaSlice<f32>, out: &mut CudaSlice<f32>, rows: usize, dim: usize, eps: f32) -> Result<(), DeviceError> {
        check("rmsnorm_f32", x.len() == rows * dim && out.len() == rows * dim && w.len() == dim)?;
        let cfg = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let dim = dim as i32;
        let mut launch = self.stream.launch_builder(self.function("rmsnorm_f32"));
        launch.arg(x).arg(w).arg(out).arg(&dim).arg(&eps);
        // SAFETY: argument types and order match `rmsnorm_f32` in cuda/elementwise.cu; lengths checked above.
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }

    /// RoPE in place on `x` = [tokens][heads * head_dim], token t at `positions[t]`.
    pub fn rope(&self, x: &mut CudaSlice<f32>, positions: &CudaSlice<i32>, heads: usize, head_dim: usize, base: f64) -> Result<(), DeviceError> {
        let tokens = positions.len();
        check("rope_f32", x.len() == tokens * heads * head_dim && head_dim % 2 == 0)?;
        let cfg = LaunchConfig { grid_dim: (tokens as u32, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
        let (heads, head_dim) = (heads as i32, head_dim as i32);
        let mut launch = self.stream.launch_builder(self.function("rope_f32"));
        launch.arg(x).arg(positions).arg(&heads).arg(&head_dim).arg(&base);
        // SAFETY: argument types and order match `rope_f32`; lengths checked above.
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }

    /// `out = silu(gate) * up`.
    pub fn swiglu(&self, gate: &CudaSlice<f32>, up: &CudaSlice<f32>, out: &mut CudaSlice<f32>) -> Result<(), DeviceError> {
        let n = gate.len();
        check("swiglu_f32", up.len() == n && out.len() == n)?;
        let n = n as i32;
        let mut launch = self.stream.launch_builder(self.function("swiglu_f32"));
        launch.arg(gate).arg(up).arg(out).arg(&n);
        // SAFETY: argument types and order match `swiglu_f32`; lengths checked above.
        unsafe { launch.launch(LaunchConfig::for_num_elems(n as u32)) }?;
        Ok(())
    }

    /// `x += y`.
    pub fn add(&self, x: &mut CudaSlice<f32>, y: &CudaSlice<f32>) -> Result<(), DeviceError> {
        let n = x.len();
        check("add_f32", y.len() == n)?;
        let n = n as i32;
        let mut launch = self.stream.launch_builder(self.function("add_f32"));
        launch.arg(x).arg(y).arg(&n);
        // SAFETY: argument types and order match `add_f32`; lengths checked above.
        unsafe { launch.launch(LaunchConfig::for_num_elems(n as u32)) }?;
        Ok(())
    }
}

/// Shape of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    /// New query tokens (the last `tokens` of the `len` cached positions).
    pub tokens: usize,
    /// Cached positions, the new ones included.
    pub len: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl Device {
    /// Causal attention of `q` over the cache `k`, `v` into `out` (see cuda/attention.cu).
    pub fn attention(&self, q: &CudaSlice<f32>, k: &CudaSlice<f32>, v: &CudaSlice<f32>, out: &mut CudaSlice<f32>, s: AttentionShape) -> Result<(), DeviceError> {
        let q_len = s.tokens * s.heads * s.head_dim;
        let kv_len = s.len * s.kv_heads * s.head_dim;
        // The cache may have room beyond `len`: the kernel reads positions 0..len only.
        let fits = q.len() == q_len && out.len() == q_len && k.len() >= kv_len && v.len() >= kv_len;
        let valid = s.tokens <= s.len && s.kv_heads > 0 && s.heads % s.kv_heads == 0 && s.head_dim <= 128;
        check("attention_f32", fits && valid)?;
        let cfg = LaunchConfig { grid_dim: (s.tokens as u32, s.heads as u32, 1), block_dim: (64, 1, 1), shared_mem_bytes: 0 };
        let scale = 1.0 / (s.head_dim as f32).sqrt();
        let dims = [s.tokens as i32, s.len as i32, s.heads as i32, s.kv_heads as i32, s.head_dim as i32];
        let mut launch = self.stream.launch_builder(self.function("attention_f32"));
        launch.arg(q).arg(k).arg(v).arg(out);
        for d in &dims {
            launch.arg(d);
        }
        launch.arg(&scale);
        // SAFETY: argument types and order match `attention_f32`; lengths and head_dim <= 128 checked above.
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }

    /// `out[t] = table[ids[t]]` for rows of `dim`.
    pub fn embed(&self, table: &CudaSlice<f32>, ids: &CudaSlice<i32>, out: &mut CudaSlice<f32>, dim: usize) -> Result<(), DeviceError> {
        check("embed_f32", out.len() == ids.len() * dim && table.len() % dim.max(1) == 0)?;
        let cfg = LaunchConfig { grid_dim: (ids.len() as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let dim = dim as i32;
        let mut launch = self.stream.launch_builder(self.function("embed_f32"));
        launch.arg(table).arg(ids).arg(out).arg(&dim);
        // SAFETY: argument types and order match `embed_f32`; ids are the caller's token ids (< vocab).
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }
}

fn check(kernel: &'static str, ok: bool) -> Result<(), DeviceError> {
    if ok {
        Ok(())
    } else {
        Err(DeviceError::Shape { kernel, detail: "buffer lengths do not match the shape".into() })
    }
}
