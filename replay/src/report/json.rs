//! The JSON report: the [`ReplayReport`] itself, pretty-printed. Its schema is the type (versioned by
//! `schema`, see [`crate::REPORT_SCHEMA`]); this file only fixes how it is written.

use crate::model::ReplayReport;

/// The report as pretty JSON, newline-terminated.
pub fn json(report: &ReplayReport) -> String {
    // Serializing plain structs with string keys cannot fail; the fallback keeps this infallible anyway.
    let mut out =
        serde_json::to_string_pretty(report).unwrap_or_else(|e| format!("{{\"error\": {}}}", serde_json::Value::String(e.to_string())));
    out.push('\n');
    out
}
