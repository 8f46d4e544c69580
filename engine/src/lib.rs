//! ctxscope's self-hosted engine. It loads Llama-family GGUF models, runs them on CPU through two
//! matmul paths (golden: f32 weights, f32 accumulation, the reference replay trusts; fast: quantized
//! weights kept quantized), keeps per-sequence KV caches with prefix reuse across requests, and
//! batches concurrent requests in one scheduler loop. The scheduler drives a [`Backend`]: the CPU, or a
//! GPU with the `cuda` feature; DeepSeek-V4 checkpoints run on their own backend (`dsv4_backend`: golden
//! on the CPU, or its products on a GPU with `cuda`).

pub mod backend;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod device;
pub mod dsv4_backend;
pub mod forward;
pub mod kv;
pub mod model;
pub mod patch;
pub mod path;
pub mod run;
pub mod sample;
pub mod scheduler;
pub mod server;
pub mod tuning;

pub use backend::{Backend, BackendError, BackendKind};
pub use cpu::CpuBackend;
pub use model::{Model, ModelConfig, ModelError};
pub use patch::PatchSet;
pub use path::Path;
pub use run::{run, Engine, StartError};
pub use scheduler::{EngineHandle, EngineOptions};
pub use server::ServerConfig;
