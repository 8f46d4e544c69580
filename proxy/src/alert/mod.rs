//! Alert sinks: where findings (and, for sinks that want them, finished turns) go besides the store
//! and the metrics. `send` and `turn` never block the capture worker: a sink queues or drops (and
//! counts what it drops).

mod gate;
mod payload;
pub mod webhook;

use ctxscope_store::{FindingRecord, TurnRecord};

use crate::capture::exchange::Exchange;

/// A destination for findings.
pub trait AlertSink: Send {
    /// Hands one finding over; returns at once.
    fn send(&self, finding: &FindingRecord);

    /// Hands over a stored turn and the findings it raised (each already given to `send`), once the
    /// turn is complete; returns at once. The OTLP exporter's hook; other sinks ignore it.
    fn turn(&self, _exchange: &Exchange, _turn: &TurnRecord, _findings: &[FindingRecord]) {}
}
