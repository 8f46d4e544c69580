//! The OpenAI-compatible HTTP server in front of the scheduler (hyper 1, HTTP/1.1): chat and text
//! completions, streaming or not, plus models, tokenize and health. [`run`] serves a listener until
//! shutdown, then lets open connections finish within the grace period.

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

use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

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
    let state = Arc::new(State::new(engine, config));
    let (stop_tx, stop_rx) = watch::channel(false);
    let accept = tokio::spawn(accept_loop(listener, state, stop_rx, grace));
    shutdown.await;
    tracing::info!("engine shutting down: finishing open requests");
    let _ = stop_tx.send(true);
    let _ = accept.await;
}

async fn accept_loop(listener: TcpListener, state: Arc<State>, mut stop: watch::Receiver<bool>, grace: std::time::Duration) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(error) => {
                        // Usually out of file descriptors: back off instead of spinning.
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let state = state.clone();
                let mut stop = stop.clone();
                connections.spawn(async move {
                    let service = hyper::service::service_fn(move |request| routes::handle(state.clone(), request));
                    let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
                    tokio::pin!(conn);
                    let result = tokio::select! {
                        result = conn.as_mut() => result,
                        _ = stop.changed() => {
                            conn.as_mut().graceful_shutdown();
                            conn.await
                        }
                    };
                    if let Err(error) = result {
                        tracing::debug!(%error, "connection ended with an error");
                    }
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            _ = stop.changed() => break,
        }
    }
    drop(listener);
    let drained = tokio::time::timeout(grace, async { while connections.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(open = connections.len(), "grace period over; closing remaining connections");
        connections.shutdown().await;
    }
}
