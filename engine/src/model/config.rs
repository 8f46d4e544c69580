//! The Llama-family hyperparameters, read from GGUF metadata (`{arch}.block_count`, ...).

use ctxscope_formats::Gguf;

use super::ModelError;

/// Shapes and constants of one model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub architecture: String,
    pub n_layers: usize,
    pub dim: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn_dim: usize,
    pub vocab: usize,
    pub ctx_len: usize,
    pub rope_base: f32,
    pub rms_eps: f32,
}

impl ModelConfig {
    pub fn from_gguf(gguf: &Gguf) -> Result<ModelConfig, ModelError> {
        let arch = gguf.get_str("general.architecture").map_err(ModelError::Gguf)?.to_string();
        if !matches!(arch.as_str(), "llama" | "mistral" | "granite" | "qwen2") {
            return Err(ModelError::Architecture(arch));
        }
        let key = |k: &str| format!("{arch}.{k}");
        let u = |k: &str| gguf.get_u64(&key(k)).map(|v| v as usize).map_err(ModelError::Gguf);
        let n_heads = u("attention.head_count")?;
        let dim = u("embedding_length")?;
        let n_kv_heads = gguf.get_u64_opt(&key("attention.head_count_kv")).map_err(ModelError::Gguf)?.map_or(n_heads, |v| v as usize);
        let vocab = gguf
            .tensor("token_embd.weight")
            .and_then(|t| t.dims.get(1).copied())
            .map(|v| v as usize)
            .ok_or_else(|| ModelError::MissingTensor("token_embd.weight".into()))?;
        let config = ModelConfig {
            n_layers: u("block_count")?,
            dim,
            n_heads,
            n_kv_heads,
            head_dim: dim / n_heads.max(1),
            ffn_dim: u("feed_forward_length")?,
            vocab,
            ctx_len: u("context_length")?,
            rope_base: gguf.get_f32(&key("rope.freq_base")).unwrap_or(10_000.0),
            rms_eps: gguf.get_f32(&key("attention.layer_norm_rms_epsilon")).unwrap_or(1e-5),
            architecture: arch,
        };
        if config.n_heads == 0 || !config.dim.is_multiple_of(config.n_heads) || !config.n_heads.is_multiple_of(config.n_kv_heads.max(1)) {
            return Err(ModelError::Shape(format!("{} heads, {} KV heads, width {}", config.n_heads, config.n_kv_heads, config.dim)));
        }
        Ok(config)
    }

    /// Width of one position's K (or V) across KV heads.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}
