//! DeepSeek-V4's forward pass, golden f32, over a whole sequence (no cache yet): token embeddings
//! copied into `hc_mult` residual streams; per layer, the attention hyper-connection, the layer's
//! attention (sliding, HCA or CSA) on the collapsed and RMS-normed streams, folded back, then the
//! same around the MoE block; the hyper-head, the final norm and the output head. Built from
//! [`super::mhc`], [`super::moe`] and [`super::dsv4_attention`], each matched to transformers on its
//! own; this pass is matched end to end (tests/fixtures/deepseek_v4/tiny/reference.json).

use std::collections::BTreeMap;
use std::path::Path;

use ctxscope_formats::{SafeTensors, SafetensorsError};
use ctxscope_numerics::dot;

use super::dsv4_attention::{attention, AttentionShape, AttentionWeights, Compressor, Indexer, Long};
use super::mhc::{fold, head, hyper_connection, HcSettings, HcWeights};
use super::moe::{moe, Expert, MoeSettings, MoeWeights, Routing, Scoring};
use crate::model::deepseek_v4::{AttentionKind, ConfigError, DeepseekV4Config, MlpKind};

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

/// A checkpoint in memory: its config, every weight as f32 and the hash layers' tables.
pub struct DeepseekV4Model {
    pub config: DeepseekV4Config,
    tensors: BTreeMap<String, Vec<f32>>,
    tables: BTreeMap<String, Vec<i64>>,
}

impl DeepseekV4Model {
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

    fn t(&self, name: &str) -> &[f32] {
        // Every name the pass asks for is in `config.tensors()`, which `load` read.
        self.tensors.get(name).map(Vec::as_slice).unwrap_or_else(|| panic!("tensor {name} was not loaded"))
    }

    fn compressor(&self, prefix: &str, rate: usize) -> Compressor<'_> {
        Compressor {
            wkv: self.t(&format!("{prefix}.wkv.weight")),
            wgate: self.t(&format!("{prefix}.wgate.weight")),
            ape: self.t(&format!("{prefix}.ape")),
            norm: self.t(&format!("{prefix}.norm.weight")),
            rate,
        }
    }

    fn hc(&self, layer: usize, part: &str) -> HcWeights<'_> {
        let scale = self.t(&format!("model.layers.{layer}.hc_{part}_scale"));
        HcWeights {
            fn_rows: self.t(&format!("model.layers.{layer}.hc_{part}_fn")),
            base: self.t(&format!("model.layers.{layer}.hc_{part}_base")),
            scale: [scale[0], scale[1], scale[2]],
        }
    }

    /// The logits of every position of `ids` (positions `0..ids.len()`).
    pub fn logits(&self, ids: &[u32]) -> Vec<Vec<f32>> {
        let c = &self.config;
        let (d, hc) = (c.hidden_size, c.hc_mult);
        let hs = HcSettings { hc, sinkhorn_iters: c.hc_sinkhorn_iters, eps: c.hc_eps, norm_eps: c.rms_norm_eps };
        let embed = self.t("model.embed_tokens.weight");
        let mut streams: Vec<Vec<f32>> = ids.iter().map(|&id| embed[id as usize * d..(id as usize + 1) * d].repeat(hc)).collect();
        let moe_settings = MoeSettings {
            top_k: c.experts_per_token,
            scoring: Scoring::parse(&c.scoring_func).unwrap_or(Scoring::SqrtSoftplus),
            routed_scaling: c.routed_scaling_factor,
            swiglu_limit: c.swiglu_limit,
        };
        for (layer, &(kind, mlp_kind)) in c.layers.iter().enumerate() {
            let l = format!("model.layers.{layer}");
            // Attention.
            let hc_attn = self.hc(layer, "attn");
            let mixes: Vec<_> = streams.iter().map(|s| hyper_connection(s, &hc_attn, hs)).collect();
            let attn_norm = self.t(&format!("{l}.attn_norm.weight"));
            let input: Vec<f32> = mixes.iter().flat_map(|m| rms_norm(&m.collapsed, attn_norm, c.rms_norm_eps)).collect();
            let a = format!("{l}.attn");
            let w = AttentionWeights {
                wq_a: self.t(&format!("{a}.wq_a.weight")),
                q_norm: self.t(&format!("{a}.q_norm.weight")),
                wq_b: self.t(&format!("{a}.wq_b.weight")),
                wkv: self.t(&format!("{a}.wkv.weight")),
                kv_norm: self.t(&format!("{a}.norm.weight")),
                wo_a: self.t(&format!("{a}.wo_a.weight")),
                wo_b: self.t(&format!("{a}.wo_b.weight")),
                sinks: self.t(&format!("{a}.attn_sink")),
            };
            let shape = AttentionShape::for_layer(c, kind);
            let long = match kind {
                AttentionKind::Sliding => Long::None,
                AttentionKind::HeavilyCompressed => Long::Heavy(self.compressor(&format!("{a}.compressor"), c.hca_rate)),
                AttentionKind::CompressedSparse => Long::Sparse(
                    self.compressor(&format!("{a}.compressor"), c.csa_rate),
                    Indexer {
                        compressor: self.compressor(&format!("{a}.indexer.compressor"), c.csa_rate),
                        wq_b: self.t(&format!("{a}.indexer.wq_b.weight")),
                        weights_proj: self.t(&format!("{a}.indexer.weights_proj.weight")),
                        heads: c.index_heads,
                        head_dim: c.index_head_dim,
                        topk: c.index_topk,
                    },
                ),
            };
            let out = attention(&input, d, &w, &shape, &long);
            for ((s, m), o) in streams.iter_mut().zip(&mixes).zip(out.chunks(d)) {
                fold(s, m, o);
            }
            // MoE.
            let hc_ffn = self.hc(layer, "ffn");
            let ffn_norm = self.t(&format!("{l}.ffn_norm.weight"));
            let f = format!("{l}.ffn");
            let routing = match mlp_kind {
                MlpKind::HashMoe => Routing::Hash { table: &self.tables[&format!("{f}.gate.tid2eid")] },
                MlpKind::Moe => Routing::TopK { bias: self.t(&format!("{f}.gate.bias")) },
            };
            let expert = |p: String| Expert {
                w1: self.t(&format!("{p}.w1.weight")),
                w2: self.t(&format!("{p}.w2.weight")),
                w3: self.t(&format!("{p}.w3.weight")),
            };
            let moe_weights = MoeWeights {
                gate: self.t(&format!("{f}.gate.weight")),
                routing,
                experts: (0..c.experts).map(|e| expert(format!("{f}.experts.{e}"))).collect(),
                shared: (c.shared_experts > 0).then(|| expert(format!("{f}.shared_experts"))),
            };
            for (s, &id) in streams.iter_mut().zip(ids) {
                let m = hyper_connection(s, &hc_ffn, hs);
                let out = moe(&rms_norm(&m.collapsed, ffn_norm, c.rms_norm_eps), id, &moe_weights, moe_settings);
                fold(s, &m, &out);
            }
        }
        let (head_fn, head_base, head_scale) =
            (self.t("model.hc_head.hc_fn"), self.t("model.hc_head.hc_base"), self.t("model.hc_head.hc_scale"));
        let norm = self.t("model.norm.weight");
        let output = if c.tie_word_embeddings { embed } else { self.t("head.weight") };
        streams
            .iter()
            .map(|s| {
                let x = rms_norm(&head(s, head_fn, head_base, head_scale[0], hs), norm, c.rms_norm_eps);
                output.chunks(d).map(|row| dot(row, &x)).collect()
            })
            .collect()
    }
}

/// `weight * x / sqrt(mean(x^2) + eps)`.
fn rms_norm(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    super::dsv4_attention::rms_norm(x, Some(weight), eps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forward::testutil::tiny;

    #[test]
    fn golden_logits_match_transformers_on_the_tiny_checkpoint() {
        let model = DeepseekV4Model::load(&tiny::dir()).unwrap();
        let reference = tiny::json("reference.json");
        let ids: Vec<u32> = ["prompt_ids", "decode_ids"]
            .iter()
            .flat_map(|k| reference[*k].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect::<Vec<_>>())
            .collect();
        let prompt = reference["prompt_ids"].as_array().unwrap().len();
        // One pass over prompt and forced tokens: row prompt-1 is the prefill's last position, the
        // rows after it the teacher-forced decode steps (the reference's cached steps equal a
        // one-pass run within 4e-7).
        let ours = model.logits(&ids);
        let mut worst = 0f32;
        for (step, want) in reference["logits"].as_array().unwrap().iter().enumerate() {
            let err = tiny::rel_l2(&ours[prompt - 1 + step], &tiny::floats(want));
            worst = worst.max(err);
            assert!(err < 1e-4, "step {step}: rel L2 {err:e} against transformers");
        }
        eprintln!("DeepSeek-V4 tiny golden logits: worst rel L2 {worst:.1e} over 17 steps");
    }
}
