//! The bounded hand-off between the hot path and the capture worker. Sending never blocks: a full
//! queue drops the exchange and counts it. The worker is one OS thread (sled is blocking I/O) that
//! drains the queue on shutdown and runs retention between exchanges.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::exchange::Exchange;
use crate::metrics::{self as m, DropReason};

/// Cloned into every connection; cheap.
#[derive(Clone)]
pub struct CaptureSender {
    inner: Option<SyncSender<Exchange>>,
    depth: Arc<AtomicI64>,
    /// Why there is no queue, when capture was wanted but is unavailable.
    unavailable: Option<DropReason>,
}

impl CaptureSender {
    /// Capture switched off by configuration: exchanges are discarded silently.
    pub fn off() -> CaptureSender {
        CaptureSender { inner: None, depth: Arc::default(), unavailable: None }
    }

    /// Capture wanted but impossible (the store would not open): every exchange counts as dropped.
    pub fn unavailable(reason: DropReason) -> CaptureSender {
        CaptureSender { inner: None, depth: Arc::default(), unavailable: Some(reason) }
    }

    pub fn send(&self, exchange: Exchange) {
        let Some(tx) = &self.inner else {
            if let Some(reason) = self.unavailable {
                m::dropped(reason);
            }
            return;
        };
        match tx.try_send(exchange) {
            Ok(()) => {
                let depth = self.depth.fetch_add(1, Ordering::Relaxed) + 1;
                metrics::gauge!(m::CAPTURE_QUEUE_DEPTH).set(depth as f64);
            }
            Err(TrySendError::Full(_)) => m::dropped(DropReason::QueueFull),
            Err(TrySendError::Disconnected(_)) => m::dropped(DropReason::StoreUnavailable),
        }
    }
}

/// How often an idle worker calls [`Sink::idle`].
pub const IDLE_EVERY: Duration = Duration::from_millis(250);

/// Something that consumes exchanges and does periodic upkeep.
pub trait Sink: Send + 'static {
    fn process(&mut self, exchange: Exchange);
    /// Called at least every [`IDLE_EVERY`] while no exchange arrives.
    fn idle(&mut self) {}
    fn upkeep(&mut self) {}
    fn finish(&mut self) {}
}

/// The running worker thread.
pub struct Worker {
    handle: Option<JoinHandle<()>>,
}

/// Starts the worker; it stops once every sender is dropped and the queue is empty.
pub fn spawn(mut sink: impl Sink, capacity: usize, upkeep_every: Duration) -> (CaptureSender, Worker) {
    let (tx, rx) = mpsc::sync_channel::<Exchange>(capacity.max(1));
    let depth = Arc::new(AtomicI64::new(0));
    let worker_depth = depth.clone();
    let handle = std::thread::Builder::new()
        .name("ctxscope-capture".into())
        .spawn(move || {
            let mut next_upkeep = Instant::now() + upkeep_every;
            // Whether exchanges were processed since the queue last ran dry.
            let mut worked = false;
            loop {
                let wait = next_upkeep.saturating_duration_since(Instant::now()).min(IDLE_EVERY);
                match rx.recv_timeout(wait) {
                    Ok(exchange) => {
                        worker_depth.fetch_sub(1, Ordering::Relaxed);
                        sink.process(exchange);
                        worked = true;
                        // The gauge follows the queue down too (0 once drained); set after the work,
                        // so that a sender's older figure cannot outlast it.
                        let depth = worker_depth.load(Ordering::Relaxed).max(0);
                        metrics::gauge!(m::CAPTURE_QUEUE_DEPTH).set(depth as f64);
                    }
                    Err(RecvTimeoutError::Timeout) => {
                        if std::mem::take(&mut worked) {
                            ctxscope_common::scratch::release();
                        }
                        sink.idle();
                    }
                    Err(RecvTimeoutError::Disconnected) => break,
                }
                if Instant::now() >= next_upkeep {
                    sink.upkeep();
                    next_upkeep = Instant::now() + upkeep_every;
                }
            }
            sink.finish();
        })
        .ok();
    let sender = match handle {
        Some(_) => CaptureSender { inner: Some(tx), depth, unavailable: None },
        None => CaptureSender::unavailable(DropReason::StoreUnavailable),
    };
    (sender, Worker { handle })
}

impl Worker {
    /// Waits up to `timeout` for the worker to drain and stop; false if it did not.
    pub fn join(mut self, timeout: Duration) -> bool {
        let Some(handle) = self.handle.take() else { return true };
        let deadline = Instant::now() + timeout;
        while !handle.is_finished() {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        handle.join().is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::exchange::Captured;
    use std::sync::mpsc as std_mpsc;
    use std::sync::Mutex;

    /// A sink that waits for permission before each exchange, so the queue can be made to fill.
    struct Gate {
        go: std_mpsc::Receiver<()>,
        seen: Arc<Mutex<Vec<String>>>,
    }

    impl Sink for Gate {
        fn process(&mut self, exchange: Exchange) {
            let _ = self.go.recv();
            self.seen.lock().unwrap().push(exchange.path);
        }
    }

    fn exchange(path: &str) -> Exchange {
        Exchange::new(ctxscope_store::Endpoint::ChatCompletions, "POST", path, Arc::new(Mutex::new(Captured::default())))
    }

    #[test]
    fn a_full_queue_drops_without_blocking_and_shutdown_drains_the_rest() {
        let (go_tx, go_rx) = std_mpsc::channel();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (sender, worker) = spawn(Gate { go: go_rx, seen: seen.clone() }, 1, Duration::from_secs(3600));
        sender.send(exchange("/a"));
        // Let the worker take /a and block on the gate, so the queue is empty again.
        while sender.depth.load(Ordering::Relaxed) > 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let started = Instant::now();
        sender.send(exchange("/b")); // fills the one slot
        sender.send(exchange("/c")); // dropped: queue full
        assert!(started.elapsed() < Duration::from_millis(100), "send blocked");
        drop(sender);
        for _ in 0..3 {
            let _ = go_tx.send(());
        }
        assert!(worker.join(Duration::from_secs(5)), "worker did not drain and stop");
        assert_eq!(*seen.lock().unwrap(), vec!["/a".to_string(), "/b".to_string()]);
    }
}
