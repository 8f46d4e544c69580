//! What the store's integration tests share: a store opened on a directory, and messages put into it.

use ctxscope_store::*;
use serde_json::json;

/// Puts a `{role, content}` message; its hex content address.
pub fn msg(store: &Store, role: &str, text: &str) -> HashHex {
    let (hash, bytes) = message_hash(&json!({"role": role, "content": text}));
    store.put_message(&hash, &bytes).unwrap();
    to_hex(&hash)
}

pub fn hash(hex: &str) -> Hash {
    from_hex(hex).unwrap()
}

pub fn open(dir: &std::path::Path) -> Store {
    unlocked(|| Store::open(dir, &StoreOptions::default())).unwrap()
}

/// Opens with `open`, retrying while sled's directory lock is still held (`ctxscope_testkit::sled_lock`).
pub use ctxscope_testkit::sled_lock::when_unlocked as unlocked;
