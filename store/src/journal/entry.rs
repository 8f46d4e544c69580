//! What a journal record's payload says: JSON, LZ4-compressed. A turn keeps what its commit wrote
//! that cannot be derived from earlier turns: its record, its conversation after it, the canonical
//! JSON of the messages it added, and the prefix points it recorded (not its whole chain, which
//! would grow with the conversation on every turn). The turn's message hashes are left out: each is
//! the SHA-256 of its message's canonical JSON, computed again when the record is read (as hex they
//! would be most of a long request's record, and do not compress). A turn captured below full
//! (`capture`: masked text, or none) keeps its hashes in its record instead: what is kept of its
//! messages is not what they hash. Records without a level are full and recompute as before.

use serde::{Deserialize, Serialize};

use crate::hash::{canonical_hash, from_hex, to_hex, Hash};
use crate::records::{CaptureLevel, ConversationRecord, FindingRecord, HashHex, TurnRecord};
use crate::StoreError;

/// A turn as the journal keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnEntry {
    pub turn: TurnRecord,
    pub conversation: ConversationRecord,
    /// Canonical JSON of the turn's new messages, then its reply (the hashes are the turn's); masked
    /// for a redacted turn, empty for a hashes-only one.
    pub messages: Vec<String>,
    /// The prefix lengths the turn recorded, with their chain hashes.
    pub points: Vec<(u32, HashHex)>,
    /// The request's chain hash (the head; absent for a request without messages).
    pub head: Option<HashHex>,
    pub tail: Option<HashHex>,
}

impl TurnEntry {
    /// The messages with their hashes, in the order a draft holds them (the turn's new messages' hashes,
    /// put back on reading, then its reply's); `None` when the last message kept is not the reply the
    /// turn names.
    pub fn hashed_messages(&self) -> Option<Vec<(Hash, Vec<u8>)>> {
        if self.turn.capture != CaptureLevel::Full {
            // The hashes are the record's own; the text is masked (one entry a message) or absent.
            let reply = match self.turn.reply.as_deref() {
                Some(hex) => Some(from_hex(hex)?),
                None => None,
            };
            let hashes: Vec<Hash> = self.turn.new_messages.iter().copied().chain(reply).collect();
            return match self.turn.capture {
                CaptureLevel::Hashes if self.messages.is_empty() => Some(hashes.into_iter().map(|h| (h, Vec::new())).collect()),
                _ if self.messages.len() == hashes.len() => {
                    Some(hashes.into_iter().zip(&self.messages).map(|(h, m)| (h, m.as_bytes().to_vec())).collect())
                }
                _ => None,
            };
        }
        let reply = match (self.turn.reply.as_deref(), self.messages.last()) {
            (Some(hex), Some(last)) => Some(from_hex(hex).filter(|hash| *hash == canonical_hash(last.as_bytes()))?),
            (Some(_), None) => return None,
            (None, _) => None,
        };
        let hashes = self.turn.new_messages.iter().copied().chain(reply);
        Some(hashes.zip(&self.messages).map(|(hash, message)| (hash, message.as_bytes().to_vec())).collect())
    }

    /// The turn as committed: its new messages' hashes put back from the messages kept.
    fn restore_hashes(&mut self) {
        if self.turn.capture != CaptureLevel::Full {
            return;
        }
        let new = self.messages.len() - usize::from(self.turn.reply.is_some() && !self.messages.is_empty());
        self.turn.new_messages = self.messages[..new].iter().map(|m| canonical_hash(m.as_bytes())).collect();
    }

    pub fn points(&self) -> Vec<(usize, Hash)> {
        self.points.iter().filter_map(|(len, hex)| Some((*len as usize, from_hex(hex)?))).collect()
    }
}

/// The payload of a turn record.
pub fn encode_turn(
    turn: &TurnRecord,
    conversation: &ConversationRecord,
    messages: &[(Hash, Vec<u8>)],
    points: &[(usize, Hash)],
    head: Option<Hash>,
    tail: Option<Hash>,
) -> Result<Vec<u8>, StoreError> {
    #[derive(Serialize)]
    struct Out<'a> {
        turn: &'a TurnRecord,
        conversation: &'a ConversationRecord,
        messages: Vec<std::borrow::Cow<'a, str>>,
        points: Vec<(u32, HashHex)>,
        head: Option<HashHex>,
        tail: Option<HashHex>,
    }
    // The hashes go (see the module's note); a copy of the record without them. Below full they
    // stay: they are not the hashes of what is kept.
    let kept = if turn.capture == CaptureLevel::Full { Vec::new() } else { turn.new_messages.clone() };
    let turn = &TurnRecord { new_messages: kept, ..turn.clone() };
    let hashes_only = turn.capture == CaptureLevel::Hashes;
    let out = Out {
        turn,
        conversation,
        messages: messages.iter().filter(|_| !hashes_only).map(|(_, json)| String::from_utf8_lossy(json)).collect(),
        points: points.iter().map(|(len, hash)| (*len as u32, to_hex(hash))).collect(),
        head: head.as_ref().map(to_hex),
        tail: tail.as_ref().map(to_hex),
    };
    compress("journal turn", &out)
}

/// A turn record's payload read back.
pub fn decode_turn(payload: &[u8], id: u64) -> Result<TurnEntry, StoreError> {
    let mut entry: TurnEntry = decompress("journal turn", payload, id)?;
    entry.restore_hashes();
    Ok(entry)
}

pub fn encode_finding(finding: &FindingRecord) -> Result<Vec<u8>, StoreError> {
    compress("journal finding", finding)
}

pub fn decode_finding(payload: &[u8], id: u64) -> Result<FindingRecord, StoreError> {
    decompress("journal finding", payload, id)
}

/// A removal says nothing past its header.
pub fn encode_deleted() -> Vec<u8> {
    Vec::new()
}

fn compress<T: Serialize + ?Sized>(kind: &'static str, value: &T) -> Result<Vec<u8>, StoreError> {
    let json = serde_json::to_vec(value).map_err(|source| StoreError::Encode { kind, source })?;
    Ok(lz4_flex::compress_prepend_size(&json))
}

fn decompress<T: serde::de::DeserializeOwned>(kind: &'static str, payload: &[u8], id: u64) -> Result<T, StoreError> {
    let damaged = |detail: String| StoreError::Damaged { tree: "journal", key: id.to_string(), detail };
    let json = lz4_flex::decompress_size_prepended(payload).map_err(|e| damaged(format!("cannot decompress: {e}")))?;
    serde_json::from_slice(&json).map_err(|source| StoreError::Decode { kind, key: id.to_string(), source })
}
