//! Replay: re-run a captured conversation against one or more targets (this engine under a patch set,
//! or any OpenAI-compatible endpoint), teacher-forced turn by turn, compare every turn with a golden
//! target and with what was captured, score recall probes, and bisect the smallest patch set that
//! still diverges. Reports as a terminal table, stable JSON, or one self-contained HTML file.

pub mod fidelity;
pub mod model;
pub mod report;

pub mod auto_probes;
pub mod bisect;
pub mod client;
mod collect;
pub mod compare;
pub mod conversation;
pub mod job;
pub mod launch;
pub mod metric;
pub mod progress;
pub mod run;
pub mod target;

pub use bisect::{bisect, BisectError};
pub use client::{ChatRequest, ClientError, TargetClient};
pub use compare::{divergence, text_match, DEFAULT_NEAR_TIE};
#[cfg(any(test, feature = "test-support"))]
pub use conversation::replay_test_conversation;
pub use conversation::{Conversation, TurnRequest};
pub use launch::replay;
pub use metric::{score, Metric, MetricError};
pub use model::*;
pub use progress::StderrProgress;
pub use run::{Endpoints, Observer, Plan, PlanError, Quiet, ReplayOptions};
pub use target::{TargetError, GRAMMAR};
