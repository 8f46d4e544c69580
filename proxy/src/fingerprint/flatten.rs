//! Turns an endpoint's JSON answer into fingerprint fields: dotted paths to scalars, with volatile
//! fields (clocks, load, random markers) left out, long text (chat templates) reduced to a digest,
//! and every list and the total bounded.

use std::collections::BTreeMap;

use serde_json::Value;

/// Keys whose values change while the deployment does not (or are too big to keep).
const VOLATILE: [&str; 17] = [
    "created",
    "is_sleeping",
    "is_processing",
    "expires_at",
    "modified_at",
    "uptime",
    "internal_states",
    "last_gen_throughput",
    "memory_usage",
    "size_vram",
    "id_task",
    "media_marker",
    "license",
    "modelfile",
    "tensors",
    "timestamp",
    "n_busy_slots",
];

/// Strings longer than this are kept as a digest.
const LONG_TEXT: usize = 200;
/// Elements kept of a list.
const LIST: usize = 16;
/// Nesting followed.
const DEPTH: usize = 8;
/// Fields kept in all.
pub const MAX_FIELDS: usize = 400;

/// Keys whose values are credentials (SGLang's server arguments carry `api_key`, for one): stored as
/// `<redacted>`, never as the value.
fn secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    ["api_key", "apikey", "secret", "password", "access_token", "hf_token", "admin_key"].iter().any(|s| key.ends_with(s))
}

/// Adds `value`'s scalars under `prefix` to `fields`.
pub fn flatten(prefix: &str, value: &Value, fields: &mut BTreeMap<String, Value>) {
    walk(prefix, value, fields, 0);
}

fn walk(path: &str, value: &Value, fields: &mut BTreeMap<String, Value>, depth: usize) {
    if fields.len() >= MAX_FIELDS {
        return;
    }
    match value {
        Value::Object(map) if depth < DEPTH => {
            for (key, inner) in map {
                if VOLATILE.contains(&key.as_str()) {
                    continue;
                }
                let field = format!("{path}.{key}");
                if secret(key) && !inner.is_null() {
                    fields.insert(field, Value::from("<redacted>"));
                } else {
                    walk(&field, inner, fields, depth + 1);
                }
            }
        }
        Value::Array(list) if depth < DEPTH => {
            for (i, inner) in list.iter().take(LIST).enumerate() {
                walk(&format!("{path}.{i}"), inner, fields, depth + 1);
            }
        }
        Value::String(text) if text.len() > LONG_TEXT => {
            let (hash, _) = ctxscope_store::message_hash(value);
            let hex = ctxscope_store::to_hex(&hash);
            fields.insert(path.to_string(), Value::from(format!("sha256:{} ({} bytes)", &hex[..16], text.len())));
        }
        Value::Object(_) | Value::Array(_) => {
            fields.insert(path.to_string(), Value::from("(nested too deep)"));
        }
        scalar => {
            fields.insert(path.to_string(), scalar.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths_volatile_and_long_text() {
        let mut fields = BTreeMap::new();
        let template = "x".repeat(500);
        let answer = json!({"default_generation_settings": {"n_ctx": 1024}, "created": 5, "chat_template": template, "data": [{"id": "m"}], "api_key": "sk-live-1", "eos_token": "<e>"});
        flatten("props", &answer, &mut fields);
        assert_eq!(fields["props.default_generation_settings.n_ctx"], json!(1024));
        assert_eq!(fields["props.data.0.id"], json!("m"));
        assert!(!fields.contains_key("props.created"));
        assert_eq!(fields["props.api_key"], json!("<redacted>"));
        assert_eq!(fields["props.eos_token"], json!("<e>"));
        let digest = fields["props.chat_template"].as_str().unwrap();
        assert!(digest.starts_with("sha256:") && digest.ends_with("(500 bytes)"), "{digest}");
        let mut again = BTreeMap::new();
        flatten("props", &json!({"chat_template": "y".repeat(500)}), &mut again);
        assert_ne!(again["props.chat_template"], fields["props.chat_template"]);
    }
}
