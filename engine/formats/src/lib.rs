//! Model formats without the engine: GGUF metadata, tokenizers, chat templates and token counting.
//! The capture proxy links this crate to count tokens the way the upstream model does; the engine
//! links it to load models. Nothing here runs a forward pass or touches a GPU.

pub mod counter;
pub mod gguf;
pub mod model_path;
pub mod safetensors;
pub mod template;
pub mod tokenizer;

pub use counter::{CounterError, Segments, TokenCounter};
pub use gguf::{Gguf, GgufError};
#[cfg(any(test, feature = "test-support"))]
pub use model_path::test_model_path;
pub use model_path::{default_model_path, DEFAULT_MODEL_FILE};
pub use safetensors::{SafeTensors, SafetensorsError};
pub use template::{ChatTemplate, RenderOptions, TemplateError};
pub use tokenizer::{TokenKind, Tokenizer, TokenizerError};
