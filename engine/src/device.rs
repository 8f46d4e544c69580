//! The CUDA backend's forward pass (first version): the model's weights uploaded as f32, one sequence,
//! the same computation as the golden CPU path (RMSNorm, adjacent-pair RoPE, grouped-query causal
//! attention over a device KV cache, SwiGLU), with the GEMMs in cuBLAS under a selectable compute type.
//! Not yet batched, not yet wired into the server.

use ctxscope_kernels::blas::{Blas, Compute};
use ctxscope_kernels::device::{AttentionShape, Device, DeviceError};
use ctxscope_kernels::cudarc::driver::CudaSlice;

use crate::model::{Matrix, Model, ModelConfig};

struct DeviceLayer {
    attn_norm: CudaSlice<f32>,
    wq: CudaSlice<f32>,
    wk: CudaSlice<f32>,
    wv: CudaSlice<f32>,
    wo: CudaSlice<f32>,
    ffn_norm: CudaSlice<f32>,
    w_gate: CudaSlice<f32>,
    w_up: CudaSlice<f32>,
    w_down: CudaSlice<f32>,
}

/// A model on the GPU.
pub struct DeviceModel {
    pub device: Device,
    blas: Blas,
    config: ModelConfig,
    token_embd: CudaSlice<f32>,
    layers: Vec<DeviceLayer>,
    output_norm: CudaSlice<f32>,
    /// `None`: tied to `token_embd`.
    output: Option<CudaSlice<f32>>,
    pub compute: Compute,
}

/// One sequence's K and V rows on the device, per layer, with room for `capacity` positions.
pub struct DeviceKv {
    k: Vec<CudaSlice<f32>>,
    v: Vec<CudaSlice<f32>>,
    len: usize,
    capacity: usize,
}

impl DeviceKv {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl DeviceModel {
    /// Opens GPU `ordinal` and uploads `model`'s weights (f32).
    pub fn upload(model: &Model, ordinal: usize, compute: Compute) -> Result<DeviceModel, DeviceError> {
        let device = Device::new(ordinal)?;
        let blas = Blas::new(device.stream.clone())?;
        let s = device.stream.clone();
        let up = |data: &[f32]| s.clone_htod(data).map_err(DeviceError::from);
        let m = |w: &Matrix| up(&w.f32);
        let w = &model.weights;
        let mut layers = Vec::with_capacity(w.layers.len());
        for l in &w.layers {
            layers.push(DeviceLayer {
                attn_norm: up(&l.attn_norm)?,
                wq: m(&l.wq)?,
                wk: m(&l.wk)?,
                wv: m(&l.wv)?,
                wo: m(&l.wo)?,
                ffn_norm: up(&l.ffn_norm)?,
                w_gate: m(&l.w_gate)?,
                w_up: m(&l.w_up)?,
                w_down: m(&l.w_down)?,
            });
        }
        let output = match &w.output {
            Some(o) => Some(m(o)?),
            None => None,
        };
        Ok(DeviceModel {
            token_embd: m(&w.token_embd)?,
            output_norm: up(&w.output_norm)?,
            output,
            layers,
            blas,
            config: model.config.clone(),
            device,
            compute,
        })
    }

    pub fn new_kv(&self, capacity: usize) -> Result<DeviceKv, DeviceError> {
        let size = capacity * self.config.kv_dim();
        let s = &self.device.stream;
        let mut k = Vec::with_capacity(self.config.n_layers);
        let mut v = Vec::with_capacity(self.config.n_layers);
        for _ in 0..self.config.n_layers {
            k.push(s.alloc_zeros::<f32>(size)?);
            v.push(s.alloc_zeros::<f32>(size)?);
        }
        Ok(DeviceKv { k, v, len: 0, capacity })
    }

    /// Runs `tokens` after the `kv.len()` positions already cached; returns the last token's logits.
    pub fn forward(&self, tokens: &[u32], kv: &mut DeviceKv) -> Result<Vec<f32>, DeviceError> {
        let c = &self.config;
        let (n, dim, kvd, ffn) = (tokens.len(), c.dim, c.kv_dim(), c.ffn_dim);
        if n == 0 || kv.len + n > kv.capacity {
            return Err(DeviceError::Shape { kernel: "forward", detail: format!("{n} tokens after {} of {}", kv.len, kv.capacity) });
        }
        let s = &self.device.stream;
        let d = &self.device;
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let positions: Vec<i32> = (kv.len..kv.len + n).map(|p| p as i32).collect();
        let (ids, positions) = (s.clone_htod(&ids)?, s.clone_htod(&positions)?);
        let mut x = s.alloc_zeros::<f32>(n * dim)?;
        d.embed(&self.token_embd, &ids, &mut x, dim)?;
        let mut h = s.alloc_zeros::<f32>(n * dim)?;
        let mut q = s.alloc_zeros::<f32>(n * dim)?;
        let mut k = s.alloc_zeros::<f32>(n * kvd)?;
        let mut v = s.alloc_zeros::<f32>(n * kvd)?;
        let mut attn = s.alloc_zeros::<f32>(n * dim)?;
        let mut proj = s.alloc_zeros::<f32>(n * dim)?;
        let mut gate = s.alloc_zeros::<f32>(n * ffn)?;
        let mut upv = s.alloc_zeros::<f32>(n * ffn)?;
        let mut act = s.alloc_zeros::<f32>(n * ffn)?;
        let len = kv.len + n;
        for (i, l) in self.layers.iter().enumerate() {
            d.rmsnorm(&x, &l.attn_norm, &mut h, n, dim, c.rms_eps)?;
            self.blas.matmul(&l.wq, &h, &mut q, (dim, dim, n), self.compute)?;
            self.blas.matmul(&l.wk, &h, &mut k, (kvd, dim, n), self.compute)?;
            self.blas.matmul(&l.wv, &h, &mut v, (kvd, dim, n), self.compute)?;
            d.rope(&mut q, &positions, c.n_heads, c.head_dim, c.rope_base as f64)?;
            d.rope(&mut k, &positions, c.n_kv_heads, c.head_dim, c.rope_base as f64)?;
            let at = kv.len * kvd..len * kvd;
            s.memcpy_dtod(&k, &mut kv.k[i].slice_mut(at.clone()))?;
            s.memcpy_dtod(&v, &mut kv.v[i].slice_mut(at))?;
            let shape = AttentionShape { tokens: n, len, heads: c.n_heads, kv_heads: c.n_kv_heads, head_dim: c.head_dim };
            d.attention(&q, &kv.k[i], &kv.v[i], &mut attn, shape)?;
            self.blas.matmul(&l.wo, &attn, &mut proj, (dim, dim, n), self.compute)?;
            d.add(&mut x, &proj)?;
            d.rmsnorm(&x, &l.ffn_norm, &mut h, n, dim, c.rms_eps)?;
            self.blas.matmul(&l.w_gate, &h, &mut gate, (ffn, dim, n), self.compute)?;
            self.blas.matmul(&l.w_up, &h, &mut upv, (ffn, dim, n), self.compute)?;
            d.swiglu(&gate, &upv, &mut act)?;
            self.blas.matmul(&l.w_down, &act, &mut proj, (dim, ffn, n), self.compute)?;
            d.add(&mut x, &proj)?;
        }
        kv.len = len;
        d.rmsnorm(&x, &self.output_norm, &mut h, n, dim, c.rms_eps)?;
        let last = h.slice((n - 1) * dim..n * dim);
        let mut logits = s.alloc_zeros::<f32>(c.vocab)?;
        let output = self.output.as_ref().unwrap_or(&self.token_embd);
        self.blas.matmul(output, &last, &mut logits, (c.vocab, dim, 1), self.compute)?;
        Ok(s.clone_dtoh(&logits)?)
    }
}
