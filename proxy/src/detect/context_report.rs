//! The context report of a conversation: at each turn, what the model could still see (the request's
//! messages, per kind, with their reasoning and media) against what was ever said in the
//! conversation up to then (every message version sent, and every reply). A harness that prunes,
//! windows or compacts shows as a gap between the two that grows.

use std::collections::{BTreeMap, HashMap};

use ctxscope_store::ConversationDetail;
use serde::Serialize;
use serde_json::Value;

use super::anatomy::{self, Kind};

/// Messages and characters of one kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Count {
    pub messages: usize,
    pub chars: usize,
}

/// One turn's view.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TurnContext {
    pub turn: u64,
    pub index: u32,
    /// The engine's prompt count, else the local one.
    pub prompt_tokens: Option<u64>,
    /// What the request carried, per kind (`reasoning` counts assistant messages with reasoning and
    /// its characters, `media` the images, audio and files).
    pub visible: BTreeMap<&'static str, Count>,
    /// What had been said up to this request, per kind: every message once (a message edited in
    /// place counts once, at its longest), and the replies before it.
    pub ever: BTreeMap<&'static str, Count>,
    /// Characters visible over characters ever said (1 when nothing was lost).
    pub visible_share: f64,
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContextReport {
    pub conversation: u64,
    /// The kinds in display order.
    pub kinds: Vec<&'static str>,
    pub turns: Vec<TurnContext>,
}

/// Kinds in display order: the message kinds, then reasoning and media.
pub fn kinds() -> Vec<&'static str> {
    Kind::ALL.iter().map(|k| k.as_str()).chain(["reasoning", "media"]).collect()
}

/// A message's kind, a compaction summary recognised by its marker.
fn kind_of(message: &Value) -> Kind {
    if super::markers::harness_of(message).is_some() {
        Kind::Summary
    } else {
        anatomy::kind(message)
    }
}

/// What `copies` of one message add to a tally.
fn tally(into: &mut BTreeMap<&'static str, Count>, message: &Value, chars: usize, copies: usize) {
    let entry = into.entry(kind_of(message).as_str()).or_default();
    entry.messages += copies;
    entry.chars += chars * copies;
    let reasoning = anatomy::reasoning_chars(message);
    if reasoning > 0 {
        let entry = into.entry("reasoning").or_default();
        entry.messages += copies;
        entry.chars += reasoning * copies;
    }
    let media = anatomy::media_parts(message);
    if media > 0 {
        into.entry("media").or_default().messages += media * copies;
    }
}

fn chars(message: &Value) -> usize {
    anatomy::visible_text(message).chars().count()
}

/// A message's identity across edits: a tool result by its call ids, anything else by its hash.
fn identity(hash: &str, message: &Value) -> String {
    let ids = anatomy::tool_ids(message);
    match anatomy::kind(message) {
        Kind::ToolResult if !ids.is_empty() => format!("tool:{}", ids.join(",")),
        _ => hash.to_string(),
    }
}

/// One thing said: the hash of its longest version, its characters, and how many times it was said
/// (a reply the model gave twice word for word is two).
struct Said {
    hash: String,
    chars: usize,
    copies: usize,
}

/// The report of a conversation (its turns in order).
pub fn context_report(detail: &ConversationDetail) -> ContextReport {
    let null = Value::Null;
    let message = |hash: &str| detail.messages.get(hash).unwrap_or(&null);
    let mut said: HashMap<String, Said> = HashMap::new();
    let mut turns = Vec::with_capacity(detail.turns.len());
    for view in &detail.turns {
        let t = &view.turn;
        let mut visible = BTreeMap::new();
        let mut here: HashMap<String, usize> = HashMap::new();
        for hash in &view.messages {
            let m = message(hash);
            let n = chars(m);
            tally(&mut visible, m, n, 1);
            let id = identity(hash, m);
            *here.entry(id.clone()).or_default() += 1;
            let entry = said.entry(id).or_insert_with(|| Said { hash: hash.clone(), chars: n, copies: 0 });
            if n > entry.chars {
                (entry.hash, entry.chars) = (hash.clone(), n);
            }
        }
        for (id, copies) in &here {
            if let Some(entry) = said.get_mut(id) {
                entry.copies = entry.copies.max(*copies);
            }
        }
        let mut ever = BTreeMap::new();
        for entry in said.values() {
            tally(&mut ever, message(&entry.hash), entry.chars, entry.copies);
        }
        let total = |c: &BTreeMap<&str, Count>| c.iter().filter(|(k, _)| **k != "media").map(|(_, v)| v.chars).sum::<usize>();
        let share = if total(&ever) == 0 { 1.0 } else { total(&visible) as f64 / total(&ever) as f64 };
        turns.push(TurnContext {
            turn: t.id,
            index: t.index,
            prompt_tokens: super::prompt_tokens(t),
            visible,
            ever,
            visible_share: (share.min(1.0) * 1000.0).round() / 1000.0,
        });
        // The reply is said too, once more than this request carried it (unless the client never
        // got it whole: it went away, or the stream broke).
        if let (Some(reply), None) = (&t.reply, &t.error) {
            let m = message(reply);
            let id = identity(reply, m);
            let carried = here.get(&id).copied().unwrap_or(0);
            let entry = said.entry(id).or_insert_with(|| Said { hash: reply.clone(), chars: chars(m), copies: 0 });
            entry.copies = entry.copies.max(carried + 1);
        }
    }
    ContextReport { conversation: detail.conversation.id, kinds: kinds(), turns }
}
