//! Threading requests into conversations without client cooperation, from the prefix hash chain.
//!
//! A request continues conversation C when C's latest turn (its messages, or its messages plus reply)
//! is a prefix of the request; the same messages again are a regenerate. A request that does not
//! extend a conversation's latest turn but carries its latest reply continues it with edited history
//! (a harness that compacted, pruned or windowed it): marked diverged. Otherwise the longest prefix
//! shared with any earlier turn decides. Sharing more than the system prompt is an edit of that
//! conversation's latest history when the request still carries a message from beyond the shared
//! prefix or a summary of what it removed (diverged), and a branch when it does not (the client went
//! back and went on differently: a new conversation that records where it left). Sharing less is a
//! new conversation, unless a message carries a known compaction marker and the text of a recent
//! reply of a conversation with the same first message (a compaction that kept only the system
//! prompt). A conversation named by header is used as named; not extending its last turn is diverged.

use std::collections::VecDeque;

use crate::detect::{anatomy, history, markers};
use crate::parse::message::Message;
use ctxscope_formats::template::reasoning_rule;
use ctxscope_store::{to_hex, BaseRef, BranchRef, ConversationRecord, Endpoint, Hash, Relation, Store, StoreError};

/// Where a request belongs.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The conversation to append to; `None` starts a new one.
    pub conversation: Option<ConversationRecord>,
    pub relation: Relation,
    /// The earlier turn whose messages (plus reply) this request's first `len` messages are.
    pub base: Option<BaseRef>,
    pub branch_of: Option<BranchRef>,
}

/// The request as threading sees it: messages, their hashes, and the chain (`chain[i]` covers `0..=i`).
pub struct Request<'a> {
    pub messages: &'a [Message],
    pub hashes: &'a [Hash],
    pub chain: &'a [Hash],
    /// The model and API, for the reasoning rule an edit is judged by.
    pub model: Option<&'a str>,
    pub endpoint: Endpoint,
    /// Recent replies, for a compaction that kept only the system prompt.
    pub recent: &'a RecentReplies,
    /// How much text the store keeps (`--capture`): the earlier history is compared in that form.
    pub capture: ctxscope_store::CaptureLevel,
}

/// The latest replies of recent conversations (text squeezed, bounded), newest last: a summary that
/// holds one names the conversation it compacted. In memory: after a restart only newer replies count.
#[derive(Default)]
pub struct RecentReplies {
    replies: VecDeque<(u64, Hash, String)>,
}

impl RecentReplies {
    const CAPACITY: usize = 256;
    /// Characters of a reply kept.
    const MAX_CHARS: usize = 16_384;
    /// Conversations with the same first message a summary is checked against, the newest first.
    const CHECKED: usize = 16;

    /// Records `conversation`'s latest reply (a conversation holds one entry: its latest).
    pub fn push(&mut self, conversation: u64, first: Hash, reply: &str) {
        self.replies.retain(|(c, _, _)| *c != conversation);
        let text: String = anatomy::squeezed(reply).chars().take(Self::MAX_CHARS).collect();
        if text.chars().count() < 40 {
            return;
        }
        self.replies.push_back((conversation, first, text));
        if self.replies.len() > Self::CAPACITY {
            self.replies.pop_front();
        }
    }

    /// The newest conversation whose first message is `first` and whose latest reply `text` holds.
    fn held_by(&self, first: &Hash, text: &str) -> Option<u64> {
        let candidates = self.replies.iter().rev().filter(|(_, f, _)| f == first).take(Self::CHECKED);
        candidates.filter(|(_, _, reply)| history::carries(text, reply)).map(|(c, _, _)| *c).next()
    }
}

/// Decides where a request belongs.
pub fn decide(store: &Store, request: &Request<'_>, name: Option<&str>) -> Result<Decision, StoreError> {
    let (messages, chain) = (request.messages, request.chain);
    if let Some(name) = name {
        return decide_named(store, request, name);
    }
    // 1. A conversation whose latest turn this request extends (longest first) or, failing that, repeats.
    let mut regenerate = None;
    for j in (1..=chain.len()).rev() {
        let Some(id) = store.end(&chain[j - 1])? else { continue };
        let Some(conversation) = store.conversation(id)? else { continue };
        match continues(&conversation, chain) {
            Some((relation @ Relation::Extend { .. }, base)) => {
                return Ok(Decision { conversation: Some(conversation), relation, base: Some(base), branch_of: None });
            }
            Some((relation, base)) if regenerate.is_none() => {
                regenerate = Some(Decision { conversation: Some(conversation), relation, base: Some(base), branch_of: None });
            }
            _ => {}
        }
    }
    if let Some(decision) = regenerate {
        return Ok(decision);
    }
    // 2. A conversation whose latest reply this request carries, with its history rewritten.
    if let Some(decision) = carries_latest_reply(store, request)? {
        return Ok(decision);
    }
    // 3. The longest prefix shared with any earlier turn.
    let Some((len, entry)) = longest_prefix(store, chain)? else {
        return Ok(compacted(store, request, None)?.unwrap_or(Decision {
            conversation: None,
            relation: Relation::New,
            base: None,
            branch_of: None,
        }));
    };
    let base = Some(BaseRef { turn: entry.turn, len: len as u32 });
    // Sharing only what a harness puts in front of every session (system and developer messages,
    // Codex's environment context) is not sharing history.
    let beyond_system = messages[..len].iter().any(|m| !markers::is_preamble(m));
    if !beyond_system {
        return Ok(compacted(store, request, base)?.unwrap_or(Decision {
            conversation: None,
            relation: Relation::New,
            base,
            branch_of: None,
        }));
    }
    // 4. An edit of that conversation's latest history, or a branch.
    if let Some(conversation) = store.conversation(entry.conversation)? {
        if edits(store, &conversation, request)? {
            return diverged(store, conversation, request, base);
        }
    }
    let branch = BranchRef { conversation: entry.conversation, turn: entry.turn, shared_messages: len as u32 };
    Ok(Decision {
        conversation: None,
        relation: Relation::Branch { conversation: branch.conversation, turn: branch.turn, shared_messages: branch.shared_messages },
        base,
        branch_of: Some(branch),
    })
}

fn decide_named(store: &Store, request: &Request<'_>, name: &str) -> Result<Decision, StoreError> {
    let chain = request.chain;
    let base = longest_prefix(store, chain)?.map(|(len, e)| BaseRef { turn: e.turn, len: len as u32 });
    let Some(conversation) = store.conversation_by_name(name)?.map(|id| store.conversation(id)).transpose()?.flatten() else {
        return Ok(Decision { conversation: None, relation: Relation::New, base, branch_of: None });
    };
    if let Some((relation, base)) = continues(&conversation, chain) {
        return Ok(Decision { conversation: Some(conversation), relation, base: Some(base), branch_of: None });
    }
    diverged(store, conversation, request, base)
}

/// How many leading messages of a request that kept only its system prompt are looked at for a
/// compaction marker.
const MARKED_WITHIN: usize = 64;

/// How many assistant messages from the end are looked up in the latest-reply index.
const REPLY_LOOKBACK: usize = 8;

/// The conversation whose latest reply is among this request's last assistant messages.
fn carries_latest_reply(store: &Store, request: &Request<'_>) -> Result<Option<Decision>, StoreError> {
    let assistants = request.messages.iter().enumerate().rev().filter(|(_, m)| m.role() == Some("assistant"));
    for (i, message) in assistants.take(REPLY_LOOKBACK) {
        // As resent, or as the reply it was before the harness stripped its reasoning or (Responses)
        // the next response's calls joined it.
        let mut found = store.reply_of(&request.hashes[i])?;
        for form in anatomy::reply_forms(message) {
            if found.is_some() {
                break;
            }
            found = store.reply_of(&ctxscope_store::message_hash(&form).0)?;
        }
        let Some(id) = found else { continue };
        let Some(conversation) = store.conversation(id)? else { continue };
        let base = longest_prefix(store, request.chain)?.map(|(len, e)| BaseRef { turn: e.turn, len: len as u32 });
        return Ok(Some(diverged(store, conversation, request, base)?));
    }
    Ok(None)
}

/// Whether the request is `conversation`'s latest history edited (see [`history::edit_of_history`]).
fn edits(store: &Store, conversation: &ConversationRecord, request: &Request<'_>) -> Result<bool, StoreError> {
    let Some(previous) = store.turn(conversation.last_turn)? else { return Ok(false) };
    let rule = reasoning_rule(request.model, request.endpoint.as_str());
    crate::detect::with_sides(store, &previous, request.hashes, request.messages, request.capture, |before, after| {
        history::edit_of_history(before, after, rule).is_some()
    })
}

/// A request that kept at most the system prompt of a conversation it compacted: one of its messages
/// carries a known compaction marker, and one holds the latest reply of a recent conversation with
/// the same first message (the summary the harness asked that conversation's model for).
fn compacted(store: &Store, request: &Request<'_>, base: Option<BaseRef>) -> Result<Option<Decision>, StoreError> {
    // Summaries sit near the front of a compacted history: the first messages are enough. The summary
    // is the marked message itself (Claude Code) or the one after it (opencode's answer).
    let marked: Vec<usize> =
        request.messages.iter().take(MARKED_WITHIN).enumerate().filter(|(_, m)| markers::harness_of(m).is_some()).map(|(i, _)| i).collect();
    let Some(first) = request.hashes.first().filter(|_| !marked.is_empty()) else { return Ok(None) };
    let texts = marked
        .iter()
        .flat_map(|&i| [i, i + 1])
        .filter_map(|i| request.messages.get(i))
        .map(|m| anatomy::squeezed(&anatomy::visible_text(m)));
    let held = texts.into_iter().find_map(|text| request.recent.held_by(first, &text));
    let Some(id) = held else { return Ok(None) };
    let Some(conversation) = store.conversation(id)? else { return Ok(None) };
    Ok(Some(diverged(store, conversation, request, base)?))
}

/// A request in `conversation` that does not extend its latest turn.
fn diverged(store: &Store, conversation: ConversationRecord, request: &Request<'_>, base: Option<BaseRef>) -> Result<Decision, StoreError> {
    let previous = store.turn(conversation.last_turn)?;
    let shared = match &previous {
        Some(turn) => {
            let theirs = store.turn_messages(turn)?;
            theirs.iter().zip(request.hashes).take_while(|(a, b)| a == b).count()
        }
        None => 0,
    };
    let relation = Relation::Diverged { previous_turn: conversation.last_turn, shared_messages: shared as u32 };
    Ok(Decision { conversation: Some(conversation), relation, base, branch_of: None })
}

/// Whether the request continues `conversation`'s latest turn: its messages plus reply (tail), or its
/// messages alone (head) followed by more, or exactly its messages again (regenerate).
fn continues(conversation: &ConversationRecord, chain: &[Hash]) -> Option<(Relation, BaseRef)> {
    let n = chain.len();
    let k = conversation.last_message_count as usize;
    let last = conversation.last_turn;
    let at = |len: usize| (len >= 1 && len <= n).then(|| to_hex(&chain[len - 1]));
    if conversation.last_tail.is_some() && n > k && at(k + 1).as_ref() == conversation.last_tail.as_ref() {
        return Some((Relation::Extend { parent_turn: last }, BaseRef { turn: last, len: (k + 1) as u32 }));
    }
    if at(k).as_deref() == Some(conversation.last_head.as_str()) {
        let base = BaseRef { turn: last, len: k as u32 };
        return Some(if n > k { (Relation::Extend { parent_turn: last }, base) } else { (Relation::Regenerate { turn: last }, base) });
    }
    None
}

/// The longest prefix shared with an earlier turn, as the store's prefix index records it (every
/// length of short deltas; long runs of new messages sampled, see `Store::longest_prefix`).
fn longest_prefix(store: &Store, chain: &[Hash]) -> Result<Option<(usize, ctxscope_store::PrefixEntry)>, StoreError> {
    store.longest_prefix(chain)
}
