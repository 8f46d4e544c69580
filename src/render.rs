//! Terminal tables for the inspection commands (the `--json` forms print the records themselves).

use std::fmt::Write;

use ctxscope_store::{Composition, ConversationDetail, ConversationRecord, FindingRecord, Parts, Relation, ReplayEntry, TurnRecord};

pub fn conversations(list: &[ConversationRecord]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{:>20}  {:>5}  {:<24}  {:<20}  NOTE", "ID", "TURNS", "MODEL", "UPDATED (UTC)");
    for c in list {
        let mut note = match (&c.name, &c.branch_of) {
            (Some(name), _) => format!("name={name}"),
            (None, Some(b)) => format!("branch of {} at turn {} ({} messages shared)", b.conversation, b.turn, b.shared_messages),
            _ => String::new(),
        };
        if !c.capture.is_full() {
            note = format!("capture={} {note}", c.capture).trim_end().to_string();
        }
        let model = c.model.clone().unwrap_or_else(|| "-".into());
        let _ = writeln!(out, "{:>20}  {:>5}  {:<24}  {:<20}  {}", c.id, c.turns, clip(&model, 24), time(c.updated_unix_ms), note);
    }
    if list.is_empty() {
        out.push_str("(no conversations captured yet)\n");
    }
    out
}

pub fn conversation(detail: &ConversationDetail) -> String {
    let c = &detail.conversation;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "conversation {}  upstream {}  model {}  turns {}  capture {}",
        c.id,
        c.upstream,
        c.model.as_deref().unwrap_or("-"),
        c.turns,
        c.capture
    );
    match c.capture {
        ctxscope_store::CaptureLevel::Full => {}
        ctxscope_store::CaptureLevel::Redacted => {
            let _ = writeln!(out, "captured with --capture redacted: secrets and personal data in its text are masked ([redacted:KIND])");
        }
        ctxscope_store::CaptureLevel::Hashes => {
            let _ = writeln!(out, "captured with --capture hashes: no message or reply text was stored (hashes, counts and timings only)");
        }
    }
    if let Some(b) = &c.branch_of {
        let _ = writeln!(out, "branch of conversation {} at turn {} ({} messages shared)", b.conversation, b.turn, b.shared_messages);
    }
    let _ = writeln!(
        out,
        "{:>3}  {:<14}  {:>6}  {:>4}  {:>8}  {:>8}  {:>8}  {:>8}  {:>9}  {:<10}  REPLY / ERROR",
        "#", "RELATION", "STATUS", "MSGS", "LOCAL", "PROMPT", "CACHED", "TTFB_MS", "TOTAL_MS", "FINISH"
    );
    for view in &detail.turns {
        let t = &view.turn;
        let _ = writeln!(
            out,
            "{:>3}  {:<14}  {:>6}  {:>4}  {:>8}  {:>8}  {:>8}  {:>8}  {:>9}  {:<10}  {}",
            t.index,
            relation(&t.relation),
            t.status,
            t.message_count,
            opt(t.local_tokens.as_ref().map(|l| l.prompt)),
            opt(t.usage.as_ref().and_then(|u| u.prompt_tokens)),
            opt(t.usage.as_ref().and_then(|u| u.cached_tokens)),
            ms(t.timing.ttfb_us),
            ms(Some(t.timing.total_us)),
            clip(t.finish_reason.as_deref().unwrap_or("-"), 10),
            summary(t),
        );
    }
    out.push_str(&fingerprints(detail));
    out.push_str(&context(&ctxscope_proxy::detect::context_report::context_report(detail)));
    out.push_str(&budget(detail));
    if !detail.findings.is_empty() {
        let _ = writeln!(out, "\nfindings:");
        out.push_str(&findings(&detail.findings));
    }
    out
}

/// The context report as a table: per turn, the messages the model could see of each kind against
/// those ever said (`visible/ever`), and the share of characters still visible.
fn context(report: &ctxscope_proxy::detect::context_report::ContextReport) -> String {
    let shown: Vec<&str> =
        report.kinds.iter().copied().filter(|k| report.turns.iter().any(|t| t.ever.get(k).is_some_and(|c| c.messages > 0))).collect();
    let mut out = String::from("\ncontext (messages the model could see / ever said, per kind):\n");
    let _ = write!(out, "{:>3}", "#");
    for kind in &shown {
        let _ = write!(out, "  {kind:>15}");
    }
    let _ = writeln!(out, "  {:>8}", "VISIBLE");
    for t in &report.turns {
        let _ = write!(out, "{:>3}", t.index);
        for kind in &shown {
            let count = |side: &std::collections::BTreeMap<&str, ctxscope_proxy::detect::context_report::Count>| {
                side.get(kind).map_or(0, |c| c.messages)
            };
            let _ = write!(out, "  {:>15}", format!("{}/{}", count(&t.visible), count(&t.ever)));
        }
        let _ = writeln!(out, "  {:>7.1}%", t.visible_share * 100.0);
    }
    out
}

/// Each turn's prompt tokens by part (the parts any turn has), and the prompt against the context
/// limit: "N of LIMIT tokens (P%)", marked `! near the limit` within 10% of it (or past it).
/// Nothing when no turn has a composition (turns captured before they were recorded).
fn budget(detail: &ConversationDetail) -> String {
    let turns: Vec<(&TurnRecord, &Composition)> =
        detail.turns.iter().filter_map(|v| v.turn.composition.as_ref().map(|c| (&v.turn, c))).collect();
    if turns.is_empty() {
        return String::new();
    }
    let shown: Vec<&str> = Parts::NAMES.into_iter().filter(|p| turns.iter().any(|(_, c)| c.parts.get(p) > 0)).collect();
    let mut out = String::from("\nbudget (prompt tokens by part; ~ estimated):\n");
    let _ = write!(out, "{:>3}  {:<13}", "#", "METHOD");
    for part in &shown {
        let _ = write!(out, "  {part:>12}");
    }
    let _ = writeln!(out, "  AGAINST THE CONTEXT LIMIT");
    for (t, c) in turns {
        let method = format!("{}{}", c.method, if c.estimated { " ~" } else { "" });
        let _ = write!(out, "{:>3}  {:<13}", t.index, method);
        for part in &shown {
            let _ = write!(out, "  {:>12}", c.parts.get(part));
        }
        let against = match (&c.limit, c.pressure()) {
            (Some(limit), Some(pressure)) => {
                let near = if c.near_limit() { "  ! near the limit" } else { "" };
                format!("{} of {} tokens ({:.1}%){near}", c.total, limit.tokens, pressure * 100.0)
            }
            _ => format!("{} tokens (limit unknown)", c.total),
        };
        let _ = writeln!(out, "  {against}");
    }
    if let Some(limit) = detail.turns.iter().rev().find_map(|v| v.turn.composition.as_ref()?.limit.as_ref()) {
        let _ = writeln!(out, "context limit {} tokens, from {}", limit.tokens, limit.source);
    }
    out
}

/// Which engine fingerprint served which turns ("engine fingerprint 1a2b3c4d5e6f: turns 0-1"), in
/// runs; nothing when no turn has one.
fn fingerprints(detail: &ConversationDetail) -> String {
    let mut runs: Vec<(&str, u32, u32)> = Vec::new();
    for t in detail.turns.iter().map(|v| &v.turn) {
        let Some(print) = t.fingerprint.as_deref() else { continue };
        match runs.last_mut() {
            Some((last, _, end)) if *last == print => *end = t.index,
            _ => runs.push((print, t.index, t.index)),
        }
    }
    let mut out = String::new();
    for (print, start, end) in runs {
        let turns = if start == end { format!("turn {start}") } else { format!("turns {start}-{end}") };
        let _ = writeln!(out, "engine fingerprint {}: {turns}", &print[..print.len().min(12)]);
    }
    out
}

pub fn findings(list: &[FindingRecord]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>20}  {:<20}  {:<19}  {:<8}  {:>20}  {:>4}  SUMMARY",
        "ID", "KIND", "TIME (UTC)", "SEVERITY", "CONVERSATION", "TURN"
    );
    for f in list {
        let _ = writeln!(
            out,
            "{:>20}  {:<20}  {:<19}  {:<8}  {:>20}  {:>4}  {}",
            f.id,
            f.kind.as_str(),
            time(f.time_unix_ms),
            f.severity.as_str(),
            f.conversation,
            f.turn_index,
            f.summary
        );
    }
    if list.is_empty() {
        out.push_str("(no findings)\n");
    }
    out
}

pub fn replays(list: &[ReplayEntry]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{:>14}  {:>20}  {:<19}  {:>7}  SUMMARY", "REPLAY", "CONVERSATION", "STARTED (UTC)", "SECONDS");
    for r in list {
        let seconds = r.finished_unix_ms.saturating_sub(r.started_unix_ms) as f64 / 1000.0;
        let _ = writeln!(
            out,
            "{:>14}  {:>20}  {:<19}  {:>7.1}  {} [{}]",
            r.id,
            r.conversation,
            time(r.started_unix_ms),
            seconds,
            r.summary,
            r.targets.join(", ")
        );
    }
    if list.is_empty() {
        out.push_str("(no replays yet)\n");
    }
    out
}

fn relation(r: &Relation) -> String {
    match r {
        Relation::New => "new".into(),
        Relation::Extend { .. } => "extend".into(),
        Relation::Regenerate { .. } => "regenerate".into(),
        Relation::Branch { shared_messages, .. } => format!("branch@{shared_messages}"),
        Relation::Diverged { shared_messages, .. } => format!("diverged@{shared_messages}"),
    }
}

fn summary(t: &TurnRecord) -> String {
    match &t.error {
        Some(e) => format!("ERROR {}", clip(e, 70)),
        None if t.capture == ctxscope_store::CaptureLevel::Hashes => "(text not stored: --capture hashes)".into(),
        None => clip(&t.reply_text.replace('\n', " "), 70),
    }
}

fn opt(v: Option<u64>) -> String {
    v.map_or("-".into(), |v| v.to_string())
}

fn ms(us: Option<u64>) -> String {
    us.map_or("-".into(), |us| format!("{:.1}", us as f64 / 1000.0))
}

fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut out: String = s.chars().take(n.saturating_sub(1)).collect();
        out.push('…');
        out
    }
}

/// `YYYY-MM-DD HH:MM:SS` in UTC from Unix milliseconds.
fn time(unix_ms: u64) -> String {
    ctxscope_common::civil::datetime(unix_ms / 1000)
}

#[cfg(test)]
mod tests {
    #[test]
    fn time_formats_utc() {
        assert_eq!(super::time(0), "1970-01-01 00:00:00");
        assert_eq!(super::time(1_764_415_200_000), "2025-11-29 11:20:00");
    }
}
