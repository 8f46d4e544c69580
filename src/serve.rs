//! `ctxscope engine` and `ctxscope serve`: load the model (fetching the default one on first use),
//! start the scheduler and the OpenAI-compatible server, and for `serve` put the capture proxy in
//! front of it in the same process. Shutdown stops the proxy first (it drains capture), then the engine.
//! `--device` picks the backend: the CPU, or a GPU in a build with the `cuda` feature.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ctxscope_engine::scheduler::{self, EngineHandle, EngineOptions};
use ctxscope_engine::{BackendKind, Model, Path, ServerConfig};
use ctxscope_proxy::{ProxyConfig, Upstream};

use crate::models;

/// Validated engine flags.
pub struct EngineSettings {
    pub model: String,
    pub listen: SocketAddr,
    pub ctx: Option<usize>,
    pub path: Path,
    pub patches: ctxscope_engine::PatchSet,
    pub max_batch: usize,
    /// Where the forward pass runs (`--device`).
    pub device: BackendKind,
    /// Where `/v1/responses` keeps responses for `previous_response_id` (`--responses-store`).
    pub responses_store: Option<std::path::PathBuf>,
}

/// Validated proxy flags of `serve`.
pub struct FrontSettings {
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
    /// The capture settings; its upstream and tokenizer are replaced by the engine's.
    pub config: ProxyConfig,
}

/// `ctxscope engine`.
pub async fn run_engine(settings: EngineSettings, shutdown: impl Future<Output = ()>) -> Result<(), CliError> {
    tokio::pin!(shutdown);
    let listener = bind(settings.listen).await?;
    let started = tokio::select! {
        started = start_engine(&settings) => started?,
        _ = &mut shutdown => return Ok(()),
    };
    let config = server_config(&settings);
    ctxscope_engine::server::run(started.handle, config, listener, shutdown).await;
    join_scheduler(started.thread).await;
    Ok(())
}

/// `ctxscope serve`: the engine plus the capture proxy in front of it.
pub async fn run_serve(settings: EngineSettings, front: FrontSettings, shutdown: impl Future<Output = ()>) -> Result<(), CliError> {
    tokio::pin!(shutdown);
    let engine_listener = bind(settings.listen).await?;
    let proxy_listener = bind(front.proxy).await?;
    let admin_listener = bind(front.admin).await?;
    let engine_addr = engine_listener.local_addr().map_err(|source| CliError::Listen { addr: settings.listen, source })?;
    let started = tokio::select! {
        started = start_engine(&settings) => started?,
        _ = &mut shutdown => return Ok(()),
    };

    let upstream = Upstream::parse(&format!("http://{engine_addr}"))?;
    let mut config = front.config;
    config.upstream = upstream;
    config.replay_engine = Some(format!("http://{engine_addr}"));
    config.tokenizer = Some(started.model_path.clone());

    let (stop_engine, engine_stopped) = tokio::sync::oneshot::channel::<()>();
    let engine = tokio::spawn(ctxscope_engine::server::run(started.handle, server_config(&settings), engine_listener, async move {
        let _ = engine_stopped.await;
    }));
    let proxied = ctxscope_proxy::run(config, proxy_listener, admin_listener, shutdown).await.map_err(CliError::from);
    let _ = stop_engine.send(());
    let _ = engine.await;
    join_scheduler(started.thread).await;
    proxied
}

struct Started {
    handle: EngineHandle,
    thread: std::thread::JoinHandle<()>,
    model_path: PathBuf,
}

async fn start_engine(settings: &EngineSettings) -> Result<Started, String> {
    // Before fetching or loading anything: a device this build cannot drive is a start-up error.
    if !cfg!(feature = "cuda") && matches!(settings.device, BackendKind::Cuda { .. }) {
        return Err(NO_CUDA.into());
    }
    let name = settings.model.clone();
    let model_path = tokio::task::spawn_blocking(move || models::ensure(&name))
        .await
        .map_err(|e| format!("fetching the model: {e}"))?
        .map_err(|e| e.to_string())?;
    tracing::info!(model = %model_path.display(), "loading model");
    let load_path = model_path.clone();
    let model = tokio::task::spawn_blocking(move || Model::load(&load_path))
        .await
        .map_err(|e| format!("loading the model: {e}"))?
        .map_err(|e| e.to_string())?;
    let mut options = EngineOptions::for_model(&model);
    // The CUDA backend's tuning variables, read here once (ctxscope_engine::tuning).
    options.device = ctxscope_engine::tuning::DeviceTuning::from_env();
    if let Some(ctx) = settings.ctx {
        if ctx < 2 || ctx > model.config.ctx_len {
            return Err(format!("--ctx {ctx} is out of range: this model's context is {} tokens (use 2..={0})", model.config.ctx_len));
        }
        options.ctx = ctx;
    }
    if settings.max_batch == 0 {
        return Err("--max-batch must be at least 1".into());
    }
    options.max_batch = settings.max_batch;
    let device = settings.device;
    let (handle, thread) = tokio::task::spawn_blocking(move || start_scheduler(Arc::new(model), options, device))
        .await
        .map_err(|e| format!("starting the engine: {e}"))??;
    tracing::info!(backend = %handle.backend, "engine started");
    Ok(Started { handle, thread, model_path })
}

const NO_CUDA: &str = "this ctxscope was built without CUDA support; rebuild with `cargo build --release --features cuda`";

/// Starts the scheduler on `device`; blocks while a GPU backend uploads the model.
fn start_scheduler(
    model: Arc<Model>,
    options: EngineOptions,
    device: BackendKind,
) -> Result<(EngineHandle, std::thread::JoinHandle<()>), String> {
    match device {
        BackendKind::Cpu => Ok(scheduler::start(model, options)),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda { ordinal } => {
            let device_model = model.clone();
            let device_options = options.clone();
            scheduler::start_backend(model, options, move || {
                ctxscope_engine::device::DeviceBackend::new(device_model, ordinal, &device_options)
            })
            .map_err(|e| format!("cannot start the engine on {device}: {e}"))
        }
        #[cfg(not(feature = "cuda"))]
        BackendKind::Cuda { .. } => Err(NO_CUDA.into()),
    }
}

/// An engine served on a loopback port inside this process (replay's engine targets).
pub struct InProcessEngine {
    pub url: String,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<()>,
    thread: std::thread::JoinHandle<()>,
}

impl InProcessEngine {
    /// Loads the model and serves it on 127.0.0.1 (the port `settings.listen` names, 0 for any).
    pub async fn start(settings: &EngineSettings) -> Result<InProcessEngine, CliError> {
        let listener = bind(settings.listen).await?;
        let addr = listener.local_addr().map_err(|e| format!("engine listener: {e}"))?;
        let started = start_engine(settings).await?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(ctxscope_engine::server::run(started.handle, server_config(settings), listener, async move {
            let _ = stopped.await;
        }));
        Ok(InProcessEngine { url: format!("http://{addr}"), stop, server, thread: started.thread })
    }

    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.server.await;
        join_scheduler(self.thread).await;
    }
}

fn server_config(settings: &EngineSettings) -> ServerConfig {
    ServerConfig {
        default_path: settings.path,
        default_patches: settings.patches.clone(),
        responses_store: settings.responses_store.clone(),
        ..ServerConfig::default()
    }
}

/// Waits (bounded) for the scheduler thread, which ends once every handle is gone.
async fn join_scheduler(thread: std::thread::JoinHandle<()>) {
    let joined = tokio::task::spawn_blocking(move || thread.join());
    if tokio::time::timeout(Duration::from_secs(10), joined).await.is_err() {
        tracing::warn!("the engine thread did not stop within 10 s");
    }
}

use crate::error::{bind, CliError};
