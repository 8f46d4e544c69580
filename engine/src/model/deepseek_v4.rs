//! DeepSeek-V4's configuration, as transformers writes `config.json` (`model_type` "deepseek_v4"),
//! checked at the edge, and the tensors a checkpoint of it holds under DeepSeek's own names (the ones
//! its releases use and `save_pretrained` writes back). The first piece of issue 27: the forward pass
//! (mHC, hash and top-k MoE, sliding / compressed sparse / heavily compressed attention) reads what
//! [`DeepseekV4Config::tensors`] names.

use std::collections::BTreeMap;
use std::path::Path;

use ctxscope_formats::{SafeTensors, SafetensorsError};
use serde_json::Value;

pub use super::yarn::{plain_inv_freq, Yarn, YarnError};

/// The most RoPE pairs a head may turn (DeepSeek-V4: 32).
pub const MAX_ROPE_PAIRS: usize = 64;

/// The attention of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionKind {
    /// Sliding-window attention over the raw keys only.
    Sliding,
    /// Compressed sparse attention: blocks of `csa_rate` tokens compressed (two overlapping series),
    /// the lightning indexer picking the top `index_topk` per query, beside the sliding window.
    CompressedSparse,
    /// Heavily compressed attention: blocks of `hca_rate` tokens, every one attended, beside the window.
    HeavilyCompressed,
}

/// The feed-forward block of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MlpKind {
    /// Experts chosen by a fixed token-id table (`tid2eid`).
    HashMoe,
    /// Experts chosen by the router's top-k (scores plus a correction bias).
    Moe,
}

/// A checkpoint's hyperparameters.
#[derive(Debug, Clone, PartialEq)]
pub struct DeepseekV4Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_heads: usize,
    pub head_dim: usize,
    /// Trailing dimensions of a head that RoPE turns (`qk_rope_head_dim`).
    pub rope_dim: usize,
    pub q_lora_rank: usize,
    pub o_groups: usize,
    pub o_lora_rank: usize,
    pub layers: Vec<(AttentionKind, MlpKind)>,
    pub csa_rate: usize,
    pub hca_rate: usize,
    pub sliding_window: usize,
    pub index_heads: usize,
    pub index_head_dim: usize,
    pub index_topk: usize,
    pub experts: usize,
    pub experts_per_token: usize,
    pub shared_experts: usize,
    pub expert_dim: usize,
    pub scoring_func: String,
    pub norm_topk_prob: bool,
    pub routed_scaling_factor: f32,
    pub swiglu_limit: f32,
    pub hc_mult: usize,
    pub hc_sinkhorn_iters: usize,
    pub hc_eps: f32,
    pub rms_norm_eps: f32,
    pub rope_theta: f64,
    pub compress_rope_theta: f64,
    /// YaRN scaling of the compress RoPE (DeepSeek-V4 ships factor 16); sliding layers' RoPE is plain.
    pub compress_yarn: Option<Yarn>,
    pub tie_word_embeddings: bool,
}

/// A config.json this module cannot take, with the key at fault.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("config.json is not DeepSeek-V4's (model_type {0:?})")]
    NotDeepseekV4(String),
    #[error("config.json has no usable {0}")]
    Missing(&'static str),
    #[error("config.json: {0}")]
    Invalid(String),
    #[error(transparent)]
    Yarn(#[from] YarnError),
}

impl DeepseekV4Config {
    /// Reads and checks a config.json value.
    pub fn from_json(c: &Value) -> Result<DeepseekV4Config, ConfigError> {
        let model_type = c.get("model_type").and_then(Value::as_str).unwrap_or("");
        if model_type != "deepseek_v4" {
            return Err(ConfigError::NotDeepseekV4(model_type.to_string()));
        }
        let u = |k: &'static str| c.get(k).and_then(Value::as_u64).map(|v| v as usize).ok_or(ConfigError::Missing(k));
        let f = |k: &'static str| c.get(k).and_then(Value::as_f64).ok_or(ConfigError::Missing(k));
        let n_layers = u("num_hidden_layers")?;
        let kinds = |k: &'static str| -> Result<Vec<String>, ConfigError> {
            let list = c.get(k).and_then(Value::as_array).ok_or(ConfigError::Missing(k))?;
            let names: Vec<String> = list.iter().filter_map(Value::as_str).map(str::to_string).collect();
            if names.len() != n_layers {
                return Err(ConfigError::Invalid(format!("{k} has {} entries for {n_layers} layers", names.len())));
            }
            Ok(names)
        };
        let attention = kinds("layer_types")?
            .iter()
            .map(|name| match name.as_str() {
                "sliding_attention" => Ok(AttentionKind::Sliding),
                "compressed_sparse_attention" => Ok(AttentionKind::CompressedSparse),
                "heavily_compressed_attention" => Ok(AttentionKind::HeavilyCompressed),
                other => Err(ConfigError::Invalid(format!("unknown layer type {other:?}"))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mlp = kinds("mlp_layer_types")?
            .iter()
            .map(|name| match name.as_str() {
                "hash_moe" => Ok(MlpKind::HashMoe),
                "moe" => Ok(MlpKind::Moe),
                other => Err(ConfigError::Invalid(format!("unknown MLP layer type {other:?}"))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let rates = c.get("compress_rates").ok_or(ConfigError::Missing("compress_rates"))?;
        let rate = |k: &'static str| rates.get(k).and_then(Value::as_u64).map(|v| v as usize).ok_or(ConfigError::Missing(k));
        let head_dim = u("head_dim")?;
        let rope_dim = match c.get("qk_rope_head_dim").and_then(Value::as_u64) {
            Some(d) => d as usize,
            None => (head_dim as f64 * f("partial_rotary_factor")?).round() as usize,
        };
        let theta = |label: &str, fallback: &'static str| -> Result<f64, ConfigError> {
            let nested = c.pointer(&format!("/rope_parameters/{label}"));
            nested.and_then(|r| r.get("rope_theta")).and_then(Value::as_f64).map_or_else(|| f(fallback), Ok)
        };
        let compress_yarn = Self::compress_yarn(c)?;
        let config = DeepseekV4Config {
            vocab_size: u("vocab_size")?,
            hidden_size: u("hidden_size")?,
            num_heads: u("num_attention_heads")?,
            head_dim,
            rope_dim,
            q_lora_rank: u("q_lora_rank")?,
            o_groups: u("o_groups")?,
            o_lora_rank: u("o_lora_rank")?,
            layers: attention.into_iter().zip(mlp).collect(),
            csa_rate: rate("compressed_sparse_attention")?,
            hca_rate: rate("heavily_compressed_attention")?,
            sliding_window: u("sliding_window")?,
            index_heads: u("index_n_heads")?,
            index_head_dim: u("index_head_dim")?,
            index_topk: u("index_topk")?,
            experts: u("n_routed_experts")?,
            experts_per_token: u("num_experts_per_tok")?,
            shared_experts: u("n_shared_experts")?,
            expert_dim: u("moe_intermediate_size")?,
            scoring_func: c.get("scoring_func").and_then(Value::as_str).unwrap_or("sqrtsoftplus").to_string(),
            norm_topk_prob: c.get("norm_topk_prob").and_then(Value::as_bool).unwrap_or(true),
            routed_scaling_factor: f("routed_scaling_factor")? as f32,
            swiglu_limit: f("swiglu_limit")? as f32,
            hc_mult: u("hc_mult")?,
            hc_sinkhorn_iters: u("hc_sinkhorn_iters")?,
            hc_eps: f("hc_eps")? as f32,
            rms_norm_eps: f("rms_norm_eps")? as f32,
            rope_theta: theta("main", "rope_theta")?,
            compress_rope_theta: theta("compress", "compress_rope_theta")?,
            compress_yarn,
            tie_word_embeddings: c.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(false),
        };
        config.check()?;
        Ok(config)
    }

    /// The compress RoPE's YaRN, from the nested `rope_parameters.compress` transformers writes, or
    /// from a flat `rope_parameters` / `rope_scaling` (DeepSeek's own config.json), which transformers
    /// applies to the compress RoPE alone with `attention_factor` 1.0. The main RoPE must be plain.
    fn compress_yarn(c: &Value) -> Result<Option<Yarn>, ConfigError> {
        let kind =
            |entry: &Value| entry.get("rope_type").or_else(|| entry.get("type")).and_then(Value::as_str).unwrap_or("default").to_string();
        let params = c.get("rope_parameters").filter(|p| p.is_object());
        let nested = |label: &str| params.and_then(|p| p.get(label)).filter(|e| e.is_object());
        if let Some(main) = nested("main").map(kind).filter(|k| k != "default") {
            return Err(ConfigError::Invalid(format!("main RoPE of type {main} (DeepSeek-V4 turns its sliding layers by plain RoPE)")));
        }
        let max_positions = c.get("max_position_embeddings").and_then(Value::as_f64);
        // transformers reads `truncate` from the top level of `rope_parameters` only.
        let truncate = params.and_then(|p| p.get("truncate")).and_then(Value::as_bool).unwrap_or(true);
        let (entry, default_attention) = match nested("compress") {
            Some(entry) => (entry, None),
            None => match params
                .filter(|p| p.get("rope_type").or_else(|| p.get("type")).is_some())
                .or_else(|| c.get("rope_scaling").filter(|s| s.is_object()))
            {
                Some(flat) => (flat, Some(1.0)),
                None => return Ok(None),
            },
        };
        match kind(entry).as_str() {
            "default" => Ok(None),
            "yarn" => Ok(Some(Yarn::from_entry(entry, max_positions, default_attention, truncate)?)),
            other => Err(ConfigError::Invalid(format!("compress RoPE of type {other} is not implemented (default and yarn are)"))),
        }
    }

    fn check(&self) -> Result<(), ConfigError> {
        let bad = |what: String| Err(ConfigError::Invalid(what));
        if self.num_heads == 0 || self.o_groups == 0 || !self.num_heads.is_multiple_of(self.o_groups) {
            return bad(format!("{} heads do not split into {} output groups", self.num_heads, self.o_groups));
        }
        if self.rope_dim > self.head_dim || !self.rope_dim.is_multiple_of(2) || self.rope_dim > 2 * MAX_ROPE_PAIRS {
            return bad(format!("a RoPE part of {} in heads of {} (even, at most {})", self.rope_dim, self.head_dim, 2 * MAX_ROPE_PAIRS));
        }
        if self.experts_per_token == 0 || self.experts_per_token > self.experts {
            return bad(format!("{} experts per token of {}", self.experts_per_token, self.experts));
        }
        if self.csa_rate == 0 || self.hca_rate == 0 || self.hc_mult == 0 {
            return bad("a compression rate or hc_mult of 0".into());
        }
        if !matches!(self.scoring_func.as_str(), "sqrtsoftplus" | "softmax" | "sigmoid") {
            return bad(format!("scoring_func {:?}", self.scoring_func));
        }
        Ok(())
    }

    /// Every tensor a checkpoint of this configuration holds: name, shape, dtype (safetensors'
    /// names: "F32" for weights as saved here, "I64" for the hash layers' token-to-expert tables).
    pub fn tensors(&self) -> Vec<(String, Vec<usize>, &'static str)> {
        let (d, hc, hd) = (self.hidden_size, self.hc_mult, self.head_dim);
        let mut out: Vec<(String, Vec<usize>, &'static str)> = Vec::new();
        let mut push = |name: String, shape: Vec<usize>| out.push((name, shape, "F32"));
        push("model.embed_tokens.weight".into(), vec![self.vocab_size, d]);
        if !self.tie_word_embeddings {
            push("head.weight".into(), vec![self.vocab_size, d]);
        }
        push("model.norm.weight".into(), vec![d]);
        push("model.hc_head.hc_fn".into(), vec![hc, hc * d]);
        push("model.hc_head.hc_base".into(), vec![hc]);
        push("model.hc_head.hc_scale".into(), vec![1]);
        // mHC per sub-block: pre (hc) + post (hc) + comb (hc x hc) weights from the hc x d streams.
        let mix = 2 * hc + hc * hc;
        let mut tables = Vec::new();
        for (i, (attention, mlp)) in self.layers.iter().enumerate() {
            let l = format!("model.layers.{i}");
            push(format!("{l}.attn_norm.weight"), vec![d]);
            push(format!("{l}.ffn_norm.weight"), vec![d]);
            for part in ["attn", "ffn"] {
                push(format!("{l}.hc_{part}_fn"), vec![mix, hc * d]);
                push(format!("{l}.hc_{part}_base"), vec![mix]);
                push(format!("{l}.hc_{part}_scale"), vec![3]);
            }
            let a = format!("{l}.attn");
            push(format!("{a}.attn_sink"), vec![self.num_heads]);
            push(format!("{a}.wq_a.weight"), vec![self.q_lora_rank, d]);
            push(format!("{a}.q_norm.weight"), vec![self.q_lora_rank]);
            push(format!("{a}.wq_b.weight"), vec![self.num_heads * hd, self.q_lora_rank]);
            push(format!("{a}.wkv.weight"), vec![hd, d]);
            push(format!("{a}.norm.weight"), vec![hd]);
            push(format!("{a}.wo_a.weight"), vec![self.o_groups * self.o_lora_rank, self.num_heads * hd / self.o_groups]);
            push(format!("{a}.wo_b.weight"), vec![d, self.o_groups * self.o_lora_rank]);
            // A compressor: projections of `width` per token, a per-slot bias over `rate` slots.
            let mut compressor = |prefix: String, rate: usize, head: usize, width: usize| {
                push(format!("{prefix}.wkv.weight"), vec![width, d]);
                push(format!("{prefix}.wgate.weight"), vec![width, d]);
                push(format!("{prefix}.ape"), vec![rate, width]);
                push(format!("{prefix}.norm.weight"), vec![head]);
            };
            match attention {
                AttentionKind::Sliding => {}
                AttentionKind::HeavilyCompressed => compressor(format!("{a}.compressor"), self.hca_rate, hd, hd),
                AttentionKind::CompressedSparse => {
                    // Two overlapping series (the previous window's and this one's): twice the width.
                    compressor(format!("{a}.compressor"), self.csa_rate, hd, 2 * hd);
                    let ihd = self.index_head_dim;
                    compressor(format!("{a}.indexer.compressor"), self.csa_rate, ihd, 2 * ihd);
                    push(format!("{a}.indexer.wq_b.weight"), vec![self.index_heads * ihd, self.q_lora_rank]);
                    push(format!("{a}.indexer.weights_proj.weight"), vec![self.index_heads, d]);
                }
            }
            let f = format!("{l}.ffn");
            push(format!("{f}.gate.weight"), vec![self.experts, d]);
            match mlp {
                MlpKind::Moe => push(format!("{f}.gate.bias"), vec![self.experts]),
                MlpKind::HashMoe => tables.push((format!("{f}.gate.tid2eid"), vec![self.vocab_size, self.experts_per_token], "I64")),
            }
            for e in 0..self.experts {
                push(format!("{f}.experts.{e}.w1.weight"), vec![self.expert_dim, d]);
                push(format!("{f}.experts.{e}.w2.weight"), vec![d, self.expert_dim]);
                push(format!("{f}.experts.{e}.w3.weight"), vec![self.expert_dim, d]);
            }
            let shared = self.expert_dim * self.shared_experts;
            if shared > 0 {
                push(format!("{f}.shared_experts.w1.weight"), vec![shared, d]);
                push(format!("{f}.shared_experts.w2.weight"), vec![d, shared]);
                push(format!("{f}.shared_experts.w3.weight"), vec![shared, d]);
            }
        }
        out.extend(tables);
        out
    }
}

/// Why a DeepSeek-V4 checkpoint could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: {source}")]
    Io { path: std::path::PathBuf, source: std::io::Error },
    #[error("config.json: {0}")]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Tensors(#[from] SafetensorsError),
    #[error("tensor {name} has shape {found:?}, expected {expected:?}")]
    Shape { name: String, found: Vec<usize>, expected: Vec<usize> },
}

/// A checkpoint in memory: its config, every weight as f32 and the hash layers' tables. Its forward
/// pass is in `crate::forward::deepseek_v4`.
pub struct DeepseekV4Model {
    pub config: DeepseekV4Config,
    pub(crate) tensors: BTreeMap<String, Vec<f32>>,
    pub(crate) tables: BTreeMap<String, Vec<i64>>,
}

impl DeepseekV4Model {
    /// Weights one decoded token reads (elements): every tensor but the embedding table (a row of
    /// it; unless tied, when it is the output head) and the routed experts, plus `num_experts_per_tok`
    /// experts in each layer.
    pub fn weights_per_token(&self) -> usize {
        let c = &self.config;
        let total: usize = self.tensors.values().map(Vec::len).sum();
        let routed: usize = self.tensors.iter().filter(|(name, _)| name.contains(".experts.")).map(|(_, t)| t.len()).sum();
        let embed = if c.tie_word_embeddings { 0 } else { self.tensors.get("model.embed_tokens.weight").map_or(0, Vec::len) };
        let per_expert = routed / (c.experts * c.layers.len()).max(1);
        total - routed - embed + per_expert * c.experts_per_token * c.layers.len()
    }

    /// Loads `dir` (config.json and safetensors), checking every tensor's shape against the config.
    pub fn load(dir: &Path) -> Result<DeepseekV4Model, LoadError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|source| LoadError::Io { path, source })?;
        let config = DeepseekV4Config::from_json(&serde_json::from_str(&text)?)?;
        let file = SafeTensors::open_dir(dir)?;
        let (mut tensors, mut tables) = (BTreeMap::new(), BTreeMap::new());
        for (name, shape, dtype) in config.tensors() {
            let found = file.entry(&name).ok_or_else(|| SafetensorsError::Missing(name.clone()))?.shape.clone();
            if found != shape {
                return Err(LoadError::Shape { name, found, expected: shape });
            }
            if dtype == "I64" {
                tables.insert(name.clone(), file.i64(&name)?);
            } else {
                tensors.insert(name.clone(), file.f32(&name)?);
            }
        }
        Ok(DeepseekV4Model { config, tensors, tables })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forward::testutil::tiny;
    use std::collections::BTreeMap;

    fn tiny_config() -> Value {
        tiny::json("config.json")
    }

    #[test]
    fn the_tiny_checkpoint_holds_exactly_the_tensors_its_config_implies() {
        let config = DeepseekV4Config::from_json(&tiny_config()).unwrap();
        assert_eq!(config.layers.len(), 4);
        assert_eq!((config.rope_dim, config.csa_rate, config.hca_rate), (8, 4, 16));
        let file = tiny::tensors();
        let found: BTreeMap<String, (Vec<usize>, String)> =
            file.names().map(|n| (n.to_string(), file.entry(n).map(|e| (e.shape.clone(), e.dtype.clone())).unwrap())).collect();
        let expected: BTreeMap<String, (Vec<usize>, String)> =
            config.tensors().into_iter().map(|(n, s, t)| (n, (s, t.to_string()))).collect();
        let missing: Vec<_> = expected.keys().filter(|k| !found.contains_key(*k)).collect();
        let extra: Vec<_> = found.keys().filter(|k| !expected.contains_key(*k)).collect();
        assert!(missing.is_empty() && extra.is_empty(), "missing {missing:?}, not expected {extra:?}");
        for (name, want) in &expected {
            assert_eq!(&found[name], want, "{name}");
        }
    }

    /// YaRN on the compress RoPE, in each form a config.json carries it: nested as transformers
    /// writes it (its `attention_factor`, or transformers' default without one), or flat as
    /// DeepSeek's own config has it (`rope_scaling`; transformers then sets 1.0).
    #[test]
    fn compress_yarn_is_read_nested_or_flat() {
        let yarn = serde_json::json!({"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 256});
        let mut c = tiny_config();
        assert_eq!(DeepseekV4Config::from_json(&c).unwrap().compress_yarn, None);
        for (k, v) in yarn.as_object().unwrap() {
            c["rope_parameters"]["compress"][k] = v.clone();
        }
        let nested = DeepseekV4Config::from_json(&c).unwrap().compress_yarn.unwrap();
        assert_eq!((nested.factor, nested.original_max_positions, nested.beta_fast, nested.beta_slow), (16.0, 256.0, 32.0, 1.0));
        assert!((nested.attention_factor - 1.2772588722239781).abs() < 1e-12);
        c["rope_parameters"]["compress"]["attention_factor"] = 1.0.into();
        assert_eq!(DeepseekV4Config::from_json(&c).unwrap().compress_yarn.unwrap().attention_factor, 1.0);
        let mut flat = tiny_config();
        flat.as_object_mut().unwrap().remove("rope_parameters");
        flat["rope_scaling"] = serde_json::json!({"type": "yarn", "factor": 16.0, "original_max_position_embeddings": 256});
        let read = DeepseekV4Config::from_json(&flat).unwrap();
        assert_eq!(read.compress_yarn.unwrap().attention_factor, 1.0);
        assert_eq!((read.rope_theta, read.compress_rope_theta), (10000.0, 160000.0));
    }

    /// DeepSeek-V4 at its released size (tests/fixtures/deepseek_v4/flash: transformers' config.json
    /// with the released YaRN): read as transformers reads it, every parameter named (the count of
    /// `DeepseekV4ForCausalLM` on the meta device with its float buffers, the hash tables as I64), both RoPE tables equal
    /// to transformers' bit for bit.
    #[test]
    fn the_released_size_reads_as_transformers_builds_it() {
        let dir = tiny::dir().join("../flash");
        let read = |name: &str| -> Value { serde_json::from_str(&std::fs::read_to_string(dir.join(name)).unwrap()).unwrap() };
        let (config, expected) = (DeepseekV4Config::from_json(&read("config.json")).unwrap(), read("expected.json"));
        assert_eq!((config.layers.len(), config.hidden_size, config.rope_dim, config.hca_rate), (43, 4096, 64, 128));
        let tensors = config.tensors();
        let numel = |dtype: &str| -> u64 { tensors.iter().filter(|t| t.2 == dtype).map(|t| t.1.iter().product::<usize>() as u64).sum() };
        let floats = expected["parameters"].as_u64().unwrap() + expected["float_buffers"].as_u64().unwrap();
        assert_eq!(numel("F32"), floats, "parameters and the routers' correction biases");
        let tables: Vec<Vec<usize>> = tensors.iter().filter(|t| t.2 == "I64").map(|t| t.1.clone()).collect();
        let want: Vec<Vec<usize>> =
            expected["integer_buffers"].as_object().unwrap().values().map(|v| serde_json::from_value(v.clone()).unwrap()).collect();
        assert_eq!(tables, want, "hash tables");
        let yarn = config.compress_yarn.as_ref().expect("the released config's YaRN");
        assert_eq!((yarn.factor, yarn.original_max_positions, yarn.attention_factor), (16.0, 65536.0, 1.0));
        let freqs = |kind: &str| tiny::floats(&expected["rope"][kind]["inv_freq"]);
        assert_eq!(yarn.inv_freq(config.compress_rope_theta, config.rope_dim), freqs("compress"));
        assert_eq!(plain_inv_freq(config.rope_theta, config.rope_dim), freqs("main"));
        assert_eq!(expected["rope"]["compress"]["attention_scaling"], 1.0);
    }

    #[test]
    fn configs_it_cannot_serve_are_refused_naming_the_key() {
        let mut c = tiny_config();
        c["model_type"] = "llama".into();
        assert_eq!(DeepseekV4Config::from_json(&c), Err(ConfigError::NotDeepseekV4("llama".into())));
        let mut c = tiny_config();
        c["layer_types"][1] = "full_attention".into();
        assert!(matches!(DeepseekV4Config::from_json(&c), Err(ConfigError::Invalid(m)) if m.contains("full_attention")));
        let mut c = tiny_config();
        c["mlp_layer_types"] = serde_json::json!(["moe"]);
        assert!(matches!(DeepseekV4Config::from_json(&c), Err(ConfigError::Invalid(m)) if m.contains("1 entries for 4 layers")));
        let mut c = tiny_config();
        c["o_groups"] = 3.into();
        assert!(DeepseekV4Config::from_json(&c).is_err());
        let mut c = tiny_config();
        c["rope_parameters"]["compress"]["rope_type"] = "longrope".into();
        assert!(matches!(DeepseekV4Config::from_json(&c), Err(ConfigError::Invalid(m)) if m.contains("longrope")));
        let mut c = tiny_config();
        c["rope_parameters"]["main"]["rope_type"] = "yarn".into();
        assert!(matches!(DeepseekV4Config::from_json(&c), Err(ConfigError::Invalid(m)) if m.contains("main RoPE")));
        let mut c = tiny_config();
        c.as_object_mut().unwrap().remove("q_lora_rank");
        assert_eq!(DeepseekV4Config::from_json(&c), Err(ConfigError::Missing("q_lora_rank")));
    }
}
