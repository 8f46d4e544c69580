//! Where a captured turn's findings (and, for sinks that want them, the finished turn) go besides the
//! store and the metrics: the webhook (`alert`) and the OTLP exporter (`otlp`) implement it.

use ctxscope_store::{FindingRecord, TurnRecord};

use super::exchange::Exchange;

/// A destination for findings.
pub trait AlertSink: Send {
    /// Hands one finding over; returns at once.
    fn send(&self, finding: &FindingRecord);

    /// Hands over a stored turn and the findings it raised (each already given to `send`), once the
    /// turn is complete; returns at once. The OTLP exporter's hook; other sinks ignore it.
    fn turn(&self, _exchange: &Exchange, _turn: &TurnRecord, _findings: &[FindingRecord]) {}
}
