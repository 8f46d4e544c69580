//! Shared by the engine's test files: the real default model (env `CTXSCOPE_MODEL` or the cache path
//! `scripts/fetch-model.sh` fills), an engine started over it, and chat prompts rendered with its template.
#![allow(dead_code)]

#[cfg(feature = "cuda")]
pub mod device;

use std::path::PathBuf;
use std::sync::Arc;

use ctxscope_engine::scheduler::{self, EngineHandle, EngineOptions};
use ctxscope_engine::Model;
use ctxscope_formats::RenderOptions;
use serde_json::Value;

/// The model file; fails the test with a clear message when it is missing.
pub fn model_path() -> PathBuf {
    ctxscope_formats::test_model_path().unwrap_or_else(|e| panic!("{e}"))
}

pub fn load_model() -> Arc<Model> {
    let path = model_path();
    Arc::new(Model::load(&path).unwrap_or_else(|e| panic!("loading {}: {e}", path.display())))
}

/// One loaded model per test binary.
pub fn shared_model() -> Arc<Model> {
    static MODEL: std::sync::OnceLock<Arc<Model>> = std::sync::OnceLock::new();
    MODEL.get_or_init(load_model).clone()
}

/// A scheduler over `model` with default options.
pub fn start_engine(model: Arc<Model>) -> EngineHandle {
    let options = EngineOptions::for_model(&model);
    scheduler::start(model, options).0
}

/// The engine's HTTP server over `engine` on a loopback port: its address, the sender that stops it,
/// and its task. Call from inside a Tokio runtime.
pub async fn serve(
    engine: EngineHandle,
    config: ctxscope_engine::ServerConfig,
) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(ctxscope_engine::server::run(engine, config, listener, async move {
        let _ = stopped.await;
    }));
    (addr, stop, server)
}

/// Token ids of `messages` rendered with the model's chat template and a generation prompt.
pub fn chat_prompt(model: &Model, messages: &[Value]) -> Vec<u32> {
    let opts = RenderOptions { add_generation_prompt: true, bos_token: "", eos_token: "", tools: None };
    let text = model.template.render(messages, &opts).expect("renders");
    model.tokenizer.encode(&text, true)
}

/// One engine per test binary, started on first use.
pub fn shared_engine() -> &'static EngineHandle {
    static ENGINE: std::sync::OnceLock<EngineHandle> = std::sync::OnceLock::new();
    ENGINE.get_or_init(|| start_engine(shared_model()))
}
