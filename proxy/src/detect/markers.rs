//! Known compaction summaries, as data (`phrases/compaction.json`): the opening of Codex's summary
//! message, Claude Code's continuation message, opencode's summary question, the Agents SDK's
//! `compaction` item. A new message that matches one is a summary standing in for earlier turns.

use std::sync::LazyLock;

use serde::Deserialize;
use serde_json::Value;

use super::anatomy;

/// One harness's marker: how its summary message reads.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Marker {
    pub harness: String,
    #[serde(default)]
    starts_with: Option<String>,
    #[serde(default)]
    contains: Option<String>,
    #[serde(default)]
    equals: Option<String>,
    #[serde(default)]
    item_type: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Markers {
    #[serde(rename = "_doc")]
    _doc: String,
    markers: Vec<Marker>,
    /// Openings of harness-injected session context (see the file's `_doc`).
    preamble: Vec<String>,
}

static MARKERS: LazyLock<Markers> = LazyLock::new(|| {
    serde_json::from_str(include_str!("phrases/compaction.json")).expect("the built-in compaction markers parse (a test checks)")
});

/// Whether `message` is session context a harness puts in front of every session (a system or
/// developer message, or a user message opening with a known preamble): unrelated sessions share it.
pub fn is_preamble(message: &Value) -> bool {
    match message.get("role").and_then(Value::as_str) {
        Some("system" | "developer") => true,
        Some("user") => {
            let text = anatomy::visible_text(message);
            let text = text.trim_start();
            MARKERS.preamble.iter().any(|p| text.starts_with(p.as_str()))
        }
        _ => false,
    }
}

/// Characters of a message that markers are matched in.
const HEAD_CHARS: usize = 4096;

/// The harness whose compaction marker `message` carries (at its start), if any.
pub fn harness_of(message: &Value) -> Option<&'static str> {
    let item_type = message.get("item").and_then(|i| i.get("type")).and_then(Value::as_str);
    // Markers open the message: its first characters are enough (a summary can be megabytes).
    let head: String = anatomy::visible_text(message).chars().take(HEAD_CHARS).collect();
    let text = anatomy::squeezed(&head).to_lowercase();
    let lower = |s: &Option<String>| s.as_ref().map(|s| anatomy::squeezed(s).to_lowercase());
    MARKERS
        .markers
        .iter()
        .find(|m| {
            let by_item = m.item_type.is_some() && m.item_type.as_deref() == item_type;
            let by_start = lower(&m.starts_with).is_some_and(|p| !text.is_empty() && text.starts_with(&p));
            let by_part = lower(&m.contains).is_some_and(|p| !text.is_empty() && text.contains(&p));
            let by_equal = lower(&m.equals).is_some_and(|p| text == p);
            by_item || by_start || by_part || by_equal
        })
        .map(|m| m.harness.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_harness_is_recognised() {
        let codex = json!({"role": "user", "content": "Another language model started to solve this problem and produced a summary of its thinking process.\nSummary: x"});
        assert_eq!(harness_of(&codex), Some("codex"));
        let claude = json!({"role": "user", "content": [{"type": "text", "text": "This session is being continued from a previous conversation that ran out of context."}]});
        assert_eq!(harness_of(&claude), Some("claude_code"));
        assert_eq!(harness_of(&json!({"role": "user", "content": "What did we do so far?"})), Some("opencode"));
        let item = json!({"role": crate::parse::responses::OPAQUE_ROLE, "item": {"type": "compaction", "encrypted_content": "e"}});
        assert_eq!(harness_of(&item), Some("agents_sdk"));
        assert_eq!(harness_of(&json!({"role": "user", "content": "What did we do so far? And then?"})), None);
        assert_eq!(harness_of(&json!({"role": "user", "content": ""})), None);
    }

    #[test]
    fn session_preamble_is_told_from_the_users_words() {
        assert!(is_preamble(&json!({"role": "developer", "content": "You are Codex."})));
        assert!(is_preamble(&json!({"role": "user", "content": "<environment_context>\n  <cwd>/w</cwd>\n</environment_context>"})));
        assert!(!is_preamble(&json!({"role": "user", "content": "Fix the <environment_context> parser."})));
        assert!(!is_preamble(&json!({"role": "assistant", "content": "<system-reminder>"})));
    }
}
