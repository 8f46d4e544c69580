//! Keyspaces and encoding, in one place: tree names, big-endian id keys, and the value codec.
//!
//! Every record value is framed: `[0x01][CRC32 of key ++ payload, big-endian][payload]`, the payload
//! being the record's JSON (a message's canonical JSON). Reads check the CRC and report a mismatch as
//! [`StoreError::Damaged`] naming the tree and key. Records written before framing existed are bare
//! JSON: their first byte starts a JSON value (`{`, `[`, `"`, a digit, `-`, `t`, `f`, `n`), never 0x01,
//! so they still decode, unchecked (a message's is still checked by `store check` against its
//! SHA-256 key). Any other first byte is a format this release does not know: damaged.

use serde::{de::DeserializeOwned, Serialize};

use crate::StoreError;

/// Tree names. One tree per record kind.
pub mod trees {
    pub const META: &str = "meta";
    pub const MESSAGES: &str = "messages";
    pub const TURNS: &str = "turns";
    pub const CONVERSATIONS: &str = "conversations";
    /// conversation id ++ turn id -> empty.
    pub const CONVERSATION_TURNS: &str = "conversation_turns";
    /// chain hash -> PrefixEntry.
    pub const PREFIXES: &str = "prefixes";
    /// chain hash of a conversation's latest head or tail -> conversation id (where the next turn attaches).
    pub const ENDS: &str = "ends";
    /// conversation name -> conversation id.
    pub const NAMES: &str = "names";
    /// hash of a conversation's latest reply -> conversation id (finds a request that kept the reply
    /// but rewrote the history before it).
    pub const REPLIES: &str = "replies";
    /// finding id -> FindingRecord.
    pub const FINDINGS: &str = "findings";
    /// cause key -> finding id (a cause is raised once).
    pub const FINDING_CAUSES: &str = "finding_causes";
    /// conversation id ++ finding id -> empty.
    pub const CONVERSATION_FINDINGS: &str = "conversation_findings";
    /// replay run id -> ReplayEntry.
    pub const REPLAYS: &str = "replays";
    /// updated_unix_ms ++ conversation id -> empty (the newest-first listing, see `listing`).
    pub const CONVERSATIONS_BY_UPDATED: &str = "conversations_by_updated";
    /// Responses API response id -> turn id.
    pub const RESPONSE_IDS: &str = "response_ids";
    /// fingerprint hash (hex) -> Fingerprint.
    pub const FINGERPRINTS: &str = "fingerprints";
}

pub const SCHEMA_KEY: &[u8] = b"schema_version";

/// The first byte of a framed record (format version 1: CRC32 then payload).
pub const FRAME_V1: u8 = 0x01;
const HEADER: usize = 5;

/// Big-endian so that sled's byte order is numeric order.
pub fn id_key(id: u64) -> [u8; 8] {
    id.to_be_bytes()
}

pub fn pair_key(a: u64, b: u64) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&a.to_be_bytes());
    key[8..].copy_from_slice(&b.to_be_bytes());
    key
}

pub fn key_id(key: &[u8]) -> Option<u64> {
    key.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_be_bytes)
}

/// The CRC a framed record carries: over its key, then its payload (a value moved to another key fails).
fn checksum(key: &[u8], payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(key);
    hasher.update(payload);
    hasher.finalize()
}

/// Frames `payload` for storage under `key`.
pub fn frame(key: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.push(FRAME_V1);
    out.extend_from_slice(&checksum(key, payload).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// The payload of a stored value, its checksum verified (a record from before framing is returned
/// as it is). Errors name `tree` and `key`.
pub fn unframe<'a>(tree: &'static str, key: &[u8], bytes: &'a [u8]) -> Result<&'a [u8], StoreError> {
    let damaged = |detail: String| StoreError::Damaged { tree, key: hex_key(key), detail };
    match bytes.first() {
        Some(&FRAME_V1) => {
            let Some(payload) = bytes.get(HEADER..) else {
                return Err(damaged(format!("record of {} bytes is shorter than its header", bytes.len())));
            };
            let stored = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
            let computed = checksum(key, payload);
            if stored != computed {
                return Err(damaged(format!("checksum mismatch (stored {stored:08x}, computed {computed:08x})")));
            }
            Ok(payload)
        }
        Some(first) if is_legacy(*first) => Ok(bytes),
        Some(first) => Err(damaged(format!("unknown record format (first byte {first:#04x})"))),
        None => Err(damaged("empty record".into())),
    }
}

/// Whether a value is a record from before framing: bare JSON.
pub fn is_legacy(first: u8) -> bool {
    matches!(first, b'{' | b'[' | b'"' | b'-' | b'0'..=b'9' | b't' | b'f' | b'n')
}

/// A record's JSON, framed for storage under `key` in `tree`.
pub fn encode<T: Serialize>(tree: &'static str, key: &[u8], value: &T) -> Result<Vec<u8>, StoreError> {
    Ok(frame(key, &json(tree, value)?))
}

/// Plain JSON, unframed (export lines and other output).
pub fn json<T: Serialize>(kind: &'static str, value: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(value).map_err(|source| StoreError::Encode { kind, source })
}

/// A record read from `tree` under `key`: checksum verified, then decoded.
pub fn decode<T: DeserializeOwned>(tree: &'static str, key: &[u8], bytes: &[u8]) -> Result<T, StoreError> {
    let payload = unframe(tree, key, bytes)?;
    serde_json::from_slice(payload).map_err(|source| StoreError::Decode { kind: tree, key: hex_key(key), source })
}

pub fn hex_key(key: &[u8]) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_keys_sort_numerically() {
        assert!(id_key(2) < id_key(10));
        assert!(pair_key(1, 300) < pair_key(2, 1));
        assert_eq!(key_id(&pair_key(7, 9)), Some(7));
    }

    #[test]
    fn a_flipped_byte_is_damage_naming_tree_and_key() {
        let value = encode("turns", &id_key(7), &serde_json::json!({"id": 7, "reply_text": "hello"})).unwrap();
        assert_eq!(decode::<serde_json::Value>("turns", &id_key(7), &value).unwrap()["id"], 7);
        let mut bad = value.clone();
        let at = bad.len() - 4;
        bad[at] ^= 0x20;
        let error = decode::<serde_json::Value>("turns", &id_key(7), &bad).unwrap_err();
        assert!(matches!(&error, StoreError::Damaged { tree: "turns", key, .. } if key == "0000000000000007"), "{error}");
        assert!(error.to_string().contains("checksum mismatch"), "{error}");
        // The same bytes under another key: damaged too.
        assert!(matches!(decode::<serde_json::Value>("turns", &id_key(8), &value), Err(StoreError::Damaged { .. })));
        // Cut short, or in a format this release does not know.
        assert!(matches!(unframe("turns", b"k", &value[..3]), Err(StoreError::Damaged { .. })));
        assert!(matches!(unframe("turns", b"k", &[0x02, 0, 0]), Err(StoreError::Damaged { .. })));
    }

    #[test]
    fn a_record_from_before_checksums_still_decodes() {
        let legacy = br#"{"id":7,"reply_text":"hello"}"#;
        let value: serde_json::Value = decode("turns", &id_key(7), legacy).unwrap();
        assert_eq!(value["reply_text"], "hello");
        for json in [&b"[1]"[..], b"\"s\"", b"-1", b"3", b"true", b"false", b"null"] {
            assert_eq!(unframe("messages", b"k", json).unwrap(), json);
        }
    }
}
