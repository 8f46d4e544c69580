//! The capture store: sled, owned here and nowhere else.
//!
//! One sled tree per record kind (messages, turns, conversations, indexes), big-endian sequence keys,
//! JSON values encoded and decoded in `codec`, a schema version checked on open, and retention by age
//! and size. The proxy writes through it off the request path; the CLI and replay read through it.

pub mod codec;
pub mod error;
pub mod hash;
pub mod records;
pub mod retention;
mod store;

pub use error::StoreError;
pub use hash::{canonical_message, chain_next, extend_chain, from_hex, message_hash, to_hex, Hash, ZERO_HASH};
pub use records::*;
pub use retention::{RetentionPolicy, RetentionReport};
pub use store::{IdSpace, Store, StoreOptions, SCHEMA_VERSION};
mod bulk;
pub mod check;
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
    }
}
