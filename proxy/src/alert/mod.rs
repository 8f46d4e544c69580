//! Alert sinks: where findings go besides the store and the metrics. `send` never blocks the capture
//! worker: a sink queues or drops (and counts what it drops).

mod gate;
mod payload;
pub mod webhook;

use ctxscope_store::FindingRecord;

/// A destination for findings.
pub trait AlertSink: Send {
    /// Hands one finding over; returns at once.
    fn send(&self, finding: &FindingRecord);
}
