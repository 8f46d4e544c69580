//! A model's weights on the device in one precision: f32 (the golden path) or bf16 (the fast path),
//! with Q, K, V fused into one matrix and gate/up into another, so a layer is four weight passes.

use ctxscope_kernels::cudarc::driver::CudaSlice;
use ctxscope_kernels::device::{Device, DeviceError, Matrix, MatrixData, StepLayer};

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
    /// Per layer, the addresses the persistent decode step reads (`Device::layer_table`).
    pub table: CudaSlice<u64>,
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
    /// Uploads `model`'s weights (dequantized f32 on the host) twice: as f32 (the golden path) and
    /// rounded to bf16 (the fast path), each fused matrix concatenated once for both.
    pub fn upload(device: &Device, model: &Model) -> Result<(DeviceWeights, DeviceWeights), DeviceError> {
        let stream = &device.stream;
        let matrix = |parts: &[&HostMatrix]| -> Result<[Matrix; 2], DeviceError> {
            let (values, rows, cols) = concat(parts);
            Ok([Matrix::upload(stream, &values, rows, cols, false)?, Matrix::upload(stream, &values, rows, cols, true)?])
        };
        let norm = |v: &[f32]| -> Result<[CudaSlice<f32>; 2], DeviceError> { Ok([stream.clone_htod(v)?, stream.clone_htod(v)?]) };
        let w = &model.weights;
        let (mut golden, mut fast) = (Vec::with_capacity(w.layers.len()), Vec::with_capacity(w.layers.len()));
        for l in &w.layers {
            let ([attn_norm, attn_norm_b], [ffn_norm, ffn_norm_b]) = (norm(&l.attn_norm)?, norm(&l.ffn_norm)?);
            let ([wqkv, wqkv_b], [wo, wo_b]) = (matrix(&[&l.wq, &l.wk, &l.wv])?, matrix(&[&l.wo])?);
            let ([w_gu, w_gu_b], [w_down, w_down_b]) = (matrix(&[&l.w_gate, &l.w_up])?, matrix(&[&l.w_down])?);
            golden.push(DeviceLayer { attn_norm, wqkv, wo, ffn_norm, w_gu, w_down });
            fast.push(DeviceLayer { attn_norm: attn_norm_b, wqkv: wqkv_b, wo: wo_b, ffn_norm: ffn_norm_b, w_gu: w_gu_b, w_down: w_down_b });
        }
        let (output, output_b) = match w.output.as_ref().map(|o| matrix(&[o])).transpose()? {
            Some([a, b]) => (Some(a), Some(b)),
            None => (None, None),
        };
        let ([embed, embed_b], [output_norm, output_norm_b]) = (matrix(&[&w.token_embd])?, norm(&w.output_norm)?);
        let table = |layers: &[DeviceLayer]| {
            device.layer_table(layers.iter().map(|l| StepLayer {
                wqkv: &l.wqkv,
                wo: &l.wo,
                w_gu: &l.w_gu,
                w_down: &l.w_down,
                attn_norm: &l.attn_norm,
                ffn_norm: &l.ffn_norm,
            }))
        };
        let (table_g, table_f) = (table(&golden)?, table(&fast)?);
        Ok((
            DeviceWeights { embed, layers: golden, output_norm, output, table: table_g },
            DeviceWeights { embed: embed_b, layers: fast, output_norm: output_norm_b, output: output_b, table: table_f },
        ))
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
