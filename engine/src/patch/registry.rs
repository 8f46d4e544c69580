//! The registry of named patches: for each, its stable name, its parameter, the real-world change it
//! reproduces, the part of the computation it touches and the architectures it applies to. `ctxscope patches` prints it; a patch list
//! is validated against it (see [`super::PatchSet::parse`]).

/// What a patch's `=value` may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Param {
    /// No parameter: `name` only.
    None,
    /// `name=N` is required; N at least `min`.
    Required { what: &'static str, min: usize },
    /// `name` or `name=N`; N at least `min`, `default` when absent.
    Optional { what: &'static str, min: usize, default: usize },
}

/// A model architecture the engine computes, as far as patches are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arch {
    /// The Llama family the engine serves (llama, mistral, granite, qwen2 GGUF and safetensors).
    Llama,
    /// DeepSeek-V4 (golden path, `forward::deepseek_v4`).
    DeepseekV4,
}

impl Arch {
    pub fn label(self) -> &'static str {
        match self {
            Arch::Llama => "Llama family",
            Arch::DeepseekV4 => "DeepSeek-V4",
        }
    }
}

const LLAMA: &[Arch] = &[Arch::Llama];
const DSV4: &[Arch] = &[Arch::DeepseekV4];
const BOTH: &[Arch] = &[Arch::Llama, Arch::DeepseekV4];

/// One entry of the registry.
#[derive(Debug, Clone, Copy)]
pub struct PatchInfo {
    pub name: &'static str,
    pub param: Param,
    /// The real-world change it reproduces, in one line.
    pub reproduces: &'static str,
    /// Where it acts in the forward pass, scheduler or cache.
    pub acts_on: &'static str,
    /// The architectures whose computation consults it.
    pub applies_to: &'static [Arch],
}

impl PatchInfo {
    /// `name`, `name=N` or `name[=N]`, as the parameter allows.
    pub fn usage(&self) -> String {
        match self.param {
            Param::None => self.name.to_string(),
            Param::Required { what, .. } => format!("{}={what}", self.name),
            Param::Optional { what, default, .. } => format!("{}[={what}, default {default}]", self.name),
        }
    }

    pub fn applies(&self, arch: Arch) -> bool {
        self.applies_to.contains(&arch)
    }

    /// "Llama family", "DeepSeek-V4" or both, joined by " and ".
    pub fn applies_to_label(&self) -> String {
        self.applies_to.iter().map(|a| a.label()).collect::<Vec<_>>().join(" and ")
    }
}

/// Every known patch, sorted by name (the canonical order of a patch set).
pub const PATCHES: &[PatchInfo] = &[
    PatchInfo {
        name: "act_q8",
        param: Param::None,
        reproduces: "activations quantized to 8 bits per block of 32 before each matmul, as llama.cpp does (Q8_0 activation rounding on f32 weights)",
        acts_on: "the input of every weight matmul (Q/K/V/O, gate/up/down, output)",
        applies_to: LLAMA,
    },
    PatchInfo {
        name: "attn_splitk_bf16",
        param: Param::Optional { what: "CHUNK", min: 1, default: 64 },
        reproduces: "split-K (flash-decoding) attention whose per-chunk max, sum and output are kept in bf16 before the merge",
        acts_on: "decode attention (single-token segments)",
        applies_to: LLAMA,
    },
    PatchInfo {
        name: "auto_truncate",
        param: Param::Required { what: "N", min: 8 },
        reproduces: "SGLang --allow-auto-truncate: a prompt longer than N-7 tokens keeps its first N-7 and drops the rest",
        acts_on: "prompt admission (scheduler); prompt_tokens reports the truncated count",
        applies_to: LLAMA,
    },
    PatchInfo {
        name: "ctx_shift",
        param: Param::Required { what: "N", min: 8 },
        reproduces: "Ollama context shift: a prompt longer than N tokens keeps its first 4 and its last N-4",
        acts_on: "prompt admission (scheduler); prompt_tokens reports the evaluated count",
        applies_to: LLAMA,
    },
    PatchInfo {
        name: "index_topk",
        param: Param::Required { what: "N", min: 1 },
        reproduces: "a lightning indexer keeping N compressed blocks per query instead of the checkpoint's index_topk (a speed or memory setting of a DeepSeek-V4 deployment)",
        acts_on: "compressed sparse attention: the indexer's top-k selection",
        applies_to: DSV4,
    },
    PatchInfo {
        name: "indexer_fp8",
        param: Param::None,
        reproduces: "DeepSeek's FP8 lightning indexer: queries and keys quantized to e4m3 per block of 128 (scale amax/448, act_quant) before the index scores",
        acts_on: "compressed sparse attention: the indexer's queries (per query) and keys (as each compressed key is made)",
        applies_to: DSV4,
    },
    PatchInfo {
        name: "kv_fp8",
        param: Param::None,
        reproduces: "KV cache stored as FP8 e4m3 with a per-tensor scale (vLLM/SGLang --kv-cache-dtype fp8_e4m3)",
        acts_on: "K and V rows as they are appended to the cache; DeepSeek-V4: every K=V entry (window and compressed), not the indexer keys",
        applies_to: BOTH,
    },
    PatchInfo {
        name: "mhc_bf16",
        param: Param::None,
        reproduces: "the bf16 mHC mixing GEMM of a DeepSeek-V4 deployment, with the Sinkhorn normalisation of comb in bf16 as well",
        acts_on: "every hyper-connection (and the hyper-head): GEMM inputs, weights and outputs in bf16; each Sinkhorn step rounded to bf16",
        applies_to: DSV4,
    },
    PatchInfo {
        name: "mhc_sinkhorn_iters",
        param: Param::Required { what: "N", min: 1 },
        reproduces: "an mHC kernel running N Sinkhorn-Knopp iterations instead of the checkpoint's hc_sinkhorn_iters (fewer: comb only roughly doubly stochastic)",
        acts_on: "every hyper-connection's comb matrix",
        applies_to: DSV4,
    },
    PatchInfo {
        name: "moe_router_bf16",
        param: Param::None,
        reproduces: "a MoE router computed in bf16 (input, weights, gate logits and scores), so near-tied experts can swap",
        acts_on: "the router of every top-k MoE layer (and the expert weights of the hash-routed ones)",
        applies_to: DSV4,
    },
    PatchInfo {
        name: "moe_topk",
        param: Param::Required { what: "N", min: 1 },
        reproduces: "a MoE served with N experts per token instead of the checkpoint's num_experts_per_tok (a speed setting)",
        acts_on: "MoE routing: top-k layers pick N; hash-routed layers keep the first min(N, table width) of the token's experts",
        applies_to: DSV4,
    },
    PatchInfo {
        name: "prefix_cache_off",
        param: Param::None,
        reproduces: "an engine with prefix caching disabled (every prompt computed cold)",
        acts_on: "prefix cache lookup and insertion",
        applies_to: LLAMA,
    },
    PatchInfo {
        name: "prefix_cache_weak_hash",
        param: Param::None,
        reproduces: "prefix blocks matched by a weak hash (block length and first token) so that different prefixes reuse each other's KV",
        acts_on: "prefix cache lookup; the reused tokens are reported as cached",
        applies_to: LLAMA,
    },
    PatchInfo {
        name: "residual_gemm_bf16",
        param: Param::None,
        reproduces: "bf16 GEMMs writing the residual stream (attention output, FFN down), like the bf16 mixing GEMM that broke a DeepSeek-V4 deployment",
        acts_on: "attention-output and FFN-down matmuls: bf16 inputs, bf16-rounded output before the residual add",
        applies_to: LLAMA,
    },
    PatchInfo {
        name: "rmsnorm_bf16",
        param: Param::None,
        reproduces: "RMSNorm whose mean-square statistic is reduced in bf16 instead of f32",
        acts_on: "every RMSNorm (attention, FFN, final)",
        applies_to: LLAMA,
    },
    PatchInfo {
        name: "rope_bf16",
        param: Param::None,
        reproduces: "RoPE angles and cos/sin tables in bf16, which cannot tell neighbouring positions apart past 256",
        acts_on: "the rotation of Q and K",
        applies_to: LLAMA,
    },
    PatchInfo {
        name: "sliding_window",
        param: Param::Required { what: "N", min: 1 },
        reproduces: "a sliding-window attention config on a full-attention model: every layer sees only the last N positions",
        acts_on: "attention (all layers)",
        applies_to: LLAMA,
    },
    PatchInfo {
        name: "swa_window",
        param: Param::Required { what: "N", min: 1 },
        reproduces: "a DeepSeek-V4 deployment whose attention window is N positions instead of the checkpoint's sliding_window",
        acts_on: "the raw-entry window of every attention layer (sliding, HCA and CSA)",
        applies_to: DSV4,
    },
];

/// The registry entry named `name`.
pub fn lookup(name: &str) -> Option<&'static PatchInfo> {
    PATCHES.iter().find(|p| p.name == name)
}

/// The known names, comma-separated (for error messages).
pub fn known_names() -> String {
    PATCHES.iter().map(PatchInfo::usage).collect::<Vec<_>>().join(", ")
}

/// The registry as a table (what `ctxscope patches` prints).
pub fn describe() -> String {
    let mut out = String::new();
    for p in PATCHES {
        out.push_str(&format!(
            "{}\n    reproduces: {}\n    acts on:    {}\n    applies to: {}\n",
            p.usage(),
            p.reproduces,
            p.acts_on,
            p.applies_to_label()
        ));
    }
    out
}
