//! The report arranged for display, shared by the terminal table and the HTML page: targets golden
//! first, the turns that ran, one cell's text per metric, per-target summaries, probe rows and dates.
//! Both renderers read the same numbers through here, so the table and the page never disagree.

use crate::model::{Divergence, Outcome, ProbeResult, ProbeSpec, ReplayReport, Reply, TextMatch, TurnResult};

/// Target names in display order: the golden target first, then `report.targets` in order, then any
/// name that only appears in the results.
pub(crate) fn target_order(report: &ReplayReport) -> Vec<&str> {
    let mut names: Vec<&str> = vec![report.golden.as_str()];
    let listed = report.targets.iter().map(|t| t.name.as_str());
    let seen = report.results.iter().map(|r| r.target.as_str());
    for name in listed.chain(seen) {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// The turns with at least one result, ascending (an interrupted run keeps only what finished).
pub(crate) fn turns(report: &ReplayReport) -> Vec<u32> {
    let mut turns: Vec<u32> = report.results.iter().map(|r| r.turn).collect();
    turns.sort_unstable();
    turns.dedup();
    turns
}

pub(crate) fn result<'a>(report: &'a ReplayReport, turn: u32, target: &str) -> Option<&'a TurnResult> {
    report.results.iter().find(|r| r.turn == turn && r.target == target)
}

/// Cuts `s` to at most `max` characters, ending with `…` when it was cut; newlines become spaces.
pub(crate) fn clip(s: &str, max: usize) -> String {
    let flat: String = s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    if flat.chars().count() <= max {
        return flat;
    }
    let mut out: String = flat.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// `=` when exact, else `≠@pos (m=margin, tie)` with what is known.
pub(crate) fn diff_cell(d: &Divergence) -> String {
    if d.exact {
        return "=".into();
    }
    let mut s = String::from("≠");
    if let Some(pos) = d.first_diff {
        s.push_str(&format!("@{pos}"));
    }
    let mut notes = Vec::new();
    if let Some(m) = d.margin_at_diff {
        notes.push(format!("m={m:.2}"));
    }
    if d.near_tie {
        notes.push("tie".into());
    }
    if !notes.is_empty() {
        s.push_str(&format!(" ({})", notes.join(", ")));
    }
    s
}

pub(crate) fn percent(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

pub(crate) fn kl_cell(d: &Divergence) -> String {
    match d.kl_topk {
        Some(kl) if kl != 0.0 && kl.abs() < 0.001 => format!("{kl:.1e}"),
        Some(kl) => format!("{kl:.3}"),
        None => "—".into(),
    }
}

/// `prompt/cached` tokens, `?` where the target did not say.
pub(crate) fn tokens_cell(reply: &Reply) -> String {
    let n = |x: Option<u64>| x.map_or_else(|| "?".to_string(), |v| v.to_string());
    format!("{}/{}", n(reply.prompt_tokens), n(reply.cached_tokens))
}

/// `=` when the replay matches the capture, else `common-prefix/captured-length` in characters.
pub(crate) fn captured_cell(m: Option<&TextMatch>) -> String {
    match m {
        Some(m) if m.exact => "=".into(),
        Some(m) => format!("{}/{}", m.common_prefix_chars, m.captured_chars),
        None => "—".into(),
    }
}

/// The failure in a few words: the HTTP status when there is one, then the error's first line.
pub(crate) fn failure(error: &str, status: Option<u16>) -> String {
    let first = error.lines().next().unwrap_or("").trim();
    match status {
        Some(code) => format!("{code} {first}"),
        None => first.to_string(),
    }
}

/// One target's totals over the run.
pub(crate) struct TargetSummary<'a> {
    pub name: &'a str,
    pub golden: bool,
    pub turns: usize,
    pub failed: usize,
    /// Turns exactly equal to golden (not counted for the golden target itself).
    pub exact: usize,
    pub mean_agreement: Option<f64>,
    pub probes_passed: usize,
    pub probes: usize,
}

pub(crate) fn summaries(report: &ReplayReport) -> Vec<TargetSummary<'_>> {
    target_order(report)
        .into_iter()
        .map(|name| {
            let rows: Vec<&TurnResult> = report.results.iter().filter(|r| r.target == name).collect();
            let agreements: Vec<f64> = rows.iter().filter_map(|r| r.vs_golden.as_ref()).map(|d| d.agreement).collect();
            let probes: Vec<&ProbeResult> = rows.iter().flat_map(|r| &r.probes).collect();
            TargetSummary {
                name,
                golden: name == report.golden,
                turns: rows.len(),
                failed: rows.iter().filter(|r| matches!(r.outcome, Outcome::Failed { .. })).count(),
                exact: rows.iter().filter(|r| r.vs_golden.as_ref().is_some_and(|d| d.exact)).count(),
                mean_agreement: (!agreements.is_empty()).then(|| agreements.iter().sum::<f64>() / agreements.len() as f64),
                probes_passed: probes.iter().filter(|p| p.passed).count(),
                probes: probes.len(),
            }
        })
        .collect()
}

/// One probe as asked of every target: its spec and each target's result (in `target_order`).
pub(crate) struct ProbeRow<'a> {
    pub spec: &'a ProbeSpec,
    pub results: Vec<Option<&'a ProbeResult>>,
}

/// Every distinct probe, in turn order, with each target's result.
pub(crate) fn probe_rows(report: &ReplayReport) -> Vec<ProbeRow<'_>> {
    let mut specs: Vec<&ProbeSpec> = Vec::new();
    for p in report.results.iter().flat_map(|r| &r.probes) {
        if !specs.contains(&&p.probe) {
            specs.push(&p.probe);
        }
    }
    specs.sort_by_key(|s| s.after_turn);
    let order = target_order(report);
    specs
        .into_iter()
        .map(|spec| ProbeRow {
            spec,
            results: order
                .iter()
                .map(|name| report.results.iter().filter(|r| r.target == *name).flat_map(|r| &r.probes).find(|p| &p.probe == spec))
                .collect(),
        })
        .collect()
}

/// `pass`, `FAIL`, `ERR` (the probe's request failed) or `—` (not asked of this target).
pub(crate) fn probe_cell(p: Option<&ProbeResult>) -> &'static str {
    match p {
        None => "—",
        Some(p) if p.passed => "pass",
        Some(ProbeResult { outcome: Outcome::Failed { .. }, .. }) => "ERR",
        Some(_) => "FAIL",
    }
}

/// `a, b, c`, or `∅` for the empty set.
pub(crate) fn patch_set(patches: &[String]) -> String {
    if patches.is_empty() {
        "∅".into()
    } else {
        patches.join(", ")
    }
}

/// `2024-05-01 12:34:56 UTC` from Unix milliseconds (proleptic Gregorian, no time-zone database).
pub(crate) fn utc(unix_ms: u64) -> String {
    format!("{} UTC", ctxscope_common::civil::datetime(unix_ms / 1000))
}

/// Wall time of the run, `12.3 s`.
pub(crate) fn duration(report: &ReplayReport) -> String {
    let ms = report.finished_unix_ms.saturating_sub(report.started_unix_ms);
    format!("{:.1} s", ms as f64 / 1000.0)
}

/// Escapes text for HTML element content and quoted attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_formats_known_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_714_566_896_789), "2024-05-01 12:34:56 UTC");
    }

    #[test]
    fn clip_cuts_on_characters_and_flattens_newlines() {
        assert_eq!(clip("héllo\nworld", 20), "héllo world");
        assert_eq!(clip("≠≠≠≠≠≠", 4), "≠≠≠…");
    }
}
