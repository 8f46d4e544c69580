//! Where the forward pass runs. The scheduler drives a [`Backend`] (the CPU, or the GPU with the `cuda`
//! feature); each sequence's KV cache is the backend's [`SequenceKv`], which the prefix cache keeps
//! and copies without knowing where it lives.

use crate::patch::PatchSet;
use crate::path::Path;

/// A backend failure: the requests in the failed step get it as their error.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{backend} backend: {message}")]
pub struct BackendError {
    pub backend: &'static str,
    pub message: String,
}

/// One sequence's KV cache.
pub trait SequenceKv: Sized + Send {
    /// Positions computed.
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many of the first `len` positions can be reused as a prefix ([`SequenceKv::prefix`]): all of
    /// them for a cache that keeps every position; fewer for one that cannot be cut back (a sliding
    /// window, closed compressed blocks), 0 when none.
    fn reusable(&self, len: usize) -> usize {
        len
    }

    /// A new cache holding a copy of the first `len` positions (room to grow as a fresh one).
    fn prefix(&self, len: usize) -> Result<Self, BackendError>;
}

/// What a step must return for one sequence.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Want {
    /// The last token's logits (the host samples: temperature, top-p, top logprobs).
    Logits,
    /// Only the greedy token and its log-probability (a device can pick it without copying logits).
    Greedy,
    /// A token drawn at `temperature` from the smallest most-probable set reaching `top_p`, with
    /// `uniform` (in [0, 1), from the request's seeded generator) — asked only of a backend whose
    /// [`Backend::samples`] is true; answered with [`Output::Token`].
    Sample { temperature: f32, top_p: f32, uniform: f32 },
}

/// One sequence's part of a step: tokens at positions `kv.len() ..`, appended to `kv` as computed.
pub struct Step<'a, K> {
    pub tokens: &'a [u32],
    pub kv: &'a mut K,
    pub want: Want,
}

/// A step's result for one sequence.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    Logits(Vec<f32>),
    /// The chosen token (greedy or sampled) and its log-probability at temperature 1.
    Token {
        token: u32,
        logprob: f32,
    },
}

/// A place to run the model.
pub trait Backend {
    type Kv: SequenceKv;

    /// `cpu`, `cuda:0`, ...
    fn name(&self) -> String;

    /// An empty cache for a new sequence.
    fn new_kv(&mut self) -> Result<Self::Kv, BackendError>;

    /// Whether [`Want::Sample`] is served here (else sampling requests ask for logits and the host samples).
    fn samples(&self) -> bool {
        false
    }

    /// Runs every step's tokens in one pass under `path` and `patches`; one output per step, in order.
    fn forward(&mut self, path: Path, patches: &PatchSet, steps: &mut [Step<'_, Self::Kv>]) -> Result<Vec<Output>, BackendError>;

    /// Before a `forward`: whether the call after it will most likely continue it — the same path and
    /// patches, the same sequences in order, each fed the one token this call gives it. A backend may
    /// then start that step early (the CUDA backend's speculative step); a hint only, never a change
    /// in what any call returns. Backends that cannot use it ignore it.
    fn expect_continuation(&mut self, _likely: bool) {}
}

impl BackendError {
    pub fn new(backend: &'static str, message: impl Into<String>) -> BackendError {
        BackendError { backend, message: message.into() }
    }
}

/// Which backend to run on, as `--device` names it: `cpu`, `cuda` (GPU 0) or `cuda:N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendKind {
    #[default]
    Cpu,
    Cuda {
        ordinal: usize,
    },
}

impl BackendKind {
    pub fn parse(text: &str) -> Result<BackendKind, String> {
        let bad = || format!("{text:?} is not a device; use cpu, cuda or cuda:N (N: the GPU's index, from 0)");
        match text.trim() {
            "cpu" => Ok(BackendKind::Cpu),
            "cuda" => Ok(BackendKind::Cuda { ordinal: 0 }),
            other => {
                let ordinal = other.strip_prefix("cuda:").ok_or_else(bad)?;
                ordinal.parse().map(|ordinal| BackendKind::Cuda { ordinal }).map_err(|_| bad())
            }
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendKind::Cpu => f.write_str("cpu"),
            BackendKind::Cuda { ordinal } => write!(f, "cuda:{ordinal}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::BackendKind;

    #[test]
    fn device_names_parse() {
        assert_eq!(BackendKind::parse("cpu"), Ok(BackendKind::Cpu));
        assert_eq!(BackendKind::parse("cuda"), Ok(BackendKind::Cuda { ordinal: 0 }));
        assert_eq!(BackendKind::parse("cuda:3"), Ok(BackendKind::Cuda { ordinal: 3 }));
        for bad in ["gpu", "cuda:", "cuda:x", "cuda:-1", ""] {
            assert!(BackendKind::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(BackendKind::Cuda { ordinal: 2 }.to_string(), "cuda:2");
    }
}
