//! Message content addresses with a memo. Every request resends the whole history, so the pipeline
//! would canonicalise and SHA-256 every old message again; instead a message is first looked up by a
//! randomly keyed 64-bit hash of its JSON structure, and only messages not seen before pay for the
//! canonical form and SHA-256. The memo is bounded; clearing it only costs recomputation.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash as StdHash, Hasher};

use ctxscope_store::{message_hash, Hash};
use serde_json::Value;

/// Entries kept before the memo is dropped: 57,344, seven eighths of 65,536, the most a table of
/// 65,536 slots holds before it doubles (2.7 MB; one more entry made it 5.4 MB). It was a million
/// (86 MB once full), then 131,072 (11 MB, held after large requests had filled it); the histories
/// passing through at once longer than this are hashed again on each request instead.
const MAX_ENTRIES: usize = (1 << 16) / 8 * 7;

pub struct MessageHashes {
    keys: RandomState,
    memo: HashMap<u64, Hash>,
}

impl Default for MessageHashes {
    fn default() -> Self {
        MessageHashes { keys: RandomState::new(), memo: HashMap::new() }
    }
}

impl MessageHashes {
    /// The content address of `message` (as [`ctxscope_store::message_hash`] computes it).
    pub fn hash(&mut self, message: &Value) -> Hash {
        let key = self.keys.hash_one(Structure(message));
        if let Some(hash) = self.memo.get(&key) {
            return *hash;
        }
        if self.memo.len() >= MAX_ENTRIES {
            // A new table, not `clear`: that would keep the full one's allocation.
            self.memo = HashMap::new();
        }
        let (hash, _) = message_hash(message);
        self.memo.insert(key, hash);
        hash
    }
}

/// Hashes a JSON value by its structure: type tags, lengths, keys (in serde_json's sorted order), text.
struct Structure<'a>(&'a Value);

impl StdHash for Structure<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        walk(self.0, state);
    }
}

fn walk<H: Hasher>(value: &Value, h: &mut H) {
    match value {
        Value::Null => h.write_u8(0),
        Value::Bool(b) => h.write_u8(if *b { 2 } else { 1 }),
        Value::Number(n) => {
            h.write_u8(3);
            h.write(n.to_string().as_bytes());
        }
        Value::String(s) => {
            h.write_u8(4);
            h.write_usize(s.len());
            h.write(s.as_bytes());
        }
        Value::Array(items) => {
            h.write_u8(5);
            h.write_usize(items.len());
            items.iter().for_each(|v| walk(v, h));
        }
        Value::Object(map) => {
            h.write_u8(6);
            h.write_usize(map.len());
            for (k, v) in map {
                h.write_usize(k.len());
                h.write(k.as_bytes());
                walk(v, h);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_full_memo_stays_in_one_table_size() {
        let mut memo = MessageHashes::default();
        for i in 0..MAX_ENTRIES + 10 {
            memo.hash(&serde_json::json!({"role": "user", "content": i}));
        }
        // Replaced once full, never grown past the table that holds MAX_ENTRIES.
        assert_eq!(memo.memo.len(), 10);
        let mut full: HashMap<u64, Hash> = HashMap::new();
        full.extend((0..MAX_ENTRIES as u64).map(|k| (k, [0; 32])));
        assert!(full.capacity() < 2 * MAX_ENTRIES, "{} slots usable for {MAX_ENTRIES} entries", full.capacity());
    }

    #[test]
    fn memoised_hashes_equal_the_content_address() {
        let mut memo = MessageHashes::default();
        let messages = [
            json!({"role": "user", "content": "hi"}),
            json!({"role": "user", "content": [{"type": "text", "text": "hi"}]}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "{}"}}]}),
            json!({"role": "user", "content": "hi "}),
        ];
        for _ in 0..2 {
            for m in &messages {
                assert_eq!(memo.hash(m), message_hash(m).0);
            }
        }
        assert_eq!(memo.memo.len(), 4);
        // Different structure with the same text must not share an entry.
        assert_ne!(memo.hash(&json!({"a": "bc"})), memo.hash(&json!({"ab": "c"})));
    }
}
