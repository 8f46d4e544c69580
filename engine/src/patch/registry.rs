//! The registry of named patches: for each, its stable name, its parameter, the real-world change it
//! reproduces and the part of the computation it touches. `ctxscope patches` prints it; a patch list
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

/// One entry of the registry.
#[derive(Debug, Clone, Copy)]
pub struct PatchInfo {
    pub name: &'static str,
    pub param: Param,
    /// The real-world change it reproduces, in one line.
    pub reproduces: &'static str,
    /// Where it acts in the forward pass, scheduler or cache.
    pub acts_on: &'static str,
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
}

/// Every known patch, sorted by name (the canonical order of a patch set).
pub const PATCHES: &[PatchInfo] = &[
    PatchInfo {
        name: "act_q8",
        param: Param::None,
        reproduces: "activations quantized to 8 bits per block of 32 before each matmul, as llama.cpp does (Q8_0 activation rounding on f32 weights)",
        acts_on: "the input of every weight matmul (Q/K/V/O, gate/up/down, output)",
    },
    PatchInfo {
        name: "attn_splitk_bf16",
        param: Param::Optional { what: "CHUNK", min: 1, default: 64 },
        reproduces: "split-K (flash-decoding) attention whose per-chunk max, sum and output are kept in bf16 before the merge",
        acts_on: "decode attention (single-token segments)",
    },
    PatchInfo {
        name: "auto_truncate",
        param: Param::Required { what: "N", min: 8 },
        reproduces: "SGLang --allow-auto-truncate: a prompt longer than N-7 tokens keeps its first N-7 and drops the rest",
        acts_on: "prompt admission (scheduler); prompt_tokens reports the truncated count",
    },
    PatchInfo {
        name: "ctx_shift",
        param: Param::Required { what: "N", min: 8 },
        reproduces: "Ollama context shift: a prompt longer than N tokens keeps its first 4 and its last N-4",
        acts_on: "prompt admission (scheduler); prompt_tokens reports the evaluated count",
    },
    PatchInfo {
        name: "kv_fp8",
        param: Param::None,
        reproduces: "KV cache stored as FP8 e4m3 with a per-tensor scale (vLLM/SGLang --kv-cache-dtype fp8_e4m3)",
        acts_on: "K and V rows, rounded as they are appended to the cache",
    },
    PatchInfo {
        name: "prefix_cache_off",
        param: Param::None,
        reproduces: "an engine with prefix caching disabled (every prompt computed cold)",
        acts_on: "prefix cache lookup and insertion",
    },
    PatchInfo {
        name: "prefix_cache_weak_hash",
        param: Param::None,
        reproduces: "prefix blocks matched by a weak hash (block length and first token) so that different prefixes reuse each other's KV",
        acts_on: "prefix cache lookup; the reused tokens are reported as cached",
    },
    PatchInfo {
        name: "residual_gemm_bf16",
        param: Param::None,
        reproduces: "bf16 GEMMs writing the residual stream (attention output, FFN down), like the bf16 mixing GEMM that broke a DeepSeek-V4 deployment",
        acts_on: "attention-output and FFN-down matmuls: bf16 inputs, bf16-rounded output before the residual add",
    },
    PatchInfo {
        name: "rmsnorm_bf16",
        param: Param::None,
        reproduces: "RMSNorm whose mean-square statistic is reduced in bf16 instead of f32",
        acts_on: "every RMSNorm (attention, FFN, final)",
    },
    PatchInfo {
        name: "rope_bf16",
        param: Param::None,
        reproduces: "RoPE angles and cos/sin tables in bf16, which cannot tell neighbouring positions apart past 256",
        acts_on: "the rotation of Q and K",
    },
    PatchInfo {
        name: "sliding_window",
        param: Param::Required { what: "N", min: 1 },
        reproduces: "a sliding-window attention config on a full-attention model: every layer sees only the last N positions",
        acts_on: "attention (all layers)",
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
        out.push_str(&format!("{}\n    reproduces: {}\n    acts on:    {}\n", p.usage(), p.reproduces, p.acts_on));
    }
    out
}
