//! Patches: named, per-request changes to the engine that reproduce real-world numerics (bf16/FP8
//! rounding a device kernel would do), context faults (prompts cut the way other engines cut them) and
//! prefix-cache faults. The empty [`PatchSet`] is the reference and changes nothing; each patch is
//! consulted at one documented point, so an unused patch costs nothing.
//!
//! Where each numerical patch rounds in the Llama family's pass (CPU emulation of the device code;
//! bf16 = round to nearest even, keeping the top 16 bits after adding the rounding bias; see
//! [`round`]):
//! - `rmsnorm_bf16`: the squares x² are rounded to bf16 and summed in 32 strided lanes (a warp) whose
//!   partial sums are rounded to bf16 after every add, then reduced pairwise in bf16; mean, rsqrt
//!   and the scaling stay f32.
//! - `residual_gemm_bf16`: the input of the attention-output and FFN-down matmuls is rounded to bf16,
//!   the product is computed as usual (weights at their file values), and the output is rounded to
//!   bf16 before it is added to the f32 residual stream.
//! - `rope_bf16`: the position and each inverse frequency are rounded to bf16, their product (the
//!   angle) is rounded to bf16, and cos/sin of it are rounded to bf16; the rotation itself is f32.
//! - `attn_splitk_bf16=C` (decode only): the visible positions are split into chunks of C; each chunk's
//!   max score, exp-sum and normalised output are rounded to bf16; the merge (rescale by exp(m_c - M),
//!   weighted sum, divide) is f32.
//! - `kv_fp8`: K and V rows are rounded to FP8 e4m3 (saturating at ±448) with a per-tensor scale
//!   ([`KV_FP8_SCALE`], the uncalibrated default of vLLM) when they are appended to the cache.
//! - `act_q8`: the input rows of every weight matmul are rounded as llama.cpp's Q8_0 activation blocks
//!   (32 elements, d = amax/127 in f16, q rounded half to even), then multiplied on the chosen path.
//!
//! DeepSeek-V4 (`forward::deepseek_v4`; each patch is read where a layer's parts and settings are
//! built, so the one-pass `logits` and the token-by-token `step` apply it at the same point):
//! - `mhc_bf16` (`forward::mhc`): the mixing GEMM of every hyper-connection and of the hyper-head
//!   takes the RMS-normed flattened streams and the `hc_*_fn` rows rounded to bf16, accumulates the
//!   dot in f32 and rounds each output (the pre/post/comb pre-activations) to bf16; scale, bias,
//!   sigmoid and softmax stay f32; comb is rounded to bf16 after the row softmax (+eps) and after
//!   every later row and column normalisation of Sinkhorn.
//! - `mhc_sinkhorn_iters=N`: comb gets N Sinkhorn iterations (the softmax and a column
//!   normalisation, then N-1 times rows then columns) instead of the config's `hc_sinkhorn_iters`.
//! - `moe_router_bf16` (`forward::moe::route`): the router's input row and gate rows rounded to bf16,
//!   the f32 dot rounded to bf16 (the gate logit), the score function in f32 and its output rounded
//!   to bf16; top-k adds the f32 correction bias to the rounded scores, and the expert weights are
//!   normalised from them (hash-routed layers too: their weights come from the same scores).
//! - `moe_topk=N`: top-k layers route to the N highest biased scores; hash-routed layers take the
//!   first min(N, width) experts of the token's `tid2eid` row (width = the config's
//!   `num_experts_per_tok`, so N at or above it changes nothing there); either way the weights are the
//!   taken experts' scores over their sum, times `routed_scaling_factor`.
//! - `indexer_fp8` (`forward::dsv4_attention`): each indexer query head after RoPE, and each indexer
//!   key when its block closes (after norm and RoPE), rounded to FP8 e4m3 per block of
//!   [`INDEXER_FP8_BLOCK`] channels with scale amax/448 (DeepSeek's `act_quant`; a head shorter than
//!   a block is one block); the head weights and the scores stay f32. No Hadamard rotation first.
//! - `index_topk=N`: the indexer keeps the N best-scoring closed entries instead of `index_topk`.
//! - `swa_window=N`: every layer (sliding, HCA, CSA) sees the raw entries of the last N positions
//!   instead of `sliding_window`; the compressed entries are unchanged.
//! - `kv_fp8`: every K=V entry the attention caches, the window's raw entries after the KV norm and
//!   RoPE and the HCA/CSA compressed entries after their norm and RoPE, rounded as for the Llama
//!   family ([`KV_FP8_SCALE`]) when it is made; the indexer's keys are not (see `indexer_fp8`).
//!
//! [`PatchSet::check_applies`] refuses a patch on an architecture that never consults it (the
//! registry's `applies_to`); the engine's server calls it with the served model's [`Arch`].

pub mod registry;
/// The rounding the patches emulate, from the crate the kernel checks share it with.
pub use ctxscope_numerics::round;

use std::collections::BTreeMap;
use std::fmt;

pub use registry::{describe, known_names, Arch, Param, PatchInfo, PATCHES};

/// The per-tensor scale of `kv_fp8` (1.0: vLLM's `k_scale`/`v_scale` when no calibration is given).
pub const KV_FP8_SCALE: f32 = 1.0;

/// Channels per scale of `indexer_fp8` (DeepSeek's `act_quant` block size).
pub const INDEXER_FP8_BLOCK: usize = 128;

/// Block size of `prefix_cache_weak_hash`'s matching, in tokens.
pub const WEAK_HASH_BLOCK: usize = 16;

/// A patch list that does not validate against the registry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    #[error("unknown patch `{name}`; known patches: {}", known_names())]
    Unknown { name: String },
    #[error("patch `{name}`: {message}; known patches: {}", known_names())]
    BadParam { name: String, message: String },
    #[error("patch `{name}` is listed twice; known patches: {}", known_names())]
    Duplicate { name: String },
    #[error("patch `{name}` applies to {applies_to} models only, and this model is {arch}; drop it from the list")]
    WrongArchitecture { name: String, applies_to: String, arch: &'static str },
}

/// A validated set of patches. Fields are what the engine consults; `entries` is the canonical form.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct PatchSet {
    entries: BTreeMap<&'static str, Option<usize>>,
    pub rmsnorm_bf16: bool,
    pub residual_gemm_bf16: bool,
    pub rope_bf16: bool,
    /// Chunk size of split-K decode attention.
    pub attn_splitk_bf16: Option<usize>,
    pub kv_fp8: bool,
    pub act_q8: bool,
    pub ctx_shift: Option<usize>,
    pub auto_truncate: Option<usize>,
    pub sliding_window: Option<usize>,
    pub prefix_cache_weak_hash: bool,
    pub prefix_cache_off: bool,
    pub mhc_bf16: bool,
    pub mhc_sinkhorn_iters: Option<usize>,
    pub moe_router_bf16: bool,
    pub moe_topk: Option<usize>,
    pub indexer_fp8: bool,
    pub index_topk: Option<usize>,
    pub swa_window: Option<usize>,
}

impl PatchSet {
    /// Parses `name` / `name=value` items separated by commas (blank items ignored).
    pub fn parse(list: &str) -> Result<PatchSet, PatchError> {
        PatchSet::from_items(list.split(','))
    }

    /// Parses one item per element (the body field's list).
    pub fn from_items<'a>(items: impl IntoIterator<Item = &'a str>) -> Result<PatchSet, PatchError> {
        let mut set = PatchSet::default();
        for item in items.into_iter().map(str::trim).filter(|i| !i.is_empty()) {
            let (name, value) = match item.split_once('=') {
                Some((n, v)) => (n.trim(), Some(v.trim())),
                None => (item, None),
            };
            let info = registry::lookup(name).ok_or_else(|| PatchError::Unknown { name: name.to_string() })?;
            let bad = |message: String| PatchError::BadParam { name: name.to_string(), message };
            let number = |v: &str, what: &str, min: usize| -> Result<usize, PatchError> {
                match v.parse::<usize>() {
                    Ok(n) if n >= min => Ok(n),
                    _ => Err(bad(format!("{what} must be an integer of at least {min}, got {v:?}"))),
                }
            };
            let param = match (info.param, value) {
                (Param::None, None) => None,
                (Param::None, Some(v)) => return Err(bad(format!("takes no parameter, got {v:?}"))),
                (Param::Required { what, .. }, None) => return Err(bad(format!("needs a parameter: {name}={what}"))),
                (Param::Required { what, min }, Some(v)) => Some(number(v, what, min)?),
                (Param::Optional { default, .. }, None) => Some(default),
                (Param::Optional { what, min, .. }, Some(v)) => Some(number(v, what, min)?),
            };
            if set.entries.insert(info.name, param).is_some() {
                return Err(PatchError::Duplicate { name: name.to_string() });
            }
        }
        set.apply_entries();
        Ok(set)
    }

    fn apply_entries(&mut self) {
        let e = &self.entries;
        let has = |n: &str| e.contains_key(n);
        let val = |n: &str| e.get(n).copied().flatten();
        self.rmsnorm_bf16 = has("rmsnorm_bf16");
        self.residual_gemm_bf16 = has("residual_gemm_bf16");
        self.rope_bf16 = has("rope_bf16");
        self.attn_splitk_bf16 = val("attn_splitk_bf16");
        self.kv_fp8 = has("kv_fp8");
        self.act_q8 = has("act_q8");
        self.ctx_shift = val("ctx_shift");
        self.auto_truncate = val("auto_truncate");
        self.sliding_window = val("sliding_window");
        self.prefix_cache_weak_hash = has("prefix_cache_weak_hash");
        self.prefix_cache_off = has("prefix_cache_off");
        self.mhc_bf16 = has("mhc_bf16");
        self.mhc_sinkhorn_iters = val("mhc_sinkhorn_iters");
        self.moe_router_bf16 = has("moe_router_bf16");
        self.moe_topk = val("moe_topk");
        self.indexer_fp8 = has("indexer_fp8");
        self.index_topk = val("index_topk");
        self.swa_window = val("swa_window");
    }

    /// Refuses a set with a patch that `arch`'s computation never consults (it would be echoed as
    /// applied and change nothing).
    pub fn check_applies(&self, arch: Arch) -> Result<(), PatchError> {
        match self.entries.keys().filter_map(|name| registry::lookup(name)).find(|info| !info.applies(arch)) {
            Some(info) => {
                Err(PatchError::WrongArchitecture { name: info.name.to_string(), applies_to: info.applies_to_label(), arch: arch.label() })
            }
            None => Ok(()),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The canonical form: sorted by name, `name` or `name=value`, comma-separated ("" when empty).
    /// An optional parameter at its default is written bare.
    pub fn canonical(&self) -> String {
        self.entries
            .iter()
            .map(|(name, value)| match (registry::lookup(name).map(|i| i.param), value) {
                (Some(Param::Optional { default, .. }), Some(v)) if *v == default => name.to_string(),
                (_, Some(v)) => format!("{name}={v}"),
                (_, None) => name.to_string(),
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The prompt the model sees under the context faults (None: unchanged). Ollama's shift keeps the
    /// first 4 and the last N-4 tokens of a prompt longer than N; SGLang's auto-truncate keeps the first
    /// N-7 of a prompt longer than N-7. Either way the engine reports the kept count as prompt_tokens.
    pub fn rewrite_prompt(&self, prompt: &[u32]) -> Option<Vec<u32>> {
        let mut out: Option<Vec<u32>> = None;
        if let Some(n) = self.auto_truncate {
            let keep = n - 7;
            if prompt.len() > keep {
                out = Some(prompt[..keep].to_vec());
            }
        }
        if let Some(n) = self.ctx_shift {
            let current = out.as_deref().unwrap_or(prompt);
            if current.len() > n {
                let mut kept = current[..4].to_vec();
                kept.extend_from_slice(&current[current.len() - (n - 4)..]);
                out = Some(kept);
            }
        }
        out
    }
}

impl fmt::Display for PatchSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.canonical())
    }
}

impl std::str::FromStr for PatchSet {
    type Err = PatchError;
    fn from_str(s: &str) -> Result<PatchSet, PatchError> {
        PatchSet::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_validates_and_canonicalises() {
        let set = PatchSet::parse(" rope_bf16, kv_fp8 ").unwrap();
        assert_eq!(set.canonical(), "kv_fp8,rope_bf16");
        assert!(set.kv_fp8 && set.rope_bf16 && !set.act_q8);
        assert_eq!(PatchSet::parse("").unwrap(), PatchSet::default());
        assert!(PatchSet::default().is_empty());
        let p = PatchSet::parse("sliding_window=128,ctx_shift=64,attn_splitk_bf16").unwrap();
        assert_eq!(p.canonical(), "attn_splitk_bf16,ctx_shift=64,sliding_window=128");
        assert_eq!((p.attn_splitk_bf16, p.ctx_shift, p.sliding_window), (Some(64), Some(64), Some(128)));
        assert_eq!(PatchSet::parse("attn_splitk_bf16=32").unwrap().canonical(), "attn_splitk_bf16=32");
        assert_eq!(PatchSet::parse("attn_splitk_bf16=64").unwrap(), PatchSet::parse("attn_splitk_bf16").unwrap());
        // The canonical string parses back to the same set.
        assert_eq!(PatchSet::parse(&p.canonical()).unwrap(), p);
    }

    #[test]
    fn refuses_unknown_names_and_bad_parameters_listing_the_known_ones() {
        let e = PatchSet::parse("kv_fp4").unwrap_err();
        assert!(matches!(e, PatchError::Unknown { .. }));
        assert!(e.to_string().contains("rope_bf16") && e.to_string().contains("ctx_shift=N"), "{e}");
        assert!(matches!(PatchSet::parse("ctx_shift").unwrap_err(), PatchError::BadParam { .. }));
        assert!(matches!(PatchSet::parse("ctx_shift=abc").unwrap_err(), PatchError::BadParam { .. }));
        assert!(matches!(PatchSet::parse("ctx_shift=2").unwrap_err(), PatchError::BadParam { .. }));
        assert!(matches!(PatchSet::parse("kv_fp8=1").unwrap_err(), PatchError::BadParam { .. }));
        assert!(matches!(PatchSet::parse("kv_fp8,kv_fp8").unwrap_err(), PatchError::Duplicate { .. }));
    }

    #[test]
    fn registry_is_sorted_and_complete() {
        let names: Vec<_> = PATCHES.iter().map(|p| p.name).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
        assert_eq!(names.len(), 18);
        assert!(PATCHES.iter().all(|p| !p.applies_to.is_empty()));
        assert!(describe().contains("Ollama"));
        assert!(describe().contains("applies to: DeepSeek-V4\n"));
        assert!(describe().contains("applies to: Llama family and DeepSeek-V4\n"));
    }

    #[test]
    fn deepseek_v4_patches_parse_and_are_refused_on_llama() {
        let set = PatchSet::parse("mhc_bf16,mhc_sinkhorn_iters=3,moe_router_bf16,moe_topk=1,indexer_fp8,index_topk=2,swa_window=4,kv_fp8")
            .unwrap();
        assert!(set.mhc_bf16 && set.moe_router_bf16 && set.indexer_fp8 && set.kv_fp8);
        assert_eq!((set.mhc_sinkhorn_iters, set.moe_topk, set.index_topk, set.swa_window), (Some(3), Some(1), Some(2), Some(4)));
        assert_eq!(set.check_applies(Arch::DeepseekV4), Ok(()));
        let e = set.check_applies(Arch::Llama).unwrap_err();
        assert!(matches!(e, PatchError::WrongArchitecture { .. }));
        assert!(e.to_string().contains("`index_topk` applies to DeepSeek-V4 models only"), "{e}");
        assert_eq!(PatchSet::parse("kv_fp8,rope_bf16").unwrap().check_applies(Arch::Llama), Ok(()));
        assert!(PatchSet::parse("rope_bf16").unwrap().check_applies(Arch::DeepseekV4).is_err());
        for zero in ["mhc_sinkhorn_iters=0", "moe_topk=0", "index_topk=0", "swa_window=0", "moe_topk"] {
            assert!(matches!(PatchSet::parse(zero).unwrap_err(), PatchError::BadParam { .. }), "{zero}");
        }
    }

    #[test]
    fn context_faults_rewrite_like_the_engines_they_imitate() {
        let prompt: Vec<u32> = (0..100).collect();
        let shifted = PatchSet::parse("ctx_shift=20").unwrap().rewrite_prompt(&prompt).unwrap();
        assert_eq!(shifted.len(), 20);
        assert_eq!(&shifted[..5], &[0, 1, 2, 3, 84]);
        let cut = PatchSet::parse("auto_truncate=30").unwrap().rewrite_prompt(&prompt).unwrap();
        assert_eq!(cut, (0..23).collect::<Vec<u32>>());
        assert!(PatchSet::parse("ctx_shift=200").unwrap().rewrite_prompt(&prompt).is_none());
    }
}
