//! Starting and serving an engine: a loaded model's scheduler on the chosen device
//! ([`Engine::start`]), its OpenAI-compatible server until shutdown ([`Engine::serve`]), the
//! scheduler thread joined after. [`run`] does all of it, beside `ctxscope_proxy::run`.

use std::future::Future;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::backend::{BackendError, BackendKind};
use crate::model::Model;
use crate::scheduler::{self, EngineHandle, EngineOptions};
use crate::server::{self, ServerConfig};

/// Why an engine did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("this ctxscope was built without CUDA support; rebuild with `cargo build --release --features cuda`")]
    NoCuda,
    #[error("--ctx {ctx} is out of range: this model's context is {max} tokens (use 2..={max})")]
    Context { ctx: usize, max: usize },
    #[error("--max-batch must be at least 1")]
    MaxBatch,
    #[error("cannot start the engine on {device}: {source}")]
    Backend { device: BackendKind, source: BackendError },
}

/// Whether this build can drive `device` (checked before a model is fetched or loaded).
pub fn check_device(device: BackendKind) -> Result<(), StartError> {
    match device {
        BackendKind::Cuda { .. } if !cfg!(feature = "cuda") => Err(StartError::NoCuda),
        _ => Ok(()),
    }
}

/// A running scheduler: its handle and its thread.
pub struct Engine {
    handle: EngineHandle,
    thread: JoinHandle<()>,
}

impl Engine {
    /// Validates `options` against the model and starts the scheduler on `device`; blocks while a
    /// GPU backend uploads the model.
    pub fn start(model: Arc<Model>, options: EngineOptions, device: BackendKind) -> Result<Engine, StartError> {
        check_device(device)?;
        let max = model.config.ctx_len;
        if options.ctx < 2 || options.ctx > max {
            return Err(StartError::Context { ctx: options.ctx, max });
        }
        if options.max_batch == 0 {
            return Err(StartError::MaxBatch);
        }
        let (handle, thread) = match (device, model.deepseek_v4.clone()) {
            (BackendKind::Cpu, Some(deepseek)) => {
                let make = move || Ok(crate::dsv4_backend::DeepseekV4Backend::new(deepseek));
                scheduler::start_backend(model, options, make).map_err(|source| StartError::Backend { device, source })?
            }
            #[cfg(feature = "cuda")]
            (BackendKind::Cuda { ordinal }, Some(deepseek)) => {
                let make = move || crate::dsv4_backend::DeepseekV4Backend::on_device(deepseek, ordinal);
                scheduler::start_backend(model, options, make).map_err(|source| StartError::Backend { device, source })?
            }
            (BackendKind::Cpu, None) => scheduler::start(model, options),
            #[cfg(feature = "cuda")]
            (BackendKind::Cuda { ordinal }, None) => {
                let (device_model, device_options) = (model.clone(), options.clone());
                scheduler::start_backend(model, options, move || crate::device::DeviceBackend::new(device_model, ordinal, &device_options))
                    .map_err(|source| StartError::Backend { device, source })?
            }
            #[cfg(not(feature = "cuda"))]
            (BackendKind::Cuda { .. }, _) => return Err(StartError::NoCuda),
        };
        tracing::info!(backend = %handle.backend, "engine started");
        Ok(Engine { handle, thread })
    }

    /// Serves the engine on `listener` until `shutdown`, then waits (bounded) for the scheduler.
    pub async fn serve(self, config: ServerConfig, listener: TcpListener, shutdown: impl Future<Output = ()>) {
        server::run(self.handle, config, listener, shutdown).await;
        join(self.thread).await;
    }
}

/// Starts the engine (off the async runtime) and serves it until `shutdown`.
pub async fn run(
    model: Arc<Model>,
    options: EngineOptions,
    device: BackendKind,
    config: ServerConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StartError> {
    let engine = tokio::task::spawn_blocking(move || Engine::start(model, options, device))
        .await
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic.into_panic()))?;
    engine.serve(config, listener, shutdown).await;
    Ok(())
}

/// Waits (bounded) for the scheduler thread, which ends once every handle is gone.
async fn join(thread: JoinHandle<()>) {
    let joined = tokio::task::spawn_blocking(move || thread.join());
    if tokio::time::timeout(Duration::from_secs(10), joined).await.is_err() {
        tracing::warn!("the engine thread did not stop within 10 s");
    }
}
