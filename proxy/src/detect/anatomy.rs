//! What a message is made of, as history edits see it: its kind (a user instruction, a tool result, a
//! system reminder, ...), its reasoning and media parts, and the hashes of the message without them,
//! so that a message resent without its reasoning or its images is still known as the same message.
//! Every API's shape is read here: chat `reasoning_content` / `reasoning`, Anthropic `thinking` and
//! `redacted_thinking` blocks and `tool_result` blocks, Responses `reasoning_items` and opaque items.

use serde::Serialize;
use serde_json::{Map, Value};

/// What a message is to the conversation (a message has one kind; reasoning and images are parts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A system or developer message: the rules.
    System,
    /// Something the user said.
    User,
    /// A harness-injected reminder (`<system-reminder>`), sent as a user or system message.
    SystemReminder,
    Assistant,
    /// A tool's output: a `tool` message, or a user message of Anthropic `tool_result` blocks.
    ToolResult,
    /// A compaction summary or an opaque compaction item.
    Summary,
    Other,
}

impl Kind {
    pub const ALL: [Kind; 7] =
        [Kind::System, Kind::User, Kind::SystemReminder, Kind::Assistant, Kind::ToolResult, Kind::Summary, Kind::Other];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::System => "system",
            Kind::User => "user",
            Kind::SystemReminder => "system_reminder",
            Kind::Assistant => "assistant",
            Kind::ToolResult => "tool_result",
            Kind::Summary => "summary",
            Kind::Other => "other",
        }
    }

    /// How much losing a message of this kind costs the model: rules and instructions most.
    pub fn weight(self) -> u8 {
        match self {
            Kind::System | Kind::User => 3,
            Kind::Assistant | Kind::Summary => 2,
            Kind::ToolResult | Kind::SystemReminder | Kind::Other => 1,
        }
    }
}

/// Keys of reasoning a chat message carries (DeepSeek / SGLang / vLLM; OpenRouter / newer vLLM;
/// Responses items folded into one assistant message).
const REASONING_KEYS: [&str; 3] = ["reasoning_content", "reasoning", "reasoning_items"];
/// Content part types that are reasoning (Anthropic).
const REASONING_PARTS: [&str; 2] = ["thinking", "redacted_thinking"];
/// Content part types that are media (OpenAI chat, Anthropic, Responses).
const MEDIA_PARTS: [&str; 8] = ["image_url", "image", "input_image", "input_audio", "audio", "file", "input_file", "document"];

/// The kind of a message.
pub fn kind(message: &Value) -> Kind {
    let role = message.get("role").and_then(Value::as_str).unwrap_or("");
    if role == crate::parse::responses::OPAQUE_ROLE {
        let item = message.get("item").and_then(|i| i.get("type")).and_then(Value::as_str);
        return if item.is_some_and(|t| t.contains("compaction")) { Kind::Summary } else { Kind::Other };
    }
    let reminder = || visible_text(message).trim_start().starts_with("<system-reminder>");
    match role {
        "system" | "developer" if reminder() => Kind::SystemReminder,
        "system" | "developer" => Kind::System,
        "tool" | "function" => Kind::ToolResult,
        "assistant" => Kind::Assistant,
        "user" if parts(message).is_some_and(|p| !p.is_empty() && p.iter().all(|p| part_type(p) == Some("tool_result"))) => {
            Kind::ToolResult
        }
        "user" if reminder() => Kind::SystemReminder,
        "user" => Kind::User,
        _ => Kind::Other,
    }
}

fn parts(message: &Value) -> Option<&Vec<Value>> {
    message.get("content").and_then(Value::as_array)
}

fn part_type(part: &Value) -> Option<&str> {
    part.get("type").and_then(Value::as_str)
}

/// The text a reader sees: a string content, or the text of its text parts (tool results' included).
pub fn visible_text(message: &Value) -> String {
    match message.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts.iter().map(part_text).filter(|t| !t.is_empty()).collect::<Vec<_>>().join("\n"),
        _ => String::new(),
    }
}

fn part_text(part: &Value) -> String {
    if let Some(text) = part.get("text").and_then(Value::as_str) {
        return text.to_string();
    }
    match part.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(inner)) => inner.iter().map(part_text).filter(|t| !t.is_empty()).collect::<Vec<_>>().join("\n"),
        _ => String::new(),
    }
}

/// The reasoning the message carries, as text: reasoning fields (Responses items as their JSON)
/// and the text of `thinking` blocks (a `redacted_thinking` block's opaque data), joined by lines.
pub fn reasoning_text(message: &Value) -> String {
    let fields = REASONING_KEYS.iter().filter_map(|k| message.get(*k)).filter_map(|v| match v {
        Value::String(s) => Some(s.clone()),
        Value::Null => None,
        other => Some(other.to_string()),
    });
    let blocks = parts(message)
        .into_iter()
        .flatten()
        .filter(|p| part_type(p).is_some_and(|t| REASONING_PARTS.contains(&t)))
        .filter_map(|p| p.get("thinking").or_else(|| p.get("data")).and_then(Value::as_str).map(str::to_string));
    fields.chain(blocks).filter(|t| !t.is_empty()).collect::<Vec<_>>().join("\n")
}

/// Whether a content part is media (an image, audio, a file).
pub fn is_media(part: &Value) -> bool {
    part_type(part).is_some_and(|t| MEDIA_PARTS.contains(&t))
}

/// Characters of reasoning the message carries (0: none).
pub fn reasoning_chars(message: &Value) -> usize {
    let fields: usize = REASONING_KEYS
        .iter()
        .filter_map(|k| message.get(*k))
        .map(|v| match v {
            Value::String(s) => s.chars().count(),
            Value::Null => 0,
            // Responses items: their summaries' text, or 1 for an item that is only encrypted.
            other => other.to_string().len().max(1),
        })
        .sum();
    let blocks: usize = parts(message)
        .into_iter()
        .flatten()
        .filter(|p| part_type(p).is_some_and(|t| REASONING_PARTS.contains(&t)))
        .map(|p| p.get("thinking").or_else(|| p.get("data")).and_then(Value::as_str).map_or(1, |s| s.chars().count().max(1)))
        .sum();
    fields + blocks
}

/// Media parts (images, audio, files) the message carries.
pub fn media_parts(message: &Value) -> usize {
    let own = parts(message).into_iter().flatten().filter(|p| part_type(p).is_some_and(|t| MEDIA_PARTS.contains(&t))).count();
    // Anthropic tool results nest their own content parts.
    let nested: usize = parts(message)
        .into_iter()
        .flatten()
        .filter_map(|p| p.get("content").and_then(Value::as_array))
        .map(|inner| inner.iter().filter(|p| part_type(p).is_some_and(|t| MEDIA_PARTS.contains(&t))).count())
        .sum();
    own + nested
}

/// The message without its reasoning (fields and blocks).
pub fn without_reasoning(message: &Value) -> Value {
    let Value::Object(map) = message else { return message.clone() };
    let mut out: Map<String, Value> =
        map.iter().filter(|(k, _)| !REASONING_KEYS.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect();
    if let Some(Value::Array(parts)) = out.get_mut("content") {
        parts.retain(|p| !part_type(p).is_some_and(|t| REASONING_PARTS.contains(&t)));
    }
    Value::Object(out)
}

/// The message without its media parts (at the top level and inside tool results).
pub fn without_media(message: &Value) -> Value {
    let mut out = message.clone();
    let is_media = |p: &Value| part_type(p).is_some_and(|t| MEDIA_PARTS.contains(&t));
    if let Some(Value::Array(parts)) = out.get_mut("content") {
        parts.retain(|p| !is_media(p));
        for part in parts.iter_mut() {
            if let Some(Value::Array(inner)) = part.get_mut("content") {
                inner.retain(|p| !is_media(p));
            }
        }
    }
    out
}

/// The forms an assistant message may have had as a reply on record: without its reasoning, and its
/// text alone (a Responses reply that the next response's calls joined). Empty when there is none
/// other than the message itself.
pub fn reply_forms(message: &Value) -> Vec<Value> {
    let mut forms = Vec::new();
    if reasoning_chars(message) > 0 {
        forms.push(without_reasoning(message));
    }
    let text = visible_text(message);
    if !text.is_empty() && (message.get("tool_calls").is_some() || message.get("reasoning_items").is_some()) {
        forms.push(serde_json::json!({"role": "assistant", "content": text}));
    }
    forms
}

/// A stable key of a message's canonical form (hex of its hash).
pub fn key(message: &Value) -> String {
    ctxscope_store::to_hex(&ctxscope_store::message_hash(message).0)
}

/// The ids that tie a message to a tool call: a tool message's `tool_call_id`, the `tool_use_id`s of
/// Anthropic `tool_result` blocks, an assistant message's call ids. Empty for other messages.
pub fn tool_ids(message: &Value) -> Vec<String> {
    let mut ids = Vec::new();
    if let Some(id) = message.get("tool_call_id").and_then(Value::as_str) {
        ids.push(id.to_string());
    }
    for call in message.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
        if let Some(id) = call.get("id").and_then(Value::as_str) {
            ids.push(id.to_string());
        }
    }
    for part in parts(message).into_iter().flatten() {
        match part_type(part) {
            Some("tool_result") => ids.extend(part.get("tool_use_id").and_then(Value::as_str).map(str::to_string)),
            Some("tool_use") => ids.extend(part.get("id").and_then(Value::as_str).map(str::to_string)),
            _ => {}
        }
    }
    ids
}

/// Whitespace collapsed to single spaces: the form summaries are matched in.
pub fn squeezed(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kinds_across_apis() {
        assert_eq!(kind(&json!({"role": "system", "content": "rules"})), Kind::System);
        assert_eq!(kind(&json!({"role": "developer", "content": "rules"})), Kind::System);
        assert_eq!(kind(&json!({"role": "user", "content": "<system-reminder>todo</system-reminder>"})), Kind::SystemReminder);
        assert_eq!(kind(&json!({"role": "tool", "tool_call_id": "c", "content": "ok"})), Kind::ToolResult);
        let anthropic = json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "42"}]});
        assert_eq!((kind(&anthropic), tool_ids(&anthropic)), (Kind::ToolResult, vec!["t1".to_string()]));
        assert_eq!(kind(&json!({"role": "user", "content": [{"type": "text", "text": "hi"}]})), Kind::User);
        let compaction = json!({"role": crate::parse::responses::OPAQUE_ROLE, "item": {"type": "compaction", "encrypted_content": "x"}});
        assert_eq!(kind(&compaction), Kind::Summary);
    }

    #[test]
    fn reasoning_and_media_come_off_leaving_the_rest() {
        let deepseek = json!({"role": "assistant", "content": "", "reasoning_content": "think", "tool_calls": [{"id": "c1"}]});
        assert_eq!(reasoning_chars(&deepseek), 5);
        assert_eq!(without_reasoning(&deepseek), json!({"role": "assistant", "content": "", "tool_calls": [{"id": "c1"}]}));
        let claude = json!({"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"}, {"type": "tool_use", "id": "t1"}]});
        assert_eq!(reasoning_chars(&claude), 3);
        assert_eq!(without_reasoning(&claude)["content"], json!([{"type": "tool_use", "id": "t1"}]));
        let image =
            json!({"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": "data:"}}]});
        assert_eq!(media_parts(&image), 1);
        assert_eq!(without_media(&image)["content"], json!([{"type": "text", "text": "see"}]));
        assert_eq!(visible_text(&image), "see");
    }
}
