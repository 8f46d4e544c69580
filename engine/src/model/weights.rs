//! Weight tensors in the two forms the matmul paths use: dequantized f32 rows (golden) and the
//! file's own quantized blocks (fast). GGUF stores a matrix as `dims = [cols, rows]`, rows contiguous.

use ctxscope_formats::gguf::{dequantize, GgmlType, TensorInfo};
use ctxscope_formats::Gguf;

use super::{ModelConfig, ModelError};

/// The file's quantized blocks of one matrix, row after row.
#[derive(Debug, Clone)]
pub struct QuantMatrix {
    pub ggml_type: GgmlType,
    pub bytes: Vec<u8>,
    pub row_bytes: usize,
}

/// A weight matrix of `rows` outputs by `cols` inputs.
#[derive(Debug, Clone)]
pub struct Matrix {
    pub name: String,
    pub rows: usize,
    pub cols: usize,
    /// Row-major f32, `rows * cols`.
    pub f32: Vec<f32>,
    pub quant: QuantMatrix,
}

#[derive(Debug, Clone)]
pub struct Layer {
    pub attn_norm: Vec<f32>,
    pub wq: Matrix,
    pub wk: Matrix,
    pub wv: Matrix,
    pub wo: Matrix,
    pub ffn_norm: Vec<f32>,
    pub w_gate: Matrix,
    pub w_up: Matrix,
    pub w_down: Matrix,
}

#[derive(Debug, Clone)]
pub struct Weights {
    pub token_embd: Matrix,
    pub layers: Vec<Layer>,
    pub output_norm: Vec<f32>,
    /// `None` when the output projection is tied to `token_embd`.
    pub output: Option<Matrix>,
}

impl Weights {
    /// No weights: a model whose forward pass keeps its own (DeepSeek-V4).
    pub fn empty() -> Weights {
        let quant = QuantMatrix { ggml_type: GgmlType(0), bytes: Vec::new(), row_bytes: 0 };
        let token_embd = Matrix { name: String::new(), rows: 0, cols: 0, f32: Vec::new(), quant };
        Weights { token_embd, layers: Vec::new(), output_norm: Vec::new(), output: None }
    }

    pub fn load(gguf: &Gguf, file: &[u8], c: &ModelConfig) -> Result<Weights, ModelError> {
        let matrix = |name: &str, rows: usize, cols: usize| load_matrix(gguf, file, name, rows, cols);
        let vector = |name: &str, len: usize| load_vector(gguf, file, name, len);
        let kv = c.kv_dim();
        let mut layers = Vec::with_capacity(c.n_layers);
        for i in 0..c.n_layers {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            layers.push(Layer {
                attn_norm: vector(&n("attn_norm"), c.dim)?,
                wq: matrix(&n("attn_q"), c.dim, c.dim)?,
                wk: matrix(&n("attn_k"), kv, c.dim)?,
                wv: matrix(&n("attn_v"), kv, c.dim)?,
                wo: matrix(&n("attn_output"), c.dim, c.dim)?,
                ffn_norm: vector(&n("ffn_norm"), c.dim)?,
                w_gate: matrix(&n("ffn_gate"), c.ffn_dim, c.dim)?,
                w_up: matrix(&n("ffn_up"), c.ffn_dim, c.dim)?,
                w_down: matrix(&n("ffn_down"), c.dim, c.ffn_dim)?,
            });
        }
        let output = match gguf.tensor("output.weight") {
            Some(_) => Some(matrix("output.weight", c.vocab, c.dim)?),
            None => None,
        };
        Ok(Weights {
            token_embd: matrix("token_embd.weight", c.vocab, c.dim)?,
            layers,
            output_norm: vector("output_norm.weight", c.dim)?,
            output,
        })
    }

    /// The output projection (tied or not).
    pub fn output(&self) -> &Matrix {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }
}

fn info<'a>(gguf: &'a Gguf, name: &str, expected: &[u64]) -> Result<&'a TensorInfo, ModelError> {
    let info = gguf.tensor(name).ok_or_else(|| ModelError::MissingTensor(name.into()))?;
    if info.dims != expected {
        return Err(ModelError::TensorShape { tensor: name.into(), found: info.dims.clone(), expected: expected.to_vec() });
    }
    Ok(info)
}

fn load_matrix(gguf: &Gguf, file: &[u8], name: &str, rows: usize, cols: usize) -> Result<Matrix, ModelError> {
    let info = info(gguf, name, &[cols as u64, rows as u64])?;
    let bytes = gguf.tensor_bytes(file, info)?;
    let f32 = dequantize(name, info.ggml_type, bytes, (rows * cols) as u64)?;
    Ok(Matrix {
        name: name.into(),
        rows,
        cols,
        f32,
        quant: QuantMatrix { ggml_type: info.ggml_type, bytes: bytes.to_vec(), row_bytes: bytes.len() / rows.max(1) },
    })
}

fn load_vector(gguf: &Gguf, file: &[u8], name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
    let info = info(gguf, name, &[len as u64])?;
    Ok(dequantize(name, info.ggml_type, gguf.tensor_bytes(file, info)?, len as u64)?)
}
