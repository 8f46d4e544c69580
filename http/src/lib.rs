//! HTTP plumbing the crates share. [`serve`]: the HTTP/1 serving loop of the engine and the proxy:
//! accept with a backoff while accepting fails (out of file descriptors), one hyper connection task
//! each under the listener's [`ConnLimits`] (a request-head timeout, a connection cap answered 503
//! beyond it), and graceful shutdown: stop accepting, let exchanges finish within the grace period,
//! abort the rest. [`client`]: the outbound client and its settings. [`timed`]: request bodies read
//! under an idle timeout and a minimum rate.

pub mod client;
pub mod limits;
pub mod timed;

use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

pub use limits::{raise_nofile, Backoff, ConnLimits};

/// Serves `service` on `listener` until `stop` turns true, then shuts connections down gracefully,
/// aborting those still open after `grace`.
pub async fn serve<S, B>(listener: TcpListener, service: S, mut stop: watch::Receiver<bool>, grace: Duration, limits: ConnLimits)
where
    S: hyper::service::Service<http::Request<Incoming>, Response = http::Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: std::error::Error + Send + Sync + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut connections = JoinSet::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut backoff = Backoff::default();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _) = match accepted {
                    Ok(pair) => pair,
                    Err(error) => {
                        // Out of file descriptors (or buffers): wait, while open connections go on.
                        tokio::time::sleep(backoff.failed(&error)).await;
                        continue;
                    }
                };
                backoff.succeeded();
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    connections.spawn(limits::refuse(stream));
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let service = service.clone();
                let mut stop = stop.clone();
                connections.spawn(async move {
                    let _slot = slot;
                    // Header names keep the case they arrived in, both ways. The head timeout runs
                    // from the connection's start and again after each response.
                    let conn = http1::Builder::new()
                        .preserve_header_case(true)
                        .timer(TokioTimer::new())
                        .header_read_timeout(limits.header_timeout)
                        .serve_connection(TokioIo::new(stream), service);
                    tokio::pin!(conn);
                    tokio::select! {
                        result = conn.as_mut() => log_conn(result),
                        _ = stop.changed() => {
                            conn.as_mut().graceful_shutdown();
                            log_conn(conn.await);
                        }
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

fn log_conn(result: Result<(), hyper::Error>) {
    if let Err(error) = result {
        tracing::debug!(%error, "connection ended with error");
    }
}
