//! The device buffers one forward pass works in, allocated once for the largest pass (token rows and
//! sequences), so passes allocate nothing and a captured CUDA graph's addresses stay valid.

use std::sync::Arc;

use ctxscope_kernels::cudarc::driver::{CudaSlice, CudaStream};
use ctxscope_kernels::device::{sync_len, DeviceError};

use crate::model::ModelConfig;

pub use ctxscope_kernels::device::MAX_SPLITS;

/// Scratch for the matmul variants: rounded copies of inputs, bf16 inputs for cuBLAS, the gate|up
/// product of a wide SwiGLU, an un-added residual product.
pub struct Scratch {
    pub tmp: CudaSlice<f32>,
    pub xb: CudaSlice<u16>,
    pub gu: CudaSlice<f32>,
    pub proj: CudaSlice<f32>,
}

pub struct Workspace {
    pub max_rows: usize,
    pub max_seqs: usize,
    pub x: CudaSlice<f32>,
    pub h: CudaSlice<f32>,
    pub qkv: CudaSlice<f32>,
    pub att: CudaSlice<f32>,
    pub act: CudaSlice<f32>,
    pub scratch: Scratch,
    pub ids: CudaSlice<i32>,
    pub positions: CudaSlice<i32>,
    pub kv_base: CudaSlice<u64>,
    /// Per output sequence: the row whose logits it needs.
    pub last_rows: CudaSlice<i32>,
    pub normed: CudaSlice<f32>,
    pub logits: CudaSlice<f32>,
    pub part_o: CudaSlice<f32>,
    pub part_ml: CudaSlice<f32>,
    /// The persistent decode step's barrier and attention counters (zero between steps).
    pub sync: CudaSlice<u32>,
    pub token: CudaSlice<i32>,
    pub logprob: CudaSlice<f32>,
    /// Per output sequence: temperature, top_p, uniform (device top-p sampling), and what it drew.
    pub temperature: CudaSlice<f32>,
    pub top_p: CudaSlice<f32>,
    pub uniform: CudaSlice<f32>,
    pub sampled: CudaSlice<i32>,
    pub sampled_logprob: CudaSlice<f32>,
}

impl Workspace {
    pub fn new(stream: &Arc<CudaStream>, c: &ModelConfig, max_rows: usize, max_seqs: usize) -> Result<Workspace, DeviceError> {
        let (r, s) = (max_rows, max_seqs);
        let kvd = c.kv_dim();
        let wide = c.dim.max(c.ffn_dim);
        let f = |n: usize| stream.alloc_zeros::<f32>(n.max(1));
        Ok(Workspace {
            max_rows,
            max_seqs,
            x: f(r * c.dim)?,
            h: f(r * c.dim)?,
            qkv: f(r * (c.dim + 2 * kvd))?,
            att: f(r * c.dim)?,
            act: f(r * c.ffn_dim)?,
            scratch: Scratch { tmp: f(r * wide)?, xb: stream.alloc_zeros::<u16>(r * wide)?, gu: f(r * 2 * c.ffn_dim)?, proj: f(r * c.dim)? },
            ids: stream.alloc_zeros::<i32>(r)?,
            positions: stream.alloc_zeros::<i32>(r)?,
            kv_base: stream.alloc_zeros::<u64>(r)?,
            last_rows: stream.alloc_zeros::<i32>(s)?,
            normed: f(s * c.dim)?,
            logits: f(s * c.vocab)?,
            part_o: f(s * c.n_heads * MAX_SPLITS * c.head_dim)?,
            part_ml: f(s * c.n_heads * MAX_SPLITS * 2)?,
            sync: stream.alloc_zeros::<u32>(sync_len(c.n_kv_heads))?,
            token: stream.alloc_zeros::<i32>(s)?,
            logprob: f(s)?,
            temperature: f(s)?,
            top_p: f(s)?,
            uniform: f(s)?,
            sampled: stream.alloc_zeros::<i32>(s)?,
            sampled_logprob: f(s)?,
        })
    }
}
