//! Ollama's native `/api/chat`: NDJSON lines with `message.content` pieces, and a final `done` line
//! with `done_reason`, `prompt_eval_count` and `eval_count`.

use serde_json::{json, Value};

use super::{usage, ParsedResponse};

pub fn stream(lines: &[Value]) -> ParsedResponse {
    let mut parsed = ParsedResponse { events: lines.len() as u32, ..Default::default() };
    let mut done = false;
    for line in lines {
        if let Some(text) = line.get("message").and_then(|m| m.get("content")).and_then(Value::as_str) {
            parsed.reply_text.push_str(text);
        }
        if let Some(error) = line.get("error").and_then(Value::as_str) {
            parsed.error = Some(error.to_string());
        }
        if line.get("done").and_then(Value::as_bool) == Some(true) {
            done = true;
            parsed.finish_reason = line.get("done_reason").and_then(Value::as_str).map(str::to_string);
            usage::absorb(line, &mut parsed.usage);
        }
    }
    if !done {
        parsed.notes.push("stream ended without a done line".into());
    }
    parsed.reply_message = Some(json!({"role": "assistant", "content": parsed.reply_text}));
    parsed
}

#[cfg(test)]
mod tests {
    use super::super::response;
    use ctxscope_store::Endpoint;

    #[test]
    fn ndjson_stream_with_counts() {
        let body = b"{\"message\":{\"role\":\"assistant\",\"content\":\"Hi\"},\"done\":false}\n{\"message\":{\"role\":\"assistant\",\"content\":\"!\"},\"done\":true,\"done_reason\":\"stop\",\"prompt_eval_count\":4096,\"eval_count\":2}\n";
        let p = response(Endpoint::OllamaChat, Some("application/x-ndjson"), 200, body, true);
        assert_eq!(p.reply_text, "Hi!");
        assert_eq!(p.usage.unwrap().prompt_tokens, Some(4096));
        assert_eq!(p.finish_reason.as_deref(), Some("stop"));
    }
}
