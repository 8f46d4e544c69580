//! What every request handler shares: the engine handle, the server's settings, and the count of
//! generation requests in flight (bounded, so an overload is a clear 429 rather than an unbounded queue).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::forward::Path;
use crate::patch::PatchSet;
use crate::scheduler::EngineHandle;

/// Settings of the HTTP server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Computation path for requests without an `x-ctxscope-path` header.
    pub default_path: Path,
    /// Patch set for requests that name none (`--patches`).
    pub default_patches: PatchSet,
    /// Generation requests admitted at once (running or queued); beyond it, 429.
    pub max_in_flight: usize,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
    /// How long shutdown waits for open connections.
    pub shutdown_grace: Duration,
    /// How long a connection may take to send a request head (idle keep-alive connections too).
    pub header_timeout: Duration,
    /// Where `/v1/responses` keeps responses for `previous_response_id` (`--responses-store`);
    /// `None`: stateless.
    pub responses_store: Option<std::path::PathBuf>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            default_path: Path::Golden,
            default_patches: PatchSet::default(),
            max_in_flight: 4096,
            max_body_bytes: 64 << 20,
            shutdown_grace: Duration::from_secs(5),
            header_timeout: Duration::from_secs(30),
            responses_store: None,
        }
    }
}

/// Shared by all connections.
pub struct State {
    pub engine: EngineHandle,
    pub config: ServerConfig,
    in_flight: Arc<AtomicUsize>,
    /// The responses store when configured, or why it could not be opened.
    pub responses: Option<Result<super::response_store::ResponseStore, String>>,
}

impl State {
    pub fn new(engine: EngineHandle, config: ServerConfig) -> State {
        let responses = config.responses_store.as_deref().map(|path| {
            super::response_store::ResponseStore::open(path).map_err(|error| {
                tracing::error!(%error, "responses store unavailable; /v1/responses refuses previous_response_id");
                error.to_string()
            })
        });
        State { engine, config, in_flight: Arc::new(AtomicUsize::new(0)), responses }
    }

    /// Admits one more generation request, or says how busy the engine is.
    pub fn admit(&self) -> Result<InFlight, (usize, usize)> {
        let limit = self.config.max_in_flight;
        let previous = self.in_flight.fetch_add(1, Ordering::AcqRel);
        let guard = InFlight(self.in_flight.clone());
        if previous >= limit {
            return Err((previous, limit));
        }
        Ok(guard)
    }
}

/// One admitted request; released when dropped (after the last byte of a stream).
pub struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
