//! A finished report as the store keeps it: a [`ReplayEntry`] with its one-line summary, made the
//! same way by the CLI and by a replay started from the UI.

use ctxscope_store::ReplayEntry;

use crate::ReplayReport;

/// "3 target(s), 12 turn(s), bisect culprit kv_fp8 in 5 replays", for listings.
pub fn summary(report: &ReplayReport) -> String {
    let mut text = format!("{} target(s), {} turn(s)", report.targets.len(), report.turns);
    if let Some(bisect) = &report.bisect {
        let culprit = if bisect.culprit.is_empty() { "none".to_string() } else { bisect.culprit.join("+") };
        text.push_str(&format!(", bisect culprit {culprit} in {} replays", bisect.replays_run));
    }
    if report.interrupted {
        text.push_str(", interrupted");
    }
    text
}

/// The store's entry for a report (the whole report inside).
pub fn entry(report: &ReplayReport) -> Result<ReplayEntry, serde_json::Error> {
    Ok(ReplayEntry {
        id: report.id,
        conversation: report.conversation,
        started_unix_ms: report.started_unix_ms,
        finished_unix_ms: report.finished_unix_ms,
        targets: report.targets.iter().map(|t| t.name.clone()).collect(),
        summary: summary(report),
        report: serde_json::to_value(report)?,
    })
}
