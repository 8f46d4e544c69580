//! Alert sinks: where findings (and, for sinks that want them, finished turns) go besides the store
//! and the metrics. `send` and `turn` never block the capture worker: a sink queues or drops (and
//! counts what it drops).

mod gate;
mod payload;
pub mod webhook;

pub use crate::capture::sink::AlertSink;
