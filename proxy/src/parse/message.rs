//! A request message: its JSON, parsed on first use when the message was already known by its bytes,
//! and the two facts every turn needs of every message (role, text bytes) without parsing it.

use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use serde_json::Value;

/// A message's role, the common ones without an allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    None,
    System,
    User,
    Assistant,
    Tool,
    Other(Arc<str>),
}

impl Role {
    fn of(message: &Value) -> Role {
        match message.get("role").and_then(Value::as_str) {
            None => Role::None,
            Some("system") => Role::System,
            Some("user") => Role::User,
            Some("assistant") => Role::Assistant,
            Some("tool") => Role::Tool,
            Some(other) => Role::Other(other.into()),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Role::None => None,
            Role::System => Some("system"),
            Role::User => Some("user"),
            Role::Assistant => Some("assistant"),
            Role::Tool => Some("tool"),
            Role::Other(role) => Some(role),
        }
    }
}

/// What is kept of a message known by its bytes, to stand in for its parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    pub role: Role,
    pub text_bytes: u64,
    /// A byte bound on the message's rendered text ([`bound_bytes`]).
    pub bound_bytes: u64,
}

impl Facts {
    pub fn of(message: &Value) -> Facts {
        Facts { role: Role::of(message), text_bytes: text_bytes(message), bound_bytes: bound_bytes(message) }
    }
}

/// One message of a request. Derefs to its JSON (parsing the bytes it was known by, once).
pub struct Message {
    value: OnceLock<Value>,
    /// The message's JSON text, when `value` is not parsed yet.
    raw: Option<Bytes>,
    facts: Facts,
}

impl Message {
    pub fn new(value: Value) -> Message {
        let facts = Facts::of(&value);
        Message { value: OnceLock::from(value), raw: None, facts }
    }

    /// A message whose JSON text `raw` was parsed before (by this process) into a message with `facts`.
    pub fn known(raw: Bytes, facts: Facts) -> Message {
        Message { value: OnceLock::new(), raw: Some(raw), facts }
    }

    pub fn value(&self) -> &Value {
        // The text parsed before, byte for byte; were it ever not to, the message reads as null.
        self.value.get_or_init(|| self.raw.as_ref().and_then(|raw| serde_json::from_slice(raw).ok()).unwrap_or(Value::Null))
    }

    /// Whether the message's JSON has been parsed (for tests of what reads it).
    #[cfg(test)]
    pub fn is_parsed(&self) -> bool {
        self.value.get().is_some()
    }

    pub fn role(&self) -> Option<&str> {
        self.facts.role.as_str()
    }

    /// Text bytes as a template renders them (see [`text_bytes`]).
    pub fn text_bytes(&self) -> u64 {
        self.facts.text_bytes
    }

    /// A byte bound on its rendered text (see [`bound_bytes`]).
    pub fn bound_bytes(&self) -> u64 {
        self.facts.bound_bytes
    }

    pub fn facts(&self) -> &Facts {
        &self.facts
    }
}

impl Deref for Message {
    type Target = Value;

    fn deref(&self) -> &Value {
        self.value()
    }
}

impl From<Value> for Message {
    fn from(value: Value) -> Message {
        Message::new(value)
    }
}

impl Clone for Message {
    fn clone(&self) -> Message {
        match self.value.get() {
            Some(value) => Message { value: OnceLock::from(value.clone()), raw: None, facts: self.facts.clone() },
            None => Message { value: OnceLock::new(), raw: self.raw.clone(), facts: self.facts.clone() },
        }
    }
}

impl PartialEq for Message {
    fn eq(&self, other: &Message) -> bool {
        self.value() == other.value()
    }
}

impl PartialEq<Value> for Message {
    fn eq(&self, other: &Value) -> bool {
        self.value() == other
    }
}

impl fmt::Debug for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.value().fmt(f)
    }
}

/// The messages' JSON values (parsing any not parsed yet).
pub fn values(messages: &[Message]) -> Vec<Value> {
    messages.iter().map(|m| m.value().clone()).collect()
}

/// Text bytes of a message as a template renders it: string contents, the text parts of a content
/// array, tool calls' names and arguments, reasoning. Images, audio and files are left out (their
/// bytes are not the model's text tokens).
pub fn text_bytes(message: &Value) -> u64 {
    let content = match message.get("content") {
        Some(Value::String(text)) => text.len() as u64,
        Some(Value::Array(parts)) => parts.iter().map(part_text_bytes).sum(),
        _ => 0,
    };
    let calls: u64 = message
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(|calls| {
            calls
                .iter()
                .map(|c| {
                    let f = c.get("function");
                    let field =
                        |name: &str| f.and_then(|f| f.get(name)).map_or(0, |v| v.as_str().map_or_else(|| v.to_string().len(), str::len));
                    (field("name") + field("arguments")) as u64
                })
                .sum()
        })
        .unwrap_or(0);
    let reasoning = message.get("reasoning_content").and_then(Value::as_str).map_or(0, |r| r.len() as u64);
    content + calls + reasoning
}

/// Bytes of a message's text as a template renders it (content; anything else as JSON): a token
/// covers at least one byte, so this bounds its tokens, with the per-message wrapping added apart.
pub fn bound_bytes(message: &Value) -> u64 {
    let bytes = match (message.get("content"), message.get("tool_calls")) {
        (Some(Value::String(text)), None) => text.len(),
        _ => message.to_string().len(),
    };
    bytes as u64
}

fn part_text_bytes(part: &Value) -> u64 {
    match part {
        Value::String(text) => text.len() as u64,
        Value::Object(o) => match o.get("type").and_then(Value::as_str) {
            Some("text" | "input_text" | "output_text") => o.get("text").and_then(Value::as_str).map_or(0, |t| t.len() as u64),
            // A tool result's content blocks (Anthropic) hold text too.
            Some("tool_result") => match o.get("content") {
                Some(Value::String(t)) => t.len() as u64,
                Some(Value::Array(inner)) => inner.iter().map(part_text_bytes).sum(),
                _ => 0,
            },
            _ => 0,
        },
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_known_message_parses_on_first_use_to_what_it_was() {
        let value = json!({"role": "assistant", "content": [{"type": "text", "text": "hello"}], "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]});
        let fresh = Message::new(value.clone());
        let raw = Bytes::from(serde_json::to_vec(&value).unwrap());
        let known = Message::known(raw, fresh.facts().clone());
        assert_eq!(known.role(), Some("assistant"));
        assert_eq!(known.text_bytes(), 5 + 1 + 2);
        assert!(known.value.get().is_none(), "facts must not need the parse");
        assert_eq!(known, value);
        assert_eq!(known.clone(), fresh);
        assert_eq!(Message::new(json!({"role": "critic"})).role(), Some("critic"));
        assert_eq!(Message::new(json!({"content": "x"})).role(), None);
    }
}
