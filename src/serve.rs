//! `ctxscope engine` and `ctxscope serve`: load the model (fetching the default one on first use),
//! start it with `ctxscope_engine::run` (scheduler and OpenAI-compatible server), and for `serve` put
//! the capture proxy in front of it in the same process. Shutdown stops the proxy first (it drains
//! capture), then the engine. `--device` picks the backend: the CPU, or a GPU in a build with the
//! `cuda` feature.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use ctxscope_engine::scheduler::EngineOptions;
use ctxscope_engine::{BackendKind, Engine, Model, Path, ServerConfig};
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
    let loaded = tokio::select! {
        loaded = load(&settings) => loaded?,
        _ = &mut shutdown => return Ok(()),
    };
    ctxscope_engine::run(loaded.model, loaded.options, settings.device, server_config(&settings), listener, shutdown).await?;
    Ok(())
}

/// `ctxscope serve`: the engine plus the capture proxy in front of it.
pub async fn run_serve(settings: EngineSettings, front: FrontSettings, shutdown: impl Future<Output = ()>) -> Result<(), CliError> {
    tokio::pin!(shutdown);
    let engine_listener = bind(settings.listen).await?;
    let proxy_listener = bind(front.proxy).await?;
    let admin_listener = bind(front.admin).await?;
    let engine_addr = engine_listener.local_addr().map_err(|source| CliError::Listen { addr: settings.listen, source })?;
    let (engine, model_path) = tokio::select! {
        started = start(&settings) => started?,
        _ = &mut shutdown => return Ok(()),
    };

    let upstream = Upstream::parse(&format!("http://{engine_addr}"))?;
    let mut config = front.config;
    config.upstream = upstream;
    config.replay_engine = Some(format!("http://{engine_addr}"));
    config.tokenizer = Some(model_path);

    let (stop_engine, engine_stopped) = tokio::sync::oneshot::channel::<()>();
    let engine = tokio::spawn(engine.serve(server_config(&settings), engine_listener, async move {
        let _ = engine_stopped.await;
    }));
    let proxied = ctxscope_proxy::run(config, proxy_listener, admin_listener, shutdown).await.map_err(CliError::from);
    let _ = stop_engine.send(());
    let _ = engine.await;
    proxied
}

/// A model loaded for serving, with the options its flags asked for.
struct Loaded {
    model: Arc<Model>,
    options: EngineOptions,
    path: PathBuf,
}

/// Fetches (a known model, on first use) and loads the model `--model` names.
async fn load(settings: &EngineSettings) -> Result<Loaded, CliError> {
    // Before fetching or loading anything: a device this build cannot drive is a start-up error.
    ctxscope_engine::run::check_device(settings.device)?;
    let name = settings.model.clone();
    let path = tokio::task::spawn_blocking(move || models::ensure(&name))
        .await
        .map_err(|e| CliError::Task { what: "fetching the model", detail: e.to_string() })??;
    tracing::info!(model = %path.display(), "loading model");
    let load_path = path.clone();
    let model = tokio::task::spawn_blocking(move || Model::load(&load_path))
        .await
        .map_err(|e| CliError::Task { what: "loading the model", detail: e.to_string() })?
        .map_err(|source| CliError::Model { path: path.clone(), source })?;
    settings.patches.check_applies(model.arch()).map_err(CliError::Patches)?;
    let mut options = EngineOptions::for_model(&model);
    // The CUDA backend's tuning variables, read here once (ctxscope_engine::tuning).
    options.device = ctxscope_engine::tuning::DeviceTuning::from_env();
    if let Some(ctx) = settings.ctx {
        options.ctx = ctx;
    }
    options.max_batch = settings.max_batch;
    Ok(Loaded { model: Arc::new(model), options, path })
}

/// Loads the model and starts its scheduler (off the runtime: a GPU backend uploads the model).
async fn start(settings: &EngineSettings) -> Result<(Engine, PathBuf), CliError> {
    let loaded = load(settings).await?;
    let device = settings.device;
    let engine = tokio::task::spawn_blocking(move || Engine::start(loaded.model, loaded.options, device))
        .await
        .map_err(|e| CliError::Task { what: "starting the engine", detail: e.to_string() })??;
    Ok((engine, loaded.path))
}

/// An engine served on a loopback port inside this process (replay's engine targets).
pub struct InProcessEngine {
    pub url: String,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<()>,
}

impl InProcessEngine {
    /// Loads the model and serves it on 127.0.0.1 (the port `settings.listen` names, 0 for any).
    pub async fn start(settings: &EngineSettings) -> Result<InProcessEngine, CliError> {
        let listener = bind(settings.listen).await?;
        let addr = listener.local_addr().map_err(|source| CliError::Listen { addr: settings.listen, source })?;
        let (engine, _) = start(settings).await?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(engine.serve(server_config(settings), listener, async move {
            let _ = stopped.await;
        }));
        Ok(InProcessEngine { url: format!("http://{addr}"), stop, server })
    }

    /// Stops serving and waits for the engine's thread.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.server.await;
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

use crate::error::{bind, CliError};
