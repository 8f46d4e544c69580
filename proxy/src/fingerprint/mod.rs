//! The engine fingerprint: what the upstream says about itself, asked off the request path by one
//! background task (at start, then every `every`, and again soon after a request failed to reach
//! the upstream), stored content-addressed, and handed to the capture pipeline so that every turn
//! names the fingerprint that served it. When the engine process is on this host (`live.rs`), what it
//! runs (command line, environment, libraries) joins the fingerprint. Fails open: an upstream that
//! answers none of the self-description endpoints keeps the last fingerprint known, and traffic never
//! waits for a probe.

mod flatten;
mod live;
mod probe;

use std::sync::Arc;
use std::time::Duration;

use ctxscope_store::{Fingerprint, HashHex, Store};
use tokio::sync::{watch, Notify};

use crate::upstream::Upstream;
use live::Live;
pub use probe::{ProbeError, Prober};

/// How the fingerprint task runs.
#[derive(Debug, Clone, Copy)]
pub struct FingerprintSettings {
    /// Time between probes of a healthy upstream.
    pub every: Duration,
    /// Time allowed for each endpoint's answer.
    pub timeout: Duration,
    /// `--engine-pid`: the engine process to read when none on this host listens on the upstream's port.
    pub engine_pid: Option<u32>,
}

impl Default for FingerprintSettings {
    fn default() -> Self {
        FingerprintSettings { every: Duration::from_secs(60), timeout: Duration::from_secs(3), engine_pid: None }
    }
}

/// The task's side that others hold: the latest fingerprint's hash, and a way to ask for a re-check.
#[derive(Clone)]
pub struct Fingerprints {
    current: watch::Receiver<Option<HashHex>>,
    recheck: Arc<Notify>,
}

impl Fingerprints {
    /// The hash of the latest fingerprint stored (None before the first answer).
    pub fn current(&self) -> Option<HashHex> {
        self.current.borrow().clone()
    }

    /// Asks the task to probe again soon (a request just failed to reach the upstream).
    pub fn recheck(&self) {
        self.recheck.notify_one();
    }
}

/// Starts the probe task on the current runtime.
pub fn spawn(upstream: Upstream, store: Store, settings: FingerprintSettings) -> Fingerprints {
    let (tx, current) = watch::channel(None);
    let recheck = Arc::new(Notify::new());
    let handle = Fingerprints { current, recheck: recheck.clone() };
    let live = Live::new(&upstream, settings.engine_pid);
    tokio::spawn(run(Prober::new(upstream, settings.timeout), live, store, settings, tx, recheck));
    handle
}

/// The shortest wait between probes, however often a re-check is asked for.
const MIN_GAP: Duration = Duration::from_millis(500);

async fn run(
    prober: Prober,
    mut live: Live,
    store: Store,
    settings: FingerprintSettings,
    tx: watch::Sender<Option<HashHex>>,
    recheck: Arc<Notify>,
) {
    // After a failure the next probe comes sooner (1 s doubling up to `every`), so that a restarted
    // upstream is described again within seconds of coming back.
    let mut retry = Duration::from_secs(1);
    loop {
        let wait = match live.complete(prober.probe().await).await {
            Ok(print) => {
                retry = Duration::from_secs(1);
                record(&store, print, &tx).await;
                settings.every
            }
            Err(error) => {
                tracing::debug!(%error, "engine fingerprint unavailable; keeping the last one");
                let wait = retry.min(settings.every);
                retry = (retry * 2).min(settings.every);
                wait
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = recheck.notified() => tokio::time::sleep(MIN_GAP).await,
        }
        if tx.is_closed() {
            return;
        }
    }
}

async fn record(store: &Store, print: Fingerprint, tx: &watch::Sender<Option<HashHex>>) {
    let store = store.clone();
    let engine = print.engine.clone();
    let stored = tokio::task::spawn_blocking(move || store.put_fingerprint(&print)).await;
    match stored {
        Ok(Ok(hash)) => {
            tx.send_if_modified(|current| {
                let changed = current.as_deref() != Some(hash.as_str());
                if changed {
                    tracing::info!(%engine, fingerprint = %&hash[..12], "engine fingerprint");
                    *current = Some(hash.clone());
                }
                changed
            });
        }
        Ok(Err(error)) => tracing::warn!(%error, "cannot store the engine fingerprint"),
        Err(error) => tracing::warn!(%error, "fingerprint store task failed"),
    }
}
