//! Content addresses: the canonical form of a chat message, its SHA-256, and the prefix hash chain
//! h_i = H(h_(i-1) || message_hash_i) that threading and prefix comparison are built on.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// A 32-byte SHA-256 content address.
pub type Hash = [u8; 32];

/// The chain's starting value h_0.
pub const ZERO_HASH: Hash = [0u8; 32];

/// Canonical form of a message: object keys sorted (serde_json's map is ordered), null-valued keys
/// and Anthropic `cache_control` markers (which harnesses move from turn to turn) dropped, content made only of text parts flattened to one string, and an empty `content` beside
/// `tool_calls` dropped. Two encodings of the same message by different clients hash the same.
pub fn canonical_message(message: &Value) -> Value {
    match message {
        Value::Object(map) => {
            let mut out = Map::new();
            for (key, value) in map {
                if value.is_null() || key == "cache_control" {
                    continue;
                }
                let value = if key == "content" { flatten_content(value) } else { canonical_value(value) };
                out.insert(key.clone(), value);
            }
            let empty_content = matches!(out.get("content"), Some(Value::String(s)) if s.is_empty());
            if empty_content && out.contains_key("tool_calls") {
                out.remove("content");
            }
            Value::Object(out)
        }
        other => canonical_value(other),
    }
}

fn canonical_value(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, v)| !v.is_null() && k.as_str() != "cache_control")
                .map(|(k, v)| (k.clone(), canonical_value(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(canonical_value).collect()),
        other => other.clone(),
    }
}

/// `[{"type":"text","text":"a"},{"type":"text","text":"b"}]` becomes `"ab"`; anything else is kept.
fn flatten_content(content: &Value) -> Value {
    if let Value::Array(parts) = content {
        let mut text = String::new();
        for part in parts {
            match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                (Some("text"), Some(t)) if only_text_keys(part) => text.push_str(t),
                _ => return canonical_value(content),
            }
        }
        return Value::String(text);
    }
    canonical_value(content)
}

fn only_text_keys(part: &Value) -> bool {
    part.as_object().is_some_and(|o| o.keys().all(|k| matches!(k.as_str(), "type" | "text" | "cache_control")))
}

/// SHA-256 of the canonical JSON encoding of a message (already canonical or not).
pub fn message_hash(message: &Value) -> (Hash, Vec<u8>) {
    let canonical = canonical_message(message);
    let bytes = serde_json::to_vec(&canonical).unwrap_or_default();
    (canonical_hash(&bytes), bytes)
}

/// A message's content address from its canonical JSON (what [`message_hash`] computes).
pub fn canonical_hash(canonical: &[u8]) -> Hash {
    Sha256::digest(canonical).into()
}

/// One step of the prefix chain.
pub fn chain_next(prev: &Hash, message: &Hash) -> Hash {
    let mut h = Sha256::new();
    h.update(prev);
    h.update(message);
    h.finalize().into()
}

/// Extends `chain` (links of the messages before) with the links of `messages` after them.
pub fn extend_chain(chain: &mut Vec<Hash>, messages: &[Hash]) {
    let mut h = chain.last().copied().unwrap_or(ZERO_HASH);
    chain.reserve(messages.len());
    for message in messages {
        h = chain_next(&h, message);
        chain.push(h);
    }
}

/// Hex encoding used in JSON output and keys shown to users.
pub fn to_hex(hash: &Hash) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(64);
    for b in hash {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 15)] as char);
    }
    out
}

/// Serde for a list of hashes as hex strings: records hold raw 32-byte hashes in memory and on disk,
/// and their JSON form (`show --json`, export) spells each as 64 hex characters, as before.
pub mod hex_list {
    use serde::de::{Error, SeqAccess, Visitor};
    use serde::ser::SerializeSeq;
    use serde::{Deserializer, Serializer};

    use super::{from_hex, to_hex, Hash};

    pub fn serialize<S: Serializer>(hashes: &[Hash], serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(hashes.len()))?;
        for hash in hashes {
            seq.serialize_element(&to_hex(hash))?;
        }
        seq.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<Hash>, D::Error> {
        struct Hashes;
        impl<'de> Visitor<'de> for Hashes {
            type Value = Vec<Hash>;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of 64-character hex hashes")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Hash>, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
                while let Some(text) = seq.next_element::<std::borrow::Cow<'de, str>>()? {
                    out.push(from_hex(&text).ok_or_else(|| A::Error::custom(format!("{text:?} is not a 64-character hex hash")))?);
                }
                Ok(out)
            }
        }
        deserializer.deserialize_seq(Hashes)
    }
}

/// Parses a 64-character hex hash.
pub fn from_hex(text: &str) -> Option<Hash> {
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, chunk) in text.as_bytes().chunks(2).enumerate() {
        let s = std::str::from_utf8(chunk).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_form_ignores_key_order_nulls_and_text_parts() {
        let a = json!({"role": "user", "content": "hi", "name": null});
        let b = json!({"content": [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}], "role": "user"});
        assert_eq!(message_hash(&a).0, message_hash(&b).0);
        let c = json!({"role": "user", "content": "hi "});
        assert_ne!(message_hash(&a).0, message_hash(&c).0);
    }

    #[test]
    fn empty_content_beside_tool_calls_is_dropped() {
        let calls = json!([{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]);
        let a = json!({"role": "assistant", "content": "", "tool_calls": calls});
        let b = json!({"role": "assistant", "content": null, "tool_calls": calls});
        assert_eq!(message_hash(&a).0, message_hash(&b).0);
    }

    #[test]
    fn anthropic_cache_control_markers_do_not_change_the_hash() {
        let plain = json!({"role": "user", "content": [{"type": "text", "text": "hi"}]});
        let marked = json!({"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]});
        assert_eq!(message_hash(&plain).0, message_hash(&marked).0);
    }

    #[test]
    fn image_parts_are_kept_verbatim() {
        let m = json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]});
        assert_eq!(canonical_message(&m)["content"][0]["type"], "image_url");
    }

    #[test]
    fn chain_depends_on_order_and_hex_round_trips() {
        let (x, _) = message_hash(&json!({"role": "user", "content": "x"}));
        let (y, _) = message_hash(&json!({"role": "user", "content": "y"}));
        let xy = chain_next(&chain_next(&ZERO_HASH, &x), &y);
        let yx = chain_next(&chain_next(&ZERO_HASH, &y), &x);
        assert_ne!(xy, yx);
        assert_eq!(from_hex(&to_hex(&xy)), Some(xy));
        assert_eq!(from_hex("zz"), None);
    }

    #[test]
    fn hash_lists_are_hex_in_json() {
        #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
        struct Listed(#[serde(with = "hex_list")] Vec<Hash>);
        let (x, _) = message_hash(&json!({"role": "user", "content": "x"}));
        let text = serde_json::to_string(&Listed(vec![x, ZERO_HASH])).unwrap();
        assert_eq!(text, format!("[\"{}\",\"{}\"]", to_hex(&x), "0".repeat(64)));
        assert_eq!(serde_json::from_str::<Listed>(&text).unwrap(), Listed(vec![x, ZERO_HASH]));
        assert!(serde_json::from_str::<Listed>("[\"zz\"]").is_err());
    }
}
