//! A turn's request against the history of the turn it continues, for the diff view: each message's
//! fate (kept, appended, dropped, rewritten, edited) from `detect::history`'s comparison, and the
//! character-level diff of each rewritten or edited message at the place the prefix broke.

use std::collections::HashSet;

use ctxscope_store::{to_hex, Hash, Relation, Store, StoreError, TurnRecord};
use serde_json::{json, Value};

use crate::detect::history::{self, History, Message};

/// Characters of context kept around a change.
const CONTEXT: usize = 160;
/// Longest message text sent whole.
const MAX_TEXT: usize = 8000;
/// The largest changed middle (old x new characters) diffed character by character; beyond it the
/// change is shown as one replaced span.
const MAX_CELLS: usize = 4_000_000;

/// The turn this one continues, from its relation (`None` for the first turn of a conversation).
pub fn previous_turn(turn: &TurnRecord) -> Option<u64> {
    match turn.relation {
        Relation::New => None,
        Relation::Extend { parent_turn } => Some(parent_turn),
        Relation::Regenerate { turn } => Some(turn),
        Relation::Branch { turn, .. } => Some(turn),
        Relation::Diverged { previous_turn, .. } => Some(previous_turn),
    }
}

/// The diff document for turn `id` (see docs/ui.md).
pub fn turn_diff(store: &Store, id: u64) -> Result<Value, StoreError> {
    let turn = store.turn(id)?.ok_or_else(|| StoreError::NotFound(format!("turn {id}")))?;
    let previous_record = match previous_turn(&turn) {
        Some(p) => store.turn(p)?,
        None => None,
    };
    let view = |list: Vec<(Hash, Option<Value>)>| -> Vec<(String, Value)> {
        list.into_iter().map(|(hash, value)| (to_hex(&hash), value.unwrap_or(Value::Null))).collect()
    };
    let new = view(store.turn_message_values(&turn)?);
    let old = match &previous_record {
        Some(p) => view(store.turn_history(p)?),
        None => Vec::new(),
    };
    let rule = crate::detect::rule_for(&turn);
    let verdict = if previous_record.is_some() { Some(history::compare(&messages(&old), &messages(&new), rule)) } else { None };
    let tools = history::compare_tools(previous_record.as_ref().and_then(|p| p.tools.as_ref()), turn.tools.as_ref());
    Ok(document(&turn, previous_record.as_ref(), &old, &new, verdict, tools))
}

fn messages(v: &[(String, Value)]) -> Vec<Message<'_>> {
    v.iter().map(|(hash, value)| Message { hash, value }).collect()
}

fn document(
    turn: &TurnRecord,
    previous: Option<&TurnRecord>,
    old: &[(String, Value)],
    new: &[(String, Value)],
    verdict: Option<History>,
    tools: Option<history::Break>,
) -> Value {
    let in_new: HashSet<&str> = new.iter().map(|(h, _)| h.as_str()).collect();
    let in_old: HashSet<&str> = old.iter().map(|(h, _)| h.as_str()).collect();
    let (kind, detail, edits, summary_at, edited) = match &verdict {
        None => ("first_turn", Value::Null, Vec::new(), None, None),
        Some(History::Extends) => ("extends", Value::Null, Vec::new(), None, None),
        Some(History::Retry) => ("retry", Value::Null, Vec::new(), None, None),
        Some(History::PrefixBreak(b)) => {
            ("prefix_break", json!(b), Vec::new(), None, (b.change != history::Change::Inserted).then_some(b.message))
        }
        Some(History::Dropped(d)) => ("dropped", json!(d), d.edits.clone(), d.summary.as_ref().map(|s| s.at), None),
        Some(History::ByDesign(d)) => ("by_design", json!(d), d.edits.clone(), None, None),
    };
    // Each earlier message's fate, and each request message's origin, from the edits.
    let old_status = |i: usize, hash: &str| -> &'static str {
        if let Some(e) = edits.iter().find(|e| e.message == i) {
            return edit_status(e.edit);
        }
        if in_new.contains(hash) {
            "kept"
        } else if edited == Some(i) {
            "edited"
        } else if kind == "retry" {
            "replaced"
        } else if kind == "dropped" {
            "dropped"
        } else {
            "kept"
        }
    };
    let new_status = |j: usize, hash: &str| -> &'static str {
        if summary_at == Some(j) {
            "summary"
        } else if let Some(e) = edits.iter().find(|e| e.at == Some(j)) {
            match e.edit {
                history::EditKind::ReasoningStripped | history::EditKind::MediaStripped => edit_status(e.edit),
                _ => "rewrite",
            }
        } else if in_old.contains(hash) {
            "kept"
        } else if edited == Some(j) {
            "edited"
        } else {
            "appended"
        }
    };
    let entry = |i: usize, (hash, value): &(String, Value), status: &str| {
        let text = history::text(value);
        let chars = text.chars().count();
        json!({"index": i, "hash": hash, "role": value.get("role").and_then(Value::as_str).unwrap_or(""), "status": status,
               "chars": chars, "text": text.chars().take(MAX_TEXT).collect::<String>(), "truncated": chars > MAX_TEXT})
    };
    let before: Vec<Value> = old.iter().enumerate().map(|(i, m)| entry(i, m, old_status(i, &m.0))).collect();
    let after: Vec<Value> = new.iter().enumerate().map(|(j, m)| entry(j, m, new_status(j, &m.0))).collect();
    // Character diffs: the edited message, every rewritten one, and for dropped history the first
    // differing position when both sides hold new content there.
    // Character diffs: the edited message of a prefix break, and every message edited in place.
    let mut pairs: Vec<(usize, usize)> = edited.map(|i| (i, i)).into_iter().collect();
    pairs.extend(edits.iter().filter(|e| !matches!(e.edit, history::EditKind::Removed)).filter_map(|e| Some((e.message, e.at?))));
    let changes: Vec<Value> = pairs
        .iter()
        .filter_map(|&(i, j)| Some((i, j, old.get(i)?, new.get(j)?)))
        .map(|(i, j, (_, a), (_, b))| json!({"message": i, "at": j, "role": b.get("role").and_then(Value::as_str).unwrap_or(""), "diff": char_diff(&history::text(a), &history::text(b))}))
        .collect();
    json!({
        "turn": turn.id, "conversation": turn.conversation, "index": turn.index, "relation": turn.relation,
        "capture": turn.capture, "previous_capture": previous.map(|p| p.capture),
        "previous_turn": previous.map(|p| p.id), "previous_conversation": previous.map(|p| p.conversation),
        "verdict": kind, "detail": detail, "tools": tools, "before": before, "after": after, "changes": changes,
    })
}

/// How an earlier message's edit reads in the diff view.
fn edit_status(edit: history::EditKind) -> &'static str {
    match edit {
        history::EditKind::Removed => "dropped",
        history::EditKind::Rewritten => "rewritten",
        history::EditKind::Truncated => "truncated",
        history::EditKind::Cleared => "cleared",
        history::EditKind::ReasoningStripped => "reasoning_stripped",
        history::EditKind::MediaStripped => "media_stripped",
    }
}

/// The first differing character, then the changed middle diffed character by character, with
/// [`CONTEXT`] characters of unchanged text on each side.
pub fn char_diff(a: &str, b: &str) -> Value {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let prefix = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let max_suffix = a.len().min(b.len()) - prefix;
    let suffix = a.iter().rev().zip(b.iter().rev()).take(max_suffix).take_while(|(x, y)| x == y).count();
    let (mid_a, mid_b) = (&a[prefix..a.len() - suffix], &b[prefix..b.len() - suffix]);
    let mut ops = Vec::new();
    let lead_from = prefix.saturating_sub(CONTEXT);
    push(&mut ops, "eq", &a[lead_from..prefix]);
    if mid_a.len() * mid_b.len() <= MAX_CELLS {
        for (op, run) in lcs_runs(mid_a, mid_b) {
            push(&mut ops, op, &run);
        }
    } else {
        push(&mut ops, "del", mid_a);
        push(&mut ops, "ins", mid_b);
    }
    let tail_to = (a.len() - suffix + CONTEXT).min(a.len());
    push(&mut ops, "eq", &a[a.len() - suffix..tail_to]);
    json!({"at_char": prefix, "skipped_before": lead_from, "skipped_after": a.len() - tail_to, "ops": ops})
}

fn push(ops: &mut Vec<Value>, op: &str, chars: &[char]) {
    if !chars.is_empty() {
        ops.push(json!({"op": op, "text": chars.iter().collect::<String>()}));
    }
}

/// Runs of equal, deleted and inserted characters from a longest-common-subsequence table.
fn lcs_runs(a: &[char], b: &[char]) -> Vec<(&'static str, Vec<char>)> {
    let (n, m) = (a.len(), b.len());
    let mut table = vec![0u32; (n + 1) * (m + 1)];
    let at = |i: usize, j: usize| i * (m + 1) + j;
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            table[at(i, j)] = if a[i] == b[j] { table[at(i + 1, j + 1)] + 1 } else { table[at(i + 1, j)].max(table[at(i, j + 1)]) };
        }
    }
    let mut runs: Vec<(&'static str, Vec<char>)> = Vec::new();
    let mut add = |op: &'static str, c: char| match runs.last_mut() {
        Some((last, run)) if *last == op => run.push(c),
        _ => runs.push((op, vec![c])),
    };
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            add("eq", a[i]);
            i += 1;
            j += 1;
        } else if i < n && (j == m || table[at(i + 1, j)] >= table[at(i, j + 1)]) {
            add("del", a[i]);
            i += 1;
        } else {
            add("ins", b[j]);
            j += 1;
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(diff: &Value) -> String {
        diff["ops"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| match o["op"].as_str().unwrap() {
                "eq" => o["text"].as_str().unwrap().to_string(),
                op => format!("[{op}:{}]", o["text"].as_str().unwrap()),
            })
            .collect()
    }

    #[test]
    fn the_changed_characters_are_exact() {
        let d = char_diff("Now: 2026-11-29 13:40:15.", "Now: 2026-11-29 13:41:02.");
        assert_eq!(d["at_char"], 20);
        // Both texts come back from the ops: equal and deleted runs give the old, equal and inserted the new.
        let side = |skip: &str| -> String {
            d["ops"].as_array().unwrap().iter().filter(|o| o["op"] != skip).map(|o| o["text"].as_str().unwrap()).collect()
        };
        assert_eq!((side("ins"), side("del")), ("Now: 2026-11-29 13:40:15.".to_string(), "Now: 2026-11-29 13:41:02.".to_string()));
        assert_eq!(render(&d), "Now: 2026-11-29 13:4[del:0:]1[del:5][ins::02].");
        assert_eq!(render(&char_diff("a b", "a  b")), "a [ins: ]b");
        let long = "x".repeat(500);
        let d = char_diff(&format!("{long}A{long}"), &format!("{long}B{long}"));
        assert_eq!((d["skipped_before"].as_u64(), d["skipped_after"].as_u64()), (Some(340), Some(340)));
    }
}
