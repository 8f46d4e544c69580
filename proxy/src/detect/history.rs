//! How a request that continues a conversation differs from that conversation's previous turn: a clean
//! extension, a retry of the last exchange, a prefix-breaking edit (a timestamp, an id, whitespace,
//! key order, an inserted message) or dropped history (turns removed, rewritten or summarized).

use ctxscope_store::ToolsDigest;
use serde::Serialize;
use serde_json::Value;

/// One message as the comparison sees it: its hash and its canonical form.
pub struct Message<'a> {
    pub hash: &'a str,
    pub value: &'a Value,
}

/// The kind of a small edit that leaves the meaning but breaks a token prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// Only whitespace differs.
    Whitespace,
    /// Only digits differ: a timestamp, a date, a counter.
    VolatileNumber,
    /// Only a long hex or alphanumeric token differs: a request id, a uuid, a nonce.
    VolatileId,
    /// A message was inserted before the end of the previous history.
    Inserted,
    /// The tool definitions are the same set in a different order.
    ToolsReordered,
    /// The tool definitions changed.
    ToolsChanged,
}

/// Where the prefix broke and how.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Break {
    /// Index of the first message whose rendering differs (0 for tools, which render first).
    pub message: usize,
    /// Character position in that message's text where it first differs.
    pub char: usize,
    pub role: String,
    pub change: Change,
    /// Excerpts around the position, before and after.
    pub before: String,
    pub after: String,
}

/// History that was removed or rewritten.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Dropped {
    /// First message (of the previous turn's history) that is not the same in the request.
    pub first_differing_message: usize,
    /// Indices in the previous history of messages absent from the request.
    pub removed_messages: Vec<usize>,
    /// Indices in the previous history of messages replaced by different content.
    pub rewritten_messages: Vec<usize>,
    /// User turns (user messages) among the removed and rewritten ones.
    pub user_turns_lost: usize,
    pub messages_before: usize,
    pub messages_after: usize,
    /// The request kept the previous reply: the harness continued after compacting.
    pub kept_latest_reply: bool,
    /// The first differing message, before and after (excerpts).
    pub first_before: String,
    pub first_after: String,
}

/// The verdict.
#[derive(Debug, Clone, PartialEq)]
pub enum History {
    Extends,
    /// The last exchange was replaced (the user edited or regenerated it): not a loss.
    Retry,
    PrefixBreak(Break),
    Dropped(Dropped),
}

/// Compares the request with the previous turn's history (its messages followed by its reply).
pub fn compare(previous: &[Message<'_>], request: &[Message<'_>]) -> History {
    let shared = previous.iter().zip(request).take_while(|(a, b)| a.hash == b.hash).count();
    if shared == previous.len() {
        return History::Extends;
    }
    // Sets, not scans: a 20,000-message history against a 20,000-message request is 4e8 comparisons.
    let requested: std::collections::HashSet<&str> = request.iter().map(|m| m.hash).collect();
    let previously: std::collections::HashSet<&str> = previous.iter().map(|m| m.hash).collect();
    let in_request = |hash: &str| requested.contains(hash);
    let in_previous = |hash: &str| previously.contains(hash);
    let (mut removed, mut rewritten, mut minor) = (Vec::new(), Vec::new(), None);
    for (i, old) in previous.iter().enumerate().skip(shared) {
        if in_request(old.hash) {
            continue;
        }
        // The request message at the same position, when it is new, is this one's replacement (only
        // when nothing was removed: a shorter request has shifted positions).
        let in_place = request.len() >= previous.len();
        match request.get(i).filter(|new| in_place && !in_previous(new.hash)) {
            Some(new) => match small_edit(old.value, new.value) {
                Some(change) if minor.is_none() => minor = Some(located(i, old.value, new.value, change)),
                Some(_) => {}
                None => rewritten.push(i),
            },
            None => removed.push(i),
        }
    }
    let last_exchange = previous.len().saturating_sub(2);
    let reply_kept = previous.last().is_some_and(|m| in_request(m.hash));
    let lost: Vec<usize> = removed.iter().chain(&rewritten).copied().collect();
    if lost.is_empty() {
        return History::PrefixBreak(minor.unwrap_or_else(|| inserted(shared, request)));
    }
    if !reply_kept && lost.iter().all(|&i| i >= last_exchange) {
        return History::Retry;
    }
    let user_turns_lost = lost.iter().filter(|&&i| role(previous[i].value) == "user").count();
    History::Dropped(Dropped {
        first_differing_message: shared,
        removed_messages: removed,
        rewritten_messages: rewritten,
        user_turns_lost,
        messages_before: previous.len(),
        messages_after: request.len(),
        kept_latest_reply: reply_kept,
        first_before: excerpt(&text(previous[shared].value), 0),
        first_after: request.get(shared).map(|m| excerpt(&text(m.value), 0)).unwrap_or_default(),
    })
}

/// Compares two turns' tool definitions (the template renders them ahead of every message).
pub fn compare_tools(previous: Option<&ToolsDigest>, request: Option<&ToolsDigest>) -> Option<Break> {
    if previous.map(|t| &t.hash) == request.map(|t| &t.hash) {
        return None;
    }
    let names = |tools: Option<&ToolsDigest>| tools.map(|t| t.names.clone()).unwrap_or_default();
    let (mut before, mut after) = (names(previous), names(request));
    let listed = (before.join(","), after.join(","));
    before.sort();
    after.sort();
    let change = if before == after && previous.is_some() && request.is_some() { Change::ToolsReordered } else { Change::ToolsChanged };
    Some(Break { message: 0, char: 0, role: "tools".into(), change, before: listed.0, after: listed.1 })
}

fn inserted(at: usize, request: &[Message<'_>]) -> Break {
    let value = request.get(at).map(|m| m.value);
    Break {
        message: at,
        char: 0,
        role: value.map(role).unwrap_or_default().to_string(),
        change: Change::Inserted,
        before: String::new(),
        after: value.map(|v| excerpt(&text(v), 0)).unwrap_or_default(),
    }
}

fn located(message: usize, old: &Value, new: &Value, change: Change) -> Break {
    let (a, b) = (text(old), text(new));
    let char = a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count();
    Break { message, char, role: role(new).to_string(), change, before: excerpt(&a, char), after: excerpt(&b, char) }
}

/// The kind of edit when `old` and `new` differ only in something volatile; `None` for real rewrites.
fn small_edit(old: &Value, new: &Value) -> Option<Change> {
    if role(old) != role(new) {
        return None;
    }
    let (a, b) = (text(old), text(new));
    let squeeze = |s: &str| s.split_whitespace().collect::<String>();
    if squeeze(&a) == squeeze(&b) {
        return Some(Change::Whitespace);
    }
    if mask_digits(&a) == mask_digits(&b) {
        return Some(Change::VolatileNumber);
    }
    if mask(&a, looks_like_id) == mask(&b, looks_like_id) {
        return Some(Change::VolatileId);
    }
    None
}

/// Every run of digits replaced by one `0` (dates, times and counters inside words and punctuation).
fn mask_digits(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut in_run = false;
    for c in s.chars() {
        if c.is_ascii_digit() {
            if !in_run {
                out.push('0');
            }
            in_run = true;
        } else {
            out.push(c);
            in_run = false;
        }
    }
    out
}

/// Words (split on anything but alphanumerics and `-`) that `volatile` accepts replaced by `#`.
fn mask(s: &str, volatile: impl Fn(&str) -> bool) -> String {
    let mut out = String::with_capacity(s.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        out.push_str(if !word.is_empty() && volatile(word) { "#" } else { word });
        word.clear();
    };
    for c in s.chars() {
        if c.is_alphanumeric() || c == '-' {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

/// A uuid, a long hex string, or a long token mixing letters and digits.
fn looks_like_id(word: &str) -> bool {
    let digits = word.chars().filter(char::is_ascii_digit).count();
    let hex = word.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
    (word.len() >= 8 && hex && digits > 0) || (word.len() >= 12 && digits >= 2 && word.chars().any(char::is_alphabetic))
}

fn role(message: &Value) -> &str {
    message.get("role").and_then(Value::as_str).unwrap_or("")
}

/// A message's text: its content string, else its content (and tool calls) as JSON.
pub fn text(message: &Value) -> String {
    match message.get("content") {
        Some(Value::String(s)) if message.get("tool_calls").is_none() => s.clone(),
        _ => {
            let mut parts = serde_json::Map::new();
            for key in ["content", "tool_calls", "tool_call_id"] {
                if let Some(v) = message.get(key) {
                    parts.insert(key.into(), v.clone());
                }
            }
            Value::Object(parts).to_string()
        }
    }
}

/// Up to 60 characters around `at`.
pub fn excerpt(text: &str, at: usize) -> String {
    let start = at.saturating_sub(20);
    text.chars().skip(start).take(60).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn conv(messages: &[Value]) -> Vec<(String, Value)> {
        messages
            .iter()
            .map(|m| (ctxscope_store::to_hex(&ctxscope_store::message_hash(m).0), ctxscope_store::canonical_message(m)))
            .collect()
    }

    fn run(previous: &[Value], request: &[Value]) -> History {
        let (p, r) = (conv(previous), conv(request));
        compare(&view(&p), &view(&r))
    }

    fn view(v: &[(String, Value)]) -> Vec<Message<'_>> {
        v.iter().map(|(hash, value)| Message { hash, value }).collect()
    }

    fn m(role: &str, content: &str) -> Value {
        json!({"role": role, "content": content})
    }

    #[test]
    fn head_dropping_and_summaries_are_dropped_history() {
        let previous = [m("system", "S"), m("user", "u1"), m("assistant", "a1"), m("user", "u2"), m("assistant", "a2")];
        // Head dropped, latest reply kept, new question.
        let History::Dropped(d) = run(&previous, &[m("system", "S"), m("user", "u2"), m("assistant", "a2"), m("user", "u3")]) else {
            panic!()
        };
        assert_eq!(d.removed_messages, vec![1, 2]);
        assert_eq!((d.first_differing_message, d.user_turns_lost, d.kept_latest_reply), (1, 1, true));
        // Summarized into one message.
        let summary = [m("system", "S"), m("user", "Summary: the user asked u1 and u2."), m("assistant", "a2"), m("user", "u3")];
        let History::Dropped(d) = run(&previous, &summary) else { panic!() };
        assert_eq!((d.removed_messages, d.rewritten_messages), (vec![1, 2, 3], vec![]));
        // Rewritten in place (same length): the replaced message is counted as rewritten.
        let rewritten =
            [m("system", "S"), m("user", "Summary: u1."), m("assistant", "a1"), m("user", "u2"), m("assistant", "a2"), m("user", "u3")];
        let History::Dropped(d) = run(&previous, &rewritten) else { panic!() };
        assert_eq!(d.rewritten_messages, vec![1]);
    }

    #[test]
    fn volatile_edits_are_prefix_breaks_with_position() {
        let previous = [m("system", "You are helpful. Now: 2026-11-29 13:40:15."), m("user", "u1"), m("assistant", "a1")];
        let request = [m("system", "You are helpful. Now: 2026-11-29 13:41:02."), m("user", "u1"), m("assistant", "a1"), m("user", "u2")];
        let History::PrefixBreak(b) = run(&previous, &request) else { panic!() };
        assert_eq!((b.message, b.change, b.char), (0, Change::VolatileNumber, 37));
        let request = [m("system", "You are helpful.  Now: 2026-11-29 13:40:15."), m("user", "u1"), m("assistant", "a1"), m("user", "u2")];
        assert!(matches!(run(&previous, &request), History::PrefixBreak(Break { change: Change::Whitespace, .. })));
        let previous = [m("system", "request id 9f1c2a7e-55d1-4f0a-b8c3-1d2e3f4a5b6c"), m("user", "u1"), m("assistant", "a1")];
        let request =
            [m("system", "request id 0a9b8c7d-1111-4222-8333-444455556666"), m("user", "u1"), m("assistant", "a1"), m("user", "u2")];
        assert!(matches!(run(&previous, &request), History::PrefixBreak(Break { change: Change::VolatileId, .. })));
    }

    #[test]
    fn retries_and_insertions() {
        let previous = [m("system", "S"), m("user", "u1"), m("assistant", "a1"), m("user", "u2"), m("assistant", "a2")];
        assert_eq!(run(&previous, &[m("system", "S"), m("user", "u1"), m("assistant", "a1"), m("user", "u2 edited")]), History::Retry);
        let inserted = [
            m("system", "S"),
            m("user", "reminder"),
            m("user", "u1"),
            m("assistant", "a1"),
            m("user", "u2"),
            m("assistant", "a2"),
            m("user", "u3"),
        ];
        assert!(matches!(run(&previous, &inserted), History::PrefixBreak(Break { change: Change::Inserted, message: 1, .. })));
    }

    #[test]
    fn tools_reordered_or_changed() {
        let digest = |names: &[&str]| ToolsDigest { hash: names.join("|"), names: names.iter().map(|n| n.to_string()).collect() };
        let (a, b) = (digest(&["f", "g"]), digest(&["g", "f"]));
        assert_eq!(compare_tools(Some(&a), Some(&b)).unwrap().change, Change::ToolsReordered);
        assert_eq!(compare_tools(Some(&a), None).unwrap().change, Change::ToolsChanged);
        assert!(compare_tools(Some(&a), Some(&a)).is_none());
    }
}
