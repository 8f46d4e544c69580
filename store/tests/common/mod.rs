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

/// Opens with `open`, retrying while sled's directory lock is still held: its background threads
/// release the lock a moment after the last handle is dropped, so reopening right after a drop can
/// fail with "could not acquire lock". Any other outcome is returned as it is.
pub fn unlocked<T, E: std::fmt::Display>(mut open: impl FnMut() -> Result<T, E>) -> Result<T, E> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match open() {
            Err(error) if error.to_string().contains("could not acquire lock") && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
}
