//! How a request that continues a conversation differs from that conversation's previous turn: a clean
//! extension, a retry of the last exchange, a prefix-breaking edit (a timestamp, an id, whitespace,
//! key order, an inserted message) or dropped history, named by its cause: compaction (a summary in
//! place of turns), windowed (the oldest turns gone), pruned (messages removed from the middle or
//! cleared), rewritten, truncated in place, media stripped, reasoning dropped where the model's format
//! needs it. The alignment is in [`super::align`], what messages are made of in [`super::anatomy`].

use std::collections::BTreeMap;

use ctxscope_formats::template::{Keep, ReasoningRule};
use ctxscope_store::ToolsDigest;
use serde::Serialize;
use serde_json::Value;

use super::{align, anatomy, markers};

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
    /// A message replaced in place whose earlier text was not stored (`--capture hashes`), or whose
    /// change lies inside masked text (`--capture redacted`): rewritten, or only a clock or an id
    /// changed, cannot be told apart.
    Withheld,
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

/// How the harness edited the history, the most telling first when several apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// A run of turns replaced by a summary message.
    Compaction,
    /// The oldest turns dropped, the rest kept (keep the last N).
    Windowed,
    /// Messages removed from the middle, or their content cleared in place (old tool results).
    Pruned,
    /// A message replaced in place by other content.
    Rewritten,
    /// A message shortened in place (a tool result cut to its head).
    TruncatedInPlace,
    /// Images, audio or files removed from messages that stayed.
    MediaStripped,
    /// Reasoning removed from assistant messages whose reasoning the model's format needs.
    ReasoningDropped,
}

impl Cause {
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Compaction => "compaction",
            Cause::Windowed => "windowed",
            Cause::Pruned => "pruned",
            Cause::Rewritten => "rewritten",
            Cause::TruncatedInPlace => "truncated_in_place",
            Cause::MediaStripped => "media_stripped",
            Cause::ReasoningDropped => "reasoning_dropped",
        }
    }

    pub const ALL: [Cause; 7] = [
        Cause::Compaction,
        Cause::Windowed,
        Cause::Pruned,
        Cause::Rewritten,
        Cause::TruncatedInPlace,
        Cause::MediaStripped,
        Cause::ReasoningDropped,
    ];
}

/// What happened to one earlier message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EditKind {
    Removed,
    /// Replaced in place by other content.
    Rewritten,
    /// Shortened in place, its head kept.
    Truncated,
    /// Its content replaced by a much shorter stub.
    Cleared,
    ReasoningStripped,
    MediaStripped,
}

/// One earlier message the request does not carry as it was.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Edit {
    /// Its index in the previous turn's history (messages, then reply).
    pub message: usize,
    /// Where it went in the request (`None`: removed).
    pub at: Option<usize>,
    pub role: String,
    pub kind: anatomy::Kind,
    pub edit: EditKind,
    /// Characters of text (or of reasoning, for a reasoning strip) before and after.
    pub chars_before: usize,
    pub chars_after: usize,
    /// For reasoning: whether the model's format needs it kept there (`reasoning.json`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub required: Option<bool>,
    /// Its text was not stored (`--capture hashes`): its role, kind and size are unknown.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub text_withheld: bool,
}

/// The message standing in for what a compaction removed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// Its index in the request.
    pub at: usize,
    pub role: String,
    /// The harness whose marker it carries (`phrases/compaction.json`), if any.
    pub harness: Option<String>,
    /// How it was recognised: `marker`, `carries_reply` (it holds the text of a reply it replaced),
    /// or `structure` (one message in place of a run of turns).
    pub recognised_by: &'static str,
    pub excerpt: String,
}

/// Messages and characters lost, per kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Lost {
    pub messages: usize,
    pub chars: usize,
}

/// History that was removed or rewritten.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Dropped {
    /// The most telling cause (none when every edit is one the chat format makes anyway), and all
    /// that apply.
    pub cause: Option<Cause>,
    pub causes: Vec<Cause>,
    /// First message (of the previous turn's history) that is not the same in the request.
    pub first_differing_message: usize,
    /// Indices in the previous history of messages absent from the request.
    pub removed_messages: Vec<usize>,
    /// Indices in the previous history of messages carried with other content (rewritten, truncated,
    /// cleared).
    pub rewritten_messages: Vec<usize>,
    /// User instructions among the removed and rewritten ones.
    pub user_turns_lost: usize,
    pub messages_before: usize,
    pub messages_after: usize,
    /// The request kept the previous reply: the harness continued after editing.
    pub kept_latest_reply: bool,
    /// Every edit, in the previous history's order.
    pub edits: Vec<Edit>,
    /// What was lost, per message kind (`reasoning` and `media` for parts).
    pub lost: BTreeMap<&'static str, Lost>,
    pub summary: Option<Summary>,
    /// The reasoning rule applied (a family of `reasoning.json`).
    pub reasoning_rule: String,
    /// The first differing message, before and after (excerpts).
    pub first_before: String,
    pub first_after: String,
}

impl Dropped {
    /// How much the loss costs the model: 3 when a rule or a user instruction was lost without a
    /// summary standing in, 2 for replies, summaries and required reasoning, 1 for tool results,
    /// reminders and media.
    pub fn weight(&self) -> u8 {
        let summarized = self.summary.is_some();
        self.edits
            .iter()
            .filter(|e| e.required != Some(false))
            .map(|e| match e.edit {
                EditKind::ReasoningStripped => 2,
                EditKind::MediaStripped => 1,
                _ if summarized => e.kind.weight().min(2),
                _ => e.kind.weight(),
            })
            .max()
            .unwrap_or(1)
    }
}

/// The verdict.
#[derive(Debug, Clone, PartialEq)]
pub enum History {
    Extends,
    /// The last exchange was replaced (the user edited or regenerated it): not a loss.
    Retry,
    PrefixBreak(Break),
    Dropped(Dropped),
    /// Edited only where the chat format drops the content anyway (reasoning of earlier turns): the
    /// model sees what it would have seen.
    ByDesign(Dropped),
}

/// Characters of a reply that a summary must carry to be recognised as holding it.
const REPLY_ANCHOR: usize = 40;
/// Removed replies a new message is checked against for holding one (the latest).
const REPLIES_CHECKED: usize = 16;

/// Compares the request with the previous turn's history (its messages followed by its reply);
/// `rule`: which reasoning the model's format needs kept.
pub fn compare(previous: &[Message<'_>], request: &[Message<'_>], rule: &ReasoningRule) -> History {
    let shared = previous.iter().zip(request).take_while(|(a, b)| a.hash == b.hash).count();
    if shared == previous.len() {
        return History::Extends;
    }
    compare_aligned(previous, request, rule, shared, &align::align(previous, request, shared))
}

fn compare_aligned(
    previous: &[Message<'_>],
    request: &[Message<'_>],
    rule: &ReasoningRule,
    shared: usize,
    alignment: &align::Alignment,
) -> History {
    let last_instruction = request.iter().rposition(|m| anatomy::kind(m.value) == anatomy::Kind::User);
    let mut edits = Vec::new();
    let mut minor = None;
    for (i, (old, fate)) in previous.iter().zip(&alignment.fates).enumerate().skip(shared) {
        // Stored without text (`--capture hashes`) and replaced in place: whether it was rewritten or
        // only a clock or an id changed cannot be told, so it is not taken for a loss.
        if let (true, align::Fate::Edited(at)) = (old.value.is_null(), fate) {
            minor = minor.or_else(|| Some(withheld(i, request[*at].value)));
            continue;
        }
        let Some(edit) = edit_of(i, old.value, *fate, request, rule, last_instruction) else { continue };
        // A rewrite that only changed something volatile (a clock, an id) is a prefix break, not a loss.
        if let (EditKind::Rewritten, Some(at)) = (edit.edit, edit.at) {
            let new = request[at].value;
            if let Some(change) = small_edit(old.value, new) {
                minor = minor.or_else(|| Some(located(i, old.value, new, change)));
                continue;
            }
        }
        edits.push(edit);
    }
    let reply_kept = matches!(alignment.fates.last(), Some(align::Fate::Kept(_) | align::Fate::ReasoningStripped(_)));
    let summary = summary_of(previous, request, alignment);
    if edits.is_empty() && summary.is_none() {
        return History::PrefixBreak(minor.unwrap_or_else(|| inserted(shared, request)));
    }
    let last_exchange = previous.len().saturating_sub(2);
    if !reply_kept && summary.is_none() && edits.iter().all(|e| e.message >= last_exchange && e.edit != EditKind::ReasoningStripped) {
        return History::Retry;
    }
    let removed: Vec<usize> = edits.iter().filter(|e| e.edit == EditKind::Removed).map(|e| e.message).collect();
    let causes = causes(previous, &edits, &removed, summary.as_ref());
    let rewritten: Vec<usize> = edits
        .iter()
        .filter(|e| matches!(e.edit, EditKind::Rewritten | EditKind::Truncated | EditKind::Cleared))
        .map(|e| e.message)
        .collect();
    let user_turns_lost = edits
        .iter()
        .filter(|e| e.kind == anatomy::Kind::User && matches!(e.edit, EditKind::Removed | EditKind::Rewritten | EditKind::Cleared))
        .count();
    let mut lost: BTreeMap<&'static str, Lost> = BTreeMap::new();
    for e in edits.iter().filter(|e| e.required != Some(false)) {
        let key = match e.edit {
            EditKind::ReasoningStripped => "reasoning",
            EditKind::MediaStripped => "media",
            _ => e.kind.as_str(),
        };
        let entry = lost.entry(key).or_default();
        entry.messages += 1;
        entry.chars += e.chars_before.saturating_sub(e.chars_after);
    }
    let first = edits.first().map_or(shared, |e| e.message);
    let dropped = Dropped {
        cause: causes.first().copied(),
        causes: causes.clone(),
        first_differing_message: first,
        removed_messages: removed,
        rewritten_messages: rewritten,
        user_turns_lost,
        messages_before: previous.len(),
        messages_after: request.len(),
        kept_latest_reply: reply_kept,
        edits,
        lost,
        summary,
        reasoning_rule: rule.family.clone(),
        first_before: excerpt(&text(previous[first].value), 0),
        first_after: request
            .get(alignment.fates[first..].iter().find_map(|f| f.at()).unwrap_or(first))
            .map(|m| excerpt(&text(m.value), 0))
            .unwrap_or_default(),
    };
    if causes.is_empty() {
        return History::ByDesign(dropped);
    }
    History::Dropped(dropped)
}

/// Whether a request that shares only a prefix with the previous history is that history edited
/// (it carries a message from beyond the shared prefix, kept or edited, or a summary of what it
/// removed) rather than a branch (the client went back to an earlier point and went on differently).
/// The comparison when it is an edit.
pub fn edit_of_history(previous: &[Message<'_>], request: &[Message<'_>], rule: &ReasoningRule) -> Option<History> {
    let shared = previous.iter().zip(request).take_while(|(a, b)| a.hash == b.hash).count();
    if shared == previous.len() {
        return Some(History::Extends);
    }
    let alignment = align::align(previous, request, shared);
    let carried = alignment.fates[shared..].iter().any(|f| f.at().is_some());
    (carried || summary_of(previous, request, &alignment).is_some()).then(|| compare_aligned(previous, request, rule, shared, &alignment))
}

/// What happened to earlier message `i` (`None`: kept as it was).
fn edit_of(
    i: usize,
    old: &Value,
    fate: align::Fate,
    request: &[Message<'_>],
    rule: &ReasoningRule,
    last_instruction: Option<usize>,
) -> Option<Edit> {
    use align::Fate;
    let role = role(old).to_string();
    let kind = anatomy::kind(old);
    let chars = |v: &Value| anatomy::visible_text(v).chars().count();
    let edit = |at, edit, chars_before, chars_after, required| Edit {
        message: i,
        at,
        role: role.clone(),
        kind,
        edit,
        chars_before,
        chars_after,
        required,
        text_withheld: old.is_null(),
    };
    match fate {
        Fate::Kept(_) => None,
        Fate::Removed => Some(edit(None, EditKind::Removed, chars(old) + anatomy::reasoning_chars(old), 0, None)),
        Fate::ReasoningStripped(j) => {
            let required = match rule.keep {
                Keep::All => true,
                Keep::None => false,
                Keep::ToolLoop => last_instruction.is_none_or(|l| j > l),
            };
            let (before, after) = (anatomy::reasoning_chars(old), anatomy::reasoning_chars(request[j].value));
            Some(edit(Some(j), EditKind::ReasoningStripped, before, after, Some(required)))
        }
        Fate::MediaStripped(j) => {
            Some(edit(Some(j), EditKind::MediaStripped, anatomy::media_parts(old), anatomy::media_parts(request[j].value), None))
        }
        Fate::Edited(j) => {
            let new = request[j].value;
            let (a, b) = (anatomy::visible_text(old), anatomy::visible_text(new));
            let (before, after) = (a.chars().count(), b.chars().count());
            let head = a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count();
            // A tool result given other content was cleared (a stub in its place), whatever its size.
            let kind_of_edit = if after < before && head >= (after / 2).clamp(1, 32) {
                EditKind::Truncated
            } else if kind == anatomy::Kind::ToolResult || (after * 2 < before && before >= 64) {
                EditKind::Cleared
            } else {
                EditKind::Rewritten
            };
            Some(edit(Some(j), kind_of_edit, before, after, None))
        }
    }
}

/// The new message that stands in for removed turns: one carrying a known marker, one holding the
/// text of a reply it replaced (the harness asked the model for the summary), or, by structure, one
/// message inserted where a run of two or more messages with a user instruction was removed.
fn summary_of(previous: &[Message<'_>], request: &[Message<'_>], alignment: &align::Alignment) -> Option<Summary> {
    let summary = |at: usize, harness: Option<&str>, by: &'static str| Summary {
        at,
        role: role(request[at].value).to_string(),
        harness: harness.map(str::to_string),
        recognised_by: by,
        excerpt: excerpt(&text(request[at].value), 0),
    };
    if let Some(&at) = alignment.fresh.iter().find(|&&j| markers::harness_of(request[j].value).is_some()) {
        return Some(summary(at, markers::harness_of(request[at].value), "marker"));
    }
    // The latest removed replies (the summary is the reply to the harness's summary request, the
    // latest; a bound keeps a compaction of thousands of turns from costing their square).
    let removed_replies: Vec<String> = previous
        .iter()
        .zip(&alignment.fates)
        .rev()
        .filter(|(m, f)| **f == align::Fate::Removed && role(m.value) == "assistant")
        .map(|(m, _)| anatomy::squeezed(&anatomy::visible_text(m.value)))
        .filter(|t| t.chars().count() >= REPLY_ANCHOR)
        .take(REPLIES_CHECKED)
        .collect();
    for &j in &alignment.fresh {
        let text = anatomy::squeezed(&anatomy::visible_text(request[j].value));
        if removed_replies.iter().any(|reply| carries(&text, reply)) {
            return Some(summary(j, None, "carries_reply"));
        }
    }
    // By structure: a removed run (between two kept messages) that held a user instruction and at
    // least two messages, with one or two new messages in its place.
    let fates = &alignment.fates;
    let mut i = 0;
    while i < fates.len() {
        if fates[i] != align::Fate::Removed {
            i += 1;
            continue;
        }
        let end = (i..fates.len()).find(|&k| fates[k] != align::Fate::Removed).unwrap_or(fates.len());
        let before = fates[..i].iter().rev().find_map(|f| f.at()).map_or(0, |j| j + 1);
        let after = fates[end..].iter().find_map(|f| f.at());
        let with_instruction = previous[i..end].iter().any(|m| anatomy::kind(m.value) == anatomy::Kind::User);
        if let (Some(after), true, true) = (after, end - i >= 2, with_instruction) {
            let gap: Vec<usize> = alignment.fresh.iter().copied().filter(|&j| j >= before && j < after).collect();
            if (1..=2).contains(&gap.len()) {
                return Some(summary(gap[0], None, "structure"));
            }
        }
        i = end;
    }
    None
}

/// Whether `text` holds `reply`: whole, or (a summary cut out of a longer reply, as Claude Code's
/// `<summary>` is) at least two and a third of the reply's [`REPLY_ANCHOR`]-character pieces.
pub fn carries(text: &str, reply: &str) -> bool {
    if text.contains(reply) {
        return true;
    }
    let chars: Vec<char> = reply.chars().collect();
    let pieces: Vec<String> = chars.chunks_exact(REPLY_ANCHOR).map(|c| c.iter().collect()).collect();
    let hits = pieces.iter().filter(|p| text.contains(p.as_str())).count();
    hits >= 2 && hits * 3 >= pieces.len()
}

/// The causes the edits show, the most telling first.
fn causes(previous: &[Message<'_>], edits: &[Edit], removed: &[usize], summary: Option<&Summary>) -> Vec<Cause> {
    let mut causes = Vec::new();
    let has = |k: EditKind| edits.iter().any(|e| e.edit == k);
    if summary.is_some() {
        causes.push(Cause::Compaction);
    } else if !removed.is_empty() {
        // Windowed: what was removed is one run from the first message after the system prompt.
        let head = previous.iter().position(|m| anatomy::kind(m.value) != anatomy::Kind::System).unwrap_or(0);
        let contiguous = removed.windows(2).all(|w| w[1] == w[0] + 1);
        if contiguous && removed.first() == Some(&head) {
            causes.push(Cause::Windowed);
        } else {
            causes.push(Cause::Pruned);
        }
    }
    if has(EditKind::Cleared) && !causes.contains(&Cause::Pruned) {
        causes.push(Cause::Pruned);
    }
    if has(EditKind::Rewritten) {
        causes.push(Cause::Rewritten);
    }
    if has(EditKind::Truncated) {
        causes.push(Cause::TruncatedInPlace);
    }
    if has(EditKind::MediaStripped) {
        causes.push(Cause::MediaStripped);
    }
    if edits.iter().any(|e| e.edit == EditKind::ReasoningStripped && e.required == Some(true)) {
        causes.push(Cause::ReasoningDropped);
    }
    causes
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

/// A prefix break at a message stored without text, replaced in place by `new`.
fn withheld(message: usize, new: &Value) -> Break {
    Break { message, char: 0, role: role(new).to_string(), change: Change::Withheld, before: String::new(), after: String::new() }
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
    // Compared masked (`--capture redacted`), the same text under another hash changed inside a mask.
    if a == b && a.contains("[redacted:") {
        return Some(Change::Withheld);
    }
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
        run_as(previous, request, "SmolLM2")
    }

    fn run_as(previous: &[Value], request: &[Value], model: &str) -> History {
        let (p, r) = (conv(previous), conv(request));
        compare(&view(&p), &view(&r), ctxscope_formats::template::reasoning_rule(Some(model), "chat_completions"))
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

    /// As `run`, with the previous history stored without text (`--capture hashes`): a message the
    /// request still carries is read from it (`with_sides`), the others are null.
    fn run_textless(previous: &[Value], request: &[Value]) -> History {
        let (mut p, r) = (conv(previous), conv(request));
        for (hash, value) in &mut p {
            *value = r.iter().find(|(h, _)| h == hash).map_or(Value::Null, |(_, v)| v.clone());
        }
        compare(&view(&p), &view(&r), ctxscope_formats::template::reasoning_rule(Some("SmolLM2"), "chat_completions"))
    }

    #[test]
    fn history_stored_without_text_is_compared_by_hash_and_never_guessed() {
        let previous = [m("system", "S"), m("user", "u1"), m("assistant", "a1"), m("user", "u2"), m("assistant", "a2")];
        // Removed messages are still a loss: by position, the oldest after the kept system prompt.
        let windowed = [m("system", "S"), m("user", "u2"), m("assistant", "a2"), m("user", "u3")];
        let History::Dropped(d) = run_textless(&previous, &windowed) else { panic!() };
        assert_eq!((d.removed_messages.clone(), d.cause), (vec![1, 2], Some(Cause::Windowed)));
        assert!(d.edits.iter().all(|e| e.text_withheld && e.kind == anatomy::Kind::Other), "{:?}", d.edits);
        // A message changed in place cannot be told rewritten from a changed clock: no loss claimed.
        let clock = |t: &str| m("system", &format!("You are helpful. Now: {t}."));
        let before = [clock("13:40:15"), m("user", "u1"), m("assistant", "a1")];
        let after = [clock("13:41:02"), m("user", "u1"), m("assistant", "a1"), m("user", "u2")];
        assert!(matches!(run_textless(&before, &after), History::PrefixBreak(Break { change: Change::Withheld, message: 0, .. })));
        let rewritten =
            [m("system", "S"), m("user", "Summary: u1."), m("assistant", "a1"), m("user", "u2"), m("assistant", "a2"), m("user", "u3")];
        assert!(matches!(run_textless(&previous, &rewritten), History::PrefixBreak(Break { change: Change::Withheld, message: 1, .. })));
        // A retry is still a retry.
        let retry = [m("system", "S"), m("user", "u1"), m("assistant", "a1"), m("user", "u2 edited")];
        assert_eq!(run_textless(&previous, &retry), History::Retry);
        // Compared masked (`--capture redacted`): a change inside a masked span is no loss either.
        let masked = |key: &str| m("system", &format!("Use key {key} for billing."));
        let (old, new) = (masked("[redacted:openai_key]"), masked("[redacted:openai_key]"));
        let (mut p, r) =
            (conv(&[old, m("user", "u1"), m("assistant", "a1")]), conv(&[new, m("user", "u1"), m("assistant", "a1"), m("user", "u2")]));
        p[0].0 = "0".repeat(64);
        let history = compare(&view(&p), &view(&r), ctxscope_formats::template::reasoning_rule(Some("SmolLM2"), "chat_completions"));
        assert!(matches!(history, History::PrefixBreak(Break { change: Change::Withheld, message: 0, .. })), "{history:?}");
        // A summary recognised by its marker still names a compaction.
        let marked = [
            m("system", "S"),
            m("user", "This session is being continued from a previous conversation that ran out of context. u1, a1."),
            m("user", "u3"),
        ];
        let History::Dropped(d) = run_textless(&previous, &marked) else { panic!() };
        assert_eq!(d.cause, Some(Cause::Compaction));
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

    fn dropped(h: History) -> Dropped {
        match h {
            History::Dropped(d) => d,
            other => panic!("not dropped: {other:?}"),
        }
    }

    fn tool_turn(i: usize, output: &str) -> [Value; 2] {
        let id = format!("call_{i}");
        [
            json!({"role": "assistant", "content": "", "tool_calls": [{"id": id, "type": "function", "function": {"name": "read", "arguments": "{}"}}]}),
            json!({"role": "tool", "tool_call_id": id, "content": output}),
        ]
    }

    #[test]
    fn causes_are_named_by_structure() {
        let long = "line of build output that goes on and on ".repeat(4);
        let mut previous = vec![m("system", "S"), m("user", "u1")];
        previous.extend(tool_turn(1, &long));
        previous.extend([m("assistant", "a1"), m("user", "u2")]);
        previous.extend(tool_turn(2, &long));
        previous.push(m("assistant", "a2"));
        // Tool results removed from the middle, every user and assistant message kept.
        let mut pruned: Vec<Value> = previous.iter().filter(|v| v["role"] != "tool").cloned().collect();
        pruned.push(m("user", "u3"));
        let d = dropped(run(&previous, &pruned));
        assert_eq!((d.cause.unwrap(), d.removed_messages.clone(), d.kept_latest_reply), (Cause::Pruned, vec![3, 7], true));
        assert_eq!(d.lost["tool_result"].messages, 2);
        assert_eq!(d.weight(), 1, "only tool results were lost");
        // A tool result cut to its head.
        let mut cut = previous.clone();
        cut[3]["content"] = json!(format!("{}... [truncated]", &long[..30]));
        cut.push(m("user", "u3"));
        let d = dropped(run(&previous, &cut));
        assert_eq!((d.cause.unwrap(), d.edits[0].edit, d.edits[0].at), (Cause::TruncatedInPlace, EditKind::Truncated, Some(3)));
        // Cleared to a stub: pruned.
        let mut stub = previous.clone();
        stub[3]["content"] = json!("[Old tool result content cleared]");
        stub.push(m("user", "u3"));
        assert_eq!(dropped(run(&previous, &stub)).cause, Some(Cause::Pruned));
        // Keep the last 3 (after the system prompt): windowed, and a user instruction lost is the worst.
        let mut window = vec![m("system", "S")];
        window.extend(previous[previous.len() - 3..].iter().cloned());
        window.push(m("user", "u3"));
        let d = dropped(run(&previous, &window));
        assert_eq!((d.cause.unwrap(), d.user_turns_lost, d.weight()), (Cause::Windowed, 2, 3));
    }

    #[test]
    fn summaries_by_marker_by_carried_reply_and_by_structure() {
        let previous = [
            m("system", "S"),
            m("user", "u1"),
            m("assistant", "a1"),
            m("user", "summarize"),
            m("assistant", "The user asked about a1 and we found that the build is fine."),
        ];
        // Codex: the summary, with its prefix, after the user messages it keeps.
        let codex = [m("system", "S"), m("user", "u1"), m("user", "Another language model started to solve this problem and produced a summary of its thinking process. The user asked about a1 and we found that the build is fine."), m("user", "next")];
        let d = dropped(run(&previous, &codex));
        assert_eq!(d.cause.unwrap(), Cause::Compaction);
        assert_eq!((d.summary.as_ref().unwrap().at, d.summary.as_ref().unwrap().harness.as_deref()), (2, Some("codex")));
        // No marker: the summary carries the reply it replaced.
        let plain =
            [m("system", "S"), m("user", "Earlier: The user asked about a1 and we found that the build is fine."), m("user", "next")];
        let d = dropped(run(&previous, &plain));
        assert_eq!((d.cause.unwrap(), d.summary.unwrap().recognised_by), (Cause::Compaction, "carries_reply"));
        // Claude Code wraps only part of the reply: two of its anchors suffice.
        let inner = "1. Primary request: fix the failing parser test. 2. Files: parser.rs and lexer.rs were read and edited. 3. The project builds; the failing test was test_parse in parser.rs, fixed by trimming input. 4. Pending: run the whole suite.";
        let reply =
            format!("<analysis>We looked at many files in the project and ran the tests twice.</analysis> <summary>{inner}</summary>");
        let previous = [m("system", "S"), m("user", "u1"), m("assistant", "a1"), m("user", "summarize"), m("assistant", &reply)];
        let wrapped =
            [m("system", "S"), m("user", &format!("This conversation is summarized below:\n{inner}\nContinue.")), m("user", "next")];
        assert_eq!(dropped(run(&previous, &wrapped)).cause, Some(Cause::Compaction));
    }

    #[test]
    fn reasoning_follows_the_family_rule() {
        let call = |id: &str, reasoning: Option<&str>| {
            let mut v = json!({"role": "assistant", "content": "", "tool_calls": [{"id": id, "type": "function", "function": {"name": "f", "arguments": "{}"}}]});
            if let Some(r) = reasoning {
                v["reasoning_content"] = json!(r);
            }
            v
        };
        let result = |id: &str| json!({"role": "tool", "tool_call_id": id, "content": "ok"});
        let previous = [
            m("user", "q1"),
            call("c1", Some("I should call f")),
            result("c1"),
            call("c2", Some("now again")),
            result("c2"),
            m("assistant", "done"),
        ];
        // Within the loop (after the last user message): DeepSeek needs it.
        let stripped =
            [m("user", "q1"), call("c1", None), result("c1"), call("c2", None), result("c2"), m("assistant", "done"), m("user", "q2")];
        let d = dropped(run_as(&previous[..4], &stripped[..5], "deepseek-v4-flash"));
        assert_eq!((d.cause.unwrap(), d.lost["reasoning"].messages), (Cause::ReasoningDropped, 2));
        // Between user turns the template drops it anyway: by design.
        assert!(matches!(run_as(&previous, &stripped, "deepseek-v4-flash"), History::ByDesign(_)));
        // A family whose format keeps all reasoning.
        assert_eq!(dropped(run_as(&previous, &stripped, "MiniMax-M2")).cause, Some(Cause::ReasoningDropped));
    }

    #[test]
    fn repeated_replies_still_read_as_a_window_and_a_joined_reply_as_kept() {
        // The model answered the same words three times: keep-the-last-3 still aligns from the back.
        let same = "I am sorry, I cannot help with that.";
        let previous = [
            m("system", "S"),
            m("user", "u1"),
            m("assistant", same),
            m("user", "u2"),
            m("assistant", same),
            m("user", "u3"),
            m("assistant", same),
        ];
        let request = [m("system", "S"), m("assistant", same), m("user", "u3"), m("assistant", same), m("user", "u4")];
        let d = dropped(run(&previous, &request));
        assert_eq!((d.cause.unwrap(), d.removed_messages), (Cause::Windowed, vec![1, 2, 3]));
        // Responses: the reply on record, resent with the next response's call joined to it.
        let previous = [m("user", "q"), m("assistant", "Checking.")];
        let joined = json!({"role": "assistant", "content": "Checking.", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]});
        let request = [m("user", "q"), joined, json!({"role": "tool", "tool_call_id": "c1", "content": "ok"})];
        assert!(matches!(run(&previous, &request), History::PrefixBreak(_)), "nothing was lost");
    }

    #[test]
    fn media_stripped_and_a_true_rewrite() {
        let image = json!({"role": "user", "content": [{"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]});
        let previous = [m("system", "S"), image.clone(), m("assistant", "a cat"), m("user", "u2"), m("assistant", "a2")];
        let mut request = previous.to_vec();
        request[1] = json!({"role": "user", "content": [{"type": "text", "text": "what is this"}]});
        request.push(m("user", "u3"));
        assert_eq!(dropped(run(&previous, &request)).cause, Some(Cause::MediaStripped));
        let mut request = previous.to_vec();
        request[3] = m("user", "a different question altogether");
        request.push(m("user", "u3"));
        assert_eq!(dropped(run(&previous, &request)).cause, Some(Cause::Rewritten));
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
