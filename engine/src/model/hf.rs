//! Hugging Face Llama-family checkpoints: `config.json`, `*.safetensors` (F32, F16 or BF16) and
//! `tokenizer.json` (+ `tokenizer_config.json` for the chat template). Q and K projections are
//! permuted from Hugging Face's rotate-half RoPE layout into the adjacent-pair layout the forward pass
//! (and GGUF) uses, exactly as llama.cpp's converter does, so one file in either format computes the
//! same thing. Weights are kept as f32 (the fast path falls back to the f32 dot for them).

use std::path::Path;
use std::sync::Arc;

use ctxscope_formats::gguf::GgmlType;
use ctxscope_formats::template::{ChatFormat, DeepSeekFormat, DeepSeekVersion};
use ctxscope_formats::{ChatTemplate, SafeTensors, Tokenizer};
use serde_json::Value;

use super::deepseek_v4::{DeepseekV4Config, DeepseekV4Model};
use super::{Layer, Matrix, Model, ModelConfig, ModelError, QuantMatrix, Weights};

/// Loads the checkpoint in `dir`.
pub fn load(dir: &Path) -> Result<Model, ModelError> {
    let config_json = read_json(&dir.join("config.json"))?;
    let deepseek_v4 = config_json.get("model_type").and_then(Value::as_str) == Some("deepseek_v4");
    let (config, weights, deepseek_v4) = if deepseek_v4 {
        let model = DeepseekV4Model::load(dir)?;
        (deepseek_v4_config(&model.config, &config_json), Weights::empty(), Some(Arc::new(model)))
    } else {
        let config = config_from_hf(&config_json)?;
        let tensors = SafeTensors::open_dir(dir).map_err(|e| ModelError::Checkpoint(e.to_string()))?;
        (config.clone(), weights(&tensors, &config)?, None)
    };
    let tokenizer_config = read_json(&dir.join("tokenizer_config.json")).ok();
    let tokenizer = Tokenizer::from_tokenizer_json(&dir.join("tokenizer.json"), tokenizer_config.as_ref())?;
    let template: ChatFormat = match &tokenizer_config {
        // DeepSeek-V4 ships no Jinja template: its encoding script, rewritten (chat mode, as servers default).
        _ if deepseek_v4.is_some() => ChatFormat::DeepSeek(DeepSeekFormat { version: DeepSeekVersion::V4, thinking: false }),
        Some(c) => ChatTemplate::from_tokenizer_config(c)?.unwrap_or_else(ChatTemplate::chatml_fallback).into(),
        None => ChatTemplate::chatml_fallback().into(),
    };
    let mut stop_tokens: Vec<u32> = match config_json.get("eos_token_id") {
        Some(Value::Number(n)) => n.as_u64().map(|v| vec![v as u32]).unwrap_or_default(),
        Some(Value::Array(list)) => list.iter().filter_map(Value::as_u64).map(|v| v as u32).collect(),
        _ => Vec::new(),
    };
    stop_tokens.extend(super::known_stop_tokens(&tokenizer));
    stop_tokens.sort_unstable();
    stop_tokens.dedup();
    let id = dir.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into());
    let size: u64 = std::fs::read_dir(dir).map(|d| d.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum()).unwrap_or(0);
    let fingerprint = format!("{id}:{size}");
    Ok(Model { id, config, weights, tokenizer, template, stop_tokens, fingerprint, deepseek_v4 })
}

/// The shape a DeepSeek-V4 checkpoint shows the scheduler and `/props` (its own config drives the pass).
fn deepseek_v4_config(c: &DeepseekV4Config, json: &Value) -> ModelConfig {
    let ctx_len = json.get("max_position_embeddings").and_then(Value::as_u64).map_or(4096, |v| v as usize);
    ModelConfig {
        architecture: "deepseek_v4".into(),
        n_layers: c.layers.len(),
        dim: c.hidden_size,
        n_heads: c.num_heads,
        n_kv_heads: 1,
        head_dim: c.head_dim,
        ffn_dim: c.expert_dim,
        vocab: c.vocab_size,
        ctx_len,
        rope_base: c.rope_theta as f32,
        rms_eps: c.rms_norm_eps,
    }
}

fn read_json(path: &Path) -> Result<Value, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?;
    serde_json::from_str(&text).map_err(|e| ModelError::Checkpoint(format!("{}: {e}", path.display())))
}

/// The hyperparameters of a Llama-family `config.json`.
pub fn config_from_hf(c: &Value) -> Result<ModelConfig, ModelError> {
    let architecture = c.pointer("/architectures/0").and_then(Value::as_str).unwrap_or("");
    if !matches!(architecture, "LlamaForCausalLM" | "MistralForCausalLM") {
        return Err(ModelError::Architecture(architecture.to_string()));
    }
    // RoPE: `rope_theta` (+ `rope_scaling`), or transformers 5's `rope_parameters` object.
    let rope = c.get("rope_parameters").filter(|v| v.is_object());
    let scaling = c.get("rope_scaling").filter(|v| !v.is_null()).or(rope);
    let rope_type = scaling.and_then(|s| s.get("rope_type").or_else(|| s.get("type"))).and_then(Value::as_str).unwrap_or("default");
    if rope_type != "default" {
        return Err(ModelError::Checkpoint(format!("config.json asks for {rope_type} RoPE scaling, which this engine does not implement")));
    }
    let rope_theta = c.get("rope_theta").or_else(|| rope.and_then(|r| r.get("rope_theta"))).and_then(Value::as_f64).unwrap_or(10_000.0);
    let u = |k: &str| {
        c.get(k).and_then(Value::as_u64).map(|v| v as usize).ok_or_else(|| ModelError::Checkpoint(format!("config.json has no {k}")))
    };
    let (dim, n_heads) = (u("hidden_size")?, u("num_attention_heads")?);
    let n_kv_heads = c.get("num_key_value_heads").and_then(Value::as_u64).map_or(n_heads, |v| v as usize);
    if n_heads == 0 || !dim.is_multiple_of(n_heads) || !n_heads.is_multiple_of(n_kv_heads.max(1)) {
        return Err(ModelError::Shape(format!("{n_heads} heads, {n_kv_heads} KV heads, width {dim}")));
    }
    let head_dim = dim / n_heads;
    if c.get("head_dim").and_then(Value::as_u64).is_some_and(|h| h as usize != head_dim) {
        return Err(ModelError::Shape(format!("head_dim {} differs from hidden_size / heads = {head_dim}", c["head_dim"])));
    }
    let f = |k: &str, default: f64| c.get(k).and_then(Value::as_f64).unwrap_or(default) as f32;
    Ok(ModelConfig {
        architecture: "llama".into(),
        n_layers: u("num_hidden_layers")?,
        dim,
        n_heads,
        n_kv_heads,
        head_dim,
        ffn_dim: u("intermediate_size")?,
        vocab: u("vocab_size")?,
        ctx_len: u("max_position_embeddings")?,
        rope_base: rope_theta as f32,
        rms_eps: f("rms_norm_eps", 1e-6),
    })
}

fn weights(t: &SafeTensors, c: &ModelConfig) -> Result<Weights, ModelError> {
    let kv = c.kv_dim();
    let mut layers = Vec::with_capacity(c.n_layers);
    for i in 0..c.n_layers {
        let n = |s: &str| format!("model.layers.{i}.{s}.weight");
        layers.push(Layer {
            attn_norm: vector(t, &n("input_layernorm"), c.dim)?,
            wq: permuted(matrix(t, &n("self_attn.q_proj"), c.dim, c.dim)?, c.n_heads),
            wk: permuted(matrix(t, &n("self_attn.k_proj"), kv, c.dim)?, c.n_kv_heads),
            wv: matrix(t, &n("self_attn.v_proj"), kv, c.dim)?,
            wo: matrix(t, &n("self_attn.o_proj"), c.dim, c.dim)?,
            ffn_norm: vector(t, &n("post_attention_layernorm"), c.dim)?,
            w_gate: matrix(t, &n("mlp.gate_proj"), c.ffn_dim, c.dim)?,
            w_up: matrix(t, &n("mlp.up_proj"), c.ffn_dim, c.dim)?,
            w_down: matrix(t, &n("mlp.down_proj"), c.dim, c.ffn_dim)?,
        });
    }
    let output = match t.entry("lm_head.weight") {
        Some(_) => Some(matrix(t, "lm_head.weight", c.vocab, c.dim)?),
        None => None,
    };
    Ok(Weights {
        token_embd: matrix(t, "model.embed_tokens.weight", c.vocab, c.dim)?,
        layers,
        output_norm: vector(t, "model.norm.weight", c.dim)?,
        output,
    })
}

fn checked(t: &SafeTensors, name: &str, shape: &[usize]) -> Result<Vec<f32>, ModelError> {
    let entry = t.entry(name).ok_or_else(|| ModelError::MissingTensor(name.into()))?;
    if entry.shape != shape {
        let as_u64 = |s: &[usize]| s.iter().map(|&d| d as u64).collect();
        return Err(ModelError::TensorShape { tensor: name.into(), found: as_u64(&entry.shape), expected: as_u64(shape) });
    }
    t.f32(name).map_err(|e| ModelError::Checkpoint(e.to_string()))
}

fn matrix(t: &SafeTensors, name: &str, rows: usize, cols: usize) -> Result<Matrix, ModelError> {
    let f32 = checked(t, name, &[rows, cols])?;
    let quant = QuantMatrix { ggml_type: GgmlType(0), bytes: Vec::new(), row_bytes: 0 };
    Ok(Matrix { name: name.into(), rows, cols, f32, quant })
}

fn vector(t: &SafeTensors, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
    checked(t, name, &[len])
}

/// Rows of a Q or K projection from rotate-half order (per head: all first halves, then all second
/// halves) to adjacent pairs: row `2j + p` of a head takes row `p * half + j`.
pub fn permuted(mut m: Matrix, heads: usize) -> Matrix {
    m.f32 = permute_rows(&m.f32, m.rows, m.cols, heads, false);
    m
}

/// The row permutation between the two RoPE layouts; `inverse` goes from adjacent pairs back to
/// rotate-half (what a converter writing Hugging Face files does).
pub fn permute_rows(data: &[f32], rows: usize, cols: usize, heads: usize, inverse: bool) -> Vec<f32> {
    let head_dim = rows / heads.max(1);
    let half = head_dim / 2;
    let mut out = vec![0f32; data.len()];
    for h in 0..heads {
        for j in 0..half {
            for p in 0..2 {
                let pair = h * head_dim + 2 * j + p;
                let split = h * head_dim + p * half + j;
                let (to, from) = if inverse { (split, pair) } else { (pair, split) };
                out[to * cols..(to + 1) * cols].copy_from_slice(&data[from * cols..(from + 1) * cols]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_permutation_interleaves_halves_and_inverts() {
        // One head of dim 4, one column: rotate-half rows [a0 a1 b0 b1] -> pairs [a0 b0 a1 b1].
        let data = [0.0, 1.0, 10.0, 11.0];
        assert_eq!(permute_rows(&data, 4, 1, 1, false), vec![0.0, 10.0, 1.0, 11.0]);
        let back = permute_rows(&permute_rows(&data, 4, 1, 1, false), 4, 1, 1, true);
        assert_eq!(back, data.to_vec());
    }

    #[test]
    fn config_maps_llama_keys_and_refuses_what_it_cannot_run() {
        let c = serde_json::json!({"architectures": ["LlamaForCausalLM"], "hidden_size": 576, "num_hidden_layers": 30,
            "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152,
            "max_position_embeddings": 8192, "rope_theta": 100000.0, "rms_norm_eps": 1e-5});
        let config = config_from_hf(&c).unwrap();
        assert_eq!((config.dim, config.head_dim, config.kv_dim(), config.rope_base), (576, 64, 192, 100000.0));
        let mut scaled = c.clone();
        scaled["rope_scaling"] = serde_json::json!({"rope_type": "llama3"});
        assert!(config_from_hf(&scaled).is_err());
        // transformers 5 writes RoPE settings as `rope_parameters`.
        let mut v5 = c.clone();
        v5.as_object_mut().unwrap().remove("rope_theta");
        v5["rope_parameters"] = serde_json::json!({"rope_theta": 100000.0, "rope_type": "default"});
        assert_eq!(config_from_hf(&v5).unwrap().rope_base, 100000.0);
        v5["rope_parameters"]["rope_type"] = serde_json::json!("yarn");
        assert!(config_from_hf(&v5).is_err());
        let mut gpt = c;
        gpt["architectures"] = serde_json::json!(["GPT2LMHeadModel"]);
        assert!(matches!(config_from_hf(&gpt), Err(ModelError::Architecture(_))));
    }
}
