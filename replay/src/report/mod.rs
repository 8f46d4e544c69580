//! Replay reports: a terminal table, the JSON report (the serialized [`crate::ReplayReport`]), and a
//! single self-contained HTML file.

mod chart;
mod context;
mod entry;
mod html;
mod json;
mod table;
mod view;

#[cfg(test)]
mod tests;

pub(crate) use chart::colour;
pub use chart::CHART_ID;
pub use context::CONTEXT_TOKENS;
pub use entry::{entry, summary};
pub use html::html;
pub use json::json;
pub use table::{launches, table, WIDTH};
pub use view::escape;
