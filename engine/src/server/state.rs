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
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig { default_path: Path::Golden, default_patches: PatchSet::default(), max_in_flight: 4096, max_body_bytes: 64 << 20, shutdown_grace: Duration::from_secs(5) }
    }
}

/// Shared by all connections.
pub struct State {
    pub engine: EngineHandle,
    pub config: ServerConfig,
    in_flight: Arc<AtomicUsize>,
}

impl State {
    pub fn new(engine: EngineHandle, config: ServerConfig) -> State {
        State { engine, config, in_flight: Arc::new(AtomicUsize::new(0)) }
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
