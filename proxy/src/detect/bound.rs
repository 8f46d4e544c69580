//! Findings' evidence kept to a size a person reads: a history edit across 100,000 messages listed
//! every index and edit (megabytes per finding, held in memory by sled and sent to every alert sink).
//! Lists keep their first [`MAX_ITEMS`] entries, with the number left out beside them as
//! `<name>_omitted`; texts keep their first [`MAX_CHARS`] characters.

use serde_json::{Map, Value};

/// Entries a list of evidence keeps.
pub const MAX_ITEMS: usize = 256;
/// Characters a text of evidence keeps.
pub const MAX_CHARS: usize = 4096;

/// `evidence` within the bounds.
pub fn evidence(evidence: Value) -> Value {
    bound(evidence)
}

fn bound(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut out = Map::with_capacity(map.len());
            for (key, value) in map {
                if let Value::Array(items) = &value {
                    if items.len() > MAX_ITEMS {
                        out.insert(format!("{key}_omitted"), (items.len() - MAX_ITEMS).into());
                    }
                }
                out.insert(key, bound(value));
            }
            Value::Object(out)
        }
        Value::Array(mut items) => {
            items.truncate(MAX_ITEMS);
            Value::Array(items.into_iter().map(bound).collect())
        }
        Value::String(text) if text.chars().count() > MAX_CHARS => {
            let kept: String = text.chars().take(MAX_CHARS).collect();
            let left = text.chars().count() - MAX_CHARS;
            Value::String(format!("{kept}… ({left} more characters)"))
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn long_lists_and_texts_are_cut_with_what_was_left_out() {
        let long: Vec<usize> = (0..100_000).collect();
        let bounded = super::evidence(json!({"removed_messages": long, "nested": {"edits": [[1, 2], "x".repeat(5000)]}, "n": 3}));
        assert_eq!(bounded["removed_messages"].as_array().unwrap().len(), super::MAX_ITEMS);
        assert_eq!(bounded["removed_messages"][255], 255);
        assert_eq!(bounded["removed_messages_omitted"], 100_000 - super::MAX_ITEMS);
        let text = bounded["nested"]["edits"][1].as_str().unwrap();
        assert!(text.starts_with(&"x".repeat(super::MAX_CHARS)) && text.ends_with("(904 more characters)"), "{text}");
        assert_eq!(bounded["n"], 3);
        assert!(bounded.get("n_omitted").is_none() && bounded["nested"].get("edits_omitted").is_none());
    }
}
