//! DeepSeek-V4's forward pass, golden f32, over a whole sequence or token by token: token embeddings
//! copied into `hc_mult` residual streams; per layer, the attention hyper-connection, the layer's
//! attention (sliding, HCA or CSA) on the collapsed and RMS-normed streams, folded back, then the
//! same around the MoE block; the hyper-head, the final norm and the output head. Built from
//! [`super::mhc`], [`super::moe`] and [`super::dsv4_attention`], each matched to transformers on its
//! own; this pass is matched end to end (tests/fixtures/deepseek_v4/tiny/reference.json). A
//! [`PatchSet`] reaches every block through `parts` and the settings, the same in `logits` and `step`.

use super::dsv4_attention::{attention, AttentionShape, AttentionWeights, Compressor, Indexer, LayerCache, Long, Storage};
use super::mhc::{fold, head, hyper_connection, HcSettings, HcWeights};
use super::moe::{moe, Expert, MoeSettings, MoeWeights, Routing, Scoring};
use crate::model::deepseek_v4::{AttentionKind, MlpKind};
pub use crate::model::deepseek_v4::{DeepseekV4Model, LoadError};
use crate::patch::PatchSet;

impl DeepseekV4Model {
    fn t(&self, name: &str) -> &[f32] {
        // Every name the pass asks for is in `config.tensors()`, which `load` read.
        self.tensors.get(name).map(Vec::as_slice).unwrap_or_else(|| panic!("tensor {name} was not loaded"))
    }

    fn compressor(&self, prefix: &str, rate: usize, storage: Storage) -> Compressor<'_> {
        Compressor {
            wkv: self.t(&format!("{prefix}.wkv.weight")),
            wgate: self.t(&format!("{prefix}.wgate.weight")),
            ape: self.t(&format!("{prefix}.ape")),
            norm: self.t(&format!("{prefix}.norm.weight")),
            rate,
            storage,
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

    /// Everything layer `layer` reads, with what `patches` changes in it.
    fn parts(&self, layer: usize, patches: &PatchSet) -> LayerParts<'_> {
        let c = &self.config;
        let (kind, mlp_kind) = c.layers[layer];
        let (l, a, f) = (format!("model.layers.{layer}"), format!("model.layers.{layer}.attn"), format!("model.layers.{layer}.ffn"));
        let attn = AttentionWeights {
            wq_a: self.t(&format!("{a}.wq_a.weight")),
            q_norm: self.t(&format!("{a}.q_norm.weight")),
            wq_b: self.t(&format!("{a}.wq_b.weight")),
            wkv: self.t(&format!("{a}.wkv.weight")),
            kv_norm: self.t(&format!("{a}.norm.weight")),
            wo_a: self.t(&format!("{a}.wo_a.weight")),
            wo_b: self.t(&format!("{a}.wo_b.weight")),
            sinks: self.t(&format!("{a}.attn_sink")),
        };
        // kv_fp8 stores the layer's own entries in FP8 (not the indexer's keys: indexer_fp8 does).
        let kv = if patches.kv_fp8 { Storage::Fp8Tensor } else { Storage::F32 };
        let index_keys = if patches.indexer_fp8 { Storage::Fp8Blocks } else { Storage::F32 };
        let long = match kind {
            AttentionKind::Sliding => Long::None,
            AttentionKind::HeavilyCompressed => Long::Heavy(self.compressor(&format!("{a}.compressor"), c.hca_rate, kv)),
            AttentionKind::CompressedSparse => Long::Sparse(
                self.compressor(&format!("{a}.compressor"), c.csa_rate, kv),
                Indexer {
                    compressor: self.compressor(&format!("{a}.indexer.compressor"), c.csa_rate, index_keys),
                    wq_b: self.t(&format!("{a}.indexer.wq_b.weight")),
                    weights_proj: self.t(&format!("{a}.indexer.weights_proj.weight")),
                    heads: c.index_heads,
                    head_dim: c.index_head_dim,
                    topk: patches.index_topk.unwrap_or(c.index_topk),
                    fp8: patches.indexer_fp8,
                },
            ),
        };
        let shape = AttentionShape {
            window: patches.swa_window.unwrap_or(c.sliding_window),
            kv_fp8: patches.kv_fp8,
            ..AttentionShape::for_layer(c, kind)
        };
        let routing = match mlp_kind {
            MlpKind::HashMoe => Routing::Hash { table: &self.tables[&format!("{f}.gate.tid2eid")], width: c.experts_per_token },
            MlpKind::Moe => Routing::TopK { bias: self.t(&format!("{f}.gate.bias")) },
        };
        let expert = |p: String| Expert {
            w1: self.t(&format!("{p}.w1.weight")),
            w2: self.t(&format!("{p}.w2.weight")),
            w3: self.t(&format!("{p}.w3.weight")),
        };
        LayerParts {
            attn,
            shape,
            long,
            hc_attn: self.hc(layer, "attn"),
            hc_ffn: self.hc(layer, "ffn"),
            attn_norm: self.t(&format!("{l}.attn_norm.weight")),
            ffn_norm: self.t(&format!("{l}.ffn_norm.weight")),
            moe: MoeWeights {
                gate: self.t(&format!("{f}.gate.weight")),
                routing,
                experts: (0..c.experts).map(|e| expert(format!("{f}.experts.{e}"))).collect(),
                shared: (c.shared_experts > 0).then(|| expert(format!("{f}.shared_experts"))),
            },
        }
    }

    fn hc_settings(&self, patches: &PatchSet) -> HcSettings {
        let c = &self.config;
        HcSettings {
            hc: c.hc_mult,
            sinkhorn_iters: patches.mhc_sinkhorn_iters.unwrap_or(c.hc_sinkhorn_iters),
            eps: c.hc_eps,
            norm_eps: c.rms_norm_eps,
            bf16: patches.mhc_bf16,
        }
    }

    fn moe_settings(&self, patches: &PatchSet) -> MoeSettings {
        let c = &self.config;
        MoeSettings {
            top_k: patches.moe_topk.unwrap_or(c.experts_per_token),
            scoring: Scoring::parse(&c.scoring_func).unwrap_or(Scoring::SqrtSoftplus),
            routed_scaling: c.routed_scaling_factor,
            swiglu_limit: c.swiglu_limit,
            router_bf16: patches.moe_router_bf16,
        }
    }

    /// A token's residual streams: its embedding in each.
    fn streams(&self, id: u32) -> Vec<f32> {
        let d = self.config.hidden_size;
        self.t("model.embed_tokens.weight")[id as usize * d..(id as usize + 1) * d].repeat(self.config.hc_mult)
    }

    /// The MoE sub-block on one token's streams, in place.
    fn ffn(&self, parts: &LayerParts<'_>, streams: &mut [f32], id: u32, patches: &PatchSet) {
        let m = hyper_connection(streams, &parts.hc_ffn, self.hc_settings(patches));
        let out = moe(&rms_norm(&m.collapsed, parts.ffn_norm, self.config.rms_norm_eps), id, &parts.moe, self.moe_settings(patches));
        fold(streams, &m, &out);
    }

    /// The logits from one token's final streams.
    fn output(&self, streams: &[f32], patches: &PatchSet) -> Vec<f32> {
        let c = &self.config;
        let (head_fn, head_base, head_scale) =
            (self.t("model.hc_head.hc_fn"), self.t("model.hc_head.hc_base"), self.t("model.hc_head.hc_scale"));
        let x = rms_norm(
            &head(streams, head_fn, head_base, head_scale[0], self.hc_settings(patches)),
            self.t("model.norm.weight"),
            c.rms_norm_eps,
        );
        let output = if c.tie_word_embeddings { self.t("model.embed_tokens.weight") } else { self.t("head.weight") };
        super::dsv4_attention::matvec(output, &x)
    }

    /// The logits of every position of `ids` (positions `0..ids.len()`), in one pass, under `patches`
    /// (the empty set: golden).
    pub fn logits(&self, ids: &[u32], patches: &PatchSet) -> Vec<Vec<f32>> {
        let d = self.config.hidden_size;
        let mut streams: Vec<Vec<f32>> = ids.iter().map(|&id| self.streams(id)).collect();
        for layer in 0..self.config.layers.len() {
            let parts = self.parts(layer, patches);
            let mixes: Vec<_> = streams.iter().map(|s| hyper_connection(s, &parts.hc_attn, self.hc_settings(patches))).collect();
            let input: Vec<f32> = mixes.iter().flat_map(|m| rms_norm(&m.collapsed, parts.attn_norm, self.config.rms_norm_eps)).collect();
            let out = attention(&input, d, &parts.attn, &parts.shape, &parts.long);
            for ((s, m), o) in streams.iter_mut().zip(&mixes).zip(out.chunks(d)) {
                fold(s, m, o);
            }
            for (s, &id) in streams.iter_mut().zip(ids) {
                self.ffn(&parts, s, id, patches);
            }
        }
        streams.iter().map(|s| self.output(s, patches)).collect()
    }

    /// A fresh decoding state (nothing seen) under `patches`, which every step of it applies.
    pub fn state(&self, patches: &PatchSet) -> DeepseekV4State {
        DeepseekV4State {
            layers: (0..self.config.layers.len()).map(|_| LayerCache::default()).collect(),
            position: 0,
            patches: patches.clone(),
        }
    }

    /// Feeds one token after what `state` has seen; returns its logits.
    pub fn step(&self, state: &mut DeepseekV4State, id: u32) -> Vec<f32> {
        let streams = self.feed(state, id);
        self.output(&streams, &state.patches)
    }

    /// Feeds one token whose logits are not wanted (a prompt's tokens before its last): the same
    /// state as [`DeepseekV4Model::step`] leaves, without the output head.
    pub fn advance(&self, state: &mut DeepseekV4State, id: u32) {
        self.feed(state, id);
    }

    /// Runs one token through every layer, moving `state` on; returns its residual streams.
    fn feed(&self, state: &mut DeepseekV4State, id: u32) -> Vec<f32> {
        let (pos, patches) = (state.position, &state.patches);
        let mut streams = self.streams(id);
        for (layer, cache) in state.layers.iter_mut().enumerate() {
            let parts = self.parts(layer, patches);
            let mix = hyper_connection(&streams, &parts.hc_attn, self.hc_settings(patches));
            let input = rms_norm(&mix.collapsed, parts.attn_norm, self.config.rms_norm_eps);
            let out = cache.step(&input, pos, &parts.attn, &parts.shape, &parts.long);
            fold(&mut streams, &mix, &out);
            self.ffn(&parts, &mut streams, id, patches);
        }
        state.position += 1;
        streams
    }
}

/// What decoding token by token keeps: each layer's attention cache, the next position and the
/// patches its entries were made under.
#[derive(Clone)]
pub struct DeepseekV4State {
    layers: Vec<LayerCache>,
    position: usize,
    patches: PatchSet,
}

impl DeepseekV4State {
    /// Positions seen.
    pub fn len(&self) -> usize {
        self.position
    }

    pub fn is_empty(&self) -> bool {
        self.position == 0
    }

    /// The patches every step of this state applies.
    pub fn patches(&self) -> &PatchSet {
        &self.patches
    }
}

/// One layer's weights, borrowed from the model.
struct LayerParts<'a> {
    attn: AttentionWeights<'a>,
    shape: AttentionShape,
    long: Long<'a>,
    hc_attn: HcWeights<'a>,
    hc_ffn: HcWeights<'a>,
    attn_norm: &'a [f32],
    ffn_norm: &'a [f32],
    moe: MoeWeights<'a>,
}

/// `weight * x / sqrt(mean(x^2) + eps)`.
fn rms_norm(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    super::dsv4_attention::rms_norm(x, Some(weight), eps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forward::testutil::tiny;
    use crate::model::deepseek_v4::DeepseekV4Config;

    /// The tiny model, the reference's tokens (prompt then forced) and the prompt's length.
    fn tiny_case() -> (DeepseekV4Model, Vec<u32>, usize) {
        let reference = tiny::json("reference.json");
        let ids: Vec<u32> = ["prompt_ids", "decode_ids"]
            .iter()
            .flat_map(|k| reference[*k].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect::<Vec<_>>())
            .collect();
        let prompt = reference["prompt_ids"].as_array().unwrap().len();
        (DeepseekV4Model::load(&tiny::dir()).unwrap(), ids, prompt)
    }

    /// The worst rel L2 of `rows` (logits by position) against the reference's 17 steps: the
    /// prefill's last position, then each teacher-forced decode step.
    fn worst_against_reference(rows: &[Vec<f32>], prompt: usize) -> f32 {
        let reference = tiny::json("reference.json");
        let mut worst = 0f32;
        for (step, want) in reference["logits"].as_array().unwrap().iter().enumerate() {
            let err = tiny::rel_l2(&rows[prompt - 1 + step], &tiny::floats(want));
            assert!(err < 1e-4, "step {step}: rel L2 {err:e} against transformers");
            worst = worst.max(err);
        }
        worst
    }

    #[test]
    fn golden_logits_match_transformers_on_the_tiny_checkpoint() {
        let (model, ids, prompt) = tiny_case();
        // One pass over prompt and forced tokens (the reference's cached steps equal a one-pass run
        // within 4e-7).
        let worst = worst_against_reference(&model.logits(&ids, &PatchSet::default()), prompt);
        eprintln!("DeepSeek-V4 tiny golden logits: worst rel L2 {worst:.1e} over 17 steps");
    }

    /// YaRN on the compressed layers' RoPE (DeepSeek-V4's factor 16, here over 256 original
    /// positions, and transformers' own `attention_factor`): the same checkpoint with that config
    /// against transformers (reference_yarn.json), one pass and token by token through the caches.
    #[test]
    fn yarn_compress_rope_matches_transformers() {
        let (mut model, ids, prompt) = tiny_case();
        let yarn = tiny::json("reference_yarn.json");
        let mut config = tiny::json("config.json");
        config["rope_parameters"]["compress"] = yarn["compress"].clone();
        model.config = DeepseekV4Config::from_json(&config).unwrap();
        let table = model.config.compress_yarn.as_ref().unwrap().inv_freq(model.config.compress_rope_theta, model.config.rope_dim);
        assert_eq!(table, tiny::floats(&yarn["inv_freq"]), "YaRN frequencies");
        let steps = {
            let mut state = model.state(&PatchSet::default());
            ids.iter().map(|&id| model.step(&mut state, id)).collect::<Vec<_>>()
        };
        let whole = model.logits(&ids, &PatchSet::default());
        let mut worst = 0f32;
        for (step, want) in yarn["logits"].as_array().unwrap().iter().enumerate() {
            let want = tiny::floats(want);
            for rows in [&whole, &steps] {
                let err = tiny::rel_l2(&rows[prompt - 1 + step], &want);
                assert!(err < 1e-4, "step {step}: rel L2 {err:e} against transformers with YaRN");
                worst = worst.max(err);
            }
        }
        // The scaling matters at these positions: the plain reference is far from it.
        let moved = yarn["rel_l2_to_plain"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).fold(f64::INFINITY, f64::min);
        assert!(moved > 1e-2, "YaRN moved the reference by only {moved:e}");
        eprintln!("DeepSeek-V4 tiny with YaRN compress RoPE: worst rel L2 {worst:.1e} over 17 steps (plain is {moved:.1e} away)");
    }

    #[test]
    fn decoding_token_by_token_matches_transformers_cached_steps() {
        let (model, ids, prompt) = tiny_case();
        let mut state = model.state(&PatchSet::default());
        let steps: Vec<Vec<f32>> = ids.iter().map(|&id| model.step(&mut state, id)).collect();
        // Every step equals the one-pass logits at its position (the caches hold what a pass computes) ...
        for (pos, (a, b)) in steps.iter().zip(&model.logits(&ids, &PatchSet::default())).enumerate() {
            assert!(tiny::rel_l2(a, b) < 1e-6, "position {pos}: {:e}", tiny::rel_l2(a, b));
        }
        // ... and transformers' cached decode.
        let worst = worst_against_reference(&steps, prompt);
        eprintln!("DeepSeek-V4 tiny, token by token through the caches: worst rel L2 {worst:.1e} over 17 steps");
    }
}
