//! DeepSeek-V4's forward pass, golden f32, over a whole sequence or token by token: token embeddings
//! copied into `hc_mult` residual streams; per layer, the attention hyper-connection, the layer's
//! attention (sliding, HCA or CSA) on the collapsed and RMS-normed streams, folded back, then the
//! same around the MoE block; the hyper-head, the final norm and the output head. Built from
//! [`super::mhc`], [`super::moe`] and [`super::dsv4_attention`], each matched to transformers on its
//! own; this pass is matched end to end (tests/fixtures/deepseek_v4/tiny/reference.json). A
//! [`PatchSet`] reaches every block through `parts` and the settings, the same in `logits` and `step`.

use std::sync::Arc;

use rayon::prelude::*;

use super::dsv4_attention::{wo_a_groups, AttentionShape, AttentionWeights, Compressor, Indexer, LayerCache, Long, Storage};
use super::dsv4_products::{Host, Products};
use super::mhc::{fold, head, hyper_connection, HcMix, HcSettings, HcWeights};
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

    /// Each token's residual streams, side by side: its embedding in each of the `hc_mult`.
    fn streams(&self, ids: &[u32]) -> Vec<f32> {
        let d = self.config.hidden_size;
        let table = self.t("model.embed_tokens.weight");
        ids.iter().flat_map(|&id| table[id as usize * d..(id as usize + 1) * d].repeat(self.config.hc_mult)).collect()
    }

    /// One hyper-connection per token's streams (`hc * width` each), on the thread pool.
    fn mixes(&self, streams: &[f32], w: &HcWeights<'_>, patches: &PatchSet) -> Vec<HcMix> {
        let per_token = self.config.hc_mult * self.config.hidden_size;
        streams.par_chunks(per_token).map(|s| hyper_connection(s, w, self.hc_settings(patches))).collect()
    }

    /// The block inputs of `mixes`: each token's collapsed streams, RMS-normed by `weight`.
    fn block_inputs(&self, mixes: &[HcMix], weight: &[f32]) -> Vec<f32> {
        mixes.iter().flat_map(|m| rms_norm(&m.collapsed, weight, self.config.rms_norm_eps)).collect()
    }

    /// Folds each token's block output back into its streams.
    fn fold_all(&self, streams: &mut [f32], mixes: &[HcMix], out: &[f32]) {
        let (per_token, d) = (self.config.hc_mult * self.config.hidden_size, self.config.hidden_size);
        for ((s, m), o) in streams.chunks_mut(per_token).zip(mixes).zip(out.chunks(d)) {
            fold(s, m, o);
        }
    }

    /// The logits from each token's final streams.
    fn outputs(&self, streams: &[f32], patches: &PatchSet, p: &dyn Products) -> Vec<Vec<f32>> {
        let c = &self.config;
        let (head_fn, head_base, head_scale) =
            (self.t("model.hc_head.hc_fn"), self.t("model.hc_head.hc_base"), self.t("model.hc_head.hc_scale"));
        let x: Vec<f32> = streams
            .chunks(c.hc_mult * c.hidden_size)
            .flat_map(|s| {
                rms_norm(
                    &head(s, head_fn, head_base, head_scale[0], self.hc_settings(patches)),
                    self.t("model.norm.weight"),
                    c.rms_norm_eps,
                )
            })
            .collect();
        p.products(self.head_weights(), &x, c.hidden_size).chunks(c.vocab_size).map(<[f32]>::to_vec).collect()
    }

    /// The logits of every position of `ids` (positions `0..ids.len()`), under `patches` (the empty
    /// set: golden): the same computation as [`DeepseekV4Model::forward`] from a fresh state.
    pub fn logits(&self, ids: &[u32], patches: &PatchSet) -> Vec<Vec<f32>> {
        self.forward(&mut self.state(patches), ids)
    }

    /// A fresh decoding state (nothing seen) under `patches`, which every step of it applies, its
    /// products on the host.
    pub fn state(&self, patches: &PatchSet) -> DeepseekV4State {
        self.state_on(patches, Arc::new(Host))
    }

    /// A fresh decoding state whose products `products` computes (a GPU's, say).
    pub fn state_on(&self, patches: &PatchSet, products: Arc<dyn Products>) -> DeepseekV4State {
        DeepseekV4State {
            layers: (0..self.config.layers.len()).map(|_| LayerCache::default()).collect(),
            position: 0,
            patches: patches.clone(),
            products,
        }
    }

    /// Every matrix a pass hands to its [`Products`] executor, with its row length (for
    /// [`Products::prepare`]): each layer's projections, compressors, indexer and experts, and the
    /// output head, as the pass slices them.
    pub fn product_matrices(&self) -> Vec<(&[f32], usize)> {
        let c = &self.config;
        let mut all = Vec::new();
        for layer in 0..c.layers.len() {
            let parts = self.parts(layer, &PatchSet::default());
            let a = &parts.attn;
            all.extend([(a.wq_a, c.hidden_size), (a.wkv, c.hidden_size), (a.wq_b, c.q_lora_rank)]);
            all.extend(wo_a_groups(a.wo_a, &parts.shape));
            all.push((a.wo_b, c.o_groups * c.o_lora_rank));
            let compressors = match &parts.long {
                Long::None => vec![],
                Long::Heavy(own) => vec![own],
                Long::Sparse(own, ix) => {
                    all.extend([(ix.wq_b, c.q_lora_rank), (ix.weights_proj, c.hidden_size)]);
                    vec![own, &ix.compressor]
                }
            };
            all.extend(compressors.into_iter().flat_map(|k| [(k.wkv, c.hidden_size), (k.wgate, c.hidden_size)]));
            for e in parts.moe.experts.iter().chain(&parts.moe.shared) {
                all.extend([(e.w1, c.hidden_size), (e.w3, c.hidden_size), (e.w2, c.expert_dim)]);
            }
        }
        all.push((self.head_weights(), c.hidden_size));
        all
    }

    /// The output head's rows (the embedding when tied).
    fn head_weights(&self) -> &[f32] {
        if self.config.tie_word_embeddings {
            self.t("model.embed_tokens.weight")
        } else {
            self.t("head.weight")
        }
    }

    /// Feeds `ids` after what `state` has seen; returns the logits of each.
    pub fn forward(&self, state: &mut DeepseekV4State, ids: &[u32]) -> Vec<Vec<f32>> {
        ids.chunks(CHUNK).flat_map(|chunk| self.outputs(&self.feed(state, chunk), &state.patches, &*state.products)).collect()
    }

    /// Feeds one token after what `state` has seen; returns its logits.
    pub fn step(&self, state: &mut DeepseekV4State, id: u32) -> Vec<f32> {
        self.forward(state, &[id]).remove(0)
    }

    /// Feeds tokens whose logits are not wanted (a prompt's before its last): the same state as
    /// [`DeepseekV4Model::forward`] leaves, without the output head.
    pub fn advance(&self, state: &mut DeepseekV4State, ids: &[u32]) {
        ids.chunks(CHUNK).for_each(|chunk| {
            self.feed(state, chunk);
        });
    }

    /// Runs `ids` through every layer after what `state` has seen, all of them at once in each
    /// layer (each product reads its weights once for them all), moving `state` on; returns their
    /// residual streams.
    fn feed(&self, state: &mut DeepseekV4State, ids: &[u32]) -> Vec<f32> {
        let DeepseekV4State { layers, position, patches, products } = state;
        let products = &**products;
        let d = self.config.hidden_size;
        let mut streams = self.streams(ids);
        for (layer, cache) in layers.iter_mut().enumerate() {
            let parts = self.parts(layer, patches);
            let mixes = self.mixes(&streams, &parts.hc_attn, patches);
            let out =
                cache.extend(products, &self.block_inputs(&mixes, parts.attn_norm), d, *position, &parts.attn, &parts.shape, &parts.long);
            self.fold_all(&mut streams, &mixes, &out);
            let mixes = self.mixes(&streams, &parts.hc_ffn, patches);
            let out = moe(products, &self.block_inputs(&mixes, parts.ffn_norm), ids, &parts.moe, self.moe_settings(patches));
            self.fold_all(&mut streams, &mixes, &out);
        }
        *position += ids.len();
        streams
    }
}

/// Tokens fed through the layers together: enough that each weight tile is read once for many
/// rows and each expert sees several tokens, few enough that a long prompt's activations stay small.
const CHUNK: usize = 512;

/// What decoding token by token keeps: each layer's attention cache, the next position, the
/// patches its entries were made under and where its products are computed.
#[derive(Clone)]
pub struct DeepseekV4State {
    layers: Vec<LayerCache>,
    position: usize,
    patches: PatchSet,
    products: Arc<dyn Products>,
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

    /// Where its products are computed.
    pub fn products(&self) -> &Arc<dyn Products> {
        &self.products
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
    use crate::forward::dsv4_products::HostBf16;
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

    /// Tokens fed in pieces of any size (one pass, chunks of [`CHUNK`], single steps, `advance`
    /// without the head) give every position the same bits: each product takes its rows together
    /// but computes each as one row alone.
    #[test]
    fn any_split_of_the_tokens_gives_the_same_bits() {
        let (model, _, _) = tiny_case();
        let ids: Vec<u32> = (0..2 * CHUNK as u32 + 90).map(|i| (i.wrapping_mul(2_654_435_761) >> 9) % 256).collect();
        let bits = |rows: &[Vec<f32>]| rows.iter().map(|r| r.iter().map(|v| v.to_bits()).collect::<Vec<_>>()).collect::<Vec<_>>();
        let golden = PatchSet::default();
        let whole = bits(&model.logits(&ids, &golden));
        let mut state = model.state(&golden);
        model.advance(&mut state, &ids[..37]);
        let cut = CHUNK + 150;
        assert_eq!(bits(&model.forward(&mut state, &ids[37..cut])), whole[37..cut], "a piece across a chunk's end");
        for (pos, &id) in ids.iter().enumerate().take(cut + 5).skip(cut) {
            assert_eq!(bits(&[model.step(&mut state, id)]), whole[pos..=pos], "step at {pos}");
        }
        model.advance(&mut state, &ids[cut + 5..ids.len() - 1]);
        assert_eq!(bits(&[model.step(&mut state, ids[ids.len() - 1])]), whole[ids.len() - 1..], "after advancing");
        assert_eq!(state.len(), ids.len());
    }

    /// Every matrix a pass multiplies is in [`DeepseekV4Model::product_matrices`] with the row
    /// length the pass uses, so a device that prepared them uploads nothing mid-pass.
    #[test]
    fn product_matrices_name_every_matrix_a_pass_multiplies() {
        use std::collections::HashSet;
        use std::sync::Mutex;
        struct Recorder(Mutex<HashSet<(usize, usize, usize)>>);
        impl Products for Recorder {
            fn products(&self, w: &[f32], xs: &[f32], k: usize) -> Vec<f32> {
                self.0.lock().unwrap().insert((w.as_ptr() as usize, w.len(), k));
                Host.products(w, xs, k)
            }
        }
        let (model, ids, _) = tiny_case();
        let recorder = Arc::new(Recorder(Mutex::new(HashSet::new())));
        let mut state = model.state_on(&PatchSet::default(), recorder.clone());
        model.forward(&mut state, &ids);
        let listed: HashSet<(usize, usize, usize)> =
            model.product_matrices().iter().map(|(w, k)| (w.as_ptr() as usize, w.len(), *k)).collect();
        let used = recorder.0.lock().unwrap();
        assert!(used.len() > 20, "only {} matrices used", used.len());
        let missing: Vec<_> = used.difference(&listed).collect();
        assert!(missing.is_empty(), "{} of {} matrices used are not listed: {missing:?}", missing.len(), used.len());
    }

    /// The fast path's numbers (bf16 products, here on the host) against transformers' fp32: within
    /// the device check's bf16 limit (3e-2 worst rel L2, `examples/device_bench.rs`), and moved from
    /// golden (the rounding happened).
    #[test]
    fn fast_path_numbers_are_within_the_bf16_limit_on_tiny() {
        let (model, ids, prompt) = tiny_case();
        let reference = tiny::json("reference.json");
        let mut state = model.state_on(&PatchSet::default(), Arc::new(HostBf16));
        model.advance(&mut state, &ids[..prompt - 1]);
        let rows: Vec<Vec<f32>> = ids[prompt - 1..].iter().map(|&id| model.step(&mut state, id)).collect();
        let errors: Vec<f32> =
            reference["logits"].as_array().unwrap().iter().zip(&rows).map(|(want, row)| tiny::rel_l2(row, &tiny::floats(want))).collect();
        assert_eq!(errors.len(), 17);
        let (best, worst) = errors.iter().fold((f32::INFINITY, 0f32), |(b, w), &e| (b.min(e), w.max(e)));
        assert!(worst < 3e-2, "fast path: worst rel L2 {worst:e} against transformers' fp32");
        assert!(best > 1e-4, "fast path: a step within {best:e} of fp32 (were the products rounded?)");
        eprintln!("DeepSeek-V4 tiny, fast path's numbers: rel L2 {best:.1e} to {worst:.1e} over 17 steps");
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
