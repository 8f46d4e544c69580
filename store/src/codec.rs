//! Keyspaces and encoding, in one place: tree names, big-endian id keys, and the value codec.
//!
//! Every record value is framed: `[format byte][CRC32 of key ++ payload, big-endian][payload]`. Format
//! 0x01: the payload is the record's JSON (a message's canonical JSON; a pack's entries, see
//! [`crate::pack::encode_pack`]). Format 0x02, turns only: the turn's JSON without its message hashes, then the
//! hashes as raw 32-byte runs ([`encode_turn`]: 32 bytes a message instead of 67 of hex JSON).
//! Reads check the CRC and report a mismatch as [`StoreError::Damaged`] naming the tree and key.
//! Records written before framing existed are bare JSON: their first byte starts a JSON value (`{`,
//! `[`, `"`, a digit, `-`, `t`, `f`, `n`), never 0x01 or 0x02, so they still decode, unchecked (a
//! message's is still checked by `store check` against its SHA-256 key). Any other first byte is a
//! format this release does not know: damaged.

use serde::{de::DeserializeOwned, Serialize};

use crate::hash::Hash;
use crate::records::TurnRecord;
use crate::StoreError;

/// Tree names. One tree per record kind.
pub mod trees {
    pub const META: &str = "meta";
    pub const MESSAGES: &str = "messages";
    pub const TURNS: &str = "turns";
    /// turn id -> the canonical JSON of the messages the turn added (its request past its base, then
    /// its reply), in one record (`pack::encode_pack`); a message too large to pack is in MESSAGES.
    pub const PACKS: &str = "packs";
    pub const CONVERSATIONS: &str = "conversations";
    /// conversation id ++ turn id -> empty.
    pub const CONVERSATION_TURNS: &str = "conversation_turns";
    /// chain hash -> PrefixEntry, for the prefix lengths threading looks up (`commit::prefix_lengths`).
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
    /// turn id -> the writes of a turn being committed (`intent`); empty between commits.
    pub const INTENTS: &str = "intents";
    /// fingerprint hash (hex) -> Fingerprint.
    pub const FINGERPRINTS: &str = "fingerprints";
}

pub const SCHEMA_KEY: &[u8] = b"schema_version";

/// The first byte of a framed record (format version 1: CRC32 then payload).
pub const FRAME_V1: u8 = 0x01;
/// The first byte of a turn record in the binary layout: CRC32, then the turn's JSON length (4 bytes,
/// big-endian), its JSON with `new_messages` empty, and the message hashes, 32 bytes each.
pub const FRAME_TURN_V2: u8 = 0x02;
/// A turn whose messages are packed (`pack`): as [`FRAME_TURN_V2`], but only the hashes of the
/// request messages its pack does not hold (those stored on their own in `messages`). The others are
/// the SHA-256 of their packed JSON, computed when the turn is read with its pack.
pub const FRAME_TURN_V3: u8 = 0x03;
const HEADER: usize = 5;
/// A message whose canonical JSON is at least this long is stored on its own in `messages` (once,
/// by hash, shared by every turn that sends it); shorter ones are packed into their turn's record.
pub const PACK_LIMIT: usize = 4096;

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
    frame_as(FRAME_V1, key, payload)
}

pub(crate) fn frame_as(format: u8, key: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.push(format);
    out.extend_from_slice(&checksum(key, payload).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// The payload of a stored value, its checksum verified (a record from before framing is returned
/// as it is). Errors name `tree` and `key`.
pub fn unframe<'a>(tree: &'static str, key: &[u8], bytes: &'a [u8]) -> Result<&'a [u8], StoreError> {
    match bytes.first() {
        Some(&FRAME_V1) => checked(tree, key, bytes),
        Some(first) if is_legacy(*first) => Ok(bytes),
        Some(first) => Err(damaged(tree, key, format!("unknown record format (first byte {first:#04x})"))),
        None => Err(damaged(tree, key, "empty record".into())),
    }
}

pub(crate) fn damaged(tree: &'static str, key: &[u8], detail: String) -> StoreError {
    StoreError::Damaged { tree, key: hex_key(key), detail }
}

/// The payload after a frame header, its checksum verified.
pub(crate) fn checked<'a>(tree: &'static str, key: &[u8], bytes: &'a [u8]) -> Result<&'a [u8], StoreError> {
    let Some(payload) = bytes.get(HEADER..) else {
        return Err(damaged(tree, key, format!("record of {} bytes is shorter than its header", bytes.len())));
    };
    let stored = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
    let computed = checksum(key, payload);
    if stored != computed {
        return Err(damaged(tree, key, format!("checksum mismatch (stored {stored:08x}, computed {computed:08x})")));
    }
    Ok(payload)
}

/// A turn record for storage under `key`, in the binary layout ([`FRAME_TURN_V2`]).
pub fn encode_turn(key: &[u8], turn: &TurnRecord) -> Result<Vec<u8>, StoreError> {
    turn_layout(FRAME_TURN_V2, key, turn, |_| true)
}

/// A turn record whose request messages are in its pack where `packed(i)` ([`FRAME_TURN_V3`]): only
/// the other messages' hashes are written.
pub fn encode_packed_turn(key: &[u8], turn: &TurnRecord, packed: impl Fn(usize) -> bool) -> Result<Vec<u8>, StoreError> {
    turn_layout(FRAME_TURN_V3, key, turn, |i| !packed(i))
}

fn turn_layout(format: u8, key: &[u8], turn: &TurnRecord, keep: impl Fn(usize) -> bool) -> Result<Vec<u8>, StoreError> {
    let shell = TurnRecord { new_messages: Vec::new(), ..turn.clone() };
    let json = json(trees::TURNS, &shell)?;
    let mut payload = Vec::with_capacity(4 + json.len() + 32 * turn.new_messages.len());
    payload.extend_from_slice(&(json.len() as u32).to_be_bytes());
    payload.extend_from_slice(&json);
    for (i, hash) in turn.new_messages.iter().enumerate() {
        if keep(i) {
            payload.extend_from_slice(hash);
        }
    }
    Ok(frame_as(format, key, &payload))
}

/// Whether a stored turn record can only be read with its pack ([`FRAME_TURN_V3`]).
pub fn needs_pack(bytes: &[u8]) -> bool {
    bytes.first() == Some(&FRAME_TURN_V3)
}

/// A turn record read under `key`: the binary layouts, or JSON (framed or from before framing). A
/// [`FRAME_TURN_V3`] record needs the entries of its turn's pack (`pack::Pack::entries`); without
/// them, it is damage.
pub fn decode_turn<'a, E>(key: &[u8], bytes: &[u8], pack: Option<E>) -> Result<TurnRecord, StoreError>
where
    E: ExactSizeIterator<Item = Option<&'a [u8]>>,
{
    let format = bytes.first().copied();
    if format != Some(FRAME_TURN_V2) && format != Some(FRAME_TURN_V3) {
        return decode(trees::TURNS, key, bytes);
    }
    let payload = checked(trees::TURNS, key, bytes)?;
    let bad = |detail: &str| damaged(trees::TURNS, key, detail.into());
    let len =
        payload.get(..4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize).ok_or_else(|| bad("turn record cut short"))?;
    let json = payload.get(4..4 + len).ok_or_else(|| bad("turn record cut short"))?;
    let hashes = &payload[4 + len..];
    if hashes.len() % 32 != 0 {
        return Err(bad("message hashes are not whole 32-byte runs"));
    }
    let mut turn: TurnRecord =
        serde_json::from_slice(json).map_err(|source| StoreError::Decode { kind: trees::TURNS, key: hex_key(key), source })?;
    let mut stored = hashes.chunks_exact(32).map(|c| Hash::try_from(c).unwrap_or_default());
    if format == Some(FRAME_TURN_V2) {
        turn.new_messages = stored.collect();
        return Ok(turn);
    }
    let pack = pack.ok_or_else(|| bad("its pack is missing"))?;
    let requested = pack.len().checked_sub(usize::from(turn.reply.is_some())).ok_or_else(|| bad("its pack holds no reply"))?;
    let mut messages = Vec::with_capacity(requested);
    for entry in pack.take(requested) {
        messages.push(match entry {
            Some(json) => crate::hash::canonical_hash(json),
            None => stored.next().ok_or_else(|| bad("fewer message hashes than its pack leaves out"))?,
        });
    }
    if stored.next().is_some() {
        return Err(bad("more message hashes than its pack leaves out"));
    }
    turn.new_messages = messages;
    Ok(turn)
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

/// The key [`hex_key`] wrote as `text` (None: not even-length lowercase or uppercase hex).
pub fn key_from_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_PACK: Option<std::iter::Empty<Option<&[u8]>>> = None;

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
    fn a_turn_keeps_its_hashes_raw_and_round_trips() {
        let hashes: Vec<Hash> = (0..3u8).map(|i| [i; 32]).collect();
        let turn = crate::store_test_turn(7, 1, hashes.clone());
        let value = encode_turn(&id_key(7), &turn).unwrap();
        assert_eq!(value[0], FRAME_TURN_V2);
        assert_eq!(&value[value.len() - 96..], hashes.concat().as_slice());
        assert_eq!(decode_turn(&id_key(7), &value, NO_PACK).unwrap(), turn);
        // The JSON layout (framed or bare) still reads.
        assert_eq!(decode_turn(&id_key(7), &encode(trees::TURNS, &id_key(7), &turn).unwrap(), NO_PACK).unwrap(), turn);
        assert_eq!(decode_turn(&id_key(7), &json("turn", &turn).unwrap(), NO_PACK).unwrap(), turn);
        let mut bad = value.clone();
        bad[9] ^= 1;
        assert!(matches!(decode_turn(&id_key(7), &bad, NO_PACK), Err(StoreError::Damaged { tree: "turns", .. })));
        assert!(matches!(decode_turn(&id_key(8), &value, NO_PACK), Err(StoreError::Damaged { .. })));
    }

    #[test]
    fn a_packed_turn_leaves_its_packed_hashes_to_its_pack() {
        let (a, b, reply) = (&b"{\"content\":\"a\"}"[..], &b"{\"content\":\"b\"}"[..], &b"{\"content\":\"r\"}"[..]);
        let large: Hash = [9; 32];
        let hashes: Vec<Hash> = vec![crate::hash::canonical_hash(a), large, crate::hash::canonical_hash(b)];
        let mut turn = crate::store_test_turn(7, 1, hashes.clone());
        turn.reply = Some(crate::to_hex(&crate::hash::canonical_hash(reply)));
        let key = id_key(7);
        let value = encode_packed_turn(&key, &turn, |i| i != 1).unwrap();
        assert_eq!(value[0], FRAME_TURN_V3);
        assert!(needs_pack(&value) && !needs_pack(&encode_turn(&key, &turn).unwrap()));
        assert_eq!(&value[value.len() - 32..], &large[..], "only the hash the pack does not hold is written");
        let pack = crate::pack::decode_pack(&key, &crate::pack::encode_pack(&key, &[Some(a), None, Some(b), Some(reply)])).unwrap();
        assert_eq!(decode_turn(&key, &value, Some(pack.entries())).unwrap(), turn);
        assert!(decode_turn(&key, &value, NO_PACK).unwrap_err().to_string().contains("pack is missing"));
        // A pack that disagrees with the record about what it leaves out.
        let other = crate::pack::decode_pack(&key, &crate::pack::encode_pack(&key, &[Some(a), Some(b), Some(b), Some(reply)])).unwrap();
        assert!(matches!(decode_turn(&key, &value, Some(other.entries())), Err(StoreError::Damaged { tree: "turns", .. })));
        let short = crate::pack::decode_pack(&key, &crate::pack::encode_pack(&key, &[None, None, None, Some(reply)])).unwrap();
        assert!(decode_turn(&key, &value, Some(short.entries())).unwrap_err().to_string().contains("fewer message hashes"));
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
