//! The OpenAI-compatible HTTP server in front of the scheduler (hyper 1, HTTP/1.1): chat and text
//! completions, streaming or not, plus models, tokenize and health. [`run`] serves a listener through
//! the loop the proxy also uses (`ctxscope_http`: head timeout, connection cap) until shutdown, then
//! lets open connections finish within the grace period.

mod body;
mod completions;
mod detok;
mod error;
mod generation;
mod info;
mod ollama;
mod reframe;
mod request;
mod response;
mod response_store;
mod responses;
mod routes;
mod state;
mod stop;
mod stream;

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;

pub use ctxscope_common::wire::{PATCHES_HEADER, PATH_HEADER};
pub use detok::Utf8Decoder;
pub use error::ApiError;
pub use state::ServerConfig;
pub use stop::StopMatcher;

use crate::scheduler::EngineHandle;
use state::State;

/// Serves the engine's API on `listener` until `shutdown` resolves.
pub async fn run(engine: EngineHandle, config: ServerConfig, listener: TcpListener, shutdown: impl Future<Output = ()>) {
    let grace = config.shutdown_grace;
    let listen = listener.local_addr().map(|a| a.to_string()).unwrap_or_else(|e| format!("unknown ({e})"));
    tracing::info!(
        listen = %listen,
        model = %engine.model.id,
        ctx = engine.options.ctx,
        path = config.default_path.as_str(),
        "ctxscope engine serving"
    );
    if let Err(error) = config.default_patches.check_applies(engine.model.arch()) {
        tracing::error!(%error, "--patches cannot apply to this model; generation requests without their own patches will be refused");
    }
    let limits = ctxscope_http::ConnLimits::engine(config.header_timeout, ctxscope_http::raise_nofile());
    let state = Arc::new(State::new(engine, config));
    let (stop_tx, stop_rx) = watch::channel(false);
    let service = hyper::service::service_fn(move |request| routes::handle(state.clone(), request));
    let accept = tokio::spawn(ctxscope_http::serve(listener, service, stop_rx, grace, limits));
    shutdown.await;
    tracing::info!("engine shutting down: finishing open requests");
    let _ = stop_tx.send(true);
    let _ = accept.await;
}
