//! Capture health as `/healthz` reports it: how capture started (on, off, unavailable) and whether
//! store writes are failing now (`degraded`, with the last error), back to `on` after a write succeeds.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Shared by the capture worker (which reports) and the admin port (which shows).
#[derive(Debug)]
pub struct CaptureHealth {
    /// "on", "off", or "unavailable: why", fixed at start.
    started: String,
    failing: AtomicBool,
    reason: Mutex<String>,
    /// Damage found in the store (stays until restart).
    damage: Mutex<Option<String>>,
}

impl CaptureHealth {
    pub fn new(started: impl Into<String>) -> CaptureHealth {
        CaptureHealth {
            started: started.into(),
            failing: AtomicBool::new(false),
            reason: Mutex::new(String::new()),
            damage: Mutex::new(None),
        }
    }

    /// A store write failed: capture is degraded until one succeeds.
    pub fn write_failed(&self, error: &dyn std::fmt::Display) {
        if let Ok(mut reason) = self.reason.lock() {
            *reason = format!("store writes failing: {error}");
        }
        if !self.failing.swap(true, Ordering::Relaxed) {
            tracing::error!(%error, "capture degraded: store writes failing (traffic still flows)");
        }
    }

    /// A store write succeeded.
    pub fn write_succeeded(&self) {
        if self.failing.swap(false, Ordering::Relaxed) {
            tracing::info!("capture recovered: store writes succeed again");
        }
    }

    /// The store was found damaged: degraded until restart, logged and counted.
    pub fn damaged(&self, reason: String) {
        tracing::error!(%reason, "capture store damaged");
        metrics::counter!(crate::metrics::STORE_DAMAGE_TOTAL).increment(1);
        if let Ok(mut damage) = self.damage.lock() {
            *damage = Some(reason);
        }
    }

    /// `("degraded", Some(reason))` while writes fail or after damage was found, else the state
    /// capture started in.
    pub fn status(&self) -> (String, Option<String>) {
        if let Some(damage) = self.damage.lock().ok().and_then(|d| d.clone()) {
            return ("degraded".into(), Some(damage));
        }
        if self.failing.load(Ordering::Relaxed) {
            let reason = self.reason.lock().map(|r| r.clone()).unwrap_or_default();
            return ("degraded".into(), Some(reason));
        }
        (self.started.clone(), None)
    }

    /// The state capture started in (for errors naming why there is no store).
    pub fn started(&self) -> &str {
        &self.started
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn degraded_while_writes_fail_and_on_again_after_one_succeeds() {
        let health = CaptureHealth::new("on");
        assert_eq!(health.status(), ("on".to_string(), None));
        health.write_failed(&"No space left on device");
        let (state, reason) = health.status();
        assert_eq!(state, "degraded");
        assert!(reason.unwrap().contains("No space left"));
        health.write_succeeded();
        assert_eq!(health.status(), ("on".to_string(), None));
    }
}
