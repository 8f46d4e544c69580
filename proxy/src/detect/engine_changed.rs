//! `engine_changed`: the turn was served under a different engine fingerprint than the conversation's
//! previous turn (a restart with other settings, another model, a changed patch set). The evidence
//! lists each changed field, old -> new.

use ctxscope_store::{FindingKind, Severity};
use serde_json::{json, Value};

use super::{Context, Draft};

/// Changed fields listed in the evidence; the rest are counted.
const LISTED: usize = 32;

pub(crate) fn finding(cx: &Context<'_>) -> Option<Draft> {
    let turn = cx.obs.turn;
    let new_hash = turn.fingerprint.as_deref()?;
    let previous = cx.previous()?;
    let old_hash = previous.fingerprint.as_deref()?;
    if old_hash == new_hash {
        return None;
    }
    let read = |hash: &str| {
        cx.store.fingerprint(hash).unwrap_or_else(|error| {
            tracing::debug!(%error, "fingerprint unreadable; engine_changed not checked");
            None
        })
    };
    let (old, new) = (read(old_hash)?, read(new_hash)?);
    let changes = old.diff(&new);
    if changes.is_empty() {
        return None;
    }
    let names: Vec<&str> = changes.iter().map(|c| c.field.as_str()).collect();
    let shown = names.iter().take(4).copied().collect::<Vec<_>>().join(", ");
    let more = if names.len() > 4 { format!(" and {} more", names.len() - 4) } else { String::new() };
    let listed: Vec<Value> = changes.iter().take(LISTED).map(|c| json!({"field": c.field, "old": c.old, "new": c.new})).collect();
    Some(Draft {
        kind: FindingKind::EngineChanged,
        severity: Severity::Warning,
        summary: format!("the {} engine changed since turn {}: {shown}{more}", new.engine, previous.index),
        evidence: json!({
            "previous_turn": previous.id,
            "old_fingerprint": old_hash,
            "new_fingerprint": new_hash,
            "engine": new.engine,
            "changed_fields": names.len(),
            "changes": listed,
        }),
        cause: format!("engine_changed:{}:{old_hash}:{new_hash}", turn.conversation),
    })
}
