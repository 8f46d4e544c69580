//! Context-fidelity sweeps (`ctxscope fidelity`): generated multi-turn conversations with facts planted
//! at chosen depths, asked for at the end, on every target; recall per target x length x depth x turn
//! count, with the golden target beside every cell. [`gen`] builds the conversations, [`run`] asks,
//! [`report`] prints a table, JSON or an HTML chart.

pub mod bisect;
pub mod export;
pub mod gen;
pub mod report;
pub mod run;

pub use gen::{conversation, passes, Probe, SweepConversation};
pub use run::{sweep, Cell, FidelityReport, ProbeAnswer, SweepError, SweepOptions};
