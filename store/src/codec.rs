//! Keyspaces and encoding, in one place: tree names, big-endian id keys, and the JSON value codec.

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
}

pub const SCHEMA_KEY: &[u8] = b"schema_version";

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

pub fn encode<T: Serialize>(kind: &'static str, value: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(value).map_err(|source| StoreError::Encode { kind, source })
}

pub fn decode<T: DeserializeOwned>(kind: &'static str, key: &[u8], bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|source| StoreError::Decode { kind, key: hex_key(key), source })
}

fn hex_key(key: &[u8]) -> String {
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
}
