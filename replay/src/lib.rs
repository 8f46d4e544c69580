//! Replay: re-run a captured conversation against one or more targets (this engine under a patch set,
//! or any OpenAI-compatible endpoint), teacher-forced turn by turn, compare every turn with a golden
//! target and with what was captured, score recall probes, and bisect the smallest patch set that
//! still diverges. Reports as a terminal table, stable JSON, or one self-contained HTML file.

pub mod model;
pub mod report;

pub use model::*;
