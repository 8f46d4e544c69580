//! The capture store: sled, owned here and nowhere else.
//!
//! One sled tree per record kind (messages, turns, conversations, indexes), big-endian sequence keys,
//! JSON values encoded and decoded in `codec`, a schema version checked on open, and retention by age
//! and size. The proxy writes through it off the request path; the CLI and replay read through it.

pub mod codec;
pub mod composition;
pub mod error;
pub mod hash;
pub mod records;
pub mod retention;
mod store;

pub use composition::{Composition, ContextLimit, Parts};
pub use error::StoreError;
pub use hash::{canonical_message, chain_next, extend_chain, from_hex, message_hash, to_hex, Hash, ZERO_HASH};
pub use records::*;
pub use retention::{RetentionPolicy, RetentionReport};
pub use store::{IdSpace, Store, StoreOptions, SCHEMA_VERSION};
mod bulk;
pub mod check;
mod clock;
mod commit;
pub mod export;
mod findings;
mod fingerprint;
mod intent;
pub mod journal;
mod listing;
mod losses;
mod marks;
pub mod pack;
mod prefixes;
mod read_only;
mod recover;
mod replays;
mod resolve;
pub mod spill;
#[cfg(test)]
mod test_support;

pub use check::{CheckReport, ConversationFate, Fate, JournalSummary, Problem, ProblemKind};
pub use commit::TurnDraft;
pub use findings::FindingFilter;
pub use fingerprint::{FieldChange, Fingerprint};
pub use journal::JOURNAL_DIR;
pub use listing::{ConversationPage, Cursor, PageQuery};
pub use losses::{Loss, NewLoss, LOSSES_FILE};
pub use marks::MARKS_FILE;
pub use prefixes::{PREFIX_EVERY, PREFIX_RUN};
pub use read_only::ReadOnlyStore;

/// A minimal turn for tests in this crate and its dependents (feature `test-support`).
#[cfg(any(test, feature = "test-support"))]
pub fn store_test_turn(id: u64, conversation: u64, new_messages: Vec<Hash>) -> TurnRecord {
    TurnRecord {
        id,
        conversation,
        index: 0,
        relation: Relation::New,
        time_unix_ms: 0,
        upstream: "http://upstream".into(),
        endpoint: Endpoint::ChatCompletions,
        method: "POST".into(),
        path: "/v1/chat/completions".into(),
        model: None,
        status: 200,
        stream: false,
        params: Default::default(),
        base: None,
        message_count: new_messages.len() as u32,
        new_messages,
        head: String::new(),
        reply: None,
        tail: None,
        local_tokens: None,
        usage: None,
        composition: None,
        timing: Timing::default(),
        chunks: 1,
        request_bytes: 0,
        response_bytes: 0,
        reply_text: String::new(),
        finish_reason: None,
        error: None,
        notes: Vec::new(),
        tools: None,
        responses: None,
        fingerprint: None,
        capture: Default::default(),
    }
}

/// Turn `id`, the `t`-th (from 1) of conversation `c`: its request is `history` (role, text), its reply
/// `reply`; past the first it extends the turn before it (id - 1) by its last request message. For
/// tests and benchmarks in this crate and its dependents (feature `test-support`).
#[cfg(any(test, feature = "test-support"))]
pub fn store_test_draft(c: u64, id: u64, history: &[(&str, String)], reply: &str, t: u64) -> TurnDraft {
    use serde_json::json;
    let hashed: Vec<(Hash, Vec<u8>)> = history.iter().map(|(role, text)| message_hash(&json!({"role": role, "content": text}))).collect();
    let mut chain = Vec::new();
    let mut h = ZERO_HASH;
    for (hash, _) in &hashed {
        h = chain_next(&h, hash);
        chain.push(h);
    }
    let base_len = if t == 1 { 0 } else { hashed.len() - 1 };
    let (reply_hash, reply_bytes) = message_hash(&json!({"role": "assistant", "content": reply}));
    let tail = chain_next(&h, &reply_hash);
    let mut turn = store_test_turn(id, c, hashed[base_len..].iter().map(|(h, _)| *h).collect());
    turn.index = (t - 1) as u32;
    if t > 1 {
        turn.base = Some(BaseRef { turn: id - 1, len: base_len as u32 });
        turn.relation = Relation::Extend { parent_turn: id - 1 };
    }
    turn.message_count = hashed.len() as u32;
    turn.head = to_hex(&h);
    turn.reply = Some(to_hex(&reply_hash));
    turn.tail = Some(to_hex(&tail));
    turn.time_unix_ms = 1_000 + id;
    let conversation = ConversationRecord {
        id: c,
        name: None,
        created_unix_ms: 1_000,
        updated_unix_ms: turn.time_unix_ms,
        upstream: "u".into(),
        model: None,
        turns: t as u32,
        last_turn: id,
        last_head: turn.head.clone(),
        last_message_count: turn.message_count,
        last_tail: turn.tail.clone(),
        branch_of: None,
        last_reply: turn.reply.clone(),
        capture: Default::default(),
    };
    let mut messages: Vec<(Hash, Vec<u8>)> = hashed[base_len..].to_vec();
    messages.push((reply_hash, reply_bytes));
    TurnDraft { messages, chain, tail: Some(tail), turn, conversation }
}
