//! The CUDA backend's tuning: read from the environment once, at the edge (the binary, a benchmark,
//! a test), and handed to the backend with the engine's options. Every setting has a measured
//! default (BENCHMARKS.md); the variables exist for A/B runs.
//!
//! - `CTXSCOPE_CUDA_GRAPHS=0`: launch a decode pass's kernels one by one instead of replaying a graph.
//! - `CTXSCOPE_CUDA_SPECULATE=0`: do not launch the next greedy step before it is asked for.
//! - `CTXSCOPE_CUDA_GEMV_ROWS=N` (1..=8): rows a GEMV block computes (default: by model size).
//! - `CTXSCOPE_CUDA_STREAM_GEMV=0`: plain GEMVs without the streamed, norm-folded variant.
//! - `CTXSCOPE_CUDA_ATTN_SPLITS=N`: decode attention's split-K partials (default 0: two blocks per SM).
//! - `CTXSCOPE_CUDA_ATTN_CLUSTER=N`: decode attention's thread-block cluster size (default 16; 0: none).
//! - `CTXSCOPE_CUDA_PERSISTENT=1`: one-row decode passes as one persistent launch (measured slower).

/// How the CUDA backend runs a model (see the module's list for each setting's variable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceTuning {
    pub graphs: bool,
    pub speculate: bool,
    /// `None`: chosen by model size.
    pub gemv_rows: Option<usize>,
    pub stream_gemv: bool,
    pub attn_splits: usize,
    pub attn_cluster: usize,
    pub persistent: bool,
}

/// Decode attention's cluster size unless told otherwise (measured on the H200: BENCHMARKS.md).
pub const DEFAULT_ATTN_CLUSTER: usize = 16;

impl Default for DeviceTuning {
    fn default() -> Self {
        DeviceTuning {
            graphs: true,
            speculate: true,
            gemv_rows: None,
            stream_gemv: true,
            attn_splits: 0,
            attn_cluster: DEFAULT_ATTN_CLUSTER,
            persistent: false,
        }
    }
}

impl DeviceTuning {
    /// The tuning the process's environment asks for (unset or unparsable variables: the defaults).
    pub fn from_env() -> DeviceTuning {
        DeviceTuning::from_vars(|name| std::env::var(name).ok())
    }

    /// The tuning `var` (a variable's value by name) asks for.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> DeviceTuning {
        let number = |name: &str| var(name).and_then(|v| v.trim().parse::<usize>().ok());
        let on_unless_zero = |name: &str, default: bool| var(name).map_or(default, |v| v.trim() != "0");
        let defaults = DeviceTuning::default();
        DeviceTuning {
            graphs: on_unless_zero("CTXSCOPE_CUDA_GRAPHS", defaults.graphs),
            speculate: on_unless_zero("CTXSCOPE_CUDA_SPECULATE", defaults.speculate),
            gemv_rows: number("CTXSCOPE_CUDA_GEMV_ROWS"),
            stream_gemv: on_unless_zero("CTXSCOPE_CUDA_STREAM_GEMV", defaults.stream_gemv),
            attn_splits: number("CTXSCOPE_CUDA_ATTN_SPLITS").unwrap_or(defaults.attn_splits),
            attn_cluster: number("CTXSCOPE_CUDA_ATTN_CLUSTER").unwrap_or(defaults.attn_cluster),
            persistent: number("CTXSCOPE_CUDA_PERSISTENT").is_some_and(|n| n != 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_override_the_defaults_and_garbage_keeps_them() {
        assert_eq!(DeviceTuning::from_vars(|_| None), DeviceTuning::default());
        let set = |name: &str| match name {
            "CTXSCOPE_CUDA_GRAPHS" => Some("0".to_string()),
            "CTXSCOPE_CUDA_GEMV_ROWS" => Some("4".into()),
            "CTXSCOPE_CUDA_ATTN_CLUSTER" => Some("many".into()),
            "CTXSCOPE_CUDA_PERSISTENT" => Some("1".into()),
            _ => None,
        };
        let tuning = DeviceTuning::from_vars(set);
        assert!(!tuning.graphs && tuning.speculate && tuning.persistent);
        assert_eq!((tuning.gemv_rows, tuning.attn_cluster), (Some(4), DEFAULT_ATTN_CLUSTER));
    }
}
