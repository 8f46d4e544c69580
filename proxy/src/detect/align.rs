//! Aligns the previous turn's history with a request: for each earlier message, where it went (kept,
//! kept without its reasoning or media, edited in place, or removed) and which request messages are
//! new (inserted between kept ones, or appended). One forward pass over hash maps: a message is
//! found by its exact hash, then by its hash without reasoning or media, then by its tool-call ids,
//! always at or after the previous match, so the order of what was kept is respected.

use std::collections::HashMap;

use serde_json::Value;

use super::anatomy;
use super::history::Message;

/// What became of one message of the previous history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// The same message, at this request position.
    Kept(usize),
    /// The same message without its reasoning.
    ReasoningStripped(usize),
    /// The same message without some of its images, audio or files.
    MediaStripped(usize),
    /// The same message (by position or tool-call id) with other content.
    Edited(usize),
    Removed,
}

impl Fate {
    /// The request position the message went to.
    pub fn at(self) -> Option<usize> {
        match self {
            Fate::Kept(j) | Fate::ReasoningStripped(j) | Fate::MediaStripped(j) | Fate::Edited(j) => Some(j),
            Fate::Removed => None,
        }
    }
}

/// The alignment of two message lists.
#[derive(Debug, Clone, PartialEq)]
pub struct Alignment {
    /// One fate per previous message.
    pub fates: Vec<Fate>,
    /// Request positions that are new: inserted among kept messages or appended after them.
    pub fresh: Vec<usize>,
    /// The first request position after the last one a previous message went to (the appended tail).
    pub appended_from: usize,
}

/// Positions of each key in the request, in order.
struct Index {
    positions: HashMap<String, Vec<usize>>,
}

impl Index {
    fn new(keys: impl Iterator<Item = (usize, String)>) -> Index {
        let mut positions: HashMap<String, Vec<usize>> = HashMap::new();
        for (j, key) in keys {
            positions.entry(key).or_default().push(j);
        }
        Index { positions }
    }

    /// The first position of `key` at or after `from` that `free` allows.
    fn find(&self, key: &str, from: usize, free: impl Fn(usize) -> bool) -> Option<usize> {
        let list = self.positions.get(key)?;
        let start = list.partition_point(|&j| j < from);
        list[start..].iter().copied().find(|&j| free(j))
    }

    /// The last position of `key` before `before` (and at or after `floor`) that `free` allows.
    fn find_before(&self, key: &str, before: usize, floor: usize, free: impl Fn(usize) -> bool) -> Option<usize> {
        let list = self.positions.get(key)?;
        let end = list.partition_point(|&j| j < before);
        list[..end].iter().rev().copied().take_while(|&j| j >= floor).find(|&j| free(j))
    }
}

/// Aligns `previous` with `request` from position `shared` on (both agree before it). Repeated
/// messages (the same short reply twice) can be matched to more than one place: the alignment is
/// made from the front and from the back (a kept tail, as keep-the-last-N leaves, aligns from the
/// back) and the one that keeps more messages wins.
pub fn align(previous: &[Message<'_>], request: &[Message<'_>], shared: usize) -> Alignment {
    let indexes = Indexes::new(request, shared);
    let forward = one_way(previous, request, shared, &indexes, Direction::Forward);
    let backward = one_way(previous, request, shared, &indexes, Direction::Backward);
    let kept = |a: &Alignment| a.fates.iter().filter(|f| matches!(f, Fate::Kept(_))).count();
    if kept(&backward) > kept(&forward) {
        backward
    } else {
        forward
    }
}

/// The request's messages by each key an earlier message may be found by.
struct Indexes {
    exact: Index,
    stripped: Index,
    ids: Index,
    grown: Index,
}

impl Indexes {
    fn new(request: &[Message<'_>], shared: usize) -> Indexes {
        let keyed = |key: fn(&Message<'_>) -> Option<String>| {
            Index::new(request.iter().enumerate().skip(shared).flat_map(|(j, m)| key(m).map(|k| (j, k))))
        };
        Indexes {
            exact: keyed(|m| Some(m.hash.to_string())),
            stripped: keyed(|m| Some(bare(m.value))),
            ids: keyed(|m| tool_key(m.value)),
            grown: keyed(|m| grown_key(m.value)),
        }
    }
}

/// The message without reasoning and media, as a key.
fn bare(message: &Value) -> String {
    anatomy::key(&anatomy::without_media(&anatomy::without_reasoning(message)))
}

#[derive(Clone, Copy, PartialEq)]
enum Direction {
    Forward,
    Backward,
}

fn one_way(previous: &[Message<'_>], request: &[Message<'_>], shared: usize, ix: &Indexes, direction: Direction) -> Alignment {
    let mut used: Vec<bool> = (0..request.len()).map(|j| j < shared).collect();
    let mut fates: Vec<Fate> = vec![Fate::Removed; previous.len()];
    for (i, fate) in fates.iter_mut().enumerate().take(shared) {
        *fate = Fate::Kept(i);
    }
    // Forward: positions at or after `bound`; backward: positions before it.
    let mut bound = if direction == Direction::Forward { shared } else { request.len() };
    let order: Box<dyn Iterator<Item = usize>> =
        if direction == Direction::Forward { Box::new(shared..previous.len()) } else { Box::new((shared..previous.len()).rev()) };
    for i in order {
        let old = &previous[i];
        let free = |j: usize| !used[j];
        let find = |index: &Index, key: &str| match direction {
            Direction::Forward => index.find(key, bound, free),
            Direction::Backward => index.find_before(key, bound, shared, free),
        };
        let reply_text = || reply_key(old.value).and_then(|k| find(&ix.grown, &k));
        let fate = if let Some(j) = find(&ix.exact, old.hash).or_else(reply_text) {
            Fate::Kept(j)
        } else if let Some(j) = find(&ix.stripped, &bare(old.value)) {
            let new = request[j].value;
            if anatomy::reasoning_chars(old.value) > anatomy::reasoning_chars(new) {
                Fate::ReasoningStripped(j)
            } else if anatomy::media_parts(old.value) > anatomy::media_parts(new) {
                Fate::MediaStripped(j)
            } else {
                Fate::Edited(j)
            }
        } else if let Some(j) = tool_key(old.value).and_then(|k| find(&ix.ids, &k)) {
            Fate::Edited(j)
        } else {
            Fate::Removed
        };
        if let Some(j) = fate.at() {
            used[j] = true;
            bound = if direction == Direction::Forward { j + 1 } else { j };
        }
        fates[i] = fate;
    }
    pair_in_place(&mut fates, previous, request, &mut used);
    let appended_from = fates.iter().filter_map(|f| f.at()).max().map_or(shared, |j| j + 1);
    let fresh = (shared..request.len()).filter(|&j| !used[j]).collect();
    Alignment { fates, fresh, appended_from }
}

/// A Responses reply resent with the next response's items after it reads as one assistant message
/// (consecutive assistant items are one message): the reply's text with calls or reasoning added.
/// Such a message is known by its text; a reply without calls is looked up by its own.
fn grown_key(message: &Value) -> Option<String> {
    let added = message.get("tool_calls").is_some() || message.get("reasoning_items").is_some();
    let text = anatomy::squeezed(&anatomy::visible_text(message));
    (added && role_is(message, "assistant") && !text.is_empty()).then(|| format!("text:{text}"))
}

/// The key of a reply (an assistant message of text alone) as [`grown_key`] reads it.
fn reply_key(message: &Value) -> Option<String> {
    let text = anatomy::squeezed(&anatomy::visible_text(message));
    let plain = message.get("tool_calls").is_none() && message.get("reasoning_items").is_none();
    (plain && role_is(message, "assistant") && !text.is_empty()).then(|| format!("text:{text}"))
}

fn role_is(message: &Value, role: &str) -> bool {
    message.get("role").and_then(Value::as_str) == Some(role)
}

/// A tool message (or Anthropic tool-result message) is known by its role and call ids.
fn tool_key(message: &Value) -> Option<String> {
    let ids = anatomy::tool_ids(message);
    if ids.is_empty() || message.get("role").and_then(Value::as_str) == Some("assistant") {
        return None;
    }
    Some(format!("{}:{}", message.get("role").and_then(Value::as_str).unwrap_or(""), ids.join(",")))
}

/// A removed message between two kept ones whose place holds exactly one new message of the same
/// role was edited in place, not removed (a rewritten question, a cleared tool result).
fn pair_in_place(fates: &mut [Fate], previous: &[Message<'_>], request: &[Message<'_>], used: &mut [bool]) {
    let role = |m: &Message<'_>| m.value.get("role").and_then(Value::as_str).map(str::to_string);
    let mut i = 0;
    while i < fates.len() {
        if fates[i] != Fate::Removed {
            i += 1;
            continue;
        }
        let run_end = (i..fates.len()).find(|&k| fates[k] != Fate::Removed).unwrap_or(fates.len());
        let before = fates[..i].iter().rev().find_map(|f| f.at()).map_or(0, |j| j + 1);
        let Some(after) = fates[run_end..].iter().find_map(|f| f.at()) else { break };
        let gap: Vec<usize> = (before..after).filter(|&j| !used[j]).collect();
        // A message that carries a compaction marker is a summary, not a rewrite.
        let summary = super::markers::harness_of(request[gap.first().copied().unwrap_or(0)].value).is_some();
        // A message stored without text (`null`, `--capture hashes`) has no role to compare.
        let same_role = || previous[i].value.is_null() || role(&previous[i]) == role(&request[gap[0]]);
        if run_end - i == 1 && gap.len() == 1 && !summary && same_role() {
            fates[i] = Fate::Edited(gap[0]);
            used[gap[0]] = true;
        }
        i = run_end;
    }
}
