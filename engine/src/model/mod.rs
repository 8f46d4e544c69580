//! A loaded model: hyperparameters, weights (f32 for the golden path, and the file's quantized blocks
//! for the fast path), tokenizer and chat format, from one GGUF file or a Hugging Face checkpoint
//! directory (config.json + safetensors + tokenizer.json); a DeepSeek-V4 checkpoint carries its own
//! weights and forward pass ([`crate::forward::deepseek_v4`]).

mod config;
pub mod deepseek_v4;
pub mod hf;
mod weights;
mod yarn;

use std::path::Path;
use std::sync::Arc;

use ctxscope_formats::template::ChatFormat;
use ctxscope_formats::{ChatTemplate, Gguf, Tokenizer};

use crate::patch::Arch;
use deepseek_v4::DeepseekV4Model;

pub use config::ModelConfig;
pub use weights::{Layer, Matrix, QuantMatrix, Weights};

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("cannot read model {path}: {source}")]
    Io { path: std::path::PathBuf, source: std::io::Error },
    #[error("model file: {0}")]
    Gguf(ctxscope_formats::GgufError),
    #[error("unsupported architecture {0:?} (supported: llama, mistral, granite, qwen2; DeepseekV4ForCausalLM checkpoints)")]
    Architecture(String),
    #[error("model file has no tensor {0}")]
    MissingTensor(String),
    #[error("tensor {tensor} has shape {found:?}, expected {expected:?}")]
    TensorShape { tensor: String, found: Vec<u64>, expected: Vec<u64> },
    #[error("model shape: {0}")]
    Shape(String),
    #[error(transparent)]
    Dequant(#[from] ctxscope_formats::gguf::DequantError),
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] ctxscope_formats::TokenizerError),
    #[error("chat template: {0}")]
    Template(#[from] ctxscope_formats::TemplateError),
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    #[error("DeepSeek-V4 checkpoint: {0}")]
    DeepseekV4(#[from] deepseek_v4::LoadError),
}

/// Everything needed to run and to talk to one model.
pub struct Model {
    /// Name served as the OpenAI `model` (the file stem).
    pub id: String,
    pub config: ModelConfig,
    pub weights: Weights,
    pub tokenizer: Tokenizer,
    /// The chat format prompts are rendered with (the model's Jinja template, or a built-in encoder).
    pub template: ChatFormat,
    /// Tokens that end generation (EOS, EOT, and control tokens such as `<|im_end|>`).
    pub stop_tokens: Vec<u32>,
    /// SHA-free identity for cache keys: id plus file size.
    pub fingerprint: String,
    /// A DeepSeek-V4 checkpoint's weights and forward pass; `weights` is then empty.
    pub deepseek_v4: Option<Arc<DeepseekV4Model>>,
}

impl Model {
    /// Loads a GGUF file, or a Hugging Face checkpoint directory.
    pub fn load(path: &Path) -> Result<Model, ModelError> {
        if path.is_dir() {
            return hf::load(path);
        }
        let io = |source| ModelError::Io { path: path.to_path_buf(), source };
        let bytes = std::fs::read(path).map_err(io)?;
        let gguf = Gguf::read_from(bytes.as_slice(), bytes.len() as u64).map_err(ModelError::Gguf)?;
        let config = ModelConfig::from_gguf(&gguf)?;
        let weights = Weights::load(&gguf, &bytes, &config)?;
        let tokenizer = Tokenizer::from_gguf(&gguf)?;
        let template = ChatTemplate::from_gguf(&gguf)?.unwrap_or_else(ChatTemplate::chatml_fallback);
        let mut stop_tokens: Vec<u32> = Vec::new();
        for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
            if let Ok(Some(id)) = gguf.get_u32_opt(key) {
                stop_tokens.push(id);
            }
        }
        stop_tokens.extend(known_stop_tokens(&tokenizer));
        stop_tokens.sort_unstable();
        stop_tokens.dedup();
        let id = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into());
        let fingerprint = format!("{id}:{}", bytes.len());
        Ok(Model { id, config, weights, tokenizer, template: template.into(), stop_tokens, fingerprint, deepseek_v4: None })
    }

    /// The architecture family, as patches name what they apply to.
    pub fn arch(&self) -> Arch {
        if self.deepseek_v4.is_some() {
            Arch::DeepseekV4
        } else {
            Arch::Llama
        }
    }
}

/// Control tokens that end a turn in the common chat templates, where the vocabulary has them.
fn known_stop_tokens(tokenizer: &Tokenizer) -> Vec<u32> {
    ["<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "</s>"].iter().filter_map(|t| tokenizer.token_id(t)).collect()
}
