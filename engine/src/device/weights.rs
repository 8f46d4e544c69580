//! A model's weights on the device in one precision: f32 (the golden path) or bf16 (the fast path),
//! with Q, K, V fused into one matrix and gate/up into another, so a layer is four weight passes.

use ctxscope_kernels::cudarc::driver::{CudaSlice, CudaStream};
use ctxscope_kernels::device::{DeviceError, Matrix, MatrixData};
use std::sync::Arc;

use crate::model::{Matrix as HostMatrix, Model};

pub struct DeviceLayer {
    pub attn_norm: CudaSlice<f32>,
    /// wq rows, then wk, then wv: one row per output of the fused projection.
    pub wqkv: Matrix,
    pub wo: Matrix,
    pub ffn_norm: CudaSlice<f32>,
    /// Gate rows, then up rows (the SwiGLU GEMV reads both halves).
    pub w_gu: Matrix,
    pub w_down: Matrix,
}

pub struct DeviceWeights {
    pub embed: Matrix,
    pub layers: Vec<DeviceLayer>,
    pub output_norm: CudaSlice<f32>,
    /// `None`: tied to `embed`.
    pub output: Option<Matrix>,
}

fn concat(parts: &[&HostMatrix]) -> (Vec<f32>, usize, usize) {
    let cols = parts[0].cols;
    let rows = parts.iter().map(|m| m.rows).sum();
    let mut values = Vec::with_capacity(rows * cols);
    for m in parts {
        values.extend_from_slice(&m.f32);
    }
    (values, rows, cols)
}

impl DeviceWeights {
    /// Uploads `model`'s weights (dequantized f32 on the host) as f32 or rounded to bf16.
    pub fn upload(stream: &Arc<CudaStream>, model: &Model, bf16: bool) -> Result<DeviceWeights, DeviceError> {
        let matrix = |parts: &[&HostMatrix]| {
            let (values, rows, cols) = concat(parts);
            Matrix::upload(stream, &values, rows, cols, bf16)
        };
        let w = &model.weights;
        let mut layers = Vec::with_capacity(w.layers.len());
        for l in &w.layers {
            layers.push(DeviceLayer {
                attn_norm: stream.clone_htod(&l.attn_norm)?,
                wqkv: matrix(&[&l.wq, &l.wk, &l.wv])?,
                wo: matrix(&[&l.wo])?,
                ffn_norm: stream.clone_htod(&l.ffn_norm)?,
                w_gu: matrix(&[&l.w_gate, &l.w_up])?,
                w_down: matrix(&[&l.w_down])?,
            });
        }
        let output = match &w.output {
            Some(o) => Some(matrix(&[o])?),
            None => None,
        };
        Ok(DeviceWeights { embed: matrix(&[&w.token_embd])?, layers, output_norm: stream.clone_htod(&w.output_norm)?, output })
    }

    /// Whether the matrices are bf16 (the fast path; the GEMVs then round their inputs to bf16).
    pub fn bf16(&self) -> bool {
        matches!(self.embed.data, MatrixData::Bf16(_))
    }

    /// The output projection (tied or not).
    pub fn output(&self) -> &Matrix {
        self.output.as_ref().unwrap_or(&self.embed)
    }

    /// Bytes of weights one decode step reads: every layer matrix and the output projection once (the
    /// embedding row gather is negligible).
    pub fn bytes_per_token(&self) -> usize {
        let layers: usize = self.layers.iter().map(|l| l.wqkv.bytes() + l.wo.bytes() + l.w_gu.bytes() + l.w_down.bytes()).sum();
        layers + self.output().bytes()
    }
}
